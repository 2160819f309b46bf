# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Measuring and clearing real trees with hostile symlinks, and finding real processes that hold them."""

from __future__ import annotations

import os
import subprocess

import pytest
from cachetree import INDUCTOR_TREE, TRITON_TREE, holder, make_tree, snapshot

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import (
    MARKER,
    CacheError,
    TorchCache,
    clear_root,
    find_holders,
    has_content,
    measure,
)


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


def test_force_clears_a_held_cache_and_warns_with_the_pid(tmp_path):
    root = tmp_path / "triton"
    make_tree(str(root), TRITON_TREE)
    env = {"HOME": str(tmp_path), "TRITON_CACHE_DIR": str(root)}
    with holder(str(root / "QWERTY123/cuda_utils.so"), "map") as proc:
        with pytest.raises(CacheError, match="PID %d " % proc.pid):
            TorchCache(["triton"], state="absent", environment=env).execute()
        assert os.path.exists(str(root / "QWERTY123/cuda_utils.so"))
        job = TorchCache(["triton"], state="absent", environment=env, force=True)
        result = job.execute()
        assert result["changed"] is True and os.listdir(str(root)) == []
        assert [w for w in job.warnings if w.startswith("force: clearing the triton cache") and "PID %d " % proc.pid in w]
