# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The verify role's checks: each of a reading's parts judged (gpu_idle, job_live, job_config,
job_libraries, venv_clean, packages, caches_fresh, gpu_healthy), judge() for all of them.

The reads are readiness/_readiness.py's; they call judge() on what they read. Judged here on the
target, so that the controller only records the checks (templating them in Jinja cost the
controller more than the reads).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import re
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._findings import check_record
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._libraries import wrong
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import MIN_FRACTION
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import canonical_name

# Each check is {name, severity, ok, summary}; the summaries are the role's one line per check.


def own_job(job, live):
    """The inventory's own job holding the GPUs, in words: its PIDs, how long it has run, its
    last throughput; what to do when preflight wants the GPUs free."""
    procs = job.get("processes", [])
    starts = [p.get("started_at") for p in procs if p.get("started_at") is not None]
    parts = ["pid %s" % ", ".join(str(p["pid"]) for p in procs)]
    if starts:
        parts.append("started %s" % time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(min(starts))))
    rate = _rate((live or {}).get("throughput") or {"tokens_per_s": None})
    if rate:
        parts.append(rate)
    return ("held by the inventory's own job (%s): stop it first if a new run needs these GPUs, or let it run with "
            "-e gpufleet_allow_running_job=true" % ", ".join(parts))


def check_gpu(gpu, job, allow_running_job, live=None):
    # The job's holders: its processes and its workers (their descendants holding a GPU).
    job_pids = [p["pid"] for p in job.get("processes", [])] + list((live or {}).get("workers") or ())
    gpus = gpu.get("gpus", [])
    busy = [g for g in gpus if not g["idle"]]
    foreign = [h for g in gpus for h in g["processes"] if h["pid"] not in job_pids]
    # A failed read has no `gpus` (a host without GPU under require_gpu=false has an empty list):
    # it fails the check whatever gpu_available says.
    error = "gpus" not in gpu
    running_ok = bool(allow_running_job and job_pids and not foreign)
    available = gpu.get("gpu_available", True)
    ok = not error and (not available or gpu.get("idle", False) or running_ok)
    if error:
        summary = gpu.get("msg", "gpu_state failed")
    elif not available:
        summary = "no usable GPU (%s)" % gpu.get("reason", "unknown reason")
    elif gpu.get("idle", False):
        summary = "%d GPU(s) idle" % len(gpus)
    elif running_ok:
        summary = "held by the running job (pid %s)" % ", ".join(str(pid) for pid in job_pids)
    elif job_pids and not foreign:
        summary = own_job(job, live)
    else:
        parts = []
        for g in busy:
            text = "GPU %s: %s MiB used" % (g["index"], g["memory_used_mib"])
            holders = g["processes"]
            if holders:
                text += ", held by " + ", ".join("pid %s %s" % (h["pid"], h["name"]) for h in holders[:5])
                if len(holders) > 5:
                    text += " and %d more" % (len(holders) - 5)
            else:
                text += ", no process holds it (memory not released yet?)"
            parts.append(text)
        summary = "; ".join(parts)
    out = {"name": "gpu_idle", "severity": "fail", "ok": bool(ok), "error": error, "summary": summary}
    if foreign and not ok:
        out["others"] = sorted(set(h["pid"] for h in foreign))  # holders that are not the job's, for the repair
    return out


def check_venv(cuda):
    error = "reference" not in cuda
    bad = cuda.get("contaminants", [])
    pending = cuda.get("restore_pending", [])
    cuda_version = cuda.get("reference", {}).get("cuda_version", "?")
    if error:
        summary = cuda.get("msg", "cuda_contamination failed")
    elif pending and not bad:
        summary = "a failed restore left files missing: %s" % " | ".join(p["problem"] for p in pending)
    elif not bad:
        summary = "%s packages consistent with CUDA %s" % (cuda.get("scanned", 0), cuda_version)
    else:
        listed = ", ".join(re.sub(r" ([0-9]+)$", r" (CUDA \1)", "%s %s %s" % (b["name"], b["version"], b["cuda_major"])) for b in bad)
        clobbered = len(cuda.get("clobbered", []))
        summary = "%d package(s) built for another CUDA than %s: %s%s" % (
            len(bad), cuda_version, listed, ("; %s file(s) of other packages overwritten" % clobbered) if clobbered > 0 else "")
    ok = not error and not bad and not pending
    return {"name": "venv_clean", "severity": "fail", "ok": ok, "error": error, "summary": summary}


# pip freeze leaves the installer's own tools out of a lock, and every venv may hold them.
BASELINE_TOOLS = frozenset(("pip", "setuptools", "wheel", "distribute"))


def check_packages(packages, strict=False):
    """The baseline check: nothing missing, nothing at another version, every file as its RECORD
    says; with ``strict`` nothing installed beyond the baseline either (its tools aside)."""
    error = "packages" not in packages
    drift = packages.get("drift", {"extra": [], "missing": [], "changed": []})
    integrity = packages.get("integrity", {"ok": True, "packages": []})
    extra = [d for d in drift["extra"] if canonical_name(d["name"]) not in BASELINE_TOOLS]
    if error:
        summary = packages.get("msg", "pip_inventory failed")
    else:
        summary = "%s packages; %d missing (%s), %d at another version (%s), %d not in the baseline%s%s" % (
            packages.get("count", 0),
            len(drift["missing"]), ", ".join(d["name"] for d in drift["missing"][:5]),
            len(drift["changed"]), ", ".join(d["name"] for d in drift["changed"][:5]),
            len(drift["extra"]),
            ("; strict, so these fail: %s" % ", ".join(d["name"] for d in extra[:5])) if strict and extra else "",
            "" if integrity["ok"] else "; files differ from RECORD in " + ", ".join(d["name"] for d in integrity["packages"]))
    ok = not error and not drift["missing"] and not drift["changed"] and bool(integrity["ok"]) and not (strict and extra)
    return {"name": "packages", "severity": "fail", "ok": ok, "error": error, "summary": summary}


def check_caches(caches):
    error = "caches" not in caches
    stale = [c for c in caches.get("caches", []) if c["stale"]]
    if error:
        summary = caches.get("msg", "torch_cache failed")
    elif not stale:
        summary = "%d cache(s), built for this venv" % len([c for c in caches["caches"] if c["exists"]])
    else:
        summary = "built for another torch/Triton/CUDA/FlashInfer: " + ", ".join("%s %s (%s entries)" % (c["name"], c["path"], c["entries"]) for c in stale)
    return {"name": "caches_fresh", "severity": "fail", "ok": not error and not stale, "error": error, "summary": summary}


def _pids(items):
    return ", ".join(str(i["pid"]) if isinstance(i, dict) else str(i) for i in items)


def _rate(rate):
    """The last tok/s reading in words, against the baseline when there is one."""
    if rate["tokens_per_s"] is None:
        return None
    text = "last %.0f tok/s" % rate["tokens_per_s"]
    if rate["ratio"] is not None:
        text += " (%.0f%% of the %.0f baseline)" % (rate["ratio"] * 100, rate["baseline"])
    return text


def check_job(live, job):
    """job_live: the job makes progress (or none runs) and no GPU holder outlived its job. Besides
    the summary it carries ``state`` (none, running, stalled) and ``leftovers`` for the repair,
    and with a log ``throughput`` ({tokens_per_s, baseline, ratio}: its last reading, for the
    reports; the verdict is the throughput gate's, not this check's)."""
    error = bool(job.get("failed")) or bool(live.get("skipped")) or bool(live.get("failed"))
    leftovers = live.get("leftovers", [])
    state = live.get("state", "unknown")
    parts = []
    if error:
        parts.append(job.get("msg") or live.get("msg") or "the job's liveness could not be read: %s" % live.get("skip_reason"))
    elif state == "stalled":
        parts.append("job (pid %s) stalled: %s" % (_pids(live["pids"]), live["reason"]))
    elif state == "running":
        age = (live.get("log") or {}).get("age_s")
        parts.append("job running (pid %s)%s" % (_pids(live["pids"]), ", its log grew %ss ago" % age if age is not None else ""))
        if live.get("throughput") and _rate(live["throughput"]):
            parts.append(_rate(live["throughput"]))
    else:
        parts.append("no job running")
    if leftovers:
        parts.append("%d GPU holder(s) left by a job that is gone (parent is init): %s" % (len(leftovers), ", ".join(
            "pid %s %s (GPU %s, %s MiB)" % (h["pid"], h["name"], h["gpu"], h["used_memory_mib"]) for h in leftovers[:5])))
    rate = live.get("throughput") or {}
    # A job that runs below the floor the throughput gate holds it to is not the job the inventory
    # describes (the seed's contaminated run made 64% of its baseline).
    slow = state == "running" and rate.get("ratio") is not None and rate["ratio"] < MIN_FRACTION
    if slow:
        parts.append("below its floor (%.0f%% of the baseline): not the run the inventory describes" % (MIN_FRACTION * 100))
    inits = live.get("namespace_inits") or []
    if inits:
        parts.append("%d GPU holder(s) left by a job that is gone are the init of their own PID namespace, which this "
                     "collection never signals: %s; stop each as its user (kill -TERM <pid>, or end the unshare/bwrap/"
                     "container that made it), then run again" % (len(inits), ", ".join(
                         "pid %s %s of %s (GPU %s, %s MiB)" % (h["pid"], h["name"], h.get("user"), h["gpu"], h["used_memory_mib"])
                         for h in inits[:5])))
    ok = not error and state != "stalled" and not slow and not leftovers and not inits
    out = {"name": "job_live", "severity": "fail", "ok": ok, "error": error, "summary": "; ".join(parts),
           "state": state, "slow": slow,
           "leftovers": [{"pid": h["pid"], "start_time": h["start_time"], "cmdline": h["cmdline"]} for h in leftovers]}
    if inits:
        out["namespace_inits"] = [{"pid": h["pid"], "start_time": h["start_time"], "cmdline": h["cmdline"], "user": h.get("user")}
                                  for h in inits]
    if live.get("throughput"):
        out["throughput"] = dict((k, live["throughput"][k]) for k in ("tokens_per_s", "baseline", "ratio"))
    return out


def judge(result, allow_running_job, strict_baseline=False):
    """The verify role's checks of one reading: [gpu_idle, job_live, job_libraries, venv_clean, packages,
    caches_fresh, gpu_healthy, job_config], a check whose read was skipped left out (job_live without job_patterns;
    job_config without an option describing the job)."""
    checks = [check_gpu(result["gpu_state"], result["processes"], allow_running_job, result.get("liveness"))]
    if not result["processes"].get("skipped"):
        checks.append(check_job(result.get("liveness", {}), result["processes"]))
    libraries = result.get("job_libraries", {"skipped": True})
    if not libraries.get("skipped"):
        checks.append(check_libraries(libraries))
    if not result["cuda_contamination"].get("skipped"):
        checks.append(check_venv(result["cuda_contamination"]))
    if not result["pip_inventory"].get("skipped"):
        checks.append(check_packages(result["pip_inventory"], strict_baseline))
    if not result["torch_cache"].get("skipped"):
        checks.append(check_caches(result["torch_cache"]))
    health = result.get("gpu_health", {"skipped": True})
    if not health.get("skipped"):
        checks.append(check_health(health))
    if "job_config" in result:
        checks.append(check_config(result["job_config"]))
    return checks


def check_config(problems):
    """job_config: the job can be launched as the options describe it (read_config); besides the
    summary it carries ``problems``, each naming the inventory variable to fix."""
    summary = "; ".join("%s=%s %s" % (pr["variable"] or pr["option"], pr["value"], pr["problem"]) for pr in problems)
    return {"name": "job_config", "severity": "fail", "ok": not problems, "error": False,
            "summary": ("configuration error: %s; fix the inventory (a repair stops nothing it could not start again)" % summary
                        if problems else "the job can be launched as described"),
            "problems": problems}


# What to do about a job running on a wrong library (the check's summary ends with it).
LIBRARIES_ADVICE = "stop the job, purge the venv (the remediate playbook) and relaunch it"


def check_libraries(reading):
    """job_libraries: no process of the job (nor a GPU holder) maps a CUDA library of another major
    than the reference, one from outside the venv where the venv ships that library, or a deleted
    one. Besides the summary it carries ``libraries``, each wrong mapping (pid, comm, path,
    package, package_version, cuda_major, deleted, reasons), and ``mapped``, how many libraries
    of the CUDA side the processes map in all."""
    error = bool(reading.get("failed"))
    bad = []
    mapped = 0
    if not error:
        ref = reading.get("reference") or {}
        words = ("expected_cuda is %s" if ref.get("source") == "expected_cuda" else "torch is CUDA %s") % (
            ref.get("cuda_version") or ref.get("cuda_major"))
        for proc in reading["processes"]:
            for lib in proc["libraries"]:
                mapped += 1
                reasons = wrong(lib, ref.get("cuda_major"), words)
                if reasons:
                    bad.append({"pid": proc["pid"], "comm": proc["comm"], "path": lib["path"], "package": lib["package"],
                                "package_version": lib["package_version"], "cuda_major": lib["cuda_major"],
                                "deleted": lib["deleted"], "reasons": reasons})
    if error:
        summary = reading.get("msg") or "the job's mapped libraries could not be read"
    elif bad:
        shown = ["pid %s %s maps %s (%s): %s" % (
            b["pid"], b["comm"], b["path"],
            "%s %s" % (b["package"], b["package_version"]) if b["package"] else "no package of the venv",
            "; ".join(b["reasons"])) for b in bad[:5]]
        summary = "%d wrong librar%s mapped by the running job: %s%s; %s" % (
            len(bad), "y" if len(bad) == 1 else "ies", " | ".join(shown),
            " and %d more" % (len(bad) - 5) if len(bad) > 5 else "", LIBRARIES_ADVICE)
    elif not reading["processes"]:
        summary = "no job process running: no mapped library to judge"
    elif reading.get("unjudged"):
        summary = "%d process(es) map %d CUDA-side librar%s from the venv, none deleted; their CUDA majors not judged: %s" % (
            len(reading["processes"]), mapped, "y" if mapped == 1 else "ies", reading["unjudged"])
    else:
        summary = "%d process(es) map %d CUDA-side librar%s, all for CUDA %s from the venv" % (
            len(reading["processes"]), mapped, "y" if mapped == 1 else "ies", reading["reference"].get("cuda_version"))
    if not error and reading.get("problems"):
        summary += " (not read: %s)" % "; ".join(reading["problems"][:3])
    return {"name": "job_libraries", "severity": "fail", "ok": not error and not bad, "error": error,
            "summary": summary, "libraries": bad}


def check_health(health):
    """gpu_healthy: every GPU without a fail finding (_health.check_record), or the read's failure."""
    if "gpus" not in health:  # the read itself did not finish (read_timeout)
        msg = health.get("msg", "gpu_health failed")
        return {"name": "gpu_healthy", "severity": "fail", "ok": False, "error": msg, "summary": msg, "gpus": [],
                "driver": {"version": None, "pin": None}, "findings": []}
    return check_record(health)
