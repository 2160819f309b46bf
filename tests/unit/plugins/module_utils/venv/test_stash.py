# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""venv/_stash: the copy (_copy_fd, sparse files, chunks, bounds) and the stash (Stash) - files copied
into root's 0700 directory and put back through handles; a directory exchanged for another real one, or
swapped for a link, is refused and named; nothing is ever replaced; a directory the uninstall removed is
made again as it was; what is put back gets its recorded owner. The tests that give files to another user
run as root."""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
import time

import pytest
from plainvenv import (
    BODY,
    DEFAULTS,
    NOBODY,
    MiB,
    _digest,
    _fds,
    _sparse,
    _world,
    _write,
    digest,
    root_only,
    taken,
)

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _restore, _stash

pytestmark = pytest.mark.usefixtures("state_dir", "_no_collection_within_a_test")


@root_only
def test_the_copy_is_root_s_alone_and_goes_with_the_run(site):
    stash = taken(site)
    st = os.stat(stash.where)
    copy = os.stat(os.path.join(stash.where, "0"))
    assert (st.st_uid, st.st_mode & 0o777, copy.st_uid, copy.st_mode & 0o777, copy.st_nlink) == (0, 0o700, 0, 0o600, 1)
    assert os.stat(_stash.stash_dir()).st_mode & 0o777 == 0o700
    assert stash.put_back(stash.items[0]) is None
    stash.close()
    assert not os.path.exists(_stash.stash_dir())
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
    stash = _stash.Stash()
    try:
        problem = stash.take(site, "pkg/sub/data.bin", digest(b"what RECORD says"), "sha256")
        assert problem and "no longer matches its RECORD" in problem
        assert stash.items == [] and stash.take(site, "../etc/passwd") and stash.items == []
    finally:
        stash.close()


def test_the_state_is_root_s_and_its_caps_are_64_kib_a_record_1_mib_a_read_1_gib_a_kept_file_and_2_gib_in_all():
    assert DEFAULTS == ("/var/lib/gpufleet-hygiene/restore", 65536, 1 << 20, 1 << 30, 2 << 30)


# --------------------------------------------------------------------------------------- _copy_fd


def _copy(tmp_path, data, **kw):
    src_path = _write(str(tmp_path / "src"), data)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        h, written = _stash._copy_fd(src, dst, **kw)
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
    monkeypatch.setattr(_stash, "_COPY_CHUNK", chunk)
    data = b"0123456789"
    assert _copy(tmp_path, data, limit=10).hexdigest() == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "dst").read_bytes() == data
    with pytest.raises(ValueError) as exc:
        _copy(tmp_path, data, limit=9)
    assert str(exc.value) == "larger than 9 bytes"
    assert (tmp_path / "dst").read_bytes() == (b"" if chunk > 10 else b"012345678")


@pytest.mark.parametrize("chunk", [1 << 20, 3])
def test_a_copy_that_writes_exactly_its_budget_is_whole_and_one_byte_more_is_refused_unwritten(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(_stash, "_COPY_CHUNK", chunk)
    data = b"0123456789"
    assert _copy(tmp_path, data, budget=10).hexdigest() == hashlib.sha256(data).hexdigest()
    with pytest.raises(_stash.StashFull):
        _copy(tmp_path, data, budget=9)
    assert (tmp_path / "dst").read_bytes() == (b"" if chunk > 10 else b"012345678")


def test_a_copy_s_budget_counts_data_not_holes(tmp_path):
    src = os.open(_sparse(str(tmp_path / "src"), {}, 64 * MiB), os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _h, written = _stash._copy_fd(src, dst, budget=0)
    finally:
        os.close(src)
        os.close(dst)
    assert (written, os.stat(str(tmp_path / "dst")).st_size) == (0, 64 * MiB)


def test_a_copy_reads_in_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(_stash, "_COPY_CHUNK", 4)
    real, reads = os.read, []

    def read(fd, n):
        reads.append(n)
        return real(fd, n)

    monkeypatch.setattr(_stash.os, "read", read)
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

    monkeypatch.setattr(_stash.os, "write", write)
    data = b"abcdefghij"
    assert _copy(tmp_path, data).hexdigest() == hashlib.sha256(data).hexdigest()
    assert writes == [b"abc", b"def", b"ghi", b"j"]
    assert (tmp_path / "dst").read_bytes() == data


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
        h, written = _stash._copy_fd(src, dst)
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
    monkeypatch.setattr(_stash, "_SEEK_DATA", 99)  # no such whence: lseek says EINVAL
    src_path = _sparse(str(tmp_path / "src"), {MiB: b"data"}, 3 * MiB)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(str(tmp_path / "dst"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        h, written = _stash._copy_fd(src, dst)
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
            _stash._copy_fd(src, dst, limit=MiB)
    finally:
        os.close(src)
        os.close(dst)
    assert (str(exc.value), os.stat(str(tmp_path / "dst")).st_size) == ("larger than %d bytes" % MiB, 0)
    assert time.monotonic() - started < 5


def test_a_sparse_shared_file_is_kept_aside_and_put_back_sparse(plain_site):
    path = _sparse(os.path.join(plain_site, "pkg", "big.bin"), {16 * MiB: b"the only data"}, 48 * MiB)
    want = _content_digest(path)
    stash = _stash.Stash()
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


# ------------------------------------------------------------------------- the stash, as any user


def test_the_stash_takes_a_copy_and_remembers_the_way_to_it(plain_site):
    stash = _stash.Stash()
    try:
        assert stash.take(plain_site, "pkg/data.bin", digest(BODY), "sha256") is None
        _top, chain = _stash._tree.walk(plain_site)
        _top.close()
        pkg = os.stat(os.path.join(plain_site, "pkg"))
        assert stash.items == [{"site": plain_site, "chain": chain, "rel": "pkg/data.bin", "copy": "0", "mode": 0o644,
                                "uid": os.geteuid(), "gid": os.getegid(),
                                "dirs": [["pkg", pkg.st_dev, pkg.st_ino, stat.S_IMODE(pkg.st_mode), pkg.st_uid, pkg.st_gid]]}]
        with open(os.path.join(stash.where, "0"), "rb") as f:
            assert f.read() == BODY
        if os.geteuid() == 0:  # root's stash: a directory of the run's own beside STATE_DIR (else a mkdtemp())
            assert re.match(r"^%d-[0-9a-f]{16}$" % os.getpid(), stash.name)
            assert (stash.where, stash.made) == (os.path.join(_stash.stash_dir(), stash.name), [
                _stash.stash_dir(), os.path.dirname(_stash.stash_dir())])
        os.remove(os.path.join(plain_site, "pkg", "data.bin"))
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    with open(os.path.join(plain_site, "pkg", "data.bin"), "rb") as f:
        assert f.read() == BODY
    assert not os.path.exists(stash.where)


def test_taking_and_putting_back_a_copy_leave_no_descriptor_open(plain_site):
    stash = _stash.Stash()
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
    stash = _stash.Stash()
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
    stash = _stash.Stash()
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
    stash = _stash.Stash()
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
    stash = _stash.Stash()
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
    stash = _stash.Stash()
    try:
        told = stash.take(plain_site, "pkg/data.bin", _digest(BODY, digest_of) if digest_of else None, algo)
    finally:
        stash.close()
    where = os.path.join(plain_site, "pkg", "data.bin")
    assert told == ("%s changed while it was copied (it no longer matches its RECORD): not preserved" % where if problem else None)


@pytest.mark.parametrize("rel", ["../x", "/etc/passwd", "pkg//data.bin", "./pkg/data.bin", "pkg/../pkg/data.bin", ""])
def test_a_path_not_below_the_site_is_not_taken(plain_site, rel):
    stash = _stash.Stash()
    try:
        assert stash.take(plain_site, rel) == "%s is not below %s: not kept aside" % (os.path.join(plain_site, rel), plain_site)
        assert stash.items == []
    finally:
        stash.close()


def test_what_is_no_regular_file_of_the_site_or_over_the_cap_is_named_not_copied(plain_site, tmp_path, monkeypatch):
    os.symlink("data.bin", os.path.join(plain_site, "pkg", "link"))
    os.mkfifo(os.path.join(plain_site, "pkg", "fifo"))
    os.symlink(plain_site, str(tmp_path / "alias"))
    with pytest.raises(_stash._tree.UnsafePath) as refused:
        _stash._tree.walk(str(tmp_path / "alias"))
    reason = refused.value.reason
    monkeypatch.setattr(_stash, "STASH_FILE_MAX", len(BODY) - 1)
    stash = _stash.Stash()
    try:
        told = [stash.take(plain_site, "pkg/link"), stash.take(plain_site, "pkg/fifo"), stash.take(plain_site, "pkg/data.bin"),
                stash.take(str(tmp_path / "alias"), "pkg/data.bin"), stash.take("relative", "pkg/data.bin"),
                stash.take(plain_site, "pkg/absent")]
        assert stash.items == []
        monkeypatch.setattr(_stash, "STASH_FILE_MAX", len(BODY))
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
    stash_dir = _stash.stash_dir()
    os.makedirs(stash_dir)
    os.chmod(stash_dir, 0o055)  # no one may write to it, yet it is not root's alone
    with pytest.raises(OSError) as exc:
        _stash.Stash()
    assert (exc.value.errno, exc.value.strerror) == (
        errno.EPERM, "%s is not root's alone: make it so with chmod 700 %s" % (stash_dir, stash_dir))
    assert (stat.S_IMODE(os.stat(stash_dir).st_mode), os.listdir(stash_dir)) == (0o055, [])


@root_only
@pytest.mark.parametrize("mode", [0o701, 0o704, 0o710, 0o740], ids=oct)
def test_a_stash_directory_anyone_else_may_read_or_enter_is_refused(state_dir, mode):
    stash_dir = _stash.stash_dir()
    os.makedirs(stash_dir)
    os.chmod(stash_dir, mode)  # one bit of group or others, none of them a write bit
    with pytest.raises(OSError) as exc:
        _stash.Stash()
    assert (exc.value.errno, exc.value.strerror) == (
        errno.EPERM, "%s is not root's alone: make it so with chmod 700 %s" % (stash_dir, stash_dir))
    assert (stat.S_IMODE(os.stat(stash_dir).st_mode), os.listdir(stash_dir)) == (mode, [])


def test_a_run_that_is_not_root_keeps_its_copies_in_a_private_temporary_directory_and_makes_nothing_of_root_s(state_dir, monkeypatch):
    monkeypatch.setattr(_stash.os, "geteuid", lambda: 1000)
    stash = _stash.Stash()
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
    stash = _stash.Stash()
    try:
        modes = [stat.S_IMODE(os.stat(p).st_mode) for p in (os.path.dirname(stash.where), stash.where)]
    finally:
        stash.close()
    assert modes == [0o700, 0o700]


@pytest.mark.parametrize("path", ["/", "//", "/./", "/var/../x", ""])
def test_a_state_directory_that_is_not_below_the_root_is_refused_before_anything_is_made(path, monkeypatch):
    monkeypatch.setattr(_restore, "STATE_DIR", path or "/")
    root = os.stat("/")
    before = (_fds(), (root.st_mode, root.st_uid, root.st_gid), sorted(os.listdir("/")))
    for create in (False, True):
        with pytest.raises(OSError) as exc:
            _restore._state_dir_fd(create=create, path=path or None)
        assert exc.value.errno == errno.EINVAL and "is no directory below /" in exc.value.strerror
    root = os.stat("/")
    assert (_fds(), (root.st_mode, root.st_uid, root.st_gid), sorted(os.listdir("/"))) == before


@pytest.mark.parametrize("path", ["/var/../x", "/./."])
def test_a_state_path_not_below_the_root_is_named_in_its_refusal(path):
    with pytest.raises(OSError) as exc:
        _restore._state_dir_fd(create=False, path=path)
    assert (exc.value.errno, exc.value.strerror) == (errno.EINVAL, "%r is no directory below / (a path without '..')" % path)


def _taken(site):
    stash = _stash.Stash()
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

    monkeypatch.setattr(_stash.os, "link", link)
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
    stash = _stash.Stash()
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


def _fchmod_spy(monkeypatch):
    """Every fchmod the stash makes, as (dir or file, the group and other bits the object had just
    before, the mode given), the call itself made."""
    real, seen = os.fchmod, []

    def fchmod(fd, mode):
        st = os.fstat(fd)
        seen.append(("dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other",
                     stat.S_IMODE(st.st_mode) & 0o077, mode))
        real(fd, mode)

    monkeypatch.setattr(_stash.os, "fchmod", fchmod)
    return seen


def test_a_directory_being_made_again_is_the_runner_s_alone_until_it_has_its_own_mode(plain_site, monkeypatch):
    stash = _taken(plain_site)
    pkg = os.path.join(plain_site, "pkg")
    mode = stat.S_IMODE(os.stat(pkg).st_mode)
    shutil.rmtree(pkg)
    seen = _fchmod_spy(monkeypatch)
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    assert seen == [("dir", 0, mode), ("file", 0, 0o644)]
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

    monkeypatch.setattr(_stash.os, "mkdir", mkdir)
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

    monkeypatch.setattr(_stash.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(_stash.os, "getegid", lambda: 1000)
    monkeypatch.setattr(_stash.os, "mkdir", mkdir)
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
    monkeypatch.setattr(_stash.os, "geteuid", lambda: 1000)  # the directory made again (by root here) is not the run's
    monkeypatch.setattr(_stash.os, "getegid", lambda: 1000)
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
    seen = _fchmod_spy(monkeypatch)
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    assert seen == [("file", 0, 0o644)]
    assert stat.S_IMODE(os.stat(os.path.join(plain_site, "pkg", "data.bin")).st_mode) == 0o644


def test_a_run_that_is_not_root_puts_a_file_back_as_its_own_and_gives_it_to_no_one(plain_site, monkeypatch):
    stash = _taken(plain_site)
    stash.items[0].update(uid=NOBODY, gid=NOBODY)  # taken from a file of nobody's
    given = []

    def fchown(fd, uid, gid):  # as the kernel answers a user who is not root
        given.append((uid, gid))
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(_stash.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(_stash.os, "getegid", lambda: 1000)
    monkeypatch.setattr(_stash.os, "fchown", fchown)
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
    moved = _stash.stash_dir() + ".moved"
    os.rename(_stash.stash_dir(), moved)
    stash.close()
    assert (os.listdir(moved), os.listdir(os.path.join(moved, stash.name))) == ([stash.name], [])


@root_only
def test_closing_a_stash_leaves_another_run_s_stash_and_the_directories_above(plain_site, state_dir):
    stash = _stash.Stash()
    other = os.path.join(_stash.stash_dir(), "another-run")
    os.mkdir(other)
    stash.close()
    assert (os.path.exists(stash.where), os.listdir(_stash.stash_dir())) == (False, ["another-run"])


def test_the_packages_problems_are_the_scan_s(tmp_path):
    w = _world(tmp_path, common=False, clobber=False)
    info = os.path.join(w.site, "noversion-1.0.dist-info")
    _write(os.path.join(info, "METADATA"), b"Metadata-Version: 2.1\nName: noversion\n\n")
    _write(os.path.join(info, "RECORD"), b"noversion-1.0.dist-info/METADATA,,\n")
    result = w.contamination().run()
    assert result["problems"] == ["noversion-1.0.dist-info lacks Name or Version; taken from the directory name"]
    assert result["scanned"] == 4


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
