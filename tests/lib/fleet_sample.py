# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A realistic fleet of per-host results (the verify role's schema) for the report tests.

Three Proxmox nodes with four containers each: one contaminated with CUDA 13 wheels, one with a
stale training process holding GPU memory (and an Xid 48 on that GPU), one with a stale compile
cache, one running a job (left alone) at 64% of its baseline throughput on a GPU the hardware
slows down (a warning), one remediated by this run, one with baseline drift (a warning), one
stopped container, the rest clean. Every reachable container has job_live (with the job's last
tok/s where its log has one) and gpu_healthy.
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


DRIVER = {"version": "570.133.20", "pin": "570.133.20"}
BASELINE = 20000.0


def _health(index, findings=(), throttle=()):
    """A GPU of gpu_healthy's record: healthy unless it has a fail-severity finding."""
    return {
        "index": index, "uuid": "GPU-5e1c%04d-8a2f-4b1d-9c3e-%012d" % (index, index), "name": H200,
        "healthy": not any(f["severity"] == "fail" for f in findings), "findings": [dict(f) for f in findings],
        "xid_events": dict((f["code"][4:], 1) for f in findings if f["code"].startswith("xid_")),
        "ecc": {"volatile_uncorrected": 0, "aggregate_uncorrected": 0}, "remapped_rows": {"pending": False, "failed": False},
        "throttle": list(throttle), "pcie": {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16},
        "persistence_mode": True, "mig": {"current": False, "pending": False, "instances": None},
    }


def gpu_healthy(gpus=(0,), findings=None, throttle=None):
    """gpu_healthy's check record; findings and throttle are {gpu index: [...]}."""
    findings, throttle = findings or {}, throttle or {}
    health = [_health(i, findings.get(i, ()), throttle.get(i, ())) for i in gpus]
    bad = [f for g in health for f in g["findings"]]
    worst = "fail" if any(f["severity"] == "fail" for f in bad) else "warn"
    summary = "; ".join("GPU %s: %s" % (g["index"], f["what"]) for g in health for f in g["findings"]) or \
        "%d GPU(s) healthy, driver %s" % (len(health), DRIVER["version"])
    return {"name": "gpu_healthy", "ok": not bad, "severity": worst if bad else "fail", "summary": summary,
            "error": None, "gpus": health, "driver": dict(DRIVER), "findings": []}


def job_live(state="none", tokens_per_s=None):
    text = {"none": "no job running", "running": "job running (pid 48211), its log grew 2.1s ago"}[state]
    rate = None
    if tokens_per_s is not None:
        rate = {"tokens_per_s": tokens_per_s, "baseline": BASELINE, "ratio": round(tokens_per_s / BASELINE, 4)}
        text += "; last %.0f tok/s (%.0f%% of the %.0f baseline)" % (tokens_per_s, rate["ratio"] * 100, BASELINE)
    out = {"name": "job_live", "ok": True, "severity": "fail", "summary": text}
    if rate:
        out["throughput"] = rate
    return out


XID_48 = {"code": "xid_48", "severity": "fail", "what": "Xid 48: double-bit ECC error (uncorrectable) at 02:58:11",
          "action": "drain the GPU, reset it (nvidia-smi -r); RMA if it recurs"}
SLOWDOWN = {"code": "throttle_hw_slowdown", "severity": "warn", "what": "clocks throttled: hardware slowdown",
            "action": "check cooling and power; drain if it persists"}


def _checks(**bad):
    """The verify checks, all passing unless given as name=(ok, severity, summary), or as a whole
    record (job_live, gpu_healthy)."""
    ok = {
        "gpu_idle": "no process holds the GPUs",
        "job_live": job_live(),
        "venv_clean": "torch 2.8.0+cu128; 184 packages, none for another CUDA major",
        "packages": "matches the baseline",
        "caches_fresh": "inductor, triton and CUDA caches match torch 2.8.0 / CUDA 12.8",
        "gpu_healthy": gpu_healthy(),
    }
    out = []
    for name, summary in ok.items():
        given = bad.get(name, summary)
        if isinstance(given, dict):
            out.append(given)
        elif name in bad:
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
        "repair_error": None,
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
              checks=_checks(gpu_idle=(True, "fail", "held by the running training job (torchrun, 2 ranks), left alone"),
                             job_live=job_live("running", 12800.0),
                             gpu_healthy=gpu_healthy((0, 1), findings={1: [SLOWDOWN]}, throttle={1: ["hw_slowdown"]})),
              gpus=[_gpu(0, 118212, [(48211, "python3 train.py --rank 0", 118000)], 97),
                    _gpu(1, 117960, [(48212, "python3 train.py --rank 1", 117748)], 96)]),
        _host("pve1", 104, "train-a4"),
        _host("pve2", 201, "train-b1", ready=False,
              checks=_checks(gpu_idle=(False, "fail", "pid 40170 (python3) holds 61.2 GiB on GPU0; no training session owns it"),
                             gpu_healthy=gpu_healthy(findings={0: [XID_48]})),
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
        "checks": [{"name": "gpu_idle", "ok": False, "severity": "fail", "summary": '<img src=x onerror=alert(1)> held by "evil"'},
                   job_live("running", 1234.0),
                   dict(gpu_healthy(findings={0: [{"code": "<u>x</u>", "severity": "fail", "what": '<svg onload="alert(3)">Xid</svg>',
                                                   "action": "<a href=x>reset</a>"}]}),
                        driver={"version": "<em>570</em>", "pin": "570.133.20"})],
        "gpus": [_gpu(0, 1000, [(4242, '<b onmouseover="alert(2)">python3</b>', 1000)])],
        "contaminants": [{"name": "<i>cupy</i>", "version": "13&1", "cuda_major": 13}],
        "caches": [{"name": "inductor", "path": "/tmp/<x>", "size_bytes": 1, "entries": 1, "fresh": False}],
        "error": None,
        "repair_error": None,
    }]
