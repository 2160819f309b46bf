# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The whole job on real trees and real processes (cache/_torch_cache.py)."""

from __future__ import annotations

import os

import pytest
from cachetree import FLASHINFER_CUBINS, TRITON_TREE, flashinfer_tree, holder, make_tree, snapshot
from importgraph import PACKAGE, collection_imports, module_files

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._locate import CacheError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import TorchCache


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


def test_each_file_has_one_job_and_only_the_job_uses_them_all():
    """Where a cache lives, what it is built against and its marker know nothing of roots,
    clearing or the job; the job alone puts them together (the graph read with ``ast``)."""
    files = module_files()
    graph = {}
    for name, path in files.items():
        if name.startswith(PACKAGE + ".cache."):
            with open(path, encoding="utf-8") as handle:
                top, late = collection_imports(handle.read(), files, path)
            graph[name[len(PACKAGE) + 7:]] = sorted(m[len(PACKAGE) + 7:] for m in top | late if m.startswith(PACKAGE + ".cache."))
    assert graph == {
        "_locate": [],
        "_fingerprint": [],
        "_marker": ["_fingerprint"],
        "_roots": ["_locate", "_marker"],
        "_clear": ["_marker", "_roots"],
        "_torch_cache": ["_clear", "_fingerprint", "_locate", "_marker", "_roots"],
    }


def test_flashinfer_workspace_held_kept_and_cleared_around_its_cubins(tmp_path):
    """FlashInfer's workspace under the job's home, as 0.6.11.post1 lays it out, beside the
    cubins it downloaded and a link out of the cache: a process mapping a JIT module stops the
    clear; forced, the JIT modules go, the cubins, the link's target and the root stay."""
    home = tmp_path / "home"
    root = home / ".cache" / "flashinfer"
    outside = tmp_path / "results.txt"
    outside.write_text("not the cache's\n")
    make_tree(str(root), dict(flashinfer_tree("0.6.11.post1", "90a"), **FLASHINFER_CUBINS))
    os.symlink(str(outside), str(root / "0.6.11.post1" / "90a" / "generated" / "link"))
    env = {"HOME": str(home)}
    report = TorchCache(["flashinfer"], environment=env).execute()
    [entry] = report["caches"]
    jit = flashinfer_tree("0.6.11.post1", "90a")
    assert (entry["path"], entry["source"], entry["exists"]) == (str(root), "default: ~/.cache/flashinfer", True)
    assert (entry["entries"], entry["size"]) == (len(jit) + 1, sum(len(v) for v in jit.values()))  # the cubins left out
    module = root / "0.6.11.post1" / "90a" / "cached_ops" / "norm" / "norm.so"
    with holder(str(module), "map") as proc:
        with pytest.raises(CacheError, match="the flashinfer cache %s is in use by a running process: PID %d " % (root, proc.pid)):
            TorchCache(["flashinfer"], state="absent", environment=env).execute()
        assert module.exists()
        result = TorchCache(["flashinfer"], state="absent", environment=env, force=True).execute()
    [entry] = result["caches"]
    assert entry["action"] == "clear" and entry["removed"] == len(jit) + 1
    assert sorted(os.listdir(str(root))) == ["cubins"]
    assert snapshot(str(root / "cubins")) == snapshot_of(FLASHINFER_CUBINS, "cubins/")
    assert outside.read_text() == "not the cache's\n"
    again = TorchCache(["flashinfer"], state="absent", environment=env).execute()
    assert again["changed"] is False and again["caches"][0]["entries"] == 0


def test_a_process_reading_flashinfers_cubins_holds_nothing_a_clear_removes(tmp_path):
    """The cubins stay through a clear: a job with one of them open is no holder of the workspace,
    while one with a JIT module open still is."""
    root = tmp_path / ".cache" / "flashinfer"
    make_tree(str(root), dict(flashinfer_tree("0.6.11.post1", "90a"), **FLASHINFER_CUBINS))
    env = {"HOME": str(tmp_path)}
    cubin = root / "cubins/8ec3a5f2/fmha/trtllm-gen/kernel.cubin"
    with holder(str(cubin), "open") as reader:
        with holder(str(root / "0.6.11.post1/90a/cached_ops/norm/norm.so"), "open") as user:
            [entry] = TorchCache(["flashinfer"], environment=env).execute()["caches"]
            assert [h["pid"] for h in entry["holders"]] == [user.pid]
        result = TorchCache(["flashinfer"], state="absent", environment=env).execute()
        assert reader.poll() is None and result["caches"][0]["holders"] == []
    assert result["changed"] is True and sorted(os.listdir(str(root))) == ["cubins"] and cubin.exists()


def snapshot_of(tree, prefix):
    """What snapshot() shows of the part of ``tree`` under ``prefix``, its folders included."""
    out = {}
    for path, data in tree.items():
        rel = path[len(prefix):]
        parts = rel.split("/")
        for i in range(1, len(parts)):
            out["/".join(parts[:i])] = ("d", None)
        out[rel] = ("f", data)
    return out
