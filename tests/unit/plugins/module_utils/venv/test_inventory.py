# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_inventory: pip_inventory's result - a venv's packages read from files, drift against a
baseline, integrity against RECORD."""

from __future__ import annotations

import os

import pytest
from distfiles import _dist_info, _make_venv, _write

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _dist, _inventory


@pytest.mark.parametrize("pinned, installed, same", [
    ("2.9.1", "2.9.1", True), ("2.9.1", "2.9.1+cu128", True), (" 2.9.1 ", "2.9.1", True), ("1.0RC1", "1.0rc1", True),
    ("2.9.1+cu128", "2.9.1+cu128", True), ("2.9.1+cu128", "2.9.1", False), ("2.9.1+cu128", "2.9.1+cu130", False),
    ("2.9.1", "2.9.10", False), ("2.9", "2.9.1", False), ("2.9.1", None, False), ("2.9.1", "2.9.1+a+b", True),
])
def test_versions_match_with_pep_440_local_labels(pinned, installed, same):
    assert _inventory.versions_match(pinned, installed) is same


class _D:
    def __init__(self, name, version):
        self.name, self.version, self.key = name, version, _dist.canonical_name(name)


def test_drift_names_extra_missing_and_changed_sorted():
    dists = [_D("Zeta", "1"), _D("torch", "2.9.1+cu128"), _D("nvidia_nccl_cu13", "2.27"), _D("numpy", "2.0"), _D("free", "5")]
    wanted = {"torch": {"name": "torch", "version": "2.9.1", "spec": "==2.9.1"},
              "numpy": {"name": "numpy", "version": "1.26", "spec": "==1.26"},
              "free": {"name": "free", "version": None, "spec": ">=1"},
              "apex": {"name": "apex", "version": "0.1", "spec": "==0.1"},
              "absent": {"name": "Absent", "version": None, "spec": ""}}
    assert _inventory.drift(dists, wanted) == {
        "extra": [{"name": "nvidia_nccl_cu13", "version": "2.27"}, {"name": "Zeta", "version": "1"}],
        "missing": [{"name": "Absent", "version": None, "spec": ""}, {"name": "apex", "version": "0.1", "spec": "==0.1"}],
        "changed": [{"name": "numpy", "baseline": "1.26", "installed": "2.0"}],
    }


def test_inventory_of_a_venv_read_from_files_with_baseline_and_integrity(tmp_path):
    env = str(tmp_path / "env")
    site = _make_venv(env)
    _dist_info(site, "torch", "2.9.1+cu128", {"torch/__init__.py": b"t"}, installer="uv")
    _dist_info(site, "nvidia_nccl_cu13", "2.27.7", {"nvidia/nccl/lib/libnccl.so.2": b"nccl"})
    _write(os.path.join(site, "nvidia/nccl/lib/libnccl.so.2"), b"edited")
    bad = _dist_info(site, "bad", "1")
    _write(os.path.join(bad, "RECORD"), "x.py,sha256,1\n")
    _write(os.path.join(site, "broken.pth"), b"\xff\n")
    baseline = _write(str(tmp_path / "req.txt"), "torch==2.9.1\nnumpy==2.0\n")

    def run(argv):
        raise AssertionError("nothing is run to read a venv: %r" % (argv,))
    for venv, python in ((env, None), (None, os.path.join(env, "bin", "python"))):
        result = _inventory.inventory(venv, python, baseline, True, run)
        assert result["changed"] is False and result["count"] == 3 and result["site_dirs"] == [site]
        assert [p["name"] for p in result["packages"]] == ["bad", "nvidia_nccl_cu13", "torch"]
        assert result["packages"][2] == {"name": "torch", "version": "2.9.1+cu128", "location": site, "installer": "uv"}
        assert result["shadowed"] == []
        assert result["drift"] == {"extra": [{"name": "bad", "version": "1"}, {"name": "nvidia_nccl_cu13", "version": "2.27.7"}],
                                   "missing": [{"name": "numpy", "version": "2.0", "spec": "==2.0"}], "changed": []}
        assert result["integrity"] == {"ok": False, "files_checked": 2, "packages": [
            {"name": "nvidia_nccl_cu13", "version": "2.27.7", "missing": [], "modified": ["nvidia/nccl/lib/libnccl.so.2"]}]}
        assert result["problems"] == ["broken.pth is not valid UTF-8 (invalid start byte); read it as Latin-1",
                                      "bad-1.dist-info/RECORD line 1 has a malformed hash 'sha256'"]
    plain = _inventory.inventory(env, None, None, False, run)
    assert "drift" not in plain and "integrity" not in plain


def test_inventory_with_clean_files_is_ok(tmp_path):
    env = str(tmp_path / "env")
    _dist_info(_make_venv(env), "a", "1", {"a.py": b"1", "b.py": b"22"})
    assert _inventory.inventory(env, None, None, True, None)["integrity"] == {"ok": True, "files_checked": 2, "packages": []}


def test_inventory_of_a_baseline_that_cannot_be_read_names_it(tmp_path):
    env = str(tmp_path / "env")
    _make_venv(env)
    for baseline, words in ((str(tmp_path / "none.txt"), "does not exist"), (str(tmp_path), "directory")):
        with pytest.raises(_dist.DistError, match="^baseline %s cannot be read: .*%s" % (baseline, words)):
            _inventory.inventory(env, None, baseline, False, None)
    huge = _write(str(tmp_path / "huge.txt"), b"torch==2.9.1\n" * (2 << 20))
    with pytest.raises(_dist.DistError, match="^baseline %s cannot be read: %s is larger than 16777216 bytes" % (huge, huge)):
        _inventory.inventory(env, None, huge, False, None)
    bad = _write(str(tmp_path / "bad.txt"), "torch===\n")
    with pytest.raises(_dist.DistError, match="bad.txt"):
        _inventory.inventory(env, None, bad, False, None)
