# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A realistic fleet of per-host results (the verify role's schema) for the report tests.

Three Proxmox nodes with four containers each: one contaminated with CUDA 13 wheels, one with a
stale training process holding GPU memory, one with a stale compile cache, one running a healthy
job (left alone), one remediated by this run, one with baseline drift (a warning), one stopped
container, the rest clean.
"""

from __future__ import annotations

import copy

H200 = "NVIDIA H200"
H200_MIB = 143771
RUN_STARTED = "2025-06-01T03:00:00Z"
VENV_SUMMARY = "3 CUDA 13 wheels in a CUDA 12.8 venv: nvidia-nccl-cu13, nvidia-cublas 13.0.0.19, cupy-cuda13x; 2 files overwritten"


def _gpu(index, used=0, procs=(), util=0):
    return {
        "index": index, "name": H200, "uuid": "GPU-5e1c%04d-8a2f-4b1d-9c3e-%012d" % (index, index),
        "memory_used_mib": used, "memory_total_mib": H200_MIB, "utilization_pct": util,
        "processes": [{"pid": pid, "name": name, "used_memory_mib": mem} for pid, name, mem in procs],
    }


def _checks(**bad):
    """The four verify checks, all passing unless given as name=(ok, severity, summary)."""
    ok = {
        "gpu_idle": "no process holds the GPUs",
        "venv_clean": "torch 2.8.0+cu128; 184 packages, none for another CUDA major",
        "packages": "matches the baseline",
        "caches_fresh": "inductor, triton and CUDA caches match torch 2.8.0 / CUDA 12.8",
    }
    out = []
    for name, summary in ok.items():
        if name in bad:
            good, severity, text = bad[name]
            out.append({"name": name, "ok": good, "severity": severity, "summary": text})
        else:
            out.append({"name": name, "ok": True, "severity": "fail", "summary": summary})
    return out


def _host(node, vmid, name, **kw):
    h = {
        "host": name, "node": node, "vmid": vmid, "ready": True, "running_job": False, "remediated": False,
        "checks": _checks(), "gpus": [_gpu(0)], "contaminants": [],
        "caches": [
            {"name": "inductor", "path": "/tmp/torchinductor_trainer", "size_bytes": 412 * 1024 * 1024, "entries": 1834, "fresh": True},
            {"name": "triton", "path": "/home/trainer/.triton/cache", "size_bytes": 96 * 1024 * 1024, "entries": 211, "fresh": True},
        ],
        "error": None,
    }
    h.update(kw)
    return h


def realistic_fleet():
    fleet = [
        _host("pve1", 101, "train-a1", ready=False,
              checks=_checks(venv_clean=(False, "fail", VENV_SUMMARY)),
              contaminants=[{"name": "nvidia-nccl-cu13", "version": "2.28.9", "cuda_major": 13},
                            {"name": "nvidia-cublas", "version": "13.0.0.19", "cuda_major": 13},
                            {"name": "cupy-cuda13x", "version": "13.6.0", "cuda_major": 13}]),
        _host("pve1", 102, "train-a2"),
        _host("pve1", 103, "train-a3", running_job=True,
              checks=_checks(gpu_idle=(True, "fail", "held by the running training job (torchrun, 2 ranks), left alone")),
              gpus=[_gpu(0, 118212, [(48211, "python3 train.py --rank 0", 118000)], 97),
                    _gpu(1, 117960, [(48212, "python3 train.py --rank 1", 117748)], 96)]),
        _host("pve1", 104, "train-a4"),
        _host("pve2", 201, "train-b1", ready=False,
              checks=_checks(gpu_idle=(False, "fail", "pid 40170 (python3) holds 61.2 GiB on GPU0; no training session owns it")),
              gpus=[_gpu(0, 62710, [(40170, "/opt/venv/bin/python3", 62684)], 0)]),
        _host("pve2", 202, "train-b2", remediated=True,
              checks=_checks(caches_fresh=(True, "fail", "inductor cache cleared this run (was built for CUDA 13.0)"))),
        _host("pve2", 203, "train-b3",
              checks=_checks(packages=(False, "warn", "2 extra packages not in the baseline: sglang 0.5.2, flashinfer-python 0.3.1"))),
        _host("pve2", 204, "train-b4"),
        _host("pve3", 301, "train-c1", ready=False,
              checks=_checks(caches_fresh=(False, "fail", "inductor cache built for torch 2.8.0+cu130; the venv is now CUDA 12.8")),
              caches=[{"name": "inductor", "path": "/tmp/torchinductor_trainer", "size_bytes": 2_840_000_000, "entries": 9421, "fresh": False},
                      {"name": "triton", "path": "/home/trainer/.triton/cache", "size_bytes": 310_000_000, "entries": 655, "fresh": True}]),
        _host("pve3", 302, "train-c2"),
        _host("pve3", 303, "train-c3"),
        _host("pve3", 304, "train-c4", ready=False, checks=[], gpus=[], caches=[],
              error="container '304' not running!"),
    ]
    return copy.deepcopy(fleet)


HOSTILE_NAME = '<script>alert("x")</script>&"\'\\\n\x01bad'


def hostile_fleet():
    """Names and summaries an attacker controls (a container name, a process's argv)."""
    return [{
        "host": HOSTILE_NAME, "node": 'pve"1\\', "vmid": 100, "ready": False, "running_job": False, "remediated": False,
        "checks": [{"name": "gpu_idle", "ok": False, "severity": "fail", "summary": '<img src=x onerror=alert(1)> held by "evil"'}],
        "gpus": [_gpu(0, 1000, [(4242, '<b onmouseover="alert(2)">python3</b>', 1000)])],
        "contaminants": [{"name": "<i>cupy</i>", "version": "13&1", "cuda_major": 13}],
        "caches": [{"name": "inductor", "path": "/tmp/<x>", "size_bytes": 1, "entries": 1, "fresh": False}],
        "error": None,
    }]
