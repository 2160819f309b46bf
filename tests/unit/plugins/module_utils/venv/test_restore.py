# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""venv/_restore: root's state directory (_trusted, _distrust, _state_dir_fd), the record of failed
restores (RestoreRecord), unrestored and pending_problem."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import time
import types

import pytest
from plainvenv import (
    NOBODY,
    World,
    _fds,
    _pending_text,
    _write,
    root_only,
)

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _restore, _venv

pytestmark = pytest.mark.usefixtures("state_dir", "_no_collection_within_a_test")


# -------------------------------------------------------------------------- root's state directory


def _st(mode, uid=0):
    return types.SimpleNamespace(st_mode=stat.S_IFDIR | mode, st_uid=uid)


@pytest.mark.parametrize("mode, trusted", [
    (0o755, True), (0o700, True), (0o1777, True), (0o1755, True), (0o775, False), (0o757, False), (0o777, False),
    (0o765, False), (0o756, False),
])
def test_a_directory_is_trusted_when_no_one_else_may_write_to_it_or_it_is_sticky(mode, trusted):
    assert bool(_restore._trusted(_st(mode))) is trusted


def test_a_directory_of_another_user_is_not_trusted_but_one_of_our_own_is(monkeypatch):
    assert bool(_restore._trusted(_st(0o755, NOBODY))) is (os.geteuid() == NOBODY)
    monkeypatch.setattr(_restore.os, "geteuid", lambda: 1000)
    assert [bool(_restore._trusted(_st(0o755, uid))) for uid in (0, 1000, 1001)] == [True, True, False]


def test_a_directory_of_root_or_of_ours_is_distrusted_for_who_else_may_write_and_another_s_for_its_owner(monkeypatch):
    assert [_restore._distrust(_st(0o755)), _restore._distrust(_st(0o777))] == [None, "is writable by another user than root"]
    monkeypatch.setattr(_restore.os, "geteuid", lambda: 1000)
    assert [_restore._distrust(_st(0o777, uid)) for uid in (0, 1000, 1001)] == [
        "is writable by another user than root", "is writable by another user than root", "belongs to uid 1001, not root"]


@root_only
def test_a_real_directory_s_owner_and_mode_decide_its_trust(tmp_path):
    path = tmp_path / "d"
    path.mkdir()
    verdicts = []
    for mode in (0o755, 0o775, 0o757, 0o1777):
        os.chmod(path, mode)
        verdicts.append(bool(_restore._trusted(os.stat(path))))
    os.chmod(path, 0o755)
    os.chown(path, NOBODY, NOBODY)
    verdicts.append(bool(_restore._trusted(os.stat(path))))
    assert verdicts == [True, False, False, True, False]


def test_the_state_directory_absent_is_none_unless_made(tmp_path, state_dir):
    before = _fds()
    assert _restore._state_dir_fd(create=False) is None
    assert _fds() == before and not os.path.exists(tmp_path / "state")
    fd = _restore._state_dir_fd(create=True)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(state_dir))
    finally:
        os.close(fd)
    assert _fds() == before
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in (tmp_path / "state", state_dir)] == [0o755, 0o755]
    fd = _restore._state_dir_fd(create=False)
    assert os.path.samestat(os.fstat(fd), os.stat(state_dir))
    os.close(fd)


def test_the_state_directory_may_be_another_path(tmp_path):
    other = str(tmp_path / "x" / "y")
    assert _restore._state_dir_fd(create=False, path=other) is None
    fd = _restore._state_dir_fd(create=True, path=other)
    assert os.path.samestat(os.fstat(fd), os.stat(other))
    os.close(fd)
    assert not os.path.exists(tmp_path / "state")


def test_every_component_of_a_state_path_is_walked_whatever_character_it_starts_with(tmp_path):
    path = str(tmp_path / "+plus" / "-dash" / " space")
    fd = _restore._state_dir_fd(create=True, path=path)
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(path))
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path)) == ["+plus"]


def test_the_last_directory_made_of_a_deep_state_path_has_the_mode_asked_for(tmp_path):
    deep = os.path.join(str(tmp_path), *["d"] * 300)  # more components than CPython keeps small ints for
    fd = _restore._state_dir_fd(create=True, path=deep, mode=0o700)
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
        _restore._state_dir_fd(create=create, path=str(open_dir / "sub" / "new"))
    assert (exc.value.errno, exc.value.strerror) == (errno.EPERM, "open is writable by another user than root")
    assert _fds() == before and not os.path.exists(open_dir / "sub" / "new")


@root_only
def test_a_state_directory_below_one_of_another_user_is_refused(tmp_path):
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(OSError) as exc:
        _restore._state_dir_fd(create=True, path=str(tmp_path / "theirs" / "new"))
    assert (exc.value.errno, exc.value.strerror) == (errno.EPERM, "theirs belongs to uid %d, not root" % NOBODY)


def test_a_link_on_the_way_to_the_state_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(str(tmp_path / "real"), str(tmp_path / "link"))
    before = _fds()
    with pytest.raises(OSError) as exc:
        _restore._state_dir_fd(create=True, path=str(tmp_path / "link" / "new"))
    assert exc.value.errno in (errno.ELOOP, errno.ENOTDIR)  # as the kernel says it of O_NOFOLLOW | O_DIRECTORY
    assert _fds() == before and os.listdir(tmp_path / "real") == []


def test_a_state_directory_that_is_a_file_is_refused(tmp_path):
    _write(str(tmp_path / "file"))
    before = _fds()
    for create in (False, True):
        with pytest.raises(OSError) as exc:
            _restore._state_dir_fd(create=create, path=str(tmp_path / "file"))
        assert exc.value.errno == errno.ENOTDIR
    assert _fds() == before


def test_a_sticky_state_directory_others_may_write_is_refused_but_one_above_is_not(tmp_path):
    (tmp_path / "sticky" / "final").mkdir(parents=True)
    os.chmod(tmp_path / "sticky", 0o1777)
    os.chmod(tmp_path / "sticky" / "final", 0o1777)
    before = _fds()
    with pytest.raises(OSError) as exc:
        _restore._state_dir_fd(create=False, path=str(tmp_path / "sticky" / "final"))
    assert (exc.value.errno, exc.value.strerror) == (errno.EPERM, "it is writable by another user than root")
    assert _fds() == before
    os.chmod(tmp_path / "sticky" / "final", 0o1755)
    fd = _restore._state_dir_fd(create=False, path=str(tmp_path / "sticky" / "final"))
    assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "sticky" / "final"))
    os.close(fd)


# --------------------------------------------------------------------------------- RestoreRecord


def test_the_record_is_named_for_the_venv_s_real_path(tmp_path, state_dir):
    (tmp_path / "venv").mkdir()
    os.symlink(str(tmp_path / "venv"), str(tmp_path / "alias"))
    real = os.path.realpath(str(tmp_path / "venv"))
    name = hashlib.sha256(real.encode("utf-8")).hexdigest()[:32] + ".json"
    for venv in ("venv", "alias"):
        record = _restore.RestoreRecord(str(tmp_path / venv))
        assert (record.venv, record.name, record.where) == (real, name, os.path.join(state_dir, name))


def test_a_stored_record_is_loaded_back_and_an_empty_one_removes_it(tmp_path, state_dir):
    record = _restore.RestoreRecord(str(tmp_path))
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
    record = _restore.RestoreRecord(str(tmp_path))
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
    record = _restore.RestoreRecord(str(tmp_path))
    if isinstance(data, dict):
        data = dict((k, record.venv if v == "VENV" else v) for k, v in data.items())
    _plant(record, data)
    problems = []
    assert record.load(problems) == []
    expected = [] if data == {"packages": []} else ["the record of failed restores %s is malformed: ignored" % record.where]
    assert problems == expected


def test_a_record_of_another_venv_is_nothing(tmp_path):
    record = _restore.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": "/elsewhere", "packages": [{"name": "a", "version": "1"}]})
    problems = []
    assert record.load(problems) == [] and problems == []


def test_a_record_s_names_and_versions_no_installer_would_read_are_dropped(tmp_path):
    record = _restore.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [
        {"name": "--python=/x", "version": "1"}, {"name": "ok", "version": "-1"}, {"name": "good", "version": "1.0"},
        {"name": "a b", "version": "1 0"}]})
    problems = []
    assert record.load(problems) == [("good", "1.0")] and problems == []


def _not_root_s(record):
    return ["the record of failed restores %s is not a regular file of root's under 65536 bytes: ignored" % record.where]


@pytest.mark.parametrize("kind", ["a directory", "a fifo", "mode 0666", "sticky 01666", "too large"])
def test_a_record_that_is_no_regular_file_of_root_s_under_the_cap_is_ignored(tmp_path, kind):
    record = _restore.RestoreRecord(str(tmp_path))
    os.makedirs(os.path.dirname(record.where))
    good = json.dumps({"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}).encode("utf-8")
    if kind == "a directory":
        os.mkdir(record.where)
    elif kind == "a fifo":
        os.mkfifo(record.where)
    elif kind == "too large":
        _plant(record, b" " * (_restore._STATE_MAX + 1 - len(good)) + good)
    else:
        _plant(record, good, 0o666 if kind == "mode 0666" else 0o1666)
    problems = []
    assert record.load(problems) == []
    assert problems == _not_root_s(record)


def test_a_sticky_record_others_may_write_is_ignored_though_its_group_may_not(tmp_path):
    record = _restore.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}, 0o1646)
    problems = []
    assert record.load(problems) == []
    assert problems == _not_root_s(record)


@pytest.mark.parametrize("mode", [0o601, 0o645, 0o755], ids=oct)
def test_a_record_no_one_else_may_write_is_read_whatever_else_they_may_do(tmp_path, mode):
    record = _restore.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}, mode)
    problems = []
    assert record.load(problems) == [("a", "1")] and problems == []


def test_a_record_of_exactly_the_cap_is_read_whole(tmp_path):
    record = _restore.RestoreRecord(str(tmp_path))
    good = json.dumps({"venv": record.venv, "packages": [{"name": "a", "version": "1"}]}).encode("utf-8")
    _plant(record, b" " * (_restore._STATE_MAX - len(good)) + good)
    assert os.path.getsize(record.where) == _restore._STATE_MAX
    problems = []
    assert record.load(problems) == [("a", "1")] and problems == []
    _plant(record, good, 0o1644)  # sticky, but no one else may write to it
    assert record.load(problems) == [("a", "1")] and problems == []


@root_only
def test_a_record_of_another_user_is_ignored(tmp_path):
    record = _restore.RestoreRecord(str(tmp_path))
    _plant(record, {"venv": record.venv, "packages": [{"name": "a", "version": "1"}]})
    os.chown(record.where, NOBODY, NOBODY)
    problems = []
    assert record.load(problems) == [] and problems == _not_root_s(record)


def test_a_record_reached_through_a_link_or_an_open_directory_is_not_read(tmp_path, state_dir):
    record = _restore.RestoreRecord(str(tmp_path))
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
    record = _restore.RestoreRecord(str(tmp_path))
    os.makedirs(state_dir)
    os.symlink(str(tmp_path / "victim"), os.path.join(state_dir, ".%s.%d" % (record.name, os.getpid())))
    assert record.store([("a", "1")]) == (
        "could not write the record of failed restores %s (%s): run as root so that the next reads know the files are missing"
        % (record.where, os.strerror(errno.ELOOP)))
    assert not os.path.lexists(tmp_path / "victim") and not os.path.lexists(record.where)


def test_a_temporary_record_an_earlier_run_of_the_same_pid_left_is_written_over_whole(tmp_path, state_dir):
    record = _restore.RestoreRecord(str(tmp_path))
    os.makedirs(state_dir)
    _write(os.path.join(state_dir, ".%s.%d" % (record.name, os.getpid())), b"x" * 4096)
    assert record.store([("a", "1")]) is None
    problems = []
    assert (record.load(problems), problems, os.listdir(state_dir)) == ([("a", "1")], [], [record.name])


def test_a_record_that_cannot_be_written_or_cleared_says_so(tmp_path, state_dir):
    record = _restore.RestoreRecord(str(tmp_path))
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
    dists = _venv.Venv(w.venv, None).distributions
    assert _restore.unrestored(dists, [("gone", "3.0"), ("intact", "0.9"), ("broken-pkg", "9")]) == [
        {"name": "gone", "version": "3.0", "installed": False, "missing": [], "modified": []},
        {"name": "Broken_Pkg", "version": "2.0", "installed": True, "missing": ["broken/a.py"], "modified": ["broken/b.py", "broken/d.py"]},
    ]
    assert _restore.unrestored(dists, []) == []


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
    assert _restore.pending_problem(item) == _pending_text("keeppkg", "1.0", "has " + listed)


def test_a_pending_restore_of_a_package_gone_says_it_is_not_installed():
    item = {"name": "gone", "version": "3.0", "installed": False, "missing": ["m"], "modified": []}
    assert _restore.pending_problem(item) == (
        "gone 3.0 lost files when the packages that had overwritten them were removed, and their reinstall failed: it is not "
        "installed any more. The venv stays not clean until they are back: reinstall it with find_links (cuda_contamination "
        "remove=true find_links=<a directory holding gone==3.0>, or pip install --force-reinstall --no-deps --find-links "
        "<that directory> gone==3.0)")
