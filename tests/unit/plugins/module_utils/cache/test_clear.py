# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Measuring and clearing real trees with hostile symlinks, finding real processes that hold
them, and clearing as root while the home's owner swaps directories under it (cache/_clear.py).

The race: a real unprivileged process exchanges (renameat2 RENAME_EXCHANGE) ~/.triton with a link
to a directory it cannot write, and ~/.triton/cache with a link to that directory's cache, in a
loop, while root clears ~/.triton/cache again and again for a bounded time. The decoy looks like
a Triton cache, so only the walk through handles keeps it: its sentinel must survive every clear.
A path-based clear run beside the same loop first shows that the loop does reach the decoy.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time

import pytest
from cachetree import INDUCTOR_TREE, TRITON_TREE, Swapper, holder, make_tree, snapshot

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._clear import clear_root, find_holders, has_content, measure
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._locate import CacheError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._marker import MARKER
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._roots import open_root, protected_homes
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import TorchCache
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tree


def test_measure_counts_files_once_and_never_follows_links(tmp_path):
    root = tmp_path / "cache"
    size = make_tree(str(root), INDUCTOR_TREE)
    big = tmp_path / "outside.bin"
    big.write_bytes(b"z" * 10000)
    os.symlink(str(big), str(root / "link-to-outside"))
    os.symlink(str(tmp_path), str(root / "link-to-dir"))
    os.link(str(root / "cu/cuabc123.py"), str(root / "cu/hardlink.py"))
    (root / MARKER).write_text("{}")
    got_size, entries, problems = measure(str(root))
    assert got_size == size  # no outside bytes, the hard link once, the marker not counted
    assert entries == len(INDUCTOR_TREE) + 3  # two symlinks and the hard link are entries
    assert problems == []


def test_clear_keeps_root_and_everything_outside(tmp_path):
    root = tmp_path / "cache"
    make_tree(str(root), TRITON_TREE)
    outside_dir = tmp_path / "precious"
    make_tree(str(outside_dir), {"model.pt": b"weights", "sub/notes.txt": b"keep me"})
    outside_file = tmp_path / "precious.txt"
    outside_file.write_bytes(b"do not delete")
    before_outside = snapshot(str(outside_dir))
    os.symlink(str(outside_file), str(root / "QWERTY123/evil-file-link"))
    os.symlink(str(outside_dir), str(root / "evil-dir-link"))
    os.symlink("../../precious.txt", str(root / "ZXCVB456/dotdot-link"))
    os.symlink("/", str(root / "slash-link"))
    (root / MARKER).write_text("{}")

    res = clear_root(str(root))

    assert res.errors == []
    assert os.path.isdir(str(root)) and not os.path.islink(str(root))
    assert os.listdir(str(root)) == []
    assert outside_file.read_bytes() == b"do not delete"
    assert snapshot(str(outside_dir)) == before_outside
    assert res.removed == len(TRITON_TREE) + 4  # the four links are removed, not followed
    assert res.freed == sum(len(v) for v in TRITON_TREE.values())
    assert res.dirs == 2


def test_clear_does_not_descend_into_another_mount(tmp_path):
    """A file system mounted inside the cache (a bind mount of data, say) is left alone."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root; the suite runs as root in CI")
    root = tmp_path / "cache"
    make_tree(str(root), {"a/b": b"1", "mnt/.keep": b""})
    mnt = str(root / "mnt")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], check=True)
    try:
        with open(os.path.join(mnt, "data.bin"), "wb") as f:
            f.write(b"on another file system")
        size, entries, problems = measure(str(root))
        assert (size, entries) == (1, 1)
        assert problems == [mnt + ": another file system is mounted here; not measured"]
        assert has_content(str(root), keep_marker=False) is True
        res = clear_root(str(root))
        assert res.kept == [mnt + " (another file system is mounted here)"]
        assert has_content(str(root), keep_marker=False) is False  # a second absent run has nothing to do
        assert sorted(os.listdir(str(root))) == ["mnt"]
        with open(os.path.join(mnt, "data.bin"), "rb") as f:
            assert f.read() == b"on another file system"
    finally:
        subprocess.run(["umount", mnt], check=True)


def test_holders_open_file_mapping_and_cwd(tmp_path):
    root = tmp_path / "cache"
    make_tree(str(root), TRITON_TREE)
    other = tmp_path / "other"
    make_tree(str(other), {"x": b"1"})
    so = str(root / "QWERTY123/cuda_utils.so")
    with holder(so, "open") as p_open, holder(str(root / "ZXCVB456/add_kernel.cubin"), "map") as p_map, \
            holder(str(root / "ZXCVB456"), "cwd") as p_cwd:
        found, _uninspected = find_holders([str(root), str(other)])
        by_pid = {h["pid"]: h for h in found[str(root)]}
        assert set(by_pid) == {p_open.pid, p_map.pid, p_cwd.pid}
        assert so in by_pid[p_open.pid]["paths"]
        assert str(root / "ZXCVB456/add_kernel.cubin") in by_pid[p_map.pid]["paths"]
        assert by_pid[p_cwd.pid]["paths"] == [str(root / "ZXCVB456")]
        assert "-c" in by_pid[p_open.pid]["command"] and "python" in by_pid[p_open.pid]["command"]
        assert found[str(other)] == []
    found, _uninspected = find_holders([str(root)])
    assert found[str(root)] == []


def test_holder_of_a_deleted_file_is_still_found(tmp_path):
    root = tmp_path / "cache"
    make_tree(str(root), {"k/kernel.so": b"\x7fELF"})
    path = str(root / "k/kernel.so")
    with holder(path, "open") as proc:
        os.unlink(path)
        found, _uninspected = find_holders([str(root)])
        assert [(h["pid"], h["paths"]) for h in found[str(root)]] == [(proc.pid, [path])]


SECONDS = float(os.environ.get("GPUFLEET_RACE_SECONDS", "20"))


VICTIM = {"KEEPSAFE01/sentinel.bin": b"outside the cache: must survive", "ABCDEF99/kernel.cubin": b"\0" * 64}


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the race needs root beside another uid; the suite runs as root in CI")


@pytest.fixture
def stage():
    """A home owned by nobody holding a real Triton cache, and a root-owned decoy outside it."""
    nobody = pwd.getpwnam("nobody")
    base = tempfile.mkdtemp(prefix="gpufleet-race-", dir="/tmp")  # pytest's tmp_path is 0700: nobody could not enter
    os.chmod(base, 0o755)
    home = os.path.join(base, "home")
    victim = os.path.join(base, "victim")
    make_tree(os.path.join(victim, "cache"), VICTIM)
    os.makedirs(os.path.join(home, ".triton", "cache"))
    os.symlink(victim, os.path.join(home, "decoy"))
    os.symlink(os.path.join(victim, "cache"), os.path.join(home, ".triton", "clink"))
    for dirpath, dirnames, filenames in os.walk(home):
        for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            os.lchown(name, nobody.pw_uid, nobody.pw_gid)
    try:
        yield {"home": home, "victim": victim, "uid": nobody.pw_uid, "gid": nobody.pw_gid,
               "cache": os.path.join(home, ".triton", "cache")}
    finally:
        shutil.rmtree(base)


def _refill(cache, n, folders=1):
    """Put kernel folders in the cache, through a handle (never through a swapped path)."""
    try:
        _real, d = _tree.lookup(cache)
    except (_tree.UnsafePath, OSError):
        return
    if d is None:
        return
    with d:
        for i in range(folders):
            name = "RACE%06d%02d" % (n, i)
            os.mkdir(name, dir_fd=d.fd)
            fd = os.open(name, _tree.DIR_FLAGS, dir_fd=d.fd)
            try:
                os.close(os.open("k.cubin", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
            finally:
                os.close(fd)


def _path_based_clear(cache, home):
    """The old way: resolve and check the path, then clear by path strings."""
    try:
        real = os.path.realpath(cache)  # raises when a link turns into a directory while it reads it
    except OSError:
        return False
    if not real.startswith(home + "/") or os.path.islink(cache):
        return False
    with contextlib.suppress(OSError):
        for name in os.listdir(cache):
            path = os.path.join(cache, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
    return True


def _race(stage, seconds, clear_once, stop_at_first_escape=False, folders=1):
    """Run ``clear_once`` beside the swap loop for ``seconds``; the counts."""
    before = snapshot(stage["victim"])
    counts = {"clears": 0, "refused": 0, "escapes": 0}
    swapper = Swapper(stage["home"], [(".triton", "decoy"), (".triton/cache", ".triton/clink")], stage["uid"], stage["gid"])
    try:
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            n += 1
            _refill(stage["cache"], n, folders)
            counts["clears" if clear_once(n) else "refused"] += 1
            if snapshot(stage["victim"]) != before:
                counts["escapes"] += 1
                shutil.rmtree(os.path.join(stage["victim"], "cache"), ignore_errors=True)
                make_tree(os.path.join(stage["victim"], "cache"), VICTIM)
                if stop_at_first_escape:
                    break
    finally:
        counts["swaps"], counts["swap_failures"] = swapper.stop()
    counts["seconds"] = round(time.monotonic() - deadline + seconds, 1)
    return counts


def _handle_clear(stage):
    homes = protected_homes([stage["home"]])
    env = {"HOME": stage["home"], "USER": "nobody"}

    def once(n):
        if n % 5 == 0:  # the whole module path now and then: inspect, holders, re-open, clear
            try:
                result = TorchCache(["triton"], state="absent", environment=env).execute()
            except CacheError:
                return False
            return result["caches"][0]["removed"] > 0
        with open_root(stage["cache"], homes, None, "triton") as root:
            if root.problem or root.dir is None:
                return False
            res = clear_root(root.dir)
            return res.removed > 0

    return once


@needs_root
def test_the_swap_loop_reaches_outside_a_path_based_clear(stage):
    """The harness can fail: a clear by path strings, checked first, is led into the decoy."""
    counts = _race(stage, 30, lambda n: _path_based_clear(stage["cache"], stage["home"]), stop_at_first_escape=True, folders=20)
    print("path-based clear beside the swap loop:", counts)
    assert counts["swaps"] > 0
    assert counts["escapes"] >= 1


@needs_root
@pytest.mark.parametrize("openat2", [False, True], ids=["walk", "openat2"])
def test_clearing_through_handles_never_reaches_outside(stage, monkeypatch, openat2):
    monkeypatch.setitem(_tree.OPENAT2, "usable", False if not openat2 else None)
    if openat2:
        _tree.lookup("/")
        if not _tree.OPENAT2["usable"]:
            pytest.skip("this kernel has no openat2: the walk case covers it")
    counts = _race(stage, SECONDS / 2, _handle_clear(stage), folders=20)
    print("clear through handles (%s) beside the swap loop:" % ("openat2" if openat2 else "walk"), counts)
    assert counts["escapes"] == 0
    assert counts["swaps"] > 1000  # the loop really ran beside the clears
    assert counts["clears"] > 0 and counts["refused"] > 0  # both outcomes happened: the race was live
    assert snapshot(os.path.join(stage["victim"], "cache")) == {
        "KEEPSAFE01": ("d", None), "ABCDEF99": ("d", None),
        "KEEPSAFE01/sentinel.bin": ("f", VICTIM["KEEPSAFE01/sentinel.bin"]),
        "ABCDEF99/kernel.cubin": ("f", VICTIM["ABCDEF99/kernel.cubin"])}
