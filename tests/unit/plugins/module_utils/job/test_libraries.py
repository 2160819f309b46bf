# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_libraries: real processes that really dlopen real shared objects of a real venv, read
back from their /proc/<pid>/maps."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import pytest
from cuda_fixtures import SEED_BASE, UV, install, make_seed_venv, make_venv, pins
from wheelmaker import build_shared_object, build_wheel

from ansible_collections.gpufleet.hygiene.plugins.module_utils.job import _libraries
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._checks import check_libraries
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv

# Loads each path given (RTLD_GLOBAL: a later library's DT_NEEDED is met by an earlier one's
# soname, as the loader does), says so, and waits until its stdin closes.
LOADER = ("import ctypes, sys\n"
          "for p in sys.argv[1:]:\n"
          "    ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)\n"
          "print('loaded', flush=True)\n"
          "sys.stdin.read()\n")


@pytest.fixture
def job():
    """Start a process that dlopens the given paths; stopped at the end of the test."""
    procs = []

    def start(*paths):
        p = subprocess.Popen([sys.executable, "-c", LOADER] + list(paths), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        procs.append(p)
        line = p.stdout.readline()
        assert line == "loaded\n", p.stderr.read() if p.poll() is not None else line
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def site(venv):
    return glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))[0]


def scan(venv):
    """The venv as the readiness read sees it: its distributions, and the contamination check's
    reference and clobbered files."""
    env = Venv(venv, None)
    result = Contamination(env, None, evidence_cache=False).scan()[0]
    return _libraries.VenvIndex(env.distributions, result["clobbered"]), result["reference"]["cuda_major"]


@pytest.fixture
def seed_venv(tmp_path, seed_wheels):
    return make_seed_venv(str(tmp_path / "venv"), seed_wheels)


@pytest.fixture
def cudart13(tmp_path):
    """A libcudart.so.13 outside the venv: the cu13 NCCL's DT_NEEDED, loaded first."""
    build_shared_object(str(tmp_path / "cuda13"), "libcudart.so.13")
    return str(tmp_path / "cuda13" / "libcudart.so.13")


def by_path(reading, pid):
    proc = next(p for p in reading["processes"] if p["pid"] == pid)
    return dict((lib["path"], lib) for lib in proc["libraries"])


def test_seed_case_the_cu13_nccl_in_a_cu128_job_is_named(seed_venv, job, cudart13):
    """The seed: nvidia-nccl-cu13 overwrote libnccl.so.2 in a torch cu128 venv; the job that
    dlopens it maps CUDA 13's NCCL, whose package is the cu13 wheel (the file is its bytes)."""
    sp = os.path.realpath(site(seed_venv))
    cudart12 = sp + "/nvidia/cuda_runtime/lib/libcudart.so.12"
    cublas12 = sp + "/nvidia/cublas/lib/libcublas.so.12"
    torch_lib = sp + "/torch/lib/libtorch_cuda.so"
    nccl = sp + "/nvidia/nccl/lib/libnccl.so.2"
    p = job(cudart12, cublas12, torch_lib, cudart13, nccl)
    index, ref = scan(seed_venv)
    assert ref == 12
    reading = _libraries.mapped_libraries([p.pid], index=index)
    assert reading["problems"] == []
    libs = by_path(reading, p.pid)
    assert set(libs) >= {cudart12, cublas12, torch_lib, nccl, cudart13}
    got = libs[nccl]
    assert got["family"] == "nccl"
    assert got["package"] == "nvidia-nccl-cu13"
    assert sorted(got["owners"]) == ["nvidia-nccl-cu12", "nvidia-nccl-cu13"]
    assert got["cuda_major"] == 13
    assert "links libcudart.so.13 (DT_NEEDED)" in got["evidence"]
    assert _libraries.wrong(got, ref) == ["CUDA 13, torch is CUDA 12"]
    # The job's own CUDA 12 libraries are right.
    assert libs[cudart12]["package"] == "nvidia-cuda-runtime-cu12" and libs[cudart12]["cuda_major"] == 12
    assert libs[torch_lib]["package"] == "torch" and libs[torch_lib]["cuda_major"] == 12
    for path in (cudart12, cublas12, torch_lib):
        assert _libraries.wrong(libs[path], ref) == [], libs[path]
    # The stand-in runtime loaded from outside the venv, which ships libcudart itself: both reasons.
    assert libs[cudart13]["package"] is None and libs[cudart13]["venv_copy"] == cudart12
    assert _libraries.wrong(libs[cudart13], ref) == [
        "CUDA 13, torch is CUDA 12", "mapped from outside the venv, which ships %s" % cudart12]


def test_a_job_of_the_right_major_is_clean(tmp_path, seed_wheels, job):
    """The same venv before the cu13 wheels came: every mapped library is fine."""
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, seed_wheels, pins(SEED_BASE))
    sp = os.path.realpath(site(venv))
    paths = [sp + "/nvidia/cuda_runtime/lib/libcudart.so.12", sp + "/nvidia/cublas/lib/libcublas.so.12",
             sp + "/torch/lib/libtorch_cuda.so", sp + "/nvidia/nccl/lib/libnccl.so.2", sp + "/nvidia/cudnn/lib/libcudnn.so.9"]
    p = job(*paths)
    index, ref = scan(venv)
    libs = by_path(_libraries.mapped_libraries([p.pid], index=index), p.pid)
    assert set(paths) <= set(libs)
    assert libs[paths[3]]["package"] == "nvidia-nccl-cu12" and libs[paths[3]]["cuda_major"] == 12
    assert [(path, _libraries.wrong(lib, ref)) for path, lib in libs.items() if _libraries.wrong(lib, ref)] == []


def test_a_library_deleted_under_the_running_job_is_named_deleted(tmp_path, seed_venv, job):
    """A library removed after the job mapped it: maps says (deleted), and so does the reading."""
    sp = os.path.realpath(site(seed_venv))
    cudart12 = sp + "/nvidia/cuda_runtime/lib/libcudart.so.12"
    cudnn_dir = str(tmp_path / "lib")
    os.makedirs(cudnn_dir)
    gone = os.path.join(cudnn_dir, "libcudnn.so.9")
    shutil.copy(sp + "/nvidia/cudnn/lib/libcudnn.so.9", gone)
    build_shared_object(str(tmp_path / "c13"), "libcudart.so.13")  # the cu13 cuDNN's DT_NEEDED
    p = job(cudart12, str(tmp_path / "c13" / "libcudart.so.13"), gone)
    os.unlink(gone)
    index, ref = scan(seed_venv)
    libs = by_path(_libraries.mapped_libraries([p.pid], index=index), p.pid)
    assert libs[gone]["deleted"] is True
    assert libs[cudart12]["deleted"] is False
    assert "deleted since it was mapped (removed or replaced under the running job)" in _libraries.wrong(libs[gone], ref)
    assert _libraries.wrong(libs[cudart12], ref) == []


def test_a_process_that_exits_is_left_out(seed_venv, job):
    sp = os.path.realpath(site(seed_venv))
    p = job(sp + "/nvidia/cuda_runtime/lib/libcudart.so.12")
    p.kill()
    p.wait()
    index, _ref = scan(seed_venv)
    reading = _libraries.mapped_libraries([p.pid, os.getpid()], index=index)
    assert [q["pid"] for q in reading["processes"]] == [os.getpid()]
    assert reading["problems"] == []


def test_the_node_seam_opens_every_library_through_the_given_opener(seed_venv, job, cudart13):
    """A node reader gives its /proc and an opener resolving inside the container's root: here
    the root is / through a directory handle, and every DT_NEEDED read goes through it."""
    sp = os.path.realpath(site(seed_venv))
    nccl = sp + "/nvidia/nccl/lib/libnccl.so.2"
    p = job(cudart13, nccl)
    root = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    opened = []

    def open_in_root(path):
        opened.append(path)
        return os.open(path.lstrip("/"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=root)

    try:
        index, ref = scan(seed_venv)
        libs = by_path(_libraries.mapped_libraries([p.pid], proc="/proc", open_file=open_in_root, index=index), p.pid)
    finally:
        os.close(root)
    assert nccl in opened and cudart13 in opened
    assert "links libcudart.so.13 (DT_NEEDED)" in libs[nccl]["evidence"]


def test_maps_are_read_within_their_bounds(monkeypatch, job, cudart13):
    p = job(cudart13)
    monkeypatch.setattr(_libraries, "MAPS_CAP", 200)
    problems = []
    data = _libraries.read_maps(p.pid, problems=problems)
    assert len(data) == 200
    assert problems == ["/proc/%d/maps is larger than 200 bytes: truncated at 200 bytes" % p.pid]


@pytest.mark.parametrize("path, family", [
    ("/v/site-packages/nvidia/nccl/lib/libnccl.so.2", "nccl"),
    ("/v/site-packages/nvidia/cudnn/lib/libcudnn_ops.so.9", "cudnn"),
    ("/v/site-packages/nvidia/cusparselt/lib/libcusparseLt.so.0", "cusparselt"),
    ("/v/site-packages/nvidia/cusparse/lib/libcusparse.so.12", "cuda"),
    ("/v/site-packages/nvidia/cublas/lib/libcublasLt.so.12", "cublas"),
    ("/v/site-packages/nvidia/nvshmem/lib/libnvshmem_host.so.3", "nvshmem"),
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.580.95.05", "cuda"),
    ("/v/site-packages/nvidia/cu13/lib/libcudart.so.13", "cuda"),
    ("/v/site-packages/torch/lib/libtorch_cuda.so", "torch"),
    ("/v/site-packages/torch/lib/libc10.so", "torch"),
    ("/v/site-packages/torch/_C.cpython-311-x86_64-linux-gnu.so", "torch"),
    ("/v/site-packages/triton/_C/libtriton.so", "triton"),
    ("/usr/lib/x86_64-linux-gnu/libc.so.6", None),
    ("/usr/lib/x86_64-linux-gnu/libcudaX.so.1", None),
    ("/v/site-packages/torch/lib/readme.txt", None),
    # What an NVIDIA H200's torch job really maps beside its libraries (the image's venv lives
    # under /opt/torch/): numpy's extensions, and the helper module Triton compiled into its cache.
    ("/opt/torch/.venv/lib/python3.12/site-packages/numpy/random/_mt19937.cpython-312-x86_64-linux-gnu.so", None),
    ("/srv/job/triton/XU5DT2AO5BD5AEHEYGLPP5LRDF/cuda_utils.cpython-312-x86_64-linux-gnu.so", None),
    ("/opt/torch/.venv/lib/python3.12/site-packages/torch/lib/libtorch.so", "torch"),
])
def test_families(path, family):
    assert _libraries.family(path) == family


def test_processes_left_when_the_time_is_up_are_named(seed_venv, job, cudart13):
    p = job(cudart13)
    reading = _libraries.mapped_libraries([p.pid, p.pid, os.getpid()], seconds=0)
    assert reading["processes"] == []
    assert reading["problems"] == ["2 process(es) not read within 0s: %s" % ", ".join(str(x) for x in sorted({p.pid, os.getpid()}))]


def _reading(venv, pids):
    """What the readiness read gives check_libraries: the processes' libraries and the reference."""
    env = Venv(venv, None)
    result = Contamination(env, None, evidence_cache=False).scan()[0]
    found = _libraries.mapped_libraries(pids, index=_libraries.VenvIndex(env.distributions, result["clobbered"]))
    found.update(reference=result["reference"])
    return found


def test_a_library_of_an_older_major_than_torch_s_is_wrong_too(tmp_path, seed_venv, job):
    """A CUDA 11 NVRTC (which the venv does not ship: no other reason) in torch cu128's job is
    named: a major below the reference is as wrong as one above it."""
    build_shared_object(str(tmp_path / "cuda11"), "libnvrtc.so.11.2")
    old = str(tmp_path / "cuda11" / "libnvrtc.so.11.2")
    p = job(old)
    reading = _reading(seed_venv, [p.pid])
    lib = by_path(reading, p.pid)[old]
    assert (lib["cuda_major"], lib["outside_venv"], lib["deleted"]) == (11, False, False)
    assert _libraries.wrong(lib, 12) == ["CUDA 11, torch is CUDA 12"]
    check = check_libraries(reading)
    assert (check["ok"], [(b["path"], b["reasons"]) for b in check["libraries"]]) == (
        False, [(old, ["CUDA 11, torch is CUDA 12.8"])])


@pytest.fixture
def ext_venv(tmp_path):
    """A venv whose torch (cu128) ships a Python extension module, torch/_C.cpython-311-x86_64-linux-gnu.so,
    and libtorch_cuda.so; and another venv's copies of both, outside it."""
    work = str(tmp_path / "work")
    wheels = str(tmp_path / "wheels")
    os.makedirs(wheels)
    ext = "_C.cpython-311-x86_64-linux-gnu.so"
    build_wheel(wheels, "torch", "2.8.0+cu128", {
        "torch/__init__.py": "", "torch/version.py": "cuda = '12.8'\n",
        "torch/" + ext: build_shared_object(os.path.join(work, "ext"), ext),
        "torch/lib/libtorch_cuda.so": build_shared_object(os.path.join(work, "lib"), "libtorch_cuda.so"),
    })
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, wheels, ["torch==2.8.0+cu128"])
    other = tmp_path / "other" / "lib" / "python3.11" / "site-packages" / "torch"
    os.makedirs(other / "lib")
    shutil.copy(os.path.join(work, "ext", ext), str(other / ext))
    shutil.copy(os.path.join(work, "lib", "libtorch_cuda.so"), str(other / "lib" / "libtorch_cuda.so"))
    return venv, str(other / ext), str(other / "lib" / "libtorch_cuda.so")


def test_only_a_library_named_by_its_soname_is_judged_mapped_from_outside_the_venv(ext_venv, job):
    """Another venv's torch extension module and libtorch_cuda.so, both of names the venv ships:
    the library (lib*.so*) is mapped from outside the venv; the extension module's name says
    nothing of which library it is, so it is not."""
    venv, ext, lib = ext_venv
    p = job(lib, ext)
    libs = by_path(_reading(venv, [p.pid]), p.pid)
    sp = os.path.realpath(site(venv))
    assert (libs[lib]["family"], libs[lib]["outside_venv"], libs[lib]["venv_copy"]) == (
        "torch", True, sp + "/torch/lib/libtorch_cuda.so")
    assert (libs[ext]["family"], libs[ext]["outside_venv"], libs[ext]["venv_copy"]) == ("torch", False, None)
    assert _libraries.wrong(libs[ext], 12) == []


MAPPER = ("import mmap, os, sys\n"
          "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
          "held = [mmap.mmap(fd, 4096, prot=mmap.PROT_READ) for _ in range(int(sys.argv[2]))]\n"
          "print('mapped', flush=True)\n"
          "sys.stdin.read()\n")


def test_maps_are_read_up_to_16_mib_and_no_further(tmp_path):
    """A real process whose maps runs past 16 MiB (one file of a ~3900-character path mapped
    4400 times, each a line of its own): its first 16 MiB are read, and the cut is said."""
    path = str(tmp_path)
    while len(path) < 3700:
        path = os.path.join(path, "d" * 200)
    os.makedirs(path)
    path = os.path.join(path, "mapped.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * 4096)
    p = subprocess.Popen([sys.executable, "-c", MAPPER, path, "4400"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "mapped\n", p.stderr.read()
        with open("/proc/%d/maps" % p.pid, "rb") as f:
            whole = f.read()
        problems = []
        data = _libraries.read_maps(p.pid, problems=problems)
    finally:
        p.kill()
        p.wait()
    assert len(whole) > (16 << 20) + 4096
    assert (len(data), data == whole[:16 << 20]) == (16 << 20, True)
    assert problems == ["/proc/%d/maps is larger than 16777216 bytes: truncated at 16777216 bytes" % p.pid]


@pytest.fixture
def cupti13_venv(tmp_path):
    """A torch cu130 venv shipping CUPTI 13 (nvidia/cu13/lib/libcupti.so.13), and a CUDA 12 CUPTI
    outside it (libcupti.so.12, linking its libcudart.so.12)."""
    work = str(tmp_path / "work")
    wheels = str(tmp_path / "wheels")
    os.makedirs(wheels)
    build_wheel(wheels, "torch", "2.9.0+cu130", {
        "torch/__init__.py": "", "torch/version.py": "cuda = '13.0'\n",
        "torch/lib/libtorch_cuda.so": build_shared_object(os.path.join(work, "torch"), "libtorch_cuda.so"),
    })
    build_wheel(wheels, "nvidia-cuda-cupti", "13.0.48", {
        "nvidia/__init__.py": "", "nvidia/cu13/__init__.py": "",
        "nvidia/cu13/lib/libcupti.so.13": build_shared_object(os.path.join(work, "cupti13"), "libcupti.so.13"),
    })
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, wheels, ["torch==2.9.0+cu130", "nvidia-cuda-cupti==13.0.48"])
    build_shared_object(str(tmp_path / "cuda12"), "libcupti.so.12", needed=["libcudart.so.12"])
    return venv, str(tmp_path / "cuda12")


def test_a_deleted_library_keeps_the_major_its_soname_says(cupti13_venv, job):
    """A CUDA 12 CUPTI from outside the venv, deleted under a CUDA 13 job: its file is gone (its
    DT_NEEDED cannot be read), and its soname still says CUDA 12, which the reasons name."""
    venv, cuda12 = cupti13_venv
    cupti12 = os.path.join(cuda12, "libcupti.so.12")
    p = job(os.path.join(cuda12, "libcudart.so.12"), cupti12)
    os.unlink(cupti12)  # the CUDA 12 toolkit removed under the running job
    reading = _reading(venv, [p.pid])
    lib = by_path(reading, p.pid)[cupti12]
    copy = os.path.realpath(site(venv)) + "/nvidia/cu13/lib/libcupti.so.13"
    assert (lib["deleted"], lib["cuda_major"], lib["evidence"], lib["venv_copy"]) == (True, 12, ["soname libcupti.so.12"], copy)
    reasons = ["CUDA 12, torch is CUDA 13.0", "mapped from outside the venv, which ships %s" % copy,
               "deleted since it was mapped (removed or replaced under the running job)"]
    assert _libraries.wrong(lib, 13, "torch is CUDA 13.0") == reasons
    check = check_libraries(reading)
    assert [(b["path"], b["cuda_major"], b["reasons"]) for b in check["libraries"] if b["path"] == cupti12] == [
        (cupti12, 12, reasons)]
    assert "%s (no package of the venv): %s" % (cupti12, "; ".join(reasons)) in check["summary"]


@pytest.mark.parametrize("name, major", [
    ("libcupti.so.12", 12), ("libcupti.so.13", 13), ("libcupti.so.11.8", 11),
    ("libcupti.so.2025.1.1", None),  # a toolkit's file behind the soname's link: its name says no CUDA major
    ("libcudart.so.12", 12), ("libnccl.so.2", None), ("libcufft.so.12", None),
])
def test_the_major_a_deleted_library_s_name_says(name, major):
    lib = _libraries.judge_library("/usr/local/cuda/lib64/" + name, True, None)
    assert (lib["cuda_major"], lib["evidence"]) == (major, ["soname %s" % name] if major else [])
