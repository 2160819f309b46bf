# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The whole job on real trees and real processes (cache/_torch_cache.py)."""

from __future__ import annotations

import os

import pytest
from cachetree import TRITON_TREE, holder, make_tree
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
