# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""venv/_contamination: the scan itself (run() without a removal, and the scan
reported by a removal), on plain-file venvs (tests/lib/plainvenv.py)."""

from __future__ import annotations

import fcntl
import os
import stat

import pytest
from plainvenv import (
    AFTER,
    BEFORE,
    COMMON,
    DROP_DATA,
    KEEP_DATA,
    PIP_INSTALL,
    PIP_UNINSTALL,
    World,
    _world,
    _write,
)

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _removal, _restore

pytestmark = pytest.mark.usefixtures("state_dir", "_no_collection_within_a_test")


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
    with pytest.raises(_removal.GpufleetError) as exc:
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
    _restore.RestoreRecord(w.venv).store([("gone", "3.0")])
    result = w.contamination(check_mode=True).run(remove=True)
    assert (result["changed"], result["installer"], result["clean"]) == (True, "pip", False)
    assert result["removed"] == [{"name": "droppkg", "version": "1.0+cu130"}]
    assert result["restored"] == [{"name": "keeppkg", "version": "1.0"}, {"name": "gone", "version": "3.0"}]
    assert (result["kept"], result["preserved_files"]) == ([], 1)
    assert result["diff"] == {"before": BEFORE, "after": AFTER}
    assert w.fake.calls == []
    assert w.read("shared/data.txt") == DROP_DATA and os.path.isdir(os.path.join(w.site, "droppkg-1.0+cu130.dist-info"))
    assert os.listdir(state_dir) == [_restore.RestoreRecord(w.venv).name]
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
        with pytest.raises(_removal.GpufleetError) as exc:
            w.contamination(lock_timeout=0.1).run(remove=True)
    finally:
        os.close(holder)
    assert exc.value.msg == "another run holds the lock on venv %s for more than 0.1s; wait for it or raise lock_timeout" % w.venv
    assert [c["name"] for c in exc.value.partial["contaminants"]] == ["droppkg"]  # the scan's result goes with the failure
    assert w.fake.calls == []
