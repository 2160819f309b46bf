# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The environments of the seed incident, as small real wheels.

Names, versions and file layouts are those of the real packages; payloads are tiny. The
shared libraries are real ELF objects compiled with gcc, so DT_NEEDED and sonames are real,
and each CUDA major's copy of a shared file has different bytes, as the real wheels do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from wheelmaker import build_shared_object, build_wheel

# The uv beside the interpreter running the tests (the project's venv), else the one on PATH.
UV = shutil.which("uv", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))

# Installed first: torch cu128 and its CUDA 12 family (as `pip install torch` did).
SEED_BASE = [
    ("torch", "2.8.0+cu128"),
    ("nvidia-cuda-runtime-cu12", "12.8.90"),
    ("nvidia-cublas-cu12", "12.8.4.1"),
    ("nvidia-cudnn-cu12", "9.10.2.21"),
    ("nvidia-nccl-cu12", "2.27.3"),
    ("nvidia-cusparselt-cu12", "0.7.1"),
    ("nvidia-nvshmem-cu12", "3.3.20"),
    ("triton", "3.4.0"),
    ("numpy", "2.2.6"),
    ("safetensors", "0.6.2"),
]

# Installed second: exactly the ten packages the seed uninstalled, same versions.
SEED_ADDED = [
    ("flash-attn-4", "4.0.0b13"),
    ("flash-linear-attention", "0.5.1"),
    ("flashinfer-cubin", "0.6.11.post1"),
    ("flashinfer-python", "0.6.11.post1"),
    ("nvidia-cudnn-cu13", "9.19.0.56"),
    ("nvidia-cusparselt-cu13", "0.8.0"),
    ("nvidia-nccl-cu13", "2.28.9"),
    ("nvidia-nvshmem-cu13", "3.4.5"),
    ("sglang", "0.5.12"),
    ("sglang-kernel", "0.4.2.post2+cu130"),
]

SEED_CUDA13 = {"nvidia-cudnn-cu13", "nvidia-cusparselt-cu13", "nvidia-nccl-cu13", "nvidia-nvshmem-cu13", "sglang-kernel"}
SEED_LEFTOVERS = ["flash-attn-4", "flash-linear-attention", "flashinfer-cubin", "flashinfer-python", "sglang"]

# Files two CUDA majors' wheels both own (the clobbered ones).
SHARED_LIBS = {
    "cudnn": "nvidia/cudnn/lib/libcudnn.so.9",
    "cusparselt": "nvidia/cusparselt/lib/libcusparseLt.so.0",
    "nccl": "nvidia/nccl/lib/libnccl.so.2",
    "nvshmem": "nvidia/nvshmem/lib/libnvshmem_host.so.3",
}

# A consistent CUDA 13 environment: unsuffixed toolkit wheels under nvidia/cu13/lib.
CUDA13_ENV = [
    ("torch", "2.9.0+cu130"),
    ("nvidia-cuda-runtime", "13.0.48"),
    ("nvidia-cublas", "13.0.0.19"),
    ("nvidia-cufft", "12.0.0.15"),
    ("nvidia-nvjitlink", "13.0.39"),
    ("nvidia-cudnn-cu13", "9.13.0.50"),
    ("nvidia-nccl-cu13", "2.27.7"),
    ("cupy-cuda13x", "13.6.0"),
    ("jax-cuda13-plugin", "0.7.2"),
    ("triton", "3.5.0"),
    ("numpy", "2.2.6"),
]


def _so(workdir, soname, needed=(), tag=""):
    return build_shared_object(os.path.join(workdir, "elf", tag or soname), soname, needed, symbol="sym_" + tag)


def _nvidia(outdir, work, name, version, sub, lib_rel, needed=(), tag=""):
    files = {
        "nvidia/__init__.py": "",
        "nvidia/%s/__init__.py" % sub: "",
        lib_rel: _so(work, os.path.basename(lib_rel), needed, tag or name),
    }
    return build_wheel(outdir, name, version, files)


def _torch(outdir, work, version, version_py, needed, tag, init="", requires=()):
    """torch with its torch/version.py and a libtorch_cuda.so linked against needed."""
    return build_wheel(outdir, "torch", version, {
        "torch/__init__.py": init,
        "torch/version.py": version_py,
        "torch/lib/libtorch_cuda.so": _so(work, "libtorch_cuda.so", needed, tag),
    }, requires=requires)


def build_seed_wheels(outdir, work):
    """Write every wheel of the seed incident into outdir; return {name: path}."""
    os.makedirs(outdir, exist_ok=True)
    w = {}
    w["torch"] = _torch(outdir, work, "2.8.0+cu128", "__version__ = '2.8.0+cu128'\ncuda: Optional[str] = '12.8'\n",
                        ["libcudart.so.12", "libcublas.so.12"], "torch128", init="__version__ = '2.8.0+cu128'\n",
                        requires=["nvidia-cuda-runtime-cu12==12.8.90", "nvidia-nccl-cu12==2.27.3", "triton==3.4.0"])
    w["nvidia-cuda-runtime-cu12"] = _nvidia(outdir, work, "nvidia-cuda-runtime-cu12", "12.8.90", "cuda_runtime",
                                            "nvidia/cuda_runtime/lib/libcudart.so.12")
    w["nvidia-cublas-cu12"] = _nvidia(outdir, work, "nvidia-cublas-cu12", "12.8.4.1", "cublas", "nvidia/cublas/lib/libcublas.so.12")
    for sub, (v12, v13) in {
        "cudnn": ("9.10.2.21", "9.19.0.56"),
        "nccl": ("2.27.3", "2.28.9"),
        "cusparselt": ("0.7.1", "0.8.0"),
        "nvshmem": ("3.3.20", "3.4.5"),
    }.items():
        w["nvidia-%s-cu12" % sub] = _nvidia(outdir, work, "nvidia-%s-cu12" % sub, v12, sub, SHARED_LIBS[sub],
                                            ["libcudart.so.12"], tag="%s12" % sub)
        w["nvidia-%s-cu13" % sub] = _nvidia(outdir, work, "nvidia-%s-cu13" % sub, v13, sub, SHARED_LIBS[sub],
                                            ["libcudart.so.13"], tag="%s13" % sub)
    w["triton"] = build_wheel(outdir, "triton", "3.4.0", {"triton/__init__.py": "__version__ = '3.4.0'\n"})
    numpy_ext = _so(work, "_multiarray_umath.so", ["libm.so.6"], "numpy")
    w["numpy"] = build_wheel(outdir, "numpy", "2.2.6", {"numpy/__init__.py": "", "numpy/_core/_multiarray_umath.so": numpy_ext})
    w["safetensors"] = build_wheel(outdir, "safetensors", "0.6.2", {"safetensors/__init__.py": ""})
    w["flash-attn-4"] = build_wheel(outdir, "flash-attn-4", "4.0.0b13", {"flash_attn/cute/__init__.py": ""})
    w["flash-linear-attention"] = build_wheel(outdir, "flash-linear-attention", "0.5.1", {"fla/__init__.py": ""})
    w["flashinfer-cubin"] = build_wheel(outdir, "flashinfer-cubin", "0.6.11.post1", {"flashinfer_cubin/__init__.py": ""})
    w["flashinfer-python"] = build_wheel(outdir, "flashinfer-python", "0.6.11.post1", {"flashinfer/__init__.py": ""},
                                         requires=["flashinfer-cubin==0.6.11.post1", "numpy"])
    w["sglang-kernel"] = build_wheel(outdir, "sglang-kernel", "0.4.2.post2+cu130", {
        "sgl_kernel/__init__.py": "",
        "sgl_kernel/common_ops.abi3.so": _so(work, "common_ops.abi3.so", ["libcudart.so.13"], "sglk"),
    })
    w["sglang"] = build_wheel(outdir, "sglang", "0.5.12", {"sglang/__init__.py": ""},
                              requires=["sglang-kernel==0.4.2.post2", "flashinfer-python==0.6.11.post1",
                                        "torch", "nvidia-nccl-cu13; extra == 'srt'"])
    return w


def build_cuda13_wheels(outdir, work):
    os.makedirs(outdir, exist_ok=True)
    w = {}
    w["torch"] = _torch(outdir, work, "2.9.0+cu130", "cuda = '13.0'\n", ["libcudart.so.13"], "torch130")
    for name, version, lib in (
        ("nvidia-cuda-runtime", "13.0.48", "libcudart.so.13"),
        ("nvidia-cublas", "13.0.0.19", "libcublas.so.13"),
        ("nvidia-cufft", "12.0.0.15", "libcufft.so.12"),
        ("nvidia-nvjitlink", "13.0.39", "libnvJitLink.so.13"),
    ):
        w[name] = build_wheel(outdir, name, version, {
            "nvidia/__init__.py": "", "nvidia/cu13/__init__.py": "",
            "nvidia/cu13/lib/%s" % lib: _so(work, lib, (), "c13" + lib),
        })
    w["nvidia-cudnn-cu13"] = _nvidia(outdir, work, "nvidia-cudnn-cu13", "9.13.0.50", "cudnn", SHARED_LIBS["cudnn"],
                                     ["libcudart.so.13"], tag="cudnn13b")
    w["nvidia-nccl-cu13"] = _nvidia(outdir, work, "nvidia-nccl-cu13", "2.27.7", "nccl", SHARED_LIBS["nccl"],
                                    ["libcudart.so.13"], tag="nccl13b")
    w["cupy-cuda13x"] = build_wheel(outdir, "cupy-cuda13x", "13.6.0", {"cupy/__init__.py": ""})
    w["jax-cuda13-plugin"] = build_wheel(outdir, "jax-cuda13-plugin", "0.7.2", {"jax_cuda13_plugin/__init__.py": ""})
    w["triton"] = build_wheel(outdir, "triton", "3.5.0", {"triton/__init__.py": ""})
    w["numpy"] = build_wheel(outdir, "numpy", "2.2.6", {"numpy/__init__.py": ""})
    return w


def make_venv(path, uv, seed_pip=False):
    """A real venv: `python -m venv` (with pip) or `uv venv` (without)."""
    if seed_pip:
        subprocess.run(["python3", "-m", "venv", path], check=True)
    else:
        subprocess.run([uv, "venv", "--quiet", "--python", "python3", path], check=True)
    return path


def install(uv, venv, wheel_dir, names):
    """Install pinned names from wheel_dir with uv, offline, as the seed's session did."""
    subprocess.run([uv, "pip", "install", "--quiet", "--python", os.path.join(venv, "bin", "python"),
                    "--no-index", "--find-links", wheel_dir] + list(names), check=True)


def pins(pairs):
    """name==version requirements of (name, version) pairs."""
    return ["%s==%s" % p for p in pairs]


def make_seed_venv(path, seed_wheels, uv=UV):
    """The seed's Frankenstein venv, installed in two steps as it happened."""
    venv = make_venv(path, uv)
    install(uv, venv, seed_wheels, pins(SEED_BASE))
    install(uv, venv, seed_wheels, pins(SEED_ADDED))
    return venv
