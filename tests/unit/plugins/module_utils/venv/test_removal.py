# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""venv/_removal, on plain-file venvs (tests/lib/plainvenv.py; FakeInstaller acts on the files as pip or
uv would): the venv's lock (VenvLock), the entries uv refuses (blocking_entries), the diff's lines, the plan
(what is removed, kept, kept aside and reinstalled), _anchored, the installer chosen, failures of a removal,
shared files not put back, the stash's bound as the removal meets it, a removal stopped before the
installer ran."""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import shutil
import threading
import time
import types

import pytest
from plainvenv import (
    AFTER,
    BEFORE,
    COMMON,
    DROP_DATA,
    HINT,
    KEEP_DATA,
    NAME_RULE,
    NOBODY,
    PIP_INSTALL,
    PIP_UNINSTALL,
    SITE_REL,
    MiB,
    World,
    _digest,
    _dist_info,
    _fds,
    _linked,
    _pending_text,
    _reinstall_text,
    _sparse,
    _world,
    _write,
    root_only,
)

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _removal, _restore, _stash

pytestmark = pytest.mark.usefixtures("state_dir", "_no_collection_within_a_test")


# ------------------------------------------------------------------------------ Removal's options


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
    with pytest.raises(_removal.DistError) as exc:
        w.contamination(**kw)
    assert exc.value.msg == message
    assert w.fake.calls == []  # nothing was run


def test_options_are_kept_canonical_and_find_links_may_be_a_directory(tmp_path):
    w = World(str(tmp_path))
    (tmp_path / "wheels").mkdir()
    _write(str(tmp_path / "file"))
    with pytest.raises(_removal.DistError):
        w.contamination(find_links=str(tmp_path / "file"))
    c = w.contamination(protect=["Torch", "NVIDIA_NCCL.cu13"], also_remove=["Sg_Lang", "flash.attn"], find_links=str(tmp_path / "wheels"))
    assert (c.protect, c.also_remove, c.find_links) == ({"torch", "nvidia-nccl-cu13"}, ["sg-lang", "flash-attn"], str(tmp_path / "wheels"))
    assert (c.python, c.sites, c.own_sites) == (w.python, [w.site], {os.path.realpath(w.site)})
    assert w.contamination(find_links="").find_links == ""


def test_the_defaults_protect_torch_and_let_the_installer_be_chosen(tmp_path):
    w = World(str(tmp_path))
    c = _removal.Removal(w.venv, w.fake)
    assert (c.venv, c.run_cmd, c.expected_cuda, c.protect, c.also_remove, c.find_links, c.no_index, c.installer_pref) == (
        w.venv, w.fake, None, {"torch"}, [], None, False, "auto")
    assert (c.scan_binaries, c.evidence_cache, c.lock_timeout, c.check_mode, c.path_env, c._identity) == (True, True, 60, False, None, None)
    assert (c.restore_record.venv, c.restore_record.where) == (os.path.realpath(w.venv), _restore.RestoreRecord(w.venv).where)


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


# ------------------------------------------------------------------------------------ VenvLock


def test_the_lock_is_an_exclusive_flock_on_the_venv_given_back_on_exit(tmp_path):
    other = os.open(str(tmp_path), os.O_RDONLY)
    try:
        before = _fds()
        with _removal.VenvLock(str(tmp_path), 5) as lock:
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
        with pytest.raises(_removal.DistError) as exc:
            _removal.VenvLock(str(tmp_path), 0.2).__enter__()
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
        with _removal.VenvLock(str(tmp_path), 5):
            waited = time.monotonic() - start
    finally:
        timer.join()
    assert 0.15 <= waited < 1, waited


def test_a_deadline_reached_exactly_is_over_and_a_timeout_of_0_tries_once_without_waiting(tmp_path, monkeypatch):
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        raise RuntimeError("waited")

    monkeypatch.setattr(_removal, "time", types.SimpleNamespace(monotonic=lambda: 100.0, sleep=sleep))
    before = _fds()
    holder = os.open(str(tmp_path), os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(_removal.DistError) as exc:
            _removal.VenvLock(str(tmp_path), 0).__enter__()
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

    monkeypatch.setattr(_removal.fcntl, "flock", flock)
    with _removal.VenvLock(str(tmp_path), 5):
        pass
    assert calls == [fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_UN]


def test_another_lock_error_is_raised_at_once(tmp_path, monkeypatch):
    def flock(fd, how):
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(_removal.fcntl, "flock", flock)
    start = time.monotonic()
    with pytest.raises(OSError) as exc:
        _removal.VenvLock(str(tmp_path), 5).__enter__()
    assert exc.value.errno == errno.ENOLCK and time.monotonic() - start < 0.1


def test_the_lock_is_taken_on_a_directory_only_and_a_file_at_the_venv_s_path_is_refused(tmp_path):
    path = _write(str(tmp_path / "venv"), b"not a directory\n")
    before = _fds()
    with pytest.raises(NotADirectoryError):
        _removal.VenvLock(path, 5).__enter__()
    assert _fds() == before


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
    assert _removal.blocking_entries([str(one), str(tmp_path / "absent"), str(two)]) == [
        str(one / "--python=x-1.dist-info"), str(one / "foo-bad version.dist-info"), str(one / "qux-.1-py3.egg-info"),
        str(two / "-x-1.dist-info"), str(two / "d-1.0 .dist-info")]
    assert _removal.blocking_entries([]) == []


def test_an_entry_without_a_version_whose_name_is_no_package_name_blocks_uv(tmp_path):
    for name in ("foo_.dist-info", "bar..egg-info", "ok.dist-info"):
        (tmp_path / name).mkdir()
    assert _removal.blocking_entries([str(tmp_path)]) == [str(tmp_path / "bar..egg-info"), str(tmp_path / "foo_.dist-info")]


def test_the_diff_lines_are_name_equals_version_sorted_by_canonical_name():
    dists = [types.SimpleNamespace(name=n, version=v, key=_removal.canonical_name(n))
             for n, v in (("Zeta", "1"), ("alpha", "2.0+cu128"), ("Beta_Pkg", "3"))]
    assert _removal._pkg_lines(dists) == "alpha==2.0+cu128\nBeta_Pkg==3\nZeta==1\n"
    assert _removal._pkg_lines([]) == ""


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
    unsafe = _removal._UNSAFE
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
    assert kept == [{"name": "oddver", "reason": _removal._UNSAFE % ("oddver", "2.0;x", oddver)},
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
                    {"name": "oddkeep", "reason": _removal._UNSAFE % ("oddkeep", "1.0;x", oddkeep)}]
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
    assert kept == [{"name": "alpha-cu13", "reason": "protected"}, {"name": "weird", "reason": _removal._UNSAFE % ("weird", "1.0;x", os.path.join(
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
    with pytest.raises(_removal.GpufleetError) as exc:
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
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination(installer=uv).run(remove=True)
    assert exc.value.msg == (
        "uv refuses this venv because of '--python=x-1.dist-info', whose name is no package name-version; nothing was removed. "
        "Remove it by hand (%s) and run again" % rm)
    assert w.fake.calls == []


def test_uv_refusing_two_entries_names_them(tmp_path):
    w = _world(tmp_path)
    w.uv()
    rm = _blocked(w, ["-x-1.dist-info", "foo-bad version.dist-info"])
    with pytest.raises(_removal.GpufleetError) as exc:
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
    with pytest.raises(_removal.GpufleetError) as exc:
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
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == (
        "the uninstall failed part-way %s. Fix what pip names and run again: the next run removes what is left and restores "
        "the files the removed packages had overwritten" % words)


def test_a_failed_reinstall_names_the_command_and_is_remembered_until_the_files_are_back(tmp_path, state_dir):
    w = _world(tmp_path)
    del w.fake.wheels["keeppkg"]
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    argv = [w.python] + PIP_INSTALL + HINT + ["keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, "ERROR: No matching distribution found for keeppkg==1.0")
    problem = _pending_text("keeppkg", "1.0", "has 1 file(s) missing or differing from its RECORD (shared/data.txt)")
    pending = [{"name": "keeppkg", "version": "1.0", "installed": True, "missing": ["shared/data.txt"], "modified": [], "problem": problem}]
    partial = exc.value.partial
    assert (partial["removed"], partial["restored"], partial["clean"], partial["restore_pending"], partial["problems"]) == (
        [{"name": "droppkg", "version": "1.0+cu130"}], [], False, pending, [problem])
    assert w.read("shared/__init__.py") == COMMON
    record = _restore.RestoreRecord(w.venv)
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
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination(find_links=wheels, no_index=True).run(remove=True)
    argv = [w.python] + PIP_INSTALL + ["--find-links", wheels, "--no-index", "keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, "x" * 200 + "y" * 200)
    assert w.fake.calls[1] == argv


@pytest.mark.parametrize("out, text", [("  from stdout \n", "from stdout"), ("", "")])
def test_a_failed_reinstall_says_what_the_installer_printed_or_nothing(tmp_path, out, text):
    w = _world(tmp_path, common=False)
    w.fake.reinstall_result = (1, out, "")
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination(no_index=True).run(remove=True)
    argv = [w.python] + PIP_INSTALL + ["--no-index"] + HINT + ["keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, text)


def test_the_hint_goes_before_every_pin_and_a_pending_package_is_pinned_too(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    _restore.RestoreRecord(w.venv).store([("gone", "3.0")])
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    argv = [w.python] + PIP_INSTALL + HINT + ["keeppkg==1.0", "gone==3.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0, gone==3.0", argv, "ERROR: No matching distribution found for keeppkg==1.0")
    assert _restore.RestoreRecord(w.venv).load([]) == [("keeppkg", "1.0"), ("gone", "3.0")]
    assert [p["name"] for p in exc.value.partial["restore_pending"]] == ["keeppkg", "gone"]


def test_the_hint_goes_before_every_pin_of_a_reinstall_of_more_pins_than_options(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    gone = [("gone%d" % i, "3.0") for i in range(10)]
    _restore.RestoreRecord(w.venv).store(gone)
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    pins = ["keeppkg==1.0"] + ["%s==%s" % p for p in gone]
    argv = [w.python] + PIP_INSTALL + HINT + pins
    assert exc.value.msg == _reinstall_text(", ".join(pins), argv, "ERROR: No matching distribution found for keeppkg==1.0")


def test_a_reinstall_killed_by_a_signal_is_a_failed_reinstall(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    w.fake.reinstall_result = (-9, "", "")  # as a run's status says a signal ended it
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    argv = [w.python] + PIP_INSTALL + HINT + ["keeppkg==1.0"]
    assert exc.value.msg == _reinstall_text("keeppkg==1.0", argv, "")
    assert _restore.RestoreRecord(w.venv).load([]) == [("keeppkg", "1.0")]


def test_a_reinstall_that_leaves_the_files_wrong_is_an_error_and_remembered(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    w.fake.reinstall_result = (0, "", "")
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    assert exc.value.msg == "restored packages still differ from their RECORD: keeppkg (1 missing, 0 modified)"
    assert exc.value.partial["restored"] == [{"name": "keeppkg", "version": "1.0"}]
    assert [p["name"] for p in exc.value.partial["restore_pending"]] == ["keeppkg"]
    assert _restore.RestoreRecord(w.venv).load([]) == [("keeppkg", "1.0")]


def test_a_package_not_asked_for_that_disappears_is_an_error(tmp_path):
    w = _world(tmp_path, common=False, clobber=False)
    w.add("extra", "2.0", {"extra/__init__.py": b"x\n"})
    w.fake.also_take = {"extra"}
    with pytest.raises(_removal.GpufleetError) as exc:
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
    _restore.RestoreRecord(w.venv).store([("keeppkg", "1.0")])
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
    _restore.RestoreRecord(w.venv).store([("keeppkg", "1.0")])
    result = w.contamination().run(remove=True)
    assert (result["changed"], result["removed"], result["restored"], result["clean"], result["problems"]) == (
        True, [], [{"name": "keeppkg", "version": "1.0"}], True, [])
    assert w.fake.calls == [[w.python] + PIP_INSTALL + ["keeppkg==1.0"]]
    assert (w.read("shared/data.txt"), os.listdir(state_dir)) == (KEEP_DATA, [])


def test_a_record_that_cannot_be_cleared_is_a_problem_of_the_read(tmp_path, monkeypatch):
    w = _world(tmp_path, common=False, clobber=False)
    w.fake.remove("droppkg")
    _restore.RestoreRecord(w.venv).store([("keeppkg", "1.0")])
    monkeypatch.setattr(_restore.RestoreRecord, "store", lambda self, pins: "could not clear it")
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
    monkeypatch.setattr(_stash.Stash, "take", lambda self, site, rel, digest=None, algo=None: "no copy of %s" % rel)
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    named = "; ".join("no copy of %s" % os.path.join(SITE_REL, "shared", "f%d.py" % i) for i in range(5))
    assert exc.value.msg == (
        "files that kept packages share with the removed ones were not put back: %s%s. Reinstall alpha==2.0, keeppkg==1.0 "
        "(cuda_contamination remove=true find_links=<a directory holding them>) once the venv's directories are plain directories "
        "again" % (named, more))
    assert _restore.RestoreRecord(w.venv).load([]) == [("alpha", "2.0"), ("keeppkg", "1.0")]
    assert [(p["name"], p["missing"]) for p in exc.value.partial["restore_pending"]] == [
        ("alpha", ["shared/f0.py"]), ("keeppkg", ["shared/f%d.py" % i for i in range(count)])]
    assert w.fake.calls == [[w.python] + PIP_UNINSTALL + ["droppkg"]]
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))


def test_a_file_that_could_not_be_put_back_is_named(tmp_path, monkeypatch):
    w = _sharing(tmp_path, 1)
    monkeypatch.setattr(_stash.Stash, "put_back", lambda self, item: "%s was not put back" % item["rel"])
    with pytest.raises(_removal.GpufleetError) as exc:
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
    with pytest.raises(_removal.GpufleetError) as exc:
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
    with pytest.raises(_removal.GpufleetError) as exc:
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
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", MiB)
    for i in range(3):  # 48 MiB each, 13 bytes of data: holes are not kept, so they do not count
        _sparse(os.path.join(plain_site, "pkg", "sparse%d.bin" % i), {16 * MiB: b"the only data"}, 48 * MiB)
    for name in ("one.bin", "two.bin"):
        _write(os.path.join(plain_site, "pkg", name), os.urandom(600 * 1024))
    stash = _stash.Stash()
    try:
        told = [stash.take(plain_site, "pkg/sparse%d.bin" % i) for i in range(3)] + [stash.take(plain_site, "pkg/one.bin")]
        used = stash.used
        with pytest.raises(_stash.StashFull) as exc:
            stash.take(plain_site, "pkg/two.bin")
        kept = sorted(os.listdir(stash.where))
    finally:
        stash.close()
    block = os.statvfs(plain_site).f_bsize
    assert told == [None] * 4 and 600 * 1024 + 3 * 13 <= used <= 600 * 1024 + 3 * block, used
    assert exc.value.where == os.path.join(plain_site, "pkg", "two.bin")
    assert kept == ["0", "1", "2", "3"]  # nothing of two.bin was copied


def test_a_file_that_grew_past_the_bound_after_its_size_was_read_is_refused_as_it_is_copied(plain_site, monkeypatch):
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", 4096)
    path = _write(os.path.join(plain_site, "pkg", "grows.bin"), b"small\n")
    real = _stash._copy_fd

    def copy(src, dst, *args):  # the venv's owner appends to it once root has read its size
        with open(path, "ab") as f:
            f.write(b"x" * 8192)
        return real(src, dst, *args)

    monkeypatch.setattr(_stash, "_copy_fd", copy)
    stash = _stash.Stash()
    try:
        with pytest.raises(_stash.StashFull) as exc:
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
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", 3 * 3000 - 1)
    w, files = _big_sharing(tmp_path, [3000, 3000, 3000])
    with pytest.raises(_removal.GpufleetError) as exc:
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
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", 3 * 3000)
    w, files = _big_sharing(tmp_path, [3000, 3000, 3000])
    result = w.contamination().run(remove=True)
    assert (result["removed"], result["preserved_files"]) == ([{"name": "droppkg", "version": "1.0+cu130"}], 3)
    for rel, data in files.items():
        assert w.read(rel) == data, rel


def test_a_stash_that_reaches_its_bound_while_it_copies_stops_the_removal_before_anything_is_removed(
        tmp_path, state_dir, monkeypatch):
    # The files grew between the plan's look and the copy (here: the plan sees nothing to keep).
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", 3 * 3000 - 1)
    monkeypatch.setattr(_stash, "stash_need", lambda preserve: [])
    w, files = _big_sharing(tmp_path, [3000, 3000, 3000])
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    at = os.path.join(os.path.realpath(w.venv), SITE_REL, "big", "f2.bin")
    assert exc.value.msg.startswith(
        "the files that keeppkg==1.0 share with the packages to remove hold more than 8999 bytes of data, the most a removal "
        "keeps aside while it runs (STASH_TOTAL_MAX; it went past it at %s); nothing was removed. " % at), exc.value.msg
    assert (exc.value.partial["changed"], exc.value.partial["removed"]) == (False, [])
    _untouched(w, files, state_dir)


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
        with pytest.raises(_removal.GpufleetError) as exc:
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
    with pytest.raises(_removal.GpufleetError) as exc:
        w.contamination().run(remove=True)
    partial = exc.value.partial
    assert (partial["changed"], partial["removed"], partial["installer"]) == (True, [{"name": "droppkg", "version": "1.0+cu130"}], "pip")
    assert partial["diff"]["after"] != partial["diff"]["before"]


def test_a_failed_restore_whose_record_cannot_be_written_is_still_pending_and_not_clean(tmp_path, state_dir):
    w = _world(tmp_path, common=False)
    del w.fake.wheels["keeppkg"]
    os.makedirs(state_dir)
    os.chmod(os.path.dirname(state_dir), 0o777)
    where = _restore.RestoreRecord(w.venv).where
    unread = "the record of failed restores %s cannot be read: state is writable by another user than root" % where
    unwritten = ("could not write the record of failed restores %s (state is writable by another user than root): run as root so "
                 "that the next reads know the files are missing" % where)
    with pytest.raises(_removal.GpufleetError) as exc:
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
    where = _restore.RestoreRecord(w.venv).where
    with pytest.raises(_removal.GpufleetError) as exc:
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

    monkeypatch.setattr(_removal.fcntl, "flock", flock)
    before = _fds()
    with pytest.raises(OSError):
        _removal.VenvLock(str(tmp_path), 5).__enter__()
    assert _fds() == before
