# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_cuda: the CUDA evidence layers (version labels, name families, files, expected_cuda),
one input at a time. The RECORD and METADATA parsers these layers read through are tested in
test_dist.py, the ELF reader in test_elf.py."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _cuda, _dist


@pytest.mark.parametrize("version, expected", [
    ("2.8.0+cu128", (12, "12.8")),
    ("2.9.0+cu130", (13, "13.0")),
    ("2.1.0+cu118", (11, "11.8")),
    ("0.4.2.post2+cu130", (13, "13.0")),
    ("2.8.3+pt28cu128", (12, "12.8")),
    ("1.0+cu12torch2.8", (12, None)),
    ("1.13.1+cu92", (9, "9.2")),
    ("2.8.0+cpu", None),
    ("2.8.0+rocm6.4", None),
    ("2.8.0", None),
    ("", None),
])
def test_label(version, expected):
    assert _cuda.label_cuda(version) == expected


@pytest.mark.parametrize("name, version, major", [
    ("nvidia-cudnn-cu13", "9.19.0.56", 13),
    ("nvidia-nccl-cu12", "2.27.3", 12),
    ("nvidia-cuda-runtime-cu12", "12.8.90", 12),
    ("nixl-cu12", "0.6.0", 12),
    ("cupy-cuda12x", "13.6.0", 12),
    ("cupy-cuda13x", "13.6.0", 13),
    ("cupy-cuda117", "10.6.0", 11),
    ("jax-cuda13-plugin", "0.7.2", 13),
    ("jax-cuda12-pjrt", "0.7.2", 12),
    ("tensorrt-cu12-libs", "10.13.3.9", 12),
    ("nvidia-cublas", "13.0.0.19", 13),
    ("nvidia-cuda-runtime", "13.0.48", 13),
    ("cuda-bindings", "13.0.1", 13),
    ("cuda-python", "12.9.0", 12),
    ("nvidia-cufft", "12.0.0.15", None),   # cuFFT's version does not follow CUDA
    ("nvidia-cusparse", "12.6.2.49", None),
    ("cuda-pathfinder", "1.2.3", None),
    ("flashinfer-python", "0.6.11.post1", None),
    ("numba-cuda", "0.19.1", None),
    ("pycuda", "2025.1", None),
])
def test_name_family(name, version, major):
    found = _cuda.name_cuda(_dist.canonical_name(name), version)
    assert (found[0] if found else None) == major


@pytest.mark.parametrize("path, major", [
    ("nvidia/cu13/lib/libcufft.so.12", 13),
    ("nvidia/cuda_runtime/lib/libcudart.so.12", 12),
    ("nvidia/cublas/lib/libcublasLt.so.12", 12),
    ("nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8", 12),
    ("x/libnvJitLink.so.13", 13),
    ("nvidia/cusparse/lib/libcusparse.so.12", None),
    ("nvidia/nccl/lib/libnccl.so.2", None),
    ("torch/lib/libtorch_cuda.so", None),
])
def test_file_layer(path, major):
    found = _cuda.file_cuda(path)
    assert (found[0] if found else None) == major


@pytest.mark.parametrize("value, expected", [("12.8", (12, "12.8")), ("13", (13, "13")), (" 12 ", (12, "12"))])
def test_expected_cuda_ok(value, expected):
    assert _cuda.parse_expected(value) == expected


@pytest.mark.parametrize("value", ["twelve", "12.x", "v12", "12.8.1", "", "0", "-1", "1e3", "12;rm -rf /"])
def test_expected_cuda_bad(value):
    with pytest.raises(_cuda.CudaError, match="expected_cuda"):
        _cuda.parse_expected(value)


@pytest.mark.parametrize("name", ["foo-cu08", "foo-cu00-libs", "cupy-cuda09x", "bar-cuda01"])
def test_a_name_numbered_cuda_0x_is_no_evidence_since_no_cuda_0_exists(name):
    # As a version label cu0x is none (test_label): a CUDA 0 would flag the package in every venv.
    assert _cuda.name_cuda(_dist.canonical_name(name), "1.0") is None
