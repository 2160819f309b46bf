# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_contamination, on venvs laid out with plain files in a temporary directory (no venv is
built and no installer runs: a fake run(argv) acts on the files as pip or uv would), so the whole
file runs in a few seconds:

- the venv's lock (VenvLock), the trust of root's state directory (_trusted, _state_dir_fd), the
  copy (_copy_fd), the record of failed restores (RestoreRecord, unrestored, _pending_problem),
  the entries uv refuses (blocking_entries) and the diff's lines (_pkg_lines);
- Contamination: its options, the plan (what is removed, kept, kept aside and reinstalled), the
  removal (check mode, the installer chosen, the files put back, the uninstall or the reinstall
  failing, a package lost, the record kept until the files are back) and _anchored;
- the stash (Stash) on real directories of another user (root only): files are copied into
  root's 0700 directory and put back through handles; a directory exchanged for another real one,
  or swapped for a link, is refused and named; nothing is ever replaced; a directory the
  uninstall removed is made again as it was."""

from __future__ import annotations

import base64
import errno
import fcntl
import gc
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import tempfile
import threading
import time
import types

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _contamination

# The tests that give files to another user, or need root's own stash, run as root; the rest as any user.
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another user or uses root's stash: runs as root")

NOBODY = 65534
BODY = b"the kept package's bytes\n"


def digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


@pytest.fixture
def site(monkeypatch, tmp_path):
    """A site directory of nobody's holding pkg/sub/data.bin (nobody's, 0640), and the stash's
    state directory in this test's own tree."""
    monkeypatch.setattr(_contamination, "STATE_DIR", str(tmp_path / "state" / "restore"))
    root = tempfile.mkdtemp(prefix="gpufleet-owned-", dir="/tmp")
    os.chmod(root, 0o755)
    path = os.path.join(root, "site-packages")
    os.makedirs(os.path.join(path, "pkg", "sub"))
    with open(os.path.join(path, "pkg", "sub", "data.bin"), "wb") as f:
        f.write(BODY)
    os.chmod(os.path.join(path, "pkg", "sub", "data.bin"), 0o640)
    os.chmod(os.path.join(path, "pkg", "sub"), 0o750)
    for top, _dirs, files in os.walk(path):
        for name in [top] + [os.path.join(top, n) for n in files]:
            os.chown(name, NOBODY, NOBODY)
    yield path
    shutil.rmtree(root, ignore_errors=True)


def taken(site):
    stash = _contamination.Stash()
    assert stash.take(site, "pkg/sub/data.bin", digest(BODY), "sha256") is None
    os.remove(os.path.join(site, "pkg", "sub", "data.bin"))  # the uninstall
    return stash


@root_only
def test_the_copy_is_root_s_alone_and_goes_with_the_run(site):
    stash = taken(site)
    st = os.stat(stash.where)
    copy = os.stat(os.path.join(stash.where, "0"))
    assert (st.st_uid, st.st_mode & 0o777, copy.st_uid, copy.st_mode & 0o777, copy.st_nlink) == (0, 0o700, 0, 0o600, 1)
    assert os.stat(_contamination.stash_dir()).st_mode & 0o777 == 0o700
    assert stash.put_back(stash.items[0]) is None
    stash.close()
    assert not os.path.exists(_contamination.stash_dir())
    path = os.path.join(site, "pkg", "sub", "data.bin")
    st = os.stat(path)
    with open(path, "rb") as f:
        assert f.read() == BODY
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777, st.st_nlink) == (NOBODY, NOBODY, 0o640, 1)
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".gpufleet")]


@root_only
def test_a_directory_the_uninstall_removed_is_made_again_as_it_was(site):
    stash = taken(site)
    shutil.rmtree(os.path.join(site, "pkg"))
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    for rel, mode in (("pkg", 0o755), ("pkg/sub", 0o750)):
        st = os.stat(os.path.join(site, rel))
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, mode), rel
    with open(os.path.join(site, "pkg", "sub", "data.bin"), "rb") as f:
        assert f.read() == BODY


@root_only
def test_a_file_put_there_meanwhile_is_never_replaced(site):
    stash = taken(site)
    with open(os.path.join(site, "pkg", "sub", "data.bin"), "wb") as f:
        f.write(b"the owner's own\n")
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    with open(os.path.join(site, "pkg", "sub", "data.bin"), "rb") as f:
        assert f.read() == b"the owner's own\n"


@root_only
@pytest.mark.parametrize("swap", ["a link", "another directory", "the site for a link"])
def test_a_swapped_directory_is_refused_and_named_and_nothing_is_written(site, tmp_path, swap):
    stash = taken(site)
    elsewhere = os.path.join(os.path.dirname(site), "elsewhere")
    os.makedirs(os.path.join(elsewhere, "sub"))
    sub = os.path.join(site, "pkg", "sub")
    if swap == "a link":
        os.rename(sub, sub + ".real")
        os.symlink(os.path.join(elsewhere, "sub"), sub)
        said = "is reached through the symbolic link %s" % sub
    elif swap == "another directory":
        os.rename(sub, sub + ".real")
        os.rename(os.path.join(elsewhere, "sub"), sub)
        said = "is reached through %s, which is another directory than before the uninstall" % sub
    else:
        os.rename(site, site + ".real")
        os.symlink(elsewhere, site)
        os.symlink(os.path.join(elsewhere, "sub"), os.path.join(elsewhere, "pkg"))
        said = "%s is a symbolic link to %s" % (site, elsewhere)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    assert problem is not None and said in problem and "nothing was written there" in problem, problem
    for top, _dirs, files in os.walk(elsewhere):
        assert files == [], (top, files)
    for top, _dirs, files in os.walk(site + (".real" if swap == "the site for a link" else "")):
        assert "data.bin" not in files, top


@root_only
def test_a_file_that_changed_before_it_was_copied_is_not_kept(site):
    stash = _contamination.Stash()
    try:
        problem = stash.take(site, "pkg/sub/data.bin", digest(b"what RECORD says"), "sha256")
        assert problem and "no longer matches its RECORD" in problem
        assert stash.items == [] and stash.take(site, "../etc/passwd") and stash.items == []
    finally:
        stash.close()


# ==================================================================== the rest, on plain files
# Venvs are laid out by hand (bin/python a shell script, pyvenv.cfg, site-packages with dist-info
# directories as pip writes them); the installer is FakeInstaller, which acts on those files.

DEFAULTS = (_contamination.STATE_DIR, _contamination._STATE_MAX, _contamination._COPY_CHUNK, _contamination.STASH_FILE_MAX,
            _contamination.STASH_TOTAL_MAX)
SITE_REL = os.path.join("lib", "python3.11", "site-packages")
PIP_UNINSTALL = ["-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", "--no-input"]
PIP_INSTALL = ["-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--no-input"]
KEEP_DATA = b"the CUDA 12 build's data\n"
DROP_DATA = b"the CUDA 13 build's data, longer\n"
COMMON = b"# the family's namespace\n"
NAME_RULE = ("a name is letters, digits, '.', '_' and '-', starting and ending with a letter or digit "
             "(as in sglang, flashinfer-python)")


@pytest.fixture(autouse=True)
def _no_collection_within_a_test():
    """No garbage collection while a test runs: a Venv's site anchors close their descriptors when
    collected, and those an earlier test left in a cycle (a traceback it kept) would otherwise
    close between two counts of _fds(), at whatever moment the collector chose."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture(autouse=True)
def state_dir(monkeypatch, tmp_path):
    """The record of failed restores and the stash, in this test's own directory."""
    path = str(tmp_path / "state" / "restore")
    monkeypatch.setattr(_contamination, "STATE_DIR", path)
    return path


def _write(path, data=b""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _digest(data, algo="sha256"):
    return base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode("ascii")


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _dist_info(site, name, version, files, algo="sha256", dirname=None):
    """A dist-info directory as pip writes it (METADATA, INSTALLER, RECORD with a hash and a size
    on each row; ``algo`` None: rows without a hash), and ``files`` (rel -> bytes) below ``site``."""
    base = dirname or "%s-%s.dist-info" % (name.replace("-", "_"), version)
    info = os.path.join(site, base)
    own = {"%s/METADATA" % base: ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n\n" % (name, version)).encode("utf-8"),
           "%s/INSTALLER" % base: b"pip\n"}
    rows = []
    for rel, data in list(files.items()) + list(own.items()):
        _write(os.path.normpath(os.path.join(site, rel)), data)
        rows.append("%s,%s=%s,%d" % (rel, algo, _digest(data, algo), len(data)) if algo else "%s,," % rel)
    rows.append("%s/RECORD,," % base)
    _write(os.path.join(info, "RECORD"), ("\n".join(rows) + "\n").encode("utf-8"))
    return info


class FakeInstaller(object):
    """run(argv) acting on a venv's files as pip (or uv) would: an uninstall removes each named
    package's RECORD files and its dist-info, a reinstall writes the pinned packages back from
    ``wheels``; each argv is kept in ``calls``."""

    def __init__(self, site):
        self.site = site
        self.wheels = {}  # canonical name -> (name, version, files, algo, dirname)
        self.infos = {}
        self.calls = []
        self.uninstall_result = (0, "", "")
        self.left = set()  # what the uninstall fails to remove
        self.also_take = set()  # what it takes away besides
        self.reinstall_result = None  # returned without writing anything

    def add(self, name, version, files, algo="sha256", dirname=None, site=None):
        info = _dist_info(site or self.site, name, version, files, algo, dirname)
        key = _contamination.canonical_name(name)
        self.infos[key] = (site or self.site, info)
        self.wheels[key] = (name, version, files, algo, dirname)
        return info

    def remove(self, key):
        """As pip does: each RECORD file, then the directories of site-packages it leaves empty."""
        site, info = self.infos[key]
        with open(os.path.join(info, "RECORD")) as f:
            for line in f.read().splitlines():
                path = os.path.normpath(os.path.join(site, line.rsplit(",", 2)[0]))
                if os.path.lexists(path) and not os.path.isdir(path):
                    os.unlink(path)
                here = os.path.dirname(path)
                while here.startswith(site + "/") and os.path.isdir(here) and not os.listdir(here):
                    os.rmdir(here)
                    here = os.path.dirname(here)
        if os.path.isdir(info):
            shutil.rmtree(info)

    def __call__(self, argv):
        self.calls.append(list(argv))
        if "uninstall" in argv:
            for name in argv[6 if argv[1] == "pip" else 7:]:
                if _contamination.canonical_name(name) not in self.left:
                    self.remove(_contamination.canonical_name(name))
            for key in sorted(self.also_take):
                self.remove(key)
            return self.uninstall_result
        if self.reinstall_result is not None:
            return self.reinstall_result
        for pin in [a for a in argv if "==" in a]:
            name, version = pin.split("==")
            spec = self.wheels.get(_contamination.canonical_name(name))
            if spec is None or spec[1] != version:
                return 1, "", "ERROR: No matching distribution found for %s\n" % pin
            self.add(*spec)
        return 0, "", ""


class World(object):
    """A venv at ``venv`` laid out with files, its FakeInstaller ``fake`` (``fake.add`` installs)."""

    def __init__(self, root, pip=True):
        self.root = root
        self.venv = os.path.join(root, "venv")
        self.site = os.path.join(self.venv, SITE_REL)
        _write(os.path.join(self.venv, "bin", "python"), b"#!/bin/sh\n")
        os.chmod(os.path.join(self.venv, "bin", "python"), 0o755)
        _write(os.path.join(self.venv, "pyvenv.cfg"), b"home = /usr/bin\nversion_info = 3.11.2\n")
        os.makedirs(self.site)
        if pip:
            _write(os.path.join(self.site, "pip", "__init__.py"))
        self.python = os.path.join(self.venv, "bin/python")
        self.fake = FakeInstaller(self.site)
        self.add = self.fake.add

    def uv(self):
        path = _write(os.path.join(self.venv, "bin", "uv"), b"#!/bin/sh\n")
        os.chmod(path, 0o755)
        return path

    def contamination(self, **kw):
        args = dict(installer="pip", scan_binaries=False, evidence_cache=False, path_env="")
        args.update(kw)
        return _contamination.Contamination(args.pop("venv", self.venv), self.fake, **args)

    def read(self, rel):
        with open(os.path.join(self.site, rel), "rb") as f:
            return f.read()


def _world(tmp_path, common=True, clobber=True):
    """torch 2.9.1+cu128 (the reference: CUDA 12), keeppkg 1.0 and droppkg 1.0+cu130 (the
    contaminant), which share shared/__init__.py (the same bytes: kept aside) and shared/data.txt
    (droppkg's bytes over keeppkg's: keeppkg is reinstalled)."""
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"torch\n"})
    keep, drop = {"keeppkg/__init__.py": b"keep\n"}, {"droppkg/__init__.py": b"drop\n"}
    if common:
        keep["shared/__init__.py"] = drop["shared/__init__.py"] = COMMON
    if clobber:
        keep["shared/data.txt"], drop["shared/data.txt"] = KEEP_DATA, DROP_DATA
    w.add("keeppkg", "1.0", keep)
    w.add("droppkg", "1.0+cu130", drop)
    return w


def _pending_text(name, version, what):
    return ("%s %s lost files when the packages that had overwritten them were removed, and their reinstall failed: it %s. "
            "The venv stays not clean until they are back: reinstall it with find_links (cuda_contamination remove=true "
            "find_links=<a directory holding %s==%s>, or pip install --force-reinstall --no-deps --find-links <that directory> "
            "%s==%s)" % (name, version, what, name, version, name, version))


def _reinstall_text(pins, argv, text):
    return ("could not reinstall %s, whose files the removed packages had overwritten: no configured source has them. "
            "Restore them with: %s (%s)" % (pins, " ".join(shlex.quote(a) for a in argv), text))


BEFORE = "droppkg==1.0+cu130\nkeeppkg==1.0\ntorch==2.9.1+cu128\n"
AFTER = "keeppkg==1.0\ntorch==2.9.1+cu128\n"
HINT = ["--find-links", "<a directory holding these wheels>"]


def test_the_state_is_root_s_and_its_caps_are_64_kib_a_record_1_mib_a_read_1_gib_a_kept_file_and_2_gib_in_all():
    assert DEFAULTS == ("/var/lib/gpufleet-hygiene/restore", 65536, 1 << 20, 1 << 30, 2 << 30)


# ------------------------------------------------------------------------------------ VenvLock


def test_the_lock_is_an_exclusive_flock_on_the_venv_given_back_on_exit(tmp_path):
    other = os.open(str(tmp_path), os.O_RDONLY)
    try:
        before = _fds()
        with _contamination.VenvLock(str(tmp_path), 5) as lock:
            assert (lock.path, lock.timeout) == (str(tmp_path), 5)
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert _fds() == before
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(other)


def test_a_second_holder_waits_its_timeout_then_fails_naming_the_venv(tmp_path):
    before = _fds()
    holder = os.open(str(tmp_path), os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        start = time.monotonic()
        with pytest.raises(_contamination.DistError) as exc:
            _contamination.VenvLock(str(tmp_path), 0.2).__enter__()
        waited = time.monotonic() - start
    finally:
        os.close(holder)
    assert exc.value.msg == ("another run holds the lock on venv %s for more than 0.2s; wait for it or raise lock_timeout"
                             % tmp_path)
    assert 0.2 <= waited < 0.6, waited
    assert _fds() == before


def test_a_second_holder_gets_the_lock_once_the_first_gives_it_back(tmp_path):
    holder = os.open(str(tmp_path), os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    timer = threading.Timer(0.15, os.close, [holder])
    start = time.monotonic()
    timer.start()
    try:
        with _contamination.VenvLock(str(tmp_path), 5):
            waited = time.monotonic() - start
    finally:
        timer.join()
    assert 0.15 <= waited < 1, waited


def test_a_deadline_reached_exactly_is_over_and_a_timeout_of_0_tries_once_without_waiting(tmp_path, monkeypatch):
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        raise RuntimeError("waited")

    monkeypatch.setattr(_contamination, "time", types.SimpleNamespace(monotonic=lambda: 100.0, sleep=sleep))
    before = _fds()
    holder = os.open(str(tmp_path), os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(_contamination.DistError) as exc:
            _contamination.VenvLock(str(tmp_path), 0).__enter__()
    finally:
        os.close(holder)
    assert exc.value.msg == ("another run holds the lock on venv %s for more than 0s; wait for it or raise lock_timeout" % tmp_path)
    assert (slept, _fds()) == ([], before)


def test_eacces_is_waited_on_like_eagain(tmp_path, monkeypatch):
    real, calls = fcntl.flock, []

    def flock(fd, how):
        calls.append(how)
        if len(calls) == 1:
            raise OSError(errno.EACCES, "busy")
        return real(fd, how)

    monkeypatch.setattr(_contamination.fcntl, "flock", flock)
    with _contamination.VenvLock(str(tmp_path), 5):
        pass
    assert calls == [fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_UN]


def test_another_lock_error_is_raised_at_once(tmp_path, monkeypatch):
    def flock(fd, how):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(_contamination.fcntl, "flock", flock)
    start = time.monotonic()
    with pytest.raises(OSError) as exc:
        _contamination.VenvLock(str(tmp_path), 5).__enter__()
    assert exc.value.errno == errno.ENOLCK and time.monotonic() - start < 0.1


def test_the_lock_is_taken_on_a_directory_only_and_a_file_at_the_venv_s_path_is_refused(tmp_path):
    path = _write(str(tmp_path / "venv"), b"not a directory\n")
    before = _fds()
    with pytest.raises(NotADirectoryError):
        _contamination.VenvLock(path, 5).__enter__()
    assert _fds() == before


# -------------------------------------------------------------------------- root's state directory


def _st(mode, uid=0):
    return types.SimpleNamespace(st_mode=stat.S_IFDIR | mode, st_uid=uid)


@pytest.mark.parametrize("mode, trusted", [
    (0o755, True), (0o700, True), (0o1777, True), (0o1755, True), (0o775, False), (0o757, False), (0o777, False),
    (0o765, False), (0o756, False),
])
def test_a_directory_is_trusted_when_no_one_else_may_write_to_it_or_it_is_sticky(mode, trusted):
    assert bool(_contamination._trusted(_st(mode))) is trusted


def test_a_directory_of_another_user_is_not_trusted_but_one_of_our_own_is(monkeypatch):
    assert bool(_contamination._trusted(_st(0o755, NOBODY))) is (os.geteuid() == NOBODY)
    monkeypatch.setattr(_contamination.os, "geteuid", lambda: 1000)
    assert [bool(_contamination._trusted(_st(0o755, uid))) for uid in (0, 1000, 1001)] == [True, True, False]


def test_a_directory_of_root_or_of_ours_is_distrusted_for_who_else_may_write_and_another_s_for_its_owner(monkeypatch):
    assert [_contamination._distrust(_st(0o755)), _contamination._distrust(_st(0o777))] == [None, "is writable by another user than root"]
    monkeypatch.setattr(_contamination.os, "geteuid", lambda: 1000)
    assert [_contamination._distrust(_st(0o777, uid)) for uid in (0, 1000, 1001)] == [
        "is writable by another user than root", "is writable by another user than root", "belongs to uid 1001, not root"]


@root_only
def test_a_real_directory_s_owner_and_mode_decide_its_trust(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    verdicts = []
    for mode in (0o755, 0o775, 0o757, 0o1777):
        os.chmod(path, mode)
        verdicts.append(bool(_contamination._trusted(os.stat(path))))
    os.chmod(path, 0o755)
    os.chown(path, NOBODY, NOBODY)
    verdicts.append(bool(_contamination._trusted(os.stat(path))))
    assert verdicts == [True, False, False, True, False]


def test_the_state_directory_absent_is_none_unless_made(tmp_path, state_dir):
    before = _fds()
    assert _contamination._state_dir_fd(create=False) is None
    assert _fds() == before and not os.path.exists(tmp_path / "state")
    fd = _contamination._state_dir_fd(create=True)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(state_dir))
    finally:
        os.close(fd)
    assert _fds() == before
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "state", state_dir)] == [0o755, 0o755]
    fd = _contamination._state_dir_fd(create=False)
    assert os.path.samestat(os.fstat(fd), os.stat(state_dir))
    os.close(fd)


def test_the_state_directory_may_be_another_path(tmp_path):
    other = str(tmp_path / "x" / "y")
    assert _contamination._state_dir_fd(create=False, path=other) is None
    fd = _contamination._state_dir_fd(create=True, path=other)
    assert os.path.samestat(os.fstat(fd), os.stat(other))
    os.close(fd)
    assert not os.path.exists(tmp_path / "state")


def test_every_component_of_a_state_path_is_walked_whatever_character_it_starts_with(tmp_path):
    path = str(tmp_path / "+plus" / "-dash" / " space")
    fd = _contamination._state_dir_fd(create=True, path=path)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(path))
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["+plus"]


def test_the_last_directory_made_of_a_deep_state_path_has_the_mode_asked_for(tmp_path):
    deep = os.path.join(str(tmp_path), *["d"] * 300)  # more components than CPython keeps small ints for
    fd = _contamination._state_dir_fd(create=True, path=deep, mode=0o700)
    os.close(fd)
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in (os.path.dirname(deep), deep)] == [0o755, 0o700]


@pytest.mark.parametrize("create", [False, True])
def test_a_state_directory_below_one_others_may_write_is_refused(tmp_path, create):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    (open_dir / "sub").mkdir()
    before = _fds()
    with pytest.raises(OSError) as exc:
        _contamination._state_dir_fd(create=create, path=str(open_dir / "sub" / "new"))
    assert (exc.value.errno, exc.value.strerror) == (errno.EPERM, "open is writable by another user than root")
    assert _fds() == before and not os.path.exists(open_dir / "sub" / "new")


@root_only
def test_a_state_directory_below_one_of_another_user_is_refused(tmp_path):
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(OSError) as exc:
        _contamination._state_dir_fd(create=True, path=str(tmp_path / "theirs" / "new"))
    assert (exc.value.errno, exc.value.strerror) == (errno.EPERM, "theirs belongs to uid %d, not root" % NOBODY)


def test_a_link_on_the_way_to_the_state_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(str(tmp_path / "real"), str(tmp_path / "link"))
    before = _fds()
    with pytest.raises(OSError) as exc:
        _contamination._state_dir_fd(create=True, path=str(tmp_path / "link" / "new"))
    assert exc.value.errno in (errno.ELOOP, errno.ENOTDIR)  # as the kernel says it of O_NOFOLLOW | O_DIRECTORY
    assert _fds() == before and os.listdir(tmp_path / "real") == []


def test_a_state_directory_that_is_a_file_is_refused(tmp_path):
    _write(str(tmp_path / "file"))
    before = _fds()
    for create in (False, True):
        with pytest.raises(OSError) as exc:
            _contamination._state_dir_fd(create=create, path=str(tmp_path / "file"))
        assert exc.value.errno == errno.ENOTDIR
    assert _fds() == before


def test_a_sticky_state_directory_others_may_write_is_refused_but_one_above_is_not(tmp_path):
    (tmp_path / "sticky" / "final").mkdir(parents=True)
    os.chmod(tmp_path / "sticky", 0o1777)
    os.chmod(tmp_path / "sticky" / "final", 0o1777)
    before = _fds()
    with pytest.raises(OSError) as exc:
        _contamination._state_dir_fd(create=False, path=str(tmp_path / "sticky" / "final"))
    assert (exc.value.errno, exc.value.strerror) == (errno.EPERM, "it is writable by another user than root")
    assert _fds() == before
    os.chmod(tmp_path / "sticky" / "final", 0o1755)
    fd = _contamination._state_dir_fd(create=False, path=str(tmp_path / "sticky" / "final"))
    assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "sticky" / "final"))
    os.close(fd)


# --------------------------------------------------------------------------------------- _copy_fd


def _copy(tmp_path, data, **kw):
    src_path = _write(str(tmp_path / "src"), data)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        h, written = _contamination._copy_fd(src, dst, **kw)
        assert written == len(data)  # every byte is data: none is a hole
        return h
    finally:
        os.close(src)
        os.close(dst)


def test_a_copy_writes_every_byte_and_hashes_them(tmp_path):
    data = bytes(range(256)) * 5
    h = _copy(tmp_path, data)
    assert (h.name, h.hexdigest()) == ("sha256", hashlib.sha256(data).hexdigest())
    assert (tmp_path / "dst").read_bytes() == data
    assert _copy(tmp_path, data, algo="md5").hexdigest() == hashlib.md5(data).hexdigest()
    assert _copy(tmp_path, b"").hexdigest() == hashlib.sha256(b"").hexdigest()
    assert (tmp_path / "dst").read_bytes() == b""


@pytest.mark.parametrize("chunk", [1 << 20, 3])
def test_a_copy_of_exactly_the_limit_is_whole_and_one_byte_more_is_refused(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(_contamination, "_COPY_CHUNK", chunk)
    data = b"0123456789"
    assert _copy(tmp_path, data, limit=10).hexdigest() == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "dst").read_bytes() == data
    with pytest.raises(ValueError) as exc:
        _copy(tmp_path, data, limit=9)
    assert str(exc.value) == "larger than 9 bytes"
    assert (tmp_path / "dst").read_bytes() == (b"" if chunk > 10 else b"012345678")


@pytest.mark.parametrize("chunk", [1 << 20, 3])
def test_a_copy_that_writes_exactly_its_budget_is_whole_and_one_byte_more_is_refused_unwritten(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(_contamination, "_COPY_CHUNK", chunk)
    data = b"0123456789"
    assert _copy(tmp_path, data, budget=10).hexdigest() == hashlib.sha256(data).hexdigest()
    with pytest.raises(_contamination.StashFull):
        _copy(tmp_path, data, budget=9)
    assert (tmp_path / "dst").read_bytes() == (b"" if chunk > 10 else b"012345678")


def test_a_copy_s_budget_counts_data_not_holes(tmp_path):
    src = os.open(_sparse(str(tmp_path / "src"), {}, 64 * MiB), os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _h, written = _contamination._copy_fd(src, dst, budget=0)
    finally:
        os.close(src)
        os.close(dst)
    assert (written, os.stat(str(tmp_path / "dst")).st_size) == (0, 64 * MiB)


def test_a_copy_reads_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(_contamination, "_COPY_CHUNK", 4)
    real, reads = os.read, []

    def read(fd, n):
        reads.append(n)
        return real(fd, n)

    monkeypatch.setattr(_contamination.os, "read", read)
    data = b"abcdefghij"
    assert _copy(tmp_path, data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert reads == [4, 4, 2]  # up to the end of the data SEEK_HOLE gave, never a read past it
    assert (tmp_path / "dst").read_bytes() == data


def test_a_short_write_is_written_on_from_where_it_stopped(tmp_path, monkeypatch):
    real, writes = os.write, []
    dst_name = str(tmp_path / "dst")

    def write(fd, data):
        if os.path.realpath("/proc/self/fd/%d" % fd) == dst_name:
            writes.append(bytes(data[:3]))
            return real(fd, data[:3])
        return real(fd, data)

    monkeypatch.setattr(_contamination.os, "write", write)
    data = b"abcdefghij"
    assert _copy(tmp_path, data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert writes == [b"abc", b"def", b"ghi", b"j"]
    assert (tmp_path / "dst").read_bytes() == data


MiB = 1 << 20


def _sparse(path, runs, size):
    """A file of ``size`` bytes holding data only at ``runs`` ({offset: bytes}): holes elsewhere."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for offset, data in runs.items():
            os.pwrite(fd, data, offset)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return path


def _content_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(MiB), b""):
            h.update(chunk)
    return h.hexdigest()


def _allocated(path):
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("runs", [{}, {0: b"head" * 1024, 40 * MiB: b"tail" * 1024}, {8 * MiB: b"x" * (3 * MiB + 5)}],
                         ids=["all-hole", "head-and-middle", "one-run-of-chunks"])
def test_a_sparse_file_is_copied_sparse_byte_for_byte_and_hashed_whole(tmp_path, runs):
    src_path = _sparse(str(tmp_path / "src"), runs, 64 * MiB)
    assert _allocated(src_path) <= 2 * sum(len(d) for d in runs.values()) + 64 * 1024  # the file system keeps holes
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        h, written = _contamination._copy_fd(src, dst)
    finally:
        os.close(src)
        os.close(dst)
    dst_path = str(tmp_path / "dst")
    # The data, each run to its file-system block's end (where SEEK_HOLE says it ends).
    data = sum(len(d) for d in runs.values())
    assert data <= written <= data + len(runs) * os.statvfs(str(tmp_path)).f_bsize, (data, written)
    assert os.stat(dst_path).st_size == 64 * MiB
    assert h.hexdigest() == _content_digest(src_path) == _content_digest(dst_path)
    # Only the data was written: a dense copy would take 64 MiB.
    assert _allocated(dst_path) <= _allocated(src_path) + 64 * 1024, (_allocated(dst_path), _allocated(src_path))


def test_where_the_kernel_cannot_tell_holes_the_file_is_copied_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(_contamination, "_SEEK_DATA", 99)  # no such whence: lseek says EINVAL
    src_path = _sparse(str(tmp_path / "src"), {MiB: b"data"}, 3 * MiB)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        h, written = _contamination._copy_fd(src, dst)
    finally:
        os.close(src)
        os.close(dst)
    assert h.hexdigest() == _content_digest(src_path) == _content_digest(str(tmp_path / "dst"))
    assert written == 3 * MiB
    assert os.stat(str(tmp_path / "dst")).st_size == 3 * MiB


def test_a_hole_past_the_limit_is_refused_before_it_is_hashed(tmp_path, monkeypatch):
    src_path = _sparse(str(tmp_path / "src"), {}, 1 << 40)  # a TiB of hole
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    started = time.monotonic()
    try:
        with pytest.raises(ValueError) as exc:
            _contamination._copy_fd(src, dst, limit=MiB)
    finally:
        os.close(src)
        os.close(dst)
    assert (str(exc.value), os.stat(str(tmp_path / "dst")).st_size) == ("larger than %d bytes" % MiB, 0)
    assert time.monotonic() - started < 5


def test_a_sparse_shared_file_is_kept_aside_and_put_back_sparse(plain_site):
    path = _sparse(os.path.join(plain_site, "pkg", "big.bin"), {16 * MiB: b"the only data"}, 48 * MiB)
    want = _content_digest(path)
    stash = _contamination.Stash()
    try:
        assert stash.take(plain_site, "pkg/big.bin", base64.urlsafe_b64encode(
            bytes.fromhex(want)).rstrip(b"=").decode("ascii"), "sha256") is None
        kept = os.path.join(stash.where, stash.items[0]["copy"])
        aside = (os.stat(kept).st_size, _allocated(kept))
        os.remove(path)  # the uninstall
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    assert aside[0] == 48 * MiB and aside[1] <= 64 * 1024, aside
    assert (os.stat(path).st_size, _content_digest(path)) == (48 * MiB, want)
    assert _allocated(path) <= 64 * 1024, _allocated(path)


# --------------------------------------------------------------------------------- RestoreRecord


def test_the_record_is_named_for_the_venv_s_real_path(tmp_path, state_dir):
    (tmp_path / "venv").mkdir()
    os.symlink(str(tmp_path / "venv"), str(tmp_path / "alias"))
    real = os.path.realpath(str(tmp_path / "venv"))
    name = hashlib.sha256(real.encode("utf-8")).hexdigest()[:32] + ".json"
    for venv in ("venv", "alias"):
        record = _contamination.RestoreRecord(str(tmp_path / venv))
        assert (record.venv, record.name, record.where) == (real, name, os.path.join(state_dir, name))


def test_a_stored_record_is_loaded_back_and_an_empty_one_removes_it(tmp_path, state_dir):
    record = _contamination.RestoreRecord(str(tmp_path))
    pins = [("keeppkg", "1.0"), ("Other_Pkg", "2.0+cu128")]
    start = int(time.time())
    assert record.store(pins) is None
    assert os.listdir(state_dir) == [record.name]
    with open(record.where) as f:
        text = f.read()
    doc = json.loads(text)
    assert start <= doc.pop("since") <= time.time()
    assert doc == {"venv": record.venv, "packages": [{"name": "keeppkg", "version": "1.0"}, {"name": "Other_Pkg", "version": "2.0+cu128"}]}
    assert text == json.dumps(json.loads(text), sort_keys=True)
    assert stat.S_IMODE(os.stat(record.where).st_mode) == 0o644
    problems = []
    assert record.load(problems) == pins and problems == []
    assert record.store([]) is None
    assert os.listdir(state_dir) == [] and record.load(problems) == [] and problems == []
    assert record.store([]) is None


def test_no_record_and_no_state_directory_is_nothing_and_makes_nothing(tmp_path, state_dir):
    record = _contamination.RestoreRecord(str(tmp_path))
    problems = []
    assert record.load(problems) == [] and problems == []
    assert record.store([]) is None
    assert not os.path.exists(os.path.dirname(state_dir))


def _plant(record, data, mode=0o644):
    os.makedirs(os.path.dirname(record.where), exist_ok=True)
    with open(record.where, "wb") as f:
        f.write(data if isinstance(data, bytes) else json.dumps(data).encode("utf-8"))
    os.chmod(record.where, mode)


@pytest.mark.parametrize("data", [
    b"{not json", b"\xff\xfe", b"[1, 2]", {"packages": []}, {"venv": "VENV"}, {"venv": "VENV", "packages": 3},
    {"venv": "VENV", "packages": [{"name": "a"}]}, {"venv": "VENV", "packages": [["a", "1"]]},
])
def test_a_malformed_record_is_ignored_and_said(tmp_path, data):
    record = _contamination.RestoreRecord(str(tmp_path))
    if isinstance(data, dict):
        data = dict((k, record.venv if v == "VENV" else v) for k, v in data.items())
    _plant(record, data)
    problems = []
    assert record.load(problems) == []
    expected = [] if data == {"packages": []} else ["the record of failed restores %s is malformed: ignored" % record.where]
    assert problems == expected


def test_a_record_of_another_venv_is_nothing(tmp_path):
    record = _contamination.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": "/elsewhere", "packages": [{"name": "a", "version": "1"}]})
    problems = []
    assert record.load(problems) == [] and problems == []


def test_a_record_s_names_and_versions_no_installer_would_read_are_dropped(tmp_path):
    record = _contamination.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [
        {"name": "--python=/x", "version": "1"}, {"name": "ok", "version": "-1"}, {"name": "good", "version": "1.0"},
        {"name": "a b", "version": "1 0"}]})
    problems = []
    assert record.load(problems) == [("good", "1.0")] and problems == []


def _not_root_s(record):
    return ["the record of failed restores %s is not a regular file of root's under 65536 bytes: ignored" % record.where]


@pytest.mark.parametrize("kind", ["a directory", "a fifo", "mode 0666", "sticky 01666", "too large"])
def test_a_record_that_is_no_regular_file_of_root_s_under_the_cap_is_ignored(tmp_path, kind):
    record = _contamination.RestoreRecord(str(tmp_path))
    os.makedirs(os.path.dirname(record.where))
    good = json.dumps({"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}).encode("utf-8")
    if kind == "a directory":
        os.mkdir(record.where)
    elif kind == "a fifo":
        os.mkfifo(record.where)
    elif kind == "too large":
        _plant(record, b" " * (_contamination._STATE_MAX + 1 - len(good)) + good)
    else:
        _plant(record, good, 0o666 if kind == "mode 0666" else 0o1666)
    problems = []
    assert record.load(problems) == []
    assert problems == _not_root_s(record)


def test_a_sticky_record_others_may_write_is_ignored_though_its_group_may_not(tmp_path):
    record = _contamination.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}, 0o1646)
    problems = []
    assert record.load(problems) == []
    assert problems == _not_root_s(record)


@pytest.mark.parametrize("mode", [0o601, 0o645, 0o755], ids=oct)
def test_a_record_no_one_else_may_write_is_read_whatever_else_they_may_do(tmp_path, mode):
    record = _contamination.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}, mode)
    problems = []
    assert record.load(problems) == [("a", "1")] and problems == []


def test_a_record_of_exactly_the_cap_is_read_whole(tmp_path):
    record = _contamination.RestoreRecord(str(tmp_path))
    good = json.dumps({"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}).encode("utf-8")
    _plant(record, b" " * (_contamination._STATE_MAX - len(good)) + good)
    assert os.path.getsize(record.where) == _contamination._STATE_MAX
    problems = []
    assert record.load(problems) == [("a", "1")] and problems == []
    _plant(record, good, 0o1644)  # sticky, but no one else may write to it
    assert record.load(problems) == [("a", "1")] and problems == []


@root_only
def test_a_record_of_another_user_is_ignored(tmp_path):
    record = _contamination.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [{"name": "a", "version": "1"}]})
    os.chown(record.where, NOBODY, NOBODY)
    problems = []
    assert record.load(problems) == [] and problems == _not_root_s(record)


def test_a_record_reached_through_a_link_or_an_open_directory_is_not_read(tmp_path, state_dir):
    record = _contamination.RestoreRecord(str(tmp_path))
    os.makedirs(state_dir)
    os.symlink("/etc/hostname", record.where)
    problems = []
    assert record.load(problems) == []
    assert problems == ["the record of failed restores %s cannot be read: %s" % (record.where, os.strerror(errno.ELOOP))]
    os.unlink(record.where)
    os.chmod(os.path.dirname(state_dir), 0o777)
    problems = []
    assert record.load(problems) == []
    assert problems == ["the record of failed restores %s cannot be read: state is writable by another user than root" % record.where]


def test_a_link_planted_at_the_record_s_temporary_name_is_not_followed(tmp_path, state_dir):
    record = _contamination.RestoreRecord(str(tmp_path))
    os.makedirs(state_dir)
    os.symlink(str(tmp_path / "victim"), os.path.join(state_dir, ".%s.%d" % (record.name, os.getpid())))
    assert record.store([("a", "1")]) == (
        "could not write the record of failed restores %s (%s): run as root so that the next reads know the files are missing"
        % (record.where, os.strerror(errno.ELOOP)))
    assert not os.path.lexists(tmp_path / "victim") and not os.path.lexists(record.where)


def test_a_temporary_record_an_earlier_run_of_the_same_pid_left_is_written_over_whole(tmp_path, state_dir):
    record = _contamination.RestoreRecord(str(tmp_path))
    os.makedirs(state_dir)
    _write(os.path.join(state_dir, ".%s.%d" % (record.name, os.getpid())), b"x" * 4096)
    assert record.store([("a", "1")]) is None
    problems = []
    assert (record.load(problems), problems, os.listdir(state_dir)) == ([("a", "1")], [], [record.name])


def test_a_record_that_cannot_be_written_or_cleared_says_so(tmp_path, state_dir):
    record = _contamination.RestoreRecord(str(tmp_path))
    os.makedirs(state_dir)
    os.chmod(os.path.dirname(state_dir), 0o777)
    tail = ("the record of failed restores %s (state is writable by another user than root): run as root so that the next "
            "reads know the files are missing" % record.where)
    assert record.store([("a", "1")]) == "could not write " + tail
    assert record.store([]) == "could not clear " + tail
    assert os.listdir(state_dir) == []


# ---------------------------------------------------------------------- unrestored, _pending_problem


def test_unrestored_names_what_is_not_installed_and_the_files_not_back(tmp_path):
    w = World(str(tmp_path))
    w.add("intact", "1.0", {"intact/a.py": b"a\n"})
    w.add("Broken_Pkg", "2.0", {"broken/a.py": b"aaa\n", "broken/b.py": b"bbb\n", "broken/c.py": b"ccc\n", "broken/d.py": b"ddd\n"})
    os.remove(os.path.join(w.site, "broken", "a.py"))
    _write(os.path.join(w.site, "broken", "b.py"), b"BBB\n")  # same size, other bytes
    _write(os.path.join(w.site, "broken", "d.py"), b"longer\n")
    dists = _contamination.Venv(w.venv, None).distributions
    assert _contamination.unrestored(dists, [("gone", "3.0"), ("intact", "0.9"), ("broken-pkg", "9")]) == [
        {"name": "gone", "version": "3.0", "installed": False, "missing": [], "modified": []},
        {"name": "Broken_Pkg", "version": "2.0", "installed": True, "missing": ["broken/a.py"], "modified": ["broken/b.py", "broken/d.py"]},
    ]
    assert _contamination.unrestored(dists, []) == []


@pytest.mark.parametrize("missing, modified, listed", [
    (["m1"], [], "1 file(s) missing or differing from its RECORD (m1)"),
    ([], ["x1"], "1 file(s) missing or differing from its RECORD (x1)"),
    (["m1", "m2"], ["x1", "x2", "x3"], "5 file(s) missing or differing from its RECORD (m1, m2, x1, x2, x3)"),
    (["m1", "m2"], ["x1", "x2", "x3", "x4"], "6 file(s) missing or differing from its RECORD (m1, m2, x1, x2, x3 and 1 more)"),
    (["m%d" % i for i in range(1, 8)], [], "7 file(s) missing or differing from its RECORD (m1, m2, m3, m4, m5 and 2 more)"),
    (["m%d" % i for i in range(1, 11)], ["x1"], "11 file(s) missing or differing from its RECORD (m1, m2, m3, m4, m5 and 6 more)"),
])
def test_a_pending_restore_lists_five_files_and_counts_the_rest(missing, modified, listed):
    item = {"name": "keeppkg", "version": "1.0", "installed": True, "missing": missing, "modified": modified}
    assert _contamination._pending_problem(item) == _pending_text("keeppkg", "1.0", "has " + listed)


def test_a_pending_restore_of_a_package_gone_says_it_is_not_installed():
    item = {"name": "gone", "version": "3.0", "installed": False, "missing": ["m"], "modified": []}
    assert _contamination._pending_problem(item) == (
        "gone 3.0 lost files when the packages that had overwritten them were removed, and their reinstall failed: it is not "
        "installed any more. The venv stays not clean until they are back: reinstall it with find_links (cuda_contamination "
        "remove=true find_links=<a directory holding gone==3.0>, or pip install --force-reinstall --no-deps --find-links "
        "<that directory> gone==3.0)")


# ------------------------------------------------------------------------ blocking_entries, _pkg_lines


def test_uv_is_blocked_by_entries_whose_name_is_no_name_version(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    entries = {one: ["foo-1.0.dist-info", "--python=x-1.dist-info", "foo-bad version.dist-info", "foo.dist-info",
                     "foo-1.0-py3.9.egg-info", "bar.egg-info", "baz-1.0-.x.egg-info", "egg-1.0-py3 9.egg-info",
                     "qux-.1-py3.egg-info", "notes.txt"],
               two: ["a_b-2.dist-info", "-x-1.dist-info", "c-1!2.0+cu128.dist-info", "d-1.0 .dist-info"]}
    for site, names in entries.items():
        for name in names:
            (site / name).mkdir(parents=True)
    assert _contamination.blocking_entries([str(one), str(tmp_path / "absent"), str(two)]) == [
        str(one / "--python=x-1.dist-info"), str(one / "foo-bad version.dist-info"), str(one / "qux-.1-py3.egg-info"),
        str(two / "-x-1.dist-info"), str(two / "d-1.0 .dist-info")]
    assert _contamination.blocking_entries([]) == []


def test_an_entry_without_a_version_whose_name_is_no_package_name_blocks_uv(tmp_path):
    for name in ("foo_.dist-info", "bar..egg-info", "ok.dist-info"):
        (tmp_path / name).mkdir()
    assert _contamination.blocking_entries([str(tmp_path)]) == [str(tmp_path / "bar..egg-info"), str(tmp_path / "foo_.dist-info")]


def test_the_diff_lines_are_name_equals_version_sorted_by_canonical_name():
    dists = [types.SimpleNamespace(name=n, version=v, key=_contamination.canonical_name(n))
             for n, v in (("Zeta", "1"), ("alpha", "2.0+cu128"), ("Beta_Pkg", "3"))]
    assert _contamination._pkg_lines(dists) == "alpha==2.0+cu128\nBeta_Pkg==3\nZeta==1\n"
    assert _contamination._pkg_lines([]) == ""


# ------------------------------------------------------------------------- Contamination's options


@pytest.mark.parametrize("kw, message", [
    (dict(also_remove=["ok", "a b"]), "also_remove holds 'a b', which is not a package name: " + NAME_RULE),
    (dict(also_remove=["a b", "-e"], protect=["--x"]), "also_remove holds 'a b', '-e', which are not package names: " + NAME_RULE),
    (dict(protect=["torch", "-e"]), "protect holds '-e', which is not a package name: " + NAME_RULE),
    (dict(protect=["x;y", "z/"]), "protect holds 'x;y', 'z/', which are not package names: " + NAME_RULE),
    (dict(also_remove=["Torch"]), ("torch is both protected and in also_remove; a protected package is never removed: "
                                   "drop it from also_remove or from protect")),
    (dict(protect=["b", "A"], also_remove=["a_x", "B", "a"]), ("a, b is both protected and in also_remove; a protected package "
                                                               "is never removed: drop it from also_remove or from protect")),
    (dict(find_links="/nonexistent/wheels"), "find_links /nonexistent/wheels is not a directory of wheels"),
])
def test_bad_options_are_refused_before_anything_is_read(tmp_path, kw, message):
    w = World(str(tmp_path))
    with pytest.raises(_contamination.DistError) as exc:
        w.contamination(**kw)
    assert exc.value.msg == message


def test_options_are_kept_canonical_and_find_links_may_be_a_directory(tmp_path):
    w = World(str(tmp_path))
    (tmp_path / "wheels").mkdir()
    _write(str(tmp_path / "file"))
    with pytest.raises(_contamination.DistError):
        w.contamination(find_links=str(tmp_path / "file"))
    c = w.contamination(protect=["Torch", "NVIDIA_NCCL.cu13"], also_remove=["Sg_Lang", "flash.attn"], find_links=str(tmp_path / "wheels"))
    assert (c.protect, c.also_remove, c.find_links) == ({"torch", "nvidia-nccl-cu13"}, ["sg-lang", "flash-attn"], str(tmp_path / "wheels"))
    assert (c.python, c.sites, c.own_sites) == (w.python, [w.site], {os.path.realpath(w.site)})
    assert w.contamination(find_links="").find_links == ""


def test_the_defaults_protect_torch_and_let_the_installer_be_chosen(tmp_path):
    w = World(str(tmp_path))
    c = _contamination.Contamination(w.venv, w.fake)
    assert (c.venv, c.run_cmd, c.expected_cuda, c.protect, c.also_remove, c.find_links, c.no_index, c.installer_pref) == (
        w.venv, w.fake, None, {"torch"}, [], None, False, "auto")
    assert (c.scan_binaries, c.evidence_cache, c.lock_timeout, c.check_mode, c.path_env, c._identity) == (True, True, 60, False, None, None)
    assert (c.restore_record.venv, c.restore_record.where) == (os.path.realpath(w.venv), _contamination.RestoreRecord(w.venv).where)


def _linked(w, tmp_path):
    """An image's packages outside the venv (``image``), seen through site/linked, a link to them
    named by a .pth line: their files are reached through the venv's site-packages."""
    image = tmp_path / "image"
    image.mkdir()
    os.symlink(str(image), os.path.join(w.site, "linked"))
    _write(os.path.join(w.site, "_image.pth"), b"# the image's packages\nlinked\nimport sys\n")
    return os.path.join(w.site, "linked"), str(image)


def test_only_the_venv_s_own_site_directories_are_its_own(tmp_path):
    w = World(str(tmp_path))
    linked, _image = _linked(w, tmp_path)
    sibling = str(tmp_path / "venv2" / "site")
    os.makedirs(sibling)
    _write(os.path.join(w.site, "_sibling.pth"), sibling.encode("utf-8") + b"\n")
    os.symlink(w.venv, str(tmp_path / "alias"))
    for venv in (w.venv, str(tmp_path / "alias")):
        c = w.contamination(venv=venv)
        assert c.own_sites == {os.path.realpath(w.site)}
        assert [os.path.realpath(s) for s in c.sites] == [os.path.realpath(p) for p in (w.site, linked, sibling)]


# ----------------------------------------------------------------------------------------- plan


def _plan(c):
    _result, dists, _clobbered, shared = c.scan()
    return c.plan(dists, _result["contaminants"], shared)


def test_plan_keeps_the_protected_the_unsafe_and_what_is_outside_and_adds_also_remove(tmp_path):
    w = World(str(tmp_path))
    linked, image = _linked(w, tmp_path)
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    w.add("droppkg", "1.0+cu130", {"droppkg/__init__.py": b"d\n"})
    w.add("nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/__init__.py": b"n\n"})
    evil = w.add("--python=x", "1.0+cu130", {"evil/__init__.py": b"e\n"}, dirname="evil-1.0+cu130.dist-info")
    badver = w.add("badver", "1.0+cu130;rm", {"badver/__init__.py": b"b\n"})
    w.add("leftover", "1.0", {"leftover/__init__.py": b"l\n"})
    oddver = w.add("oddver", "2.0;x", {"oddver/__init__.py": b"o\n"})
    _dist_info(image, "outsidepkg", "1.0+cu130", {"outsidepkg/__init__.py": b"o\n"})
    _dist_info(image, "imgleft", "1.0", {"imgleft/__init__.py": b"i\n"})
    c = w.contamination(protect=("torch", "NVIDIA_NCCL_cu13"), also_remove=["leftover", "droppkg", "absent", "imgleft", "oddver"])
    remove, kept, preserve, reinstall = _plan(c)
    unsafe = _contamination._UNSAFE
    assert [d.name for d in remove] == ["droppkg", "leftover"]
    assert kept == [
        {"name": "badver", "reason": unsafe % ("badver", "1.0+cu130;rm", badver)},
        {"name": "--python=x", "reason": unsafe % ("--python=x", "1.0+cu130", evil)},
        {"name": "nvidia-nccl-cu13", "reason": "protected"},
        {"name": "outsidepkg", "reason": "installed outside the venv, in %s" % linked},
        {"name": "imgleft", "reason": "installed outside the venv, in %s" % linked},
        {"name": "oddver", "reason": unsafe % ("oddver", "2.0;x", oddver)},
    ]
    assert (preserve, reinstall) == ([], [])
    assert kept[1]["reason"] == ("its metadata names it '--python=x', version '1.0+cu130', which an installer would not read as "
                                 "a package (%s): not handed to uv or pip; remove that directory by hand" % evil)


def test_plan_goes_on_past_an_also_remove_name_it_keeps_or_finds_absent(tmp_path):
    w = World(str(tmp_path))
    linked, image = _linked(w, tmp_path)
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    oddver = w.add("oddver", "2.0;x", {"oddver/__init__.py": b"o\n"})
    w.add("leftover", "1.0", {"leftover/__init__.py": b"l\n"})
    w.add("extra", "1.0", {"extra/__init__.py": b"e\n"})
    _dist_info(image, "imgleft", "1.0", {"imgleft/__init__.py": b"i\n"})
    c = w.contamination(also_remove=["absent", "leftover", "oddver", "imgleft", "extra"])
    remove, kept, _preserve, _reinstall = _plan(c)
    assert [d.name for d in remove] == ["leftover", "extra"]
    assert kept == [{"name": "oddver", "reason": _contamination._UNSAFE % ("oddver", "2.0;x", oddver)},
                    {"name": "imgleft", "reason": "installed outside the venv, in %s" % linked}]


def test_plan_keeps_an_unsafe_keeper_whose_shared_file_changed_whatever_else_it_keeps(tmp_path):
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    w.add("zzzpkg", "1.0+cu130", {"zzzpkg/__init__.py": b"z\n"})
    oddkeep = w.add("oddkeep", "1.0;x", {"shared/data.txt": KEEP_DATA})
    w.add("droppkg", "1.0+cu130", {"shared/data.txt": DROP_DATA})
    remove, kept, preserve, reinstall = _plan(w.contamination(protect=("torch", "zzzpkg")))
    assert [d.name for d in remove] == ["droppkg"]
    assert kept == [{"name": "zzzpkg", "reason": "protected"},
                    {"name": "oddkeep", "reason": _contamination._UNSAFE % ("oddkeep", "1.0;x", oddkeep)}]
    assert (preserve, reinstall) == ([], [])


def test_plan_keeps_aside_what_keepers_still_match_and_reinstalls_those_that_do_not(tmp_path):
    w = World(str(tmp_path))
    a, c_, d, tool = b"a\n", b"cc\n", b"ddd\n", b"#!/bin/sh\necho tool\n"
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    w.add("anodigest", "1.0", {"shared/c.py": c_, "shared/z.py": b"z\n"}, algo=None)
    w.add("gonefile", "1.0", {"shared/e.py": b"e\n"})
    w.add("keeppkg", "1.0", {"shared/a.py": a, "shared/b.py": b"keep b\n", "shared/c.py": c_, "shared/d.py": d,
                             "shared/z.py": b"z\n", "../../../bin/tool": tool})
    w.add("linkpkg", "1.0", {"shared/f.py": b"f\n"})
    w.add("weird", "1.0;x", {"shared/g.py": b"g\n", "shared/g2.py": b"g2\n"})
    w.add("zeta", "1.0", {"shared/d.py": d}, algo="sha384")
    w.add("alpha-cu13", "1.0", {"alpha/__init__.py": b"p\n"})  # a protected contaminant, kept first
    w.add("droppkg", "1.0+cu130", {"shared/a.py": a, "shared/b.py": b"drop b\n", "shared/c.py": c_, "shared/d.py": d,
                                   "shared/e.py": b"e\n", "shared/f.py": b"f\n", "shared/g.py": b"G\n", "shared/g2.py": b"G2\n",
                                   "shared/y.py": b"y\n", "../../../bin/tool": tool})
    w.add("leftover", "1.0", {"shared/y.py": b"y\n"})
    os.remove(os.path.join(w.site, "shared", "e.py"))
    os.remove(os.path.join(w.site, "shared", "f.py"))
    os.symlink("/etc/hostname", os.path.join(w.site, "shared", "f.py"))
    os.symlink(w.venv, str(tmp_path / "alias"))
    c = w.contamination(venv=str(tmp_path / "alias"), also_remove=["leftover"], protect=["torch", "alpha-cu13"])
    remove, kept, preserve, reinstall = _plan(c)
    real = os.path.realpath(w.venv)
    shared = os.path.join(SITE_REL, "shared")
    assert [d.name for d in remove] == ["droppkg", "leftover"]
    assert kept == [{"name": "alpha-cu13", "reason": "protected"}, {"name": "weird", "reason": _contamination._UNSAFE % ("weird", "1.0;x", os.path.join(
        str(tmp_path / "alias"), SITE_REL, "weird-1.0;x.dist-info"))}]
    assert preserve == [
        [real, "bin/tool", "sha256", _digest(tool), [("keeppkg", "1.0")]],
        [real, os.path.join(shared, "a.py"), "sha256", _digest(a), [("keeppkg", "1.0")]],
        [real, os.path.join(shared, "c.py"), "sha256", _digest(c_), [("anodigest", "1.0"), ("keeppkg", "1.0")]],
        [real, os.path.join(shared, "d.py"), "sha256", _digest(d), [("keeppkg", "1.0"), ("zeta", "1.0")]],
    ]
    assert [d.name for d in reinstall] == ["gonefile", "keeppkg", "linkpkg"]


def test_plan_keeps_aside_a_file_no_keeper_has_a_digest_for(tmp_path):
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    w.add("anodigest", "1.0", {"shared/c.py": b"c\n"}, algo=None)
    w.add("droppkg", "1.0+cu130", {"shared/c.py": b"c\n"})
    _remove, _kept, preserve, reinstall = _plan(w.contamination())
    assert preserve == [[os.path.realpath(w.venv), os.path.join(SITE_REL, "shared", "c.py"), None, None, [("anodigest", "1.0")]]]
    assert reinstall == []


# ---------------------------------------------------------------------------------------- _anchored


def test_anchored_is_the_path_below_the_venv_s_real_directory_or_none(tmp_path):
    w = _world(tmp_path)
    linked, image = _linked(w, tmp_path)
    _dist_info(image, "imagepkg", "1.0", {"imagepkg/__init__.py": b"i\n"})
    w.add("tooly", "1.0", {"../../../bin/tool": b"#!/bin/sh\n"})
    os.symlink(w.venv, str(tmp_path / "alias"))
    c = w.contamination(venv=str(tmp_path / "alias"))
    dists = dict((d.name, d) for d in c.env.distributions)
    real, site = os.path.realpath(w.venv), os.path.join(str(tmp_path / "alias"), SITE_REL)
    keep, tooly = dists["keeppkg"], dists["tooly"]
    assert c._anchored(keep, os.path.join(site, "shared", "data.txt")) == (real, os.path.join(SITE_REL, "shared", "data.txt"))
    assert c._anchored(tooly, [p for p, rel in tooly.paths if rel == "../../../bin/tool"][0]) == (real, "bin/tool")
    assert c._anchored(keep, "/etc/passwd") == (None, "/etc/passwd")
    assert c._anchored(keep, real + "2/x") == (None, real + "2/x")
    assert c._anchored(dists["imagepkg"], os.path.join(linked, "imagepkg", "__init__.py")) == (
        None, os.path.join(linked, "imagepkg", "__init__.py"))


def test_anchored_is_the_same_below_a_venv_whose_real_path_has_an_odd_or_an_even_length(tmp_path):
    got, want = [], []
    for root in ("a", "ab"):
        w = _world(tmp_path / root)
        c = w.contamination()
        keep = dict((d.name, d) for d in c.env.distributions)["keeppkg"]
        got.append(c._anchored(keep, os.path.join(w.site, "shared", "data.txt")))
        want.append((os.path.realpath(w.venv), os.path.join(SITE_REL, "shared", "data.txt")))
    assert got == want


# ------------------------------------------------------------------------------------ the scan, run()


def test_the_scan_reports_the_contaminant_what_it_clobbered_and_changes_nothing(tmp_path):
    w = _world(tmp_path)
    result = w.contamination().run()
    assert result == {
        "reference": {"cuda_major": 12, "cuda_version": "12.8", "source": "torch 2.9.1+cu128 (local version label)"},
        "contaminants": [{"name": "droppkg", "version": "1.0+cu130", "cuda_major": 13, "layer": "version label", "location": w.site,
                          "evidence": ["version 1.0+cu130 carries the local label for CUDA 13.0 (version label evidence)",
                                       "overwrote shared/data.txt of keeppkg 1.0"]}],
        "clobbered": [{"path": "shared/data.txt", "owner": "keeppkg", "owner_version": "1.0", "state": "overwritten",
                       "overwritten_by": ["droppkg"]}],
        "unknown": ["keeppkg"], "restore_pending": [], "clean": False, "scanned": 3, "problems": [], "warnings": [],
        "changed": False,
    }
    assert w.fake.calls == []


def test_the_scan_of_a_consistent_venv_is_clean_and_a_removal_there_changes_nothing(tmp_path):
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    w.add("nvidia-nccl-cu12", "2.27.3", {"nvidia/nccl/__init__.py": b"n\n"})
    result = w.contamination().run(remove=True)
    assert (result["clean"], result["contaminants"], result["changed"]) == (True, [], False)
    assert (result["removed"], result["kept"], result["restored"], result["preserved_files"]) == ([], [], [], 0)
    lines = "nvidia-nccl-cu12==2.27.3\ntorch==2.9.1+cu128\n"
    assert result["diff"] == {"before": lines, "after": lines}
    assert "installer" not in result and w.fake.calls == []


def test_a_removal_of_only_protected_contaminants_changes_nothing(tmp_path):
    w = _world(tmp_path)
    result = w.contamination(protect=["torch", "droppkg"]).run(remove=True)
    assert (result["changed"], result["kept"], result["removed"], result["restored"]) == (
        False, [{"name": "droppkg", "reason": "protected"}], [], [])
    assert result["diff"] == {"before": BEFORE, "after": BEFORE}
    assert w.fake.calls == []


@pytest.mark.parametrize("what", ["nothing", "a pyvenv.cfg directory", "a conda-meta file"])
def test_a_removal_is_refused_where_there_is_no_pyvenv_cfg_nor_conda_meta(tmp_path, what):
    w = _world(tmp_path)
    os.remove(os.path.join(w.venv, "pyvenv.cfg"))
    if what == "a pyvenv.cfg directory":
        os.mkdir(os.path.join(w.venv, "pyvenv.cfg"))
    elif what == "a conda-meta file":
        _write(os.path.join(w.venv, "conda-meta"))
    os.symlink(w.venv, str(tmp_path / "alias"))
    alias = str(tmp_path / "alias")
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(venv=alias).run(remove=True)
    assert exc.value.msg == (
        "venv %s (%s) has no pyvenv.cfg and no conda-meta: it is neither a virtual nor a conda environment, and packages "
        "are removed only from one of those; give the training venv's own directory" % (alias, os.path.realpath(w.venv)))
    assert (exc.value.partial["changed"], [c["name"] for c in exc.value.partial["contaminants"]]) == (False, ["droppkg"])
    assert w.fake.calls == []


def test_a_conda_environment_is_removed_from(tmp_path):
    w = _world(tmp_path)
    os.remove(os.path.join(w.venv, "pyvenv.cfg"))
    os.mkdir(os.path.join(w.venv, "conda-meta"))
    result = w.contamination(check_mode=True).run(remove=True)
    assert (result["changed"], result["installer"]) == (True, "pip")


def test_check_mode_says_what_would_be_done_and_runs_nothing(tmp_path, state_dir):
    w = _world(tmp_path)
    _contamination.RestoreRecord(w.venv).store([("gone", "3.0")])
    result = w.contamination(check_mode=True).run(remove=True)
    assert (result["changed"], result["installer"], result["clean"]) == (True, "pip", False)
    assert result["removed"] == [{"name": "droppkg", "version": "1.0+cu130"}]
    assert result["restored"] == [{"name": "keeppkg", "version": "1.0"}, {"name": "gone", "version": "3.0"}]
    assert (result["kept"], result["preserved_files"]) == ([], 1)
    assert result["diff"] == {"before": BEFORE, "after": AFTER}
    assert w.fake.calls == []
    assert w.read("shared/data.txt") == DROP_DATA and os.path.isdir(os.path.join(w.site, "droppkg-1.0+cu130.dist-info"))
    assert os.listdir(state_dir) == [_contamination.RestoreRecord(w.venv).name]
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))


def test_a_removal_takes_the_contaminant_away_keeps_the_shared_file_and_reinstalls_what_it_clobbered(tmp_path, state_dir):
    w = _world(tmp_path)
    result = w.contamination().run(remove=True)
    assert result == {
        "reference": {"cuda_major": 12, "cuda_version": "12.8", "source": "torch 2.9.1+cu128 (local version label)"},
        "contaminants": [{"name": "droppkg", "version": "1.0+cu130", "cuda_major": 13, "layer": "version label", "location": w.site,
                          "evidence": ["version 1.0+cu130 carries the local label for CUDA 13.0 (version label evidence)",
                                       "overwrote shared/data.txt of keeppkg 1.0"]}],
        "clobbered": [{"path": "shared/data.txt", "owner": "keeppkg", "owner_version": "1.0", "state": "overwritten",
                       "overwritten_by": ["droppkg"]}],
        "unknown": ["keeppkg"], "restore_pending": [], "clean": True, "scanned": 3, "problems": [], "warnings": [],
        "changed": True, "installer": "pip", "kept": [], "removed": [{"name": "droppkg", "version": "1.0+cu130"}],
        "restored": [{"name": "keeppkg", "version": "1.0"}], "preserved_files": 1,
        "diff": {"before": BEFORE, "after": AFTER}, "clobbered_after": [],
    }
    assert w.fake.calls == [[w.python] + PIP_UNINSTALL + ["droppkg"], [w.python] + PIP_INSTALL + ["keeppkg==1.0"]]
    assert (w.read("shared/__init__.py"), w.read("shared/data.txt")) == (COMMON, KEEP_DATA)
    assert not os.path.exists(os.path.join(w.site, "droppkg")) and not os.path.exists(os.path.join(w.site, "droppkg-1.0+cu130.dist-info"))
    assert not os.path.exists(os.path.dirname(state_dir))  # no record, no stash left


def test_a_shared_file_is_put_back_after_the_uninstall_without_a_reinstall(tmp_path, state_dir):
    w = _world(tmp_path, clobber=False)
    result = w.contamination().run(remove=True)
    assert (result["removed"], result["restored"], result["preserved_files"], result["clean"]) == (
        [{"name": "droppkg", "version": "1.0+cu130"}], [], 1, True)
    assert w.fake.calls == [[w.python] + PIP_UNINSTALL + ["droppkg"]]
    assert w.read("shared/__init__.py") == COMMON
    assert stat.S_IMODE(os.stat(os.path.join(w.site, "shared", "__init__.py")).st_mode) == 0o644
    assert not os.path.exists(os.path.dirname(state_dir))


def test_a_removal_waits_for_the_venv_s_lock_and_gives_up_after_lock_timeout(tmp_path):
    w = _world(tmp_path)
    holder = os.open(w.venv, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(_contamination.GpufleetError) as exc:
            w.contamination(lock_timeout=0.1).run(remove=True)
    finally:
        os.close(holder)
    assert exc.value.msg == "another run holds the lock on venv %s for more than 0.1s; wait for it or raise lock_timeout" % w.venv
    assert [c["name"] for c in exc.value.partial["contaminants"]] == ["droppkg"]  # the scan's result goes with the failure
    assert w.fake.calls == []


# ---------------------------------------------------------------------------------- uv or pip


def test_uv_is_taken_when_found_and_runs_the_removal(tmp_path):
    w = _world(tmp_path, common=False)
    uv = w.uv()
    assert w.contamination(installer="auto", check_mode=True).run(remove=True)["installer"] == "uv"
    result = w.contamination(installer="uv").run(remove=True)
    assert result["installer"] == "uv" and result["clean"] is True
    assert w.fake.calls == [[uv, "pip", "uninstall", "--no-cache", "--python", w.python, "droppkg"],
                            [uv, "pip", "install", "--no-cache", "--python", w.python, "--reinstall", "--no-deps", "keeppkg==1.0"]]


@root_only
def test_a_uv_of_another_user_is_run_as_that_user_and_one_of_root_s_as_root(tmp_path):
    w = _world(tmp_path)
    uv = w.uv()
    identities = []
    for owner in (0, NOBODY):
        os.chown(uv, owner, owner)
        c = w.contamination(installer="uv", check_mode=True)
        assert c.run(remove=True)["installer"] == "uv"
        identities.append(c._identity)
    assert identities == [None, (NOBODY, NOBODY, "%s is owned by uid %d" % (uv, NOBODY))]
    assert w.fake.calls == []


def _blocked(w, names):
    for name in names:
        os.mkdir(os.path.join(w.site, name))
    return "; ".join("rm -r -- %s" % shlex.quote(os.path.join(w.site, n)) for n in names)


@pytest.mark.parametrize("installer, pip", [("uv", True), ("auto", False)])
def test_uv_refuses_a_venv_with_an_entry_that_is_no_name_version_and_says_how_to_fix_it(tmp_path, installer, pip):
    w = _world(tmp_path)
    if not pip:
        shutil.rmtree(os.path.join(w.site, "pip"))
    w.uv()
    rm = _blocked(w, ["--python=x-1.dist-info"])
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(installer=installer).run(remove=True)
    assert exc.value.msg == (
        "uv refuses this venv because of '--python=x-1.dist-info', whose name is no package name-version; nothing was removed. "
        "Remove it by hand (%s) and run again%s" % (rm, "" if installer == "uv" else ", or install pip into the venv, which passes over it"))
    assert [c["name"] for c in exc.value.partial["contaminants"]] == ["droppkg"]
    assert w.fake.calls == []


def test_uv_asked_for_in_a_module_argument_refuses_such_a_venv_without_offering_pip(tmp_path):
    w = _world(tmp_path)
    w.uv()
    rm = _blocked(w, ["--python=x-1.dist-info"])
    uv = "".join(["u", "v"])  # as a module's arguments give it: not the interned literal
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(installer=uv).run(remove=True)
    assert exc.value.msg == (
        "uv refuses this venv because of '--python=x-1.dist-info', whose name is no package name-version; nothing was removed. "
        "Remove it by hand (%s) and run again" % rm)
    assert w.fake.calls == []


def test_uv_refusing_two_entries_names_them(tmp_path):
    w = _world(tmp_path)
    w.uv()
    rm = _blocked(w, ["-x-1.dist-info", "foo-bad version.dist-info"])
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(installer="uv").run(remove=True)
    assert exc.value.msg == (
        "uv refuses this venv because of '-x-1.dist-info', 'foo-bad version.dist-info', whose name is no package name-version; "
        "nothing was removed. Remove them by hand (%s) and run again" % rm)


def test_pip_is_taken_over_uv_for_such_a_venv_when_the_choice_is_free(tmp_path):
    w = _world(tmp_path)
    w.uv()
    _blocked(w, ["--python=x-1.dist-info"])
    auto = "".join(["au", "to"])  # as a module's arguments give it: not the interned literal
    result = w.contamination(installer=auto).run(remove=True)
    assert (result["installer"], result["clean"]) == ("pip", True)
    assert [argv[:3] for argv in w.fake.calls] == [[w.python, "-m", "pip"]] * 2


def test_pip_asked_for_removes_from_a_venv_with_an_entry_uv_would_refuse(tmp_path):
    w = _world(tmp_path)
    w.uv()
    _blocked(w, ["--python=x-1.dist-info"])
    result = w.contamination(installer="pip").run(remove=True)
    assert (result["installer"], result["clean"]) == ("pip", True)
    assert [argv[:3] for argv in w.fake.calls] == [[w.python, "-m", "pip"]] * 2


# ------------------------------------------------------------------------------ failures of a removal


def test_an_uninstall_failing_part_way_names_what_is_left_and_the_installer_s_words(tmp_path):
    w = _world(tmp_path)
    w.add("extra", "2.0", {"extra/__init__.py": b"x\n"})
    w.fake.left = {"extra"}
    w.fake.uninstall_result = (1, "Found existing installation\n", "  ERROR: Cannot uninstall extra 2.0: no RECORD file\n")
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(also_remove=["extra"]).run(remove=True)
    assert exc.value.msg == (
        "the uninstall failed part-way (pip exited 1): removed droppkg; still installed extra: ERROR: Cannot uninstall extra 2.0: "
        "no RECORD file. Fix what pip names and run again: the next run removes what is left and restores the files the removed "
        "packages had overwritten")
    partial = exc.value.partial
    assert (partial["removed"], partial["restored"], partial["changed"], partial["clean"]) == (
        [{"name": "droppkg", "version": "1.0+cu130"}], [{"name": "keeppkg", "version": "1.0"}], True, True)
    assert partial["diff"] == {"before": "droppkg==1.0+cu130\nextra==2.0\n" + AFTER, "after": "extra==2.0\n" + AFTER}
    assert w.fake.calls == [[w.python] + PIP_UNINSTALL + ["droppkg", "extra"], [w.python] + PIP_INSTALL + ["keeppkg==1.0"]]


@pytest.mark.parametrize("result, left, words", [
    ((0, "", ""), {"droppkg"}, "(pip exited 0): removed nothing; still installed droppkg: no message"),
    ((2, "only stdout\n", ""), set(), "(pip exited 2): removed droppkg; still installed nothing: only stdout"),
    ((1, "out", "x" * 700), {"droppkg"}, "(pip exited 1): removed nothing; still installed droppkg: " + "x" * 600),
    ((-9, "", ""), set(), "(pip exited -9): removed droppkg; still installed nothing: no message"),
])
def test_an_uninstall_that_fails_or_leaves_a_package_is_an_error(tmp_path, result, left, words):
    w = _world(tmp_path, common=False, clobber=False)
    w.fake.uninstall_result, w.fake.left = result, left
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == (
        "the uninstall failed part-way %s. Fix what pip names and run again: the next run removes what is left and restores "
        "the files the removed packages had overwritten" % words)


def test_a_failed_reinstall_names_the_command_and_is_remembered_until_the_files_are_back(tmp_path, state_dir):
    w = _world(tmp_path)
    del w.fake.wheels["keeppkg"]
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    argv = [w.python] + PIP_INSTALL + HINT + ["keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, "ERROR: No matching distribution found for keeppkg==1.0")
    problem = _pending_text("keeppkg", "1.0", "has 1 file(s) missing or differing from its RECORD (shared/data.txt)")
    pending = [{"name": "keeppkg", "version": "1.0", "installed": True, "missing": ["shared/data.txt"], "modified": [], "problem": problem}]
    partial = exc.value.partial
    assert (partial["removed"], partial["restored"], partial["clean"], partial["restore_pending"], partial["problems"]) == (
        [{"name": "droppkg", "version": "1.0+cu130"}], [], False, pending, [problem])
    assert w.read("shared/__init__.py") == COMMON
    record = _contamination.RestoreRecord(w.venv)
    assert record.load([]) == [("keeppkg", "1.0")]

    for _round in range(2):  # every later read says so
        again = w.contamination().run()
        assert (again["clean"], again["contaminants"], again["restore_pending"], again["problems"]) == (False, [], pending, [problem])
    _write(os.path.join(w.site, "shared", "data.txt"), KEEP_DATA)  # put back by hand
    check = w.contamination(check_mode=True).run()
    assert (check["clean"], check["restore_pending"], check["problems"]) == (True, [], [])
    assert os.listdir(state_dir) == [record.name]  # a check leaves the record to a real read
    assert w.contamination().run()["clean"] is True
    assert os.listdir(state_dir) == []


def test_a_failed_reinstall_with_find_links_names_its_own_command_and_the_last_400_characters(tmp_path):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    wheels = str(tmp_path / "wheels")
    os.mkdir(wheels)
    w.fake.reinstall_result = (1, "stdout is not read when there is stderr", "  " + "x" * 300 + "y" * 200 + "\n")
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(find_links=wheels, no_index=True).run(remove=True)
    argv = [w.python] + PIP_INSTALL + ["--find-links", wheels, "--no-index", "keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, "x" * 200 + "y" * 200)
    assert w.fake.calls[1] == argv


@pytest.mark.parametrize("out, text", [("  from stdout \n", "from stdout"), ("", "")])
def test_a_failed_reinstall_says_what_the_installer_printed_or_nothing(tmp_path, out, text):
    w = _world(tmp_path, common=False)
    w.fake.reinstall_result = (1, out, "")
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(no_index=True).run(remove=True)
    argv = [w.python] + PIP_INSTALL + ["--no-index"] + HINT + ["keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, text)


def test_the_hint_goes_before_every_pin_and_a_pending_package_is_pinned_too(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    _contamination.RestoreRecord(w.venv).store([("gone", "3.0")])
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    argv = [w.python] + PIP_INSTALL + HINT + ["keeppkg==1.0", "gone==3.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0, gone==3.0", argv, "ERROR: No matching distribution found for keeppkg==1.0")
    assert _contamination.RestoreRecord(w.venv).load([]) == [("keeppkg", "1.0"), ("gone", "3.0")]
    assert [p["name"] for p in exc.value.partial["restore_pending"]] == ["keeppkg", "gone"]


def test_the_hint_goes_before_every_pin_of_a_reinstall_of_more_pins_than_options(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    gone = [("gone%d" % i, "3.0") for i in range(10)]
    _contamination.RestoreRecord(w.venv).store(gone)
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    pins = ["keeppkg==1.0"] + ["%s==%s" % p for p in gone]
    argv = [w.python] + PIP_INSTALL + HINT + pins
    assert exc.value.msg == _reinstall_text(", ".join(pins), argv, "ERROR: No matching distribution found for keeppkg==1.0")


def test_a_reinstall_killed_by_a_signal_is_a_failed_reinstall(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    w.fake.reinstall_result = (-9, "", "")  # as a run's status says a signal ended it
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    argv = [w.python] + PIP_INSTALL + HINT + ["keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, "")
    assert _contamination.RestoreRecord(w.venv).load([]) == [("keeppkg", "1.0")]


def test_a_reinstall_that_leaves_the_files_wrong_is_an_error_and_remembered(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    w.fake.reinstall_result = (0, "", "")
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == "restored packages still differ from their RECORD: keeppkg (1 missing, 0 modified)"
    assert exc.value.partial["restored"] == [{"name": "keeppkg", "version": "1.0"}]
    assert [p["name"] for p in exc.value.partial["restore_pending"]] == ["keeppkg"]
    assert _contamination.RestoreRecord(w.venv).load([]) == [("keeppkg", "1.0")]


def test_a_package_not_asked_for_that_disappears_is_an_error(tmp_path):
    w = _world(tmp_path, common=False, clobber=False)
    w.add("extra", "2.0", {"extra/__init__.py": b"x\n"})
    w.fake.also_take = {"extra"}
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == "packages that were not asked for disappeared: extra"
    assert exc.value.partial["diff"]["after"] == AFTER


def test_a_package_to_reinstall_that_the_uninstall_took_away_is_reinstalled_not_lost(tmp_path):
    w = _world(tmp_path)
    w.fake.also_take = {"keeppkg"}
    result = w.contamination().run(remove=True)
    assert (result["restored"], result["clean"], result["diff"]["after"]) == ([{"name": "keeppkg", "version": "1.0"}], True, AFTER)
    assert (w.read("shared/__init__.py"), w.read("shared/data.txt")) == (COMMON, KEEP_DATA)


def test_a_pending_restore_is_reinstalled_by_a_removal_once_with_what_it_clobbered(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    _contamination.RestoreRecord(w.venv).store([("keeppkg", "1.0")])
    c = w.contamination()
    before = c.scan()[0]
    problem = _pending_text("keeppkg", "1.0", "has 1 file(s) missing or differing from its RECORD (shared/data.txt)")
    assert (before["problems"], before["clean"]) == ([problem], False)
    result = w.contamination().run(remove=True)
    assert (result["restored"], result["restore_pending"], result["problems"], result["clean"]) == (
        [{"name": "keeppkg", "version": "1.0"}], [], [], True)
    assert w.fake.calls[1] == [w.python] + PIP_INSTALL + ["keeppkg==1.0"]
    assert os.listdir(state_dir) == []


def test_a_pending_restore_alone_is_reinstalled_by_a_removal(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    w.fake.remove("droppkg")
    _contamination.RestoreRecord(w.venv).store([("keeppkg", "1.0")])
    result = w.contamination().run(remove=True)
    assert (result["changed"], result["removed"], result["restored"], result["clean"], result["problems"]) == (
        True, [], [{"name": "keeppkg", "version": "1.0"}], True, [])
    assert w.fake.calls == [[w.python] + PIP_INSTALL + ["keeppkg==1.0"]]
    assert (w.read("shared/data.txt"), os.listdir(state_dir)) == (KEEP_DATA, [])


def test_a_record_that_cannot_be_cleared_is_a_problem_of_the_read(tmp_path, monkeypatch):
    w = _world(tmp_path, common=False, clobber=False)
    w.fake.remove("droppkg")
    _contamination.RestoreRecord(w.venv).store([("keeppkg", "1.0")])
    monkeypatch.setattr(_contamination.RestoreRecord, "store", lambda self, pins: "could not clear it")
    result = w.contamination().run()
    assert (result["restore_pending"], result["problems"], result["clean"]) == ([], ["could not clear it"], True)


# ----------------------------------------------------------------- shared files not put back (unkept)


def _sharing(tmp_path, count):
    """droppkg shares shared/f0.py .. f<count-1>.py with keeppkg, and f0.py with alpha too."""
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    files = dict(("shared/f%d.py" % i, b"%d\n" % i) for i in range(count))
    w.add("alpha", "2.0", {"shared/f0.py": b"0\n"})
    w.add("keeppkg", "1.0", files)
    w.add("droppkg", "1.0+cu130", files)
    return w


@pytest.mark.parametrize("count, more", [(5, ""), (6, " and 1 more"), (7, " and 2 more"), (10, " and 5 more")])
def test_files_not_kept_aside_are_named_five_at_most_and_their_packages_remembered(tmp_path, monkeypatch, state_dir, count, more):
    w = _sharing(tmp_path, count)
    monkeypatch.setattr(_contamination.Stash, "take", lambda self, site, rel, digest=None, algo=None: "no copy of %s" % rel)
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    named = "; ".join("no copy of %s" % os.path.join(SITE_REL, "shared", "f%d.py" % i) for i in range(5))
    assert exc.value.msg == (
        "files that kept packages share with the removed ones were not put back: %s%s. Reinstall alpha==2.0, keeppkg==1.0 "
        "(cuda_contamination remove=true find_links=<a directory holding them>) once the venv's directories are plain directories "
        "again" % (named, more))
    assert _contamination.RestoreRecord(w.venv).load([]) == [("alpha", "2.0"), ("keeppkg", "1.0")]
    assert [(p["name"], p["missing"]) for p in exc.value.partial["restore_pending"]] == [
        ("alpha", ["shared/f0.py"]), ("keeppkg", ["shared/f%d.py" % i for i in range(count)])]
    assert w.fake.calls == [[w.python] + PIP_UNINSTALL + ["droppkg"]]
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))


def test_a_file_that_could_not_be_put_back_is_named(tmp_path, monkeypatch):
    w = _sharing(tmp_path, 1)
    monkeypatch.setattr(_contamination.Stash, "put_back", lambda self, item: "%s was not put back" % item["rel"])
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == (
        "files that kept packages share with the removed ones were not put back: %s was not put back. Reinstall alpha==2.0, "
        "keeppkg==1.0 (cuda_contamination remove=true find_links=<a directory holding them>) once the venv's directories are "
        "plain directories again" % os.path.join(SITE_REL, "shared", "f0.py"))


def test_a_shared_file_outside_the_venv_is_named_not_kept_aside(tmp_path, state_dir):
    w = _world(tmp_path, clobber=False)
    linked, image = _linked(w, tmp_path)
    _dist_info(image, "imagepkg", "1.0", {"imagepkg/__init__.py": b"i\n", "shared/x.py": b"x\n"})
    w.add("droppkg", "1.0+cu130", {"droppkg/__init__.py": b"drop\n", "shared/__init__.py": COMMON, "linked/shared/x.py": b"x\n"})
    c = w.contamination()
    _remove, _kept, preserve, _reinstall = _plan(c)
    outside = os.path.join(linked, "shared", "x.py")
    assert [entry[:2] for entry in preserve] == [[None, outside], [os.path.realpath(w.venv), os.path.join(SITE_REL, "shared", "__init__.py")]]
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == (
        "files that kept packages share with the removed ones were not put back: %s is not in the venv: not kept aside. Reinstall "
        "imagepkg==1.0 (cuda_contamination remove=true find_links=<a directory holding them>) once the venv's directories are plain "
        "directories again" % outside)
    assert w.read("shared/__init__.py") == COMMON
    assert [(p["name"], p["missing"]) for p in exc.value.partial["restore_pending"]] == [("imagepkg", ["shared/x.py"])]


def test_plan_lists_the_files_outside_the_venv_first_then_those_below_it_by_path(tmp_path):
    w = _world(tmp_path, clobber=False)
    linked, image = _linked(w, tmp_path)
    _dist_info(image, "imagepkg", "1.0", {"imagepkg/__init__.py": b"i\n", "shared/x.py": b"x\n"})
    w.add("dotkeep", "1.0", {"dotkeep/__init__.py": b"k\n", "../../../.hidden/x": b"h\n"})
    w.add("droppkg", "1.0+cu130", {"droppkg/__init__.py": b"drop\n", "shared/__init__.py": COMMON, "linked/shared/x.py": b"x\n",
                                   "../../../.hidden/x": b"h\n"})
    _remove, _kept, preserve, _reinstall = _plan(w.contamination())
    real = os.path.realpath(w.venv)
    assert [entry[:2] for entry in preserve] == [
        [None, os.path.join(linked, "shared", "x.py")], [real, ".hidden/x"], [real, os.path.join(SITE_REL, "shared", "__init__.py")]]


@root_only
def test_a_stash_that_cannot_be_made_stops_the_removal_before_anything_is_removed(tmp_path, state_dir):
    w = _world(tmp_path)
    os.makedirs(os.path.dirname(state_dir))
    os.chmod(os.path.dirname(state_dir), 0o777)
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    state = os.path.dirname(state_dir)
    assert exc.value.msg == (
        "could not make %s, where the files the removed packages share with kept ones are kept during the uninstall (state is "
        "writable by another user than root); nothing was removed: run as root, with %s root's and writable by root alone"
        % (os.path.join(state, "stash"), state))
    assert [c["name"] for c in exc.value.partial["contaminants"]] == ["droppkg"]
    assert w.fake.calls == [] and w.read("shared/data.txt") == DROP_DATA


# --------------------------------------------------------------- the stash's bound on all it keeps aside


def test_the_stash_counts_the_data_it_keeps_and_refuses_the_file_that_would_pass_its_bound(plain_site, monkeypatch):
    monkeypatch.setattr(_contamination, "STASH_TOTAL_MAX", MiB)
    for i in range(3):  # 48 MiB each, 13 bytes of data: holes are not kept, so they do not count
        _sparse(os.path.join(plain_site, "pkg", "sparse%d.bin" % i), {16 * MiB: b"the only data"}, 48 * MiB)
    for name in ("one.bin", "two.bin"):
        _write(os.path.join(plain_site, "pkg", name), os.urandom(600 * 1024))
    stash = _contamination.Stash()
    try:
        told = [stash.take(plain_site, "pkg/sparse%d.bin" % i) for i in range(3)] + [stash.take(plain_site, "pkg/one.bin")]
        used = stash.used
        with pytest.raises(_contamination.StashFull) as exc:
            stash.take(plain_site, "pkg/two.bin")
        kept = sorted(os.listdir(stash.where))
    finally:
        stash.close()
    block = os.statvfs(plain_site).f_bsize
    assert told == [None] * 4 and 600 * 1024 + 3 * 13 <= used <= 600 * 1024 + 3 * block, used
    assert exc.value.where == os.path.join(plain_site, "pkg", "two.bin")
    assert kept == ["0", "1", "2", "3"]  # nothing of two.bin was copied


def test_a_file_that_grew_past_the_bound_after_its_size_was_read_is_refused_as_it_is_copied(plain_site, monkeypatch):
    monkeypatch.setattr(_contamination, "STASH_TOTAL_MAX", 4096)
    path = _write(os.path.join(plain_site, "pkg", "grows.bin"), b"small\n")
    real = _contamination._copy_fd

    def copy(src, dst, *args):  # the venv's owner appends to it once root has read its size
        with open(path, "ab") as f:
            f.write(b"x" * 8192)
        return real(src, dst, *args)

    monkeypatch.setattr(_contamination, "_copy_fd", copy)
    stash = _contamination.Stash()
    try:
        with pytest.raises(_contamination.StashFull) as exc:
            stash.take(plain_site, "pkg/grows.bin")
        copied = os.stat(os.path.join(stash.where, "0")).st_size
    finally:
        stash.close()
    assert (exc.value.where, stash.items, copied <= 4096) == (path, [], True)


def _big_sharing(tmp_path, sizes):
    """keeppkg 1.0 and droppkg 1.0+cu130 (the contaminant) both install big/f<i>.bin, ``sizes``
    bytes each, the same bytes: kept aside for keeppkg during the removal."""
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"t\n"})
    files = dict(("big/f%d.bin" % i, os.urandom(n)) for i, n in enumerate(sizes))
    w.add("keeppkg", "1.0", files)
    w.add("droppkg", "1.0+cu130", files)
    return w, files


def _untouched(w, files, state_dir):
    assert w.fake.calls == []
    assert os.path.isdir(os.path.join(w.site, "droppkg-1.0+cu130.dist-info"))
    for rel, data in files.items():
        assert w.read(rel) == data, rel
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))


@pytest.mark.parametrize("check_mode", [False, True], ids=["run", "check-mode"])
def test_shared_files_past_the_stash_s_bound_stop_the_removal_before_anything_is_removed(
        tmp_path, state_dir, monkeypatch, check_mode):
    monkeypatch.setattr(_contamination, "STASH_TOTAL_MAX", 3 * 3000 - 1)
    w, files = _big_sharing(tmp_path, [3000, 3000, 3000])
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination(check_mode=check_mode).run(remove=True)
    big = os.path.join(os.path.realpath(w.venv), SITE_REL, "big")
    assert exc.value.msg == (
        "the files that keeppkg==1.0 share with the packages to remove hold more than 8999 bytes of data, the most a removal "
        "keeps aside while it runs (STASH_TOTAL_MAX; the largest: %s/f2.bin (3000 bytes), %s/f1.bin (3000 bytes), %s/f0.bin "
        "(3000 bytes)); nothing was removed. Shared files are small (the __init__.py a family of wheels holds): see what those "
        "packages' RECORD lists (pip_inventory verify_files=true) and reinstall them if that is not what they ship, or remove "
        "them too (also_remove) and install them again afterwards" % (big, big, big))
    partial = exc.value.partial
    assert (partial["changed"], partial["removed"], partial["preserved_files"]) == (False, [], 0)
    _untouched(w, files, state_dir)


def test_shared_files_of_exactly_the_stash_s_bound_are_kept_aside_and_put_back(tmp_path, state_dir, monkeypatch):
    monkeypatch.setattr(_contamination, "STASH_TOTAL_MAX", 3 * 3000)
    w, files = _big_sharing(tmp_path, [3000, 3000, 3000])
    result = w.contamination().run(remove=True)
    assert (result["removed"], result["preserved_files"]) == ([{"name": "droppkg", "version": "1.0+cu130"}], 3)
    for rel, data in files.items():
        assert w.read(rel) == data, rel


def test_a_stash_that_reaches_its_bound_while_it_copies_stops_the_removal_before_anything_is_removed(
        tmp_path, state_dir, monkeypatch):
    # The files grew between the plan's look and the copy (here: the plan sees nothing to keep).
    monkeypatch.setattr(_contamination, "STASH_TOTAL_MAX", 3 * 3000 - 1)
    monkeypatch.setattr(_contamination, "_stash_need", lambda preserve: [])
    w, files = _big_sharing(tmp_path, [3000, 3000, 3000])
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    at = os.path.join(os.path.realpath(w.venv), SITE_REL, "big", "f2.bin")
    assert exc.value.msg.startswith(
        "the files that keeppkg==1.0 share with the packages to remove hold more than 8999 bytes of data, the most a removal "
        "keeps aside while it runs (STASH_TOTAL_MAX; it went past it at %s); nothing was removed. " % at), exc.value.msg
    assert (exc.value.partial["changed"], exc.value.partial["removed"]) == (False, [])
    _untouched(w, files, state_dir)


# ------------------------------------------------------------------------- the stash, as any user


@pytest.fixture
def plain_site(tmp_path):
    """A site directory of ours holding pkg/data.bin (BODY)."""
    site = tmp_path / "site"
    _write(str(site / "pkg" / "data.bin"), BODY)
    return str(site)


def test_the_stash_takes_a_copy_and_remembers_the_way_to_it(plain_site):
    stash = _contamination.Stash()
    try:
        assert stash.take(plain_site, "pkg/data.bin", digest(BODY), "sha256") is None
        _top, chain = _contamination._tree.walk(plain_site)
        _top.close()
        pkg = os.stat(os.path.join(plain_site, "pkg"))
        assert stash.items == [{"site": plain_site, "chain": chain, "rel": "pkg/data.bin", "copy": "0", "mode": 0o644,
                                "uid": os.geteuid(), "gid": os.getegid(),
                                "dirs": [["pkg", pkg.st_dev, pkg.st_ino, stat.S_IMODE(pkg.st_mode), pkg.st_uid, pkg.st_gid]]}]
        with open(os.path.join(stash.where, "0"), "rb") as f:
            assert f.read() == BODY
        if os.geteuid() == 0:  # root's stash: a directory of the run's own beside STATE_DIR (else a mkdtemp())
            assert re.match(r"^%d-[0-9a-f]{16}$" % os.getpid(), stash.name)
            assert (stash.where, stash.made) == (os.path.join(_contamination.stash_dir(), stash.name), [
                _contamination.stash_dir(), os.path.dirname(_contamination.stash_dir())])
        os.remove(os.path.join(plain_site, "pkg", "data.bin"))
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    with open(os.path.join(plain_site, "pkg", "data.bin"), "rb") as f:
        assert f.read() == BODY
    assert not os.path.exists(stash.where)


def test_taking_and_putting_back_a_copy_leave_no_descriptor_open(plain_site):
    stash = _contamination.Stash()
    try:
        before = _fds()
        problems = [stash.take(plain_site, "pkg/data.bin"), stash.take(plain_site, "pkg/absent")]
        taking = _fds()
        os.remove(os.path.join(plain_site, "pkg", "data.bin"))
        problems.append(stash.put_back(stash.items[0]))
        putting = _fds()
    finally:
        stash.close()
    assert problems[0] is None and problems[1].startswith("%s/pkg/absent could not be copied" % plain_site) and problems[2] is None
    assert (taking, putting) == (before, before)


def test_every_file_of_a_directory_the_uninstall_removed_goes_back_into_the_one_made_again(plain_site, tmp_path):
    """The uninstall took pkg/ away with its files: the first file put back makes it again, and the
    others go into that same directory, never refused as if it had been exchanged meanwhile."""
    bodies = {"pkg/data.bin": BODY, "pkg/two.bin": b"two\n", "pkg/three.bin": b"three\n"}
    for rel, data in bodies.items():
        _write(os.path.join(plain_site, rel), data)
    stash = _contamination.Stash()
    try:
        for rel, data in bodies.items():
            assert stash.take(plain_site, rel, digest(data), "sha256") is None
        # The uninstall, as pip does it: the directory moved aside with its files (so that its inode
        # number is not the one the directory made again gets).
        os.rename(os.path.join(plain_site, "pkg"), str(tmp_path / "uninstalled"))
        problems = [stash.put_back(item) for item in stash.items]
    finally:
        stash.close()
    assert problems == [None, None, None]
    assert sorted(os.listdir(os.path.join(plain_site, "pkg"))) == ["data.bin", "three.bin", "two.bin"]
    for rel, data in bodies.items():
        with open(os.path.join(plain_site, rel), "rb") as f:
            assert f.read() == data, rel


def test_a_directory_made_again_then_exchanged_before_the_next_file_is_refused_for_that_file(plain_site, tmp_path):
    """The directory a put-back made again is accepted for the next files only while it is that
    directory: exchanged for another between two files, the next is refused and nothing goes there."""
    bodies = {"pkg/data.bin": BODY, "pkg/two.bin": b"two\n"}
    for rel, data in bodies.items():
        _write(os.path.join(plain_site, rel), data)
    other = tmp_path / "other"
    other.mkdir()
    pkg = os.path.join(plain_site, "pkg")
    stash = _contamination.Stash()
    try:
        for rel, data in bodies.items():
            assert stash.take(plain_site, rel, digest(data), "sha256") is None
        os.rename(pkg, str(tmp_path / "uninstalled"))
        first = stash.put_back(stash.items[0])
        os.rename(pkg, pkg + ".made")
        os.rename(str(other), pkg)
        second = stash.put_back(stash.items[1])
    finally:
        stash.close()
    assert first is None and os.listdir(pkg + ".made") == ["data.bin"]
    assert second == ("%s was not put back: it is reached through %s, which is another directory than before the uninstall (it "
                      "was exchanged meanwhile); nothing was written there" % (os.path.join(pkg, "two.bin"), pkg))
    assert os.listdir(pkg) == []


def test_a_file_directly_in_the_site_is_taken_and_put_back(plain_site):
    _write(os.path.join(plain_site, "top.py"), BODY)
    stash = _contamination.Stash()
    try:
        assert stash.take(plain_site, "top.py", digest(BODY), "sha256") is None
        os.remove(os.path.join(plain_site, "top.py"))
        assert stash.items[0]["dirs"] == []
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    with open(os.path.join(plain_site, "top.py"), "rb") as f:
        assert f.read() == BODY


@pytest.mark.parametrize("told", ["A" * 43, "z" * 43], ids=["sorting-below", "sorting-above"])
def test_a_copy_that_matches_no_digest_is_not_kept_whichever_way_the_two_sort(plain_site, told):
    stash = _contamination.Stash()
    try:
        problem = stash.take(plain_site, "pkg/data.bin", told, "sha256")
        items = stash.items
    finally:
        stash.close()
    where = os.path.join(plain_site, "pkg", "data.bin")
    assert (problem, items) == ("%s changed while it was copied (it no longer matches its RECORD): not preserved" % where, [])


@pytest.mark.parametrize("digest_of, algo, problem", [
    (None, None, False), ("sha384", "sha384", False), ("sha256", "no-such-hash", False), ("sha256", "sha384", True),
])
def test_the_copy_is_checked_against_the_digest_with_its_algorithm_or_sha256(plain_site, digest_of, algo, problem):
    stash = _contamination.Stash()
    try:
        told = stash.take(plain_site, "pkg/data.bin", _digest(BODY, digest_of) if digest_of else None, algo)
    finally:
        stash.close()
    where = os.path.join(plain_site, "pkg", "data.bin")
    assert told == ("%s changed while it was copied (it no longer matches its RECORD): not preserved" % where if problem else None)


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "pkg//data.bin", "./pkg/data.bin", "pkg/../pkg/data.bin", ""])
def test_a_path_not_below_the_site_is_not_taken(plain_site, rel):
    stash = _contamination.Stash()
    try:
        assert stash.take(plain_site, rel) == "%s is not below %s: not kept aside" % (os.path.join(plain_site, rel), plain_site)
        assert stash.items == []
    finally:
        stash.close()


def test_what_is_no_regular_file_of_the_site_or_over_the_cap_is_named_not_copied(plain_site, tmp_path, monkeypatch):
    os.symlink("data.bin", os.path.join(plain_site, "pkg", "link"))
    os.mkfifo(os.path.join(plain_site, "pkg", "fifo"))
    os.symlink(plain_site, str(tmp_path / "alias"))
    with pytest.raises(_contamination._tree.UnsafePath) as refused:
        _contamination._tree.walk(str(tmp_path / "alias"))
    reason = refused.value.reason
    monkeypatch.setattr(_contamination, "STASH_FILE_MAX", len(BODY) - 1)
    stash = _contamination.Stash()
    try:
        told = [stash.take(plain_site, "pkg/link"), stash.take(plain_site, "pkg/fifo"), stash.take(plain_site, "pkg/data.bin"),
                stash.take(str(tmp_path / "alias"), "pkg/data.bin"), stash.take("relative", "pkg/data.bin"),
                stash.take(plain_site, "pkg/absent")]
        assert stash.items == []
        monkeypatch.setattr(_contamination, "STASH_FILE_MAX", len(BODY))
        assert stash.take(plain_site, "pkg/data.bin") is None
        _write(os.path.join(stash.where, "1"), b"there before")
        told.append(stash.take(plain_site, "pkg/data.bin"))
    finally:
        stash.close()
    at = os.path.join(plain_site, "pkg")
    assert told == [
        "%s/link could not be copied before the uninstall (%s): not preserved" % (at, os.strerror(errno.ELOOP)),
        "%s/fifo is not a regular file: not preserved" % at,
        "%s/data.bin is larger than %d bytes: not kept aside" % (at, len(BODY) - 1),
        "%s/pkg/data.bin could not be copied before the uninstall (%s): not preserved" % (tmp_path / "alias", reason),
        "relative/pkg/data.bin could not be copied before the uninstall ('relative' is not an absolute path): not preserved",
        "%s/absent could not be copied before the uninstall (%s): not preserved" % (at, os.strerror(errno.ENOENT)),
        "%s/data.bin could not be copied before the uninstall (%s): not preserved" % (at, os.strerror(errno.EEXIST)),
    ]


@root_only
def test_a_stash_directory_left_open_to_others_is_refused_and_left_as_it_was(state_dir):
    stash_dir = _contamination.stash_dir()
    os.makedirs(stash_dir)
    os.chmod(stash_dir, 0o055)  # no one may write to it, yet it is not root's alone
    with pytest.raises(OSError) as exc:
        _contamination.Stash()
    assert (exc.value.errno, exc.value.strerror) == (
        errno.EPERM, "%s is not root's alone: make it so with chmod 700 %s" % (stash_dir, stash_dir))
    assert (stat.S_IMODE(os.stat(stash_dir).st_mode), os.listdir(stash_dir)) == (0o055, [])


@root_only
@pytest.mark.parametrize("mode", [0o701, 0o704, 0o710, 0o740], ids=oct)
def test_a_stash_directory_anyone_else_may_read_or_enter_is_refused(state_dir, mode):
    stash_dir = _contamination.stash_dir()
    os.makedirs(stash_dir)
    os.chmod(stash_dir, mode)  # one bit of group or others, none of them a write bit
    with pytest.raises(OSError) as exc:
        _contamination.Stash()
    assert (exc.value.errno, exc.value.strerror) == (
        errno.EPERM, "%s is not root's alone: make it so with chmod 700 %s" % (stash_dir, stash_dir))
    assert (stat.S_IMODE(os.stat(stash_dir).st_mode), os.listdir(stash_dir)) == (mode, [])


def test_a_run_that_is_not_root_keeps_its_copies_in_a_private_temporary_directory_and_makes_nothing_of_root_s(state_dir, monkeypatch):
    monkeypatch.setattr(_contamination.os, "geteuid", lambda: 1000)
    stash = _contamination.Stash()
    try:
        where = stash.where
        assert (os.path.dirname(where), os.path.basename(where).startswith("gpufleet-preserve-")) == (tempfile.gettempdir(), True)
        assert (stat.S_IMODE(os.stat(where).st_mode), stash.made) == (0o700, [])
        assert not os.path.lexists(os.path.dirname(state_dir))
    finally:
        stash.close()
    assert not os.path.lexists(where)


@root_only
def test_a_stash_directory_the_run_makes_is_root_s_alone_from_the_start(state_dir):
    stash = _contamination.Stash()
    try:
        modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (os.path.dirname(stash.where), stash.where)]
    finally:
        stash.close()
    assert modes == [0o700, 0o700]


@pytest.mark.parametrize("path", ["/", "//", "/./", "/var/../x", ""])
def test_a_state_directory_that_is_not_below_the_root_is_refused_before_anything_is_made(path, monkeypatch):
    monkeypatch.setattr(_contamination, "STATE_DIR", path or "/")
    root = os.stat("/")
    before = (_fds(), (root.st_mode, root.st_uid, root.st_gid), sorted(os.listdir("/")))
    for create in (False, True):
        with pytest.raises(OSError) as exc:
            _contamination._state_dir_fd(create=create, path=path or None)
        assert exc.value.errno == errno.EINVAL and "is no directory below /" in exc.value.strerror
    root = os.stat("/")
    assert (_fds(), (root.st_mode, root.st_uid, root.st_gid), sorted(os.listdir("/"))) == before


@pytest.mark.parametrize("path", ["/var/../x", "/./."])
def test_a_state_path_not_below_the_root_is_named_in_its_refusal(path):
    with pytest.raises(OSError) as exc:
        _contamination._state_dir_fd(create=False, path=path)
    assert (exc.value.errno, exc.value.strerror) == (errno.EINVAL, "%r is no directory below / (a path without '..')" % path)


def _taken(site):
    stash = _contamination.Stash()
    assert stash.take(site, "pkg/data.bin", digest(BODY), "sha256") is None
    os.remove(os.path.join(site, "pkg", "data.bin"))  # the uninstall
    return stash


@pytest.mark.parametrize("copy", ["gone", "a link"])
def test_a_copy_that_is_gone_or_a_link_is_not_put_back(plain_site, tmp_path, copy):
    _write(str(tmp_path / "other"), b"not the copy\n")
    stash = _taken(plain_site)
    try:
        os.remove(os.path.join(stash.where, "0"))
        if copy == "a link":
            os.symlink(str(tmp_path / "other"), os.path.join(stash.where, "0"))
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    where = os.path.join(plain_site, "pkg", "data.bin")
    assert problem == "%s was not put back: %s" % (where, os.strerror(errno.ENOENT if copy == "gone" else errno.ELOOP))
    assert not os.path.lexists(where)


def test_a_directory_of_the_site_swapped_for_a_link_is_named_in_a_problem_about_the_file(plain_site, tmp_path):
    stash = _taken(plain_site)
    pkg = os.path.join(plain_site, "pkg")
    os.rename(pkg, pkg + ".real")
    os.symlink(str(tmp_path), pkg)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    assert problem == "%s was not put back: it is reached through the symbolic link %s (to %s); nothing was written there" % (
        os.path.join(pkg, "data.bin"), pkg, tmp_path)
    assert not os.path.lexists(tmp_path / "data.bin")


def test_a_temporary_file_exchanged_for_a_link_before_it_is_put_in_place_is_never_followed(plain_site, tmp_path, monkeypatch):
    stash = _taken(plain_site)
    victim = _write(str(tmp_path / "victim"), b"not the venv's\n")
    real = os.link

    def link(src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):  # the venv's owner is quicker
        os.unlink(src, dir_fd=src_dir_fd)
        os.symlink(victim, src, dir_fd=src_dir_fd)
        real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks)

    monkeypatch.setattr(_contamination.os, "link", link)
    try:
        stash.put_back(stash.items[0])
    finally:
        stash.close()
    where = os.path.join(plain_site, "pkg", "data.bin")
    assert (os.path.islink(where), os.stat(victim).st_nlink) == (True, 1)


def _exchange(a, b):
    """renameat2(RENAME_EXCHANGE): ``a`` and ``b`` trade places in one step, as the venv's owner can."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)


@pytest.mark.parametrize("rel", ["pkg/data.bin", "data.bin"], ids=["below-a-directory", "in-the-site"])
@pytest.mark.parametrize("exchanged", ["the site", "the directory above it"])
def test_a_site_exchanged_for_another_real_directory_after_the_stash_is_refused_and_nothing_is_written(tmp_path, exchanged, rel):
    """Between the stash and the put-back, the site directory (or the one above it) trades places
    with another real directory laid out alike (renameat2 RENAME_EXCHANGE): the put-back walks the
    chain taken from / again, finds the exchanged directory, names it, and writes nothing in either
    (a file directly in the site has no directory of its own whose identity would tell)."""
    site = str(tmp_path / "a" / "venv" / "site")
    other = str(tmp_path / "b" / "venv" / "site")
    _write(os.path.join(site, rel), BODY)
    os.makedirs(os.path.dirname(os.path.join(other, rel)), exist_ok=True)
    stash = _contamination.Stash()
    try:
        assert stash.take(site, rel, digest(BODY), "sha256") is None
        os.remove(os.path.join(site, rel))  # the uninstall
        swapped = site if exchanged == "the site" else os.path.dirname(site)
        _exchange(swapped, swapped.replace(str(tmp_path / "a"), str(tmp_path / "b")))
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    said = ("is another directory than when it was first read" if exchanged == "the site" else
            "is reached through %s, which is another directory than when it was first read" % swapped)
    assert problem == "%s was not put back: %s %s (it was exchanged meanwhile); nothing was written there" % (
        os.path.join(site, rel), site, said), problem
    # Neither the directory now at the site's path (the other one) nor the site (now at the other's) got the file.
    for top in (site, other):
        assert os.listdir(os.path.dirname(os.path.join(top, rel))) == [], top


def test_a_directory_exchanged_for_one_of_a_lower_inode_is_refused_too(plain_site):
    made = [os.path.join(plain_site, n) for n in ("one", "two")]
    for path in made:
        os.mkdir(path)
    lower, higher = sorted(made, key=lambda p: (os.stat(p).st_dev, os.stat(p).st_ino))
    pkg = os.path.join(plain_site, "pkg")
    os.rename(os.path.join(pkg, "data.bin"), os.path.join(higher, "data.bin"))
    os.rmdir(pkg)
    os.rename(higher, pkg)  # pkg is the one of the higher inode, and the other is swapped in for it
    stash = _taken(plain_site)
    os.rename(pkg, pkg + ".real")
    os.rename(lower, pkg)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    assert problem == ("%s was not put back: it is reached through %s, which is another directory than before the uninstall (it was "
                       "exchanged meanwhile); nothing was written there" % (os.path.join(pkg, "data.bin"), pkg))
    assert os.listdir(pkg) == []


def test_a_link_planted_at_the_restore_s_temporary_name_is_never_written_through(plain_site, tmp_path):
    stash = _taken(plain_site)
    planted = os.path.join(plain_site, "pkg", ".gpufleet-restore-%d-0" % os.getpid())
    os.symlink(str(tmp_path / "victim"), planted)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    where = os.path.join(plain_site, "pkg", "data.bin")
    assert problem == "%s was not put back: %s" % (where, os.strerror(errno.EEXIST))
    assert (os.path.lexists(tmp_path / "victim"), os.path.lexists(where), os.path.islink(planted)) == (False, False, True)


@root_only
def test_a_directory_root_makes_again_while_of_another_group_gets_its_own_group_back(plain_site):
    pkg = os.path.join(plain_site, "pkg")
    os.chown(pkg, 0, 50)  # root's, of group 50: below the group root runs with here
    os.chmod(pkg, 0o750)
    stash = _taken(plain_site)
    shutil.rmtree(pkg)
    os.setegid(1000)  # as under sudo -g or a setgid wrapper
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        os.setegid(0)
        stash.close()
    st = os.stat(pkg)
    assert (problem, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (None, 0, 50, 0o750)
    with open(os.path.join(pkg, "data.bin"), "rb") as f:
        assert f.read() == BODY


def test_a_directory_being_made_again_is_the_runner_s_alone_until_it_has_its_own_mode(plain_site, monkeypatch):
    stash = _taken(plain_site)
    pkg = os.path.join(plain_site, "pkg")
    mode = stat.S_IMODE(os.stat(pkg).st_mode)
    shutil.rmtree(pkg)
    real, seen = os.fchmod, []

    def fchmod(fd, new):
        st = os.fstat(fd)
        seen.append((stat.S_ISDIR(st.st_mode), stat.S_IMODE(st.st_mode) & 0o077, new))
        real(fd, new)

    monkeypatch.setattr(_contamination.os, "fchmod", fchmod)
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    assert seen == [(True, 0, mode), (False, 0, 0o644)]
    assert stat.S_IMODE(os.stat(pkg).st_mode) == mode


@root_only
def test_a_directory_swapped_in_between_its_making_and_its_opening_is_refused_and_left_as_its_owner_made_it(plain_site, monkeypatch):
    """The venv's owner exchanges the directory the run made again for one of theirs (here: the
    same one, given away, so that even its inode is the one the stash made): not chowned, not
    chmod-ed, nothing written in it, and the problem names it."""
    pkg = os.path.join(plain_site, "pkg")
    os.chown(pkg, 0, 50)
    stash = _taken(plain_site)
    shutil.rmtree(pkg)
    real = os.mkdir

    def mkdir(name, mode=0o777, *, dir_fd=None):  # the venv's owner puts a directory of theirs there at once
        real(name, mode, dir_fd=dir_fd)
        os.chown(name, NOBODY, NOBODY, dir_fd=dir_fd)
        os.chmod(name, 0o777, dir_fd=dir_fd)

    monkeypatch.setattr(_contamination.os, "mkdir", mkdir)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    st = os.stat(pkg)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), os.listdir(pkg)) == (NOBODY, NOBODY, 0o777, [])
    assert problem == ("%s was not put back: it is reached through %s, which this run made again and found exchanged for "
                       "a directory of uid %d when it opened it; nothing was written there" % (
                           os.path.join(pkg, "data.bin"), pkg, NOBODY)), problem


@root_only
def test_a_run_of_another_user_than_root_gives_a_directory_it_makes_again_the_group_it_had(plain_site, monkeypatch):
    pkg = os.path.join(plain_site, "pkg")
    os.chown(pkg, 1000, 50)
    stash = _taken(plain_site)
    shutil.rmtree(pkg)
    real = os.mkdir

    def mkdir(name, mode=0o777, *, dir_fd=None):  # as a run of uid 1000, group 1000, makes it
        real(name, mode, dir_fd=dir_fd)
        os.chown(name, 1000, 1000, dir_fd=dir_fd)

    monkeypatch.setattr(_contamination.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(_contamination.os, "getegid", lambda: 1000)
    monkeypatch.setattr(_contamination.os, "mkdir", mkdir)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    st = os.stat(pkg)
    assert (problem, st.st_uid, st.st_gid) == (None, 1000, 50)


@root_only
def test_a_run_of_another_user_than_root_never_gives_away_a_directory_that_is_not_its_own(plain_site, monkeypatch):
    pkg = os.path.join(plain_site, "pkg")
    os.chown(pkg, NOBODY, NOBODY)
    stash = _taken(plain_site)
    shutil.rmtree(pkg)
    monkeypatch.setattr(_contamination.os, "geteuid", lambda: 1000)  # the directory made again (by root here) is not the run's
    monkeypatch.setattr(_contamination.os, "getegid", lambda: 1000)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    st = os.stat(pkg)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode), os.listdir(pkg)) == (0, 0, 0o700, [])
    assert problem.endswith("which this run made again and found exchanged for a directory of uid 0 when it opened it; "
                            "nothing was written there"), problem


def test_a_file_being_put_back_is_the_runner_s_alone_until_it_has_its_own_mode(plain_site, monkeypatch):
    stash = _taken(plain_site)
    real, seen = os.fchmod, []

    def fchmod(fd, mode):
        st = os.fstat(fd)
        seen.append((stat.S_ISREG(st.st_mode), stat.S_IMODE(st.st_mode) & 0o077, mode))
        real(fd, mode)

    monkeypatch.setattr(_contamination.os, "fchmod", fchmod)
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    assert seen == [(True, 0, 0o644)]
    assert stat.S_IMODE(os.stat(os.path.join(plain_site, "pkg", "data.bin")).st_mode) == 0o644


def test_a_run_that_is_not_root_puts_a_file_back_as_its_own_and_gives_it_to_no_one(plain_site, monkeypatch):
    stash = _taken(plain_site)
    stash.items[0].update(uid=NOBODY, gid=NOBODY)  # taken from a file of nobody's
    given = []

    def fchown(fd, uid, gid):  # as the kernel answers a user who is not root
        given.append((uid, gid))
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(_contamination.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(_contamination.os, "getegid", lambda: 1000)
    monkeypatch.setattr(_contamination.os, "fchown", fchown)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    path = os.path.join(plain_site, "pkg", "data.bin")
    with open(path, "rb") as f:
        assert (problem, given, f.read(), stat.S_IMODE(os.stat(path).st_mode)) == (None, [], BODY, 0o644)


@root_only
def test_closing_a_stash_whose_directory_was_moved_away_removes_its_copies_and_stops_there(plain_site, state_dir):
    stash = _taken(plain_site)
    moved = _contamination.stash_dir() + ".moved"
    os.rename(_contamination.stash_dir(), moved)
    stash.close()
    assert (os.listdir(moved), os.listdir(os.path.join(moved, stash.name))) == ([stash.name], [])


@root_only
def test_closing_a_stash_leaves_another_run_s_stash_and_the_directories_above(plain_site, state_dir):
    stash = _contamination.Stash()
    other = os.path.join(_contamination.stash_dir(), "another-run")
    os.mkdir(other)
    stash.close()
    assert (os.path.exists(stash.where), os.listdir(_contamination.stash_dir())) == (False, ["another-run"])


def test_the_packages_problems_are_the_scan_s(tmp_path):
    w = _world(tmp_path, common=False, clobber=False)
    info = os.path.join(w.site, "noversion-1.0.dist-info")
    _write(os.path.join(info, "METADATA"), b"Metadata-Version: 2.1\nName: noversion\n\n")
    _write(os.path.join(info, "RECORD"), b"noversion-1.0.dist-info/METADATA,,\n")
    result = w.contamination().run()
    assert result["problems"] == ["noversion-1.0.dist-info lacks Name or Version; taken from the directory name"]
    assert result["scanned"] == 4


# ------------------------------------------------------------ a removal stopped before the installer ran


def _refused(w, why, state_dir):
    """Stop w's removal before its installer runs, for the reason ``why``; the GpufleetError."""
    holder = None
    kw = {}
    if why == "the lock":
        holder = os.open(w.venv, os.O_RDONLY)
        fcntl.flock(holder, fcntl.LOCK_EX)
        kw["lock_timeout"] = 0.1
    elif why == "uv's refusal":
        w.uv()
        _blocked(w, ["--python=x-1.dist-info"])
        kw["installer"] = "uv"
    else:  # the stash cannot be made
        os.makedirs(os.path.dirname(state_dir))
        os.chmod(os.path.dirname(state_dir), 0o777)
    try:
        with pytest.raises(_contamination.GpufleetError) as exc:
            w.contamination(**kw).run(remove=True)
    finally:
        if holder is not None:
            os.close(holder)
    return exc.value


@pytest.mark.parametrize("why", ["the lock", "uv's refusal", pytest.param("the stash", marks=root_only)])
def test_a_removal_stopped_before_the_installer_ran_reports_nothing_removed_and_no_change(tmp_path, state_dir, why):
    w = _world(tmp_path)
    err = _refused(w, why, state_dir)
    partial = err.partial
    assert (partial["changed"], partial["removed"], partial["restored"], partial["preserved_files"]) == (False, [], [], 0)
    assert "installer" not in partial
    assert partial["diff"]["after"] == partial["diff"]["before"] and partial["diff"]["before"].endswith(BEFORE)
    assert [c["name"] for c in partial["contaminants"]] == ["droppkg"]  # the scan's findings stay
    assert w.fake.calls == [] and w.read("shared/data.txt") == DROP_DATA


def test_a_removal_that_failed_after_the_installer_ran_keeps_what_it_did(tmp_path):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]  # the reinstall fails: the uninstall has happened
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    partial = exc.value.partial
    assert (partial["changed"], partial["removed"], partial["installer"]) == (True, [{"name": "droppkg", "version": "1.0+cu130"}], "pip")
    assert partial["diff"]["after"] != partial["diff"]["before"]


def test_a_failed_restore_whose_record_cannot_be_written_is_still_pending_and_not_clean(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    os.makedirs(state_dir)
    os.chmod(os.path.dirname(state_dir), 0o777)
    where = _contamination.RestoreRecord(w.venv).where
    unread = "the record of failed restores %s cannot be read: state is writable by another user than root" % where
    unwritten = ("could not write the record of failed restores %s (state is writable by another user than root): run as root so "
                 "that the next reads know the files are missing" % where)
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    partial = exc.value.partial
    pending = _pending_text("keeppkg", "1.0", "has 1 file(s) missing or differing from its RECORD (shared/data.txt)")
    assert [(p["name"], p["version"], p["installed"], p["missing"], p["problem"]) for p in partial["restore_pending"]] == [
        ("keeppkg", "1.0", True, [os.path.join("shared", "data.txt")], pending)]
    assert partial["clean"] is False
    assert partial["problems"] == [unread, pending, unwritten]
    assert os.listdir(state_dir) == []


def test_what_a_failed_restore_left_pending_is_listed_just_before_the_record_s_own_problem(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    info = os.path.join(w.site, "noversion-1.0.dist-info")
    _write(os.path.join(info, "METADATA"), b"Metadata-Version: 2.1\nName: noversion\n\n")
    _write(os.path.join(info, "RECORD"), b"noversion-1.0.dist-info/METADATA,,\n")
    os.makedirs(state_dir)
    os.chmod(os.path.dirname(state_dir), 0o777)
    where = _contamination.RestoreRecord(w.venv).where
    with pytest.raises(_contamination.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.partial["problems"] == [
        "noversion-1.0.dist-info lacks Name or Version; taken from the directory name",
        "the record of failed restores %s cannot be read: state is writable by another user than root" % where,
        _pending_text("keeppkg", "1.0", "has 1 file(s) missing or differing from its RECORD (shared/data.txt)"),
        "could not write the record of failed restores %s (state is writable by another user than root): run as root so that the "
        "next reads know the files are missing" % where]


def test_a_lock_that_fails_otherwise_gives_its_descriptor_back(tmp_path, monkeypatch):
    def flock(fd, how):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(_contamination.fcntl, "flock", flock)
    before = _fds()
    with pytest.raises(OSError):
        _contamination.VenvLock(str(tmp_path), 5).__enter__()
    assert _fds() == before


# ------------------------------------------- what is put back gets its recorded owner, not its parent's group


@root_only
@pytest.mark.parametrize("removed", ["the file", "its directory"])
def test_what_is_put_back_below_a_setgid_directory_gets_its_recorded_group_not_the_directory_s(plain_site, state_dir, removed):
    # Below a setgid directory a new entry takes that directory's group: a file (or a directory
    # made again) recorded as root:root must be given root's group back, though root made it.
    pkg = os.path.join(plain_site, "pkg")
    os.chown(plain_site, 0, 50)
    os.chmod(plain_site, 0o2755)
    if removed == "the file":  # the file's own directory is a setgid one
        os.chown(pkg, 0, 50)
        os.chmod(pkg, 0o2755)
    stash = _taken(plain_site)
    if removed == "its directory":
        shutil.rmtree(pkg)
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    st = os.stat(os.path.join(pkg, "data.bin"))
    assert (st.st_uid, st.st_gid) == (0, 0)
    if removed == "its directory":
        st = os.stat(pkg)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o755)


@root_only
def test_a_root_s_setuid_file_put_back_as_root_s_keeps_its_mode(plain_site, state_dir):
    # A chown, even to the owner a file already has, clears its set-user-ID bit: none is made
    # when the file put back already has its recorded owner.
    data = os.path.join(plain_site, "pkg", "data.bin")
    os.chmod(data, 0o4755)
    stash = _taken(plain_site)
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    st = os.stat(data)
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o4755)
