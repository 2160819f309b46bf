# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A package that carries libraries of two CUDA majors, in a real venv, judged by cuda_contamination.

Such a package (a "fat" build shipping a CUDA 12 and a CUDA 13 copy of its kernels) runs with
either major: it is no contaminant when the reference is one of its majors, and a contaminant
naming both when the reference is neither. Judging it by its newest major only would call it a
contaminant of every CUDA 12 venv: these tests fail on that.
"""

from __future__ import annotations

import os

import pytest
from cuda_fixtures import UV, install, make_venv
from wheelmaker import build_shared_object, build_wheel

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _restore
from ansible_collections.gpufleet.hygiene.plugins.modules import cuda_contamination

pytestmark = pytest.mark.slow

# name: (layer that decides, evidence of CUDA 12, evidence of CUDA 13)
MIXED = {
    "fat-kernels": ("files", "nvidia/cu12/lib/libfat_kernels.so", "nvidia/cu13/lib/libfat_kernels.so"),
    "dual-ops": ("binaries", "dual_ops/_ops_cu12.so links libcudart.so.12 (DT_NEEDED)",
                 "dual_ops/_ops_cu13.so links libcudart.so.13 (DT_NEEDED)"),
}


@pytest.fixture(scope="module")
def mixed_venv(tmp_path_factory):
    """torch 2.8.0+cu128 and two packages of both majors: one says so by its install paths
    (layer files), one only by what its shared objects link (layer binaries)."""
    root = tmp_path_factory.mktemp("mixed")
    wheels, work = str(root / "w"), str(root / "work")
    os.makedirs(wheels)
    build_wheel(wheels, "torch", "2.8.0+cu128", {"torch/__init__.py": ""})
    build_wheel(wheels, "fat-kernels", "1.0", {
        "nvidia/cu12/lib/libfat_kernels.so": build_shared_object(os.path.join(work, "f12"), "libfat_kernels.so", symbol="f12"),
        "nvidia/cu13/lib/libfat_kernels.so": build_shared_object(os.path.join(work, "f13"), "libfat_kernels.so", symbol="f13"),
    })
    build_wheel(wheels, "dual-ops", "1.0", {
        "dual_ops/__init__.py": "",
        "dual_ops/_ops_cu12.so": build_shared_object(os.path.join(work, "d12"), "_ops_cu12.so", ["libcudart.so.12"], symbol="d12"),
        "dual_ops/_ops_cu13.so": build_shared_object(os.path.join(work, "d13"), "_ops_cu13.so", ["libcudart.so.13"], symbol="d13"),
    })
    venv = make_venv(str(root / "venv"), UV)
    install(UV, venv, wheels, ["torch==2.8.0+cu128", "fat-kernels==1.0", "dual-ops==1.0"])
    return venv


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(_restore, "STATE_DIR", str(tmp_path / "state" / "restore"))


def _judged(run_module, venv, expected_cuda):
    args = dict(venv=venv)
    if expected_cuda:
        args["expected_cuda"] = expected_cuda
    result = run_module(cuda_contamination.main, args)
    assert not result.get("failed"), result
    return result


@pytest.mark.parametrize("expected_cuda, ref_major", [(None, 12), ("13.0", 13)],
                         ids=["reference_12_its_older_major", "reference_13_its_newer_major"])
def test_a_package_of_two_majors_is_no_contaminant_when_one_of_them_is_the_reference(
        run_module, mixed_venv, expected_cuda, ref_major):
    result = _judged(run_module, mixed_venv, expected_cuda)
    assert result["reference"]["cuda_major"] == ref_major
    flagged = {c["name"] for c in result["contaminants"]}
    assert not flagged & set(MIXED), result["contaminants"]
    # judged, not overlooked: neither is "unknown" (no evidence) either
    assert not set(result["unknown"]) & set(MIXED)


def test_a_package_of_two_majors_is_a_contaminant_naming_both_when_neither_is_the_reference(run_module, mixed_venv):
    result = _judged(run_module, mixed_venv, "11.8")
    assert result["reference"]["cuda_major"] == 11
    flagged = {c["name"]: c for c in result["contaminants"]}
    for name, (layer, cu12, cu13) in MIXED.items():
        assert flagged[name]["layer"] == layer
        evidence = "\n".join(flagged[name]["evidence"])
        assert cu12 in evidence and cu13 in evidence, flagged[name]["evidence"]
