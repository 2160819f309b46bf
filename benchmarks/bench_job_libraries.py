# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the job_libraries check costs one container's read, in-process, side by side.

Usage: .venv/bin/python benchmarks/bench_job_libraries.py [--rounds 40] [--contaminated]

Builds the seed's venv (tests/lib/cuda_fixtures.py: torch +cu128 and NVIDIA wheels with real ELF
payloads, installed by uv; with --contaminated the CUDA-13 wheels too) and starts a job process
that loads the venv's CUDA runtime and NCCL with dlopen, as torch does. Then reads it with the
readiness read (readiness/_readiness.read(), as node_readiness runs it for each container:
evidence cache off) with job_libraries on and off, interleaved round by round (round 0 not
counted), and prints the medians of the read's CPU time (this process's, the reads' threads
included) and wall time, and the ratio on/off. The fleet benchmark (bench_fleet.py, B against
BL) measures the same check end to end, where the round-to-round spread of a whole preflight on
two shared cores is larger than the check.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
sys.path.insert(0, os.path.join(ROOT, ".ansible", "collections"))

import cuda_fixtures  # noqa: E402 - tests/lib, put on the path above

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options, _readiness  # noqa: E402 - importable only once .ansible/collections (the collection link) is on sys.path, above

JOB = "import ctypes, sys, time\n[ctypes.CDLL(p) for p in sys.argv[2:]]\ntime.sleep(3600)\n"
TAG = "gpufleet_bench_job_zq7"


def options(venv, job_libraries):
    p = {name: spec.get("default") for name, spec in _options.ARGUMENT_SPEC.items()}
    p.update(job_patterns=[TAG], venv=venv, job_libraries=job_libraries, evidence_cache=False, require_gpu=False)
    return p


def run(argv, **_kw):
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    return res.returncode, res.stdout.decode(), res.stderr.decode()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--contaminated", action="store_true", help="the CUDA-13 wheels installed over the venv too")
    args = ap.parse_args(argv)
    uv = os.path.join(ROOT, ".venv", "bin", "uv")
    with tempfile.TemporaryDirectory(prefix="bench-job-libraries-") as work:
        wheels = os.path.join(work, "wheels")
        cuda_fixtures.build_seed_wheels(wheels, os.path.join(work, "build"))
        venv = cuda_fixtures.make_venv(os.path.join(work, "venv"), uv)
        cuda_fixtures.install(uv, venv, wheels, cuda_fixtures.pins(cuda_fixtures.SEED_BASE))
        if args.contaminated:
            cuda_fixtures.install(uv, venv, wheels, cuda_fixtures.pins(cuda_fixtures.SEED_ADDED))
        site = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))[0]
        libs = [os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so.12"),
                os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so.2")]
        job = subprocess.Popen([sys.executable, "-c", JOB, TAG] + libs)
        try:
            time.sleep(1.0)
            gpus = {"gpus": [], "apps": [], "backend": None, "seconds": 0.0}
            cpu = {True: [], False: []}
            wall = {True: [], False: []}
            mapped = None
            for n in range(args.rounds + 1):
                for on in ((True, False) if n % 2 else (False, True)):
                    c0, w0 = time.process_time(), time.perf_counter()
                    result = _readiness.read(options(venv, on), run, lambda _name: None, gpu_reading=gpus)
                    c1, w1 = time.process_time(), time.perf_counter()
                    if n:
                        cpu[on].append(c1 - c0)
                        wall[on].append(w1 - w0)
                    if on:
                        mapped = sum(len(p["libraries"]) for p in result["job_libraries"]["processes"])
        finally:
            job.kill()
            job.wait()
    print("%s, %d CPUs, Python %s; %d rounds interleaved; the job maps %d CUDA libraries of the venv%s" % (
        platform.machine(), os.cpu_count(), platform.python_version(), args.rounds, mapped,
        " (contaminated venv)" if args.contaminated else ""))
    print("| read | CPU (median) | wall (median) |")
    print("| --- | ---: | ---: |")
    for on in (True, False):
        row = ("on" if on else "off", statistics.median(cpu[on]) * 1e3, statistics.median(wall[on]) * 1e3)
        print("| job_libraries %s | %.2f ms | %.2f ms |" % row)
    print("on/off: CPU %.3fx, wall %.3fx; the check's CPU: %.2f ms a container" % (
        statistics.median(cpu[True]) / statistics.median(cpu[False]), statistics.median(wall[True]) / statistics.median(wall[False]),
        (statistics.median(cpu[True]) - statistics.median(cpu[False])) * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
