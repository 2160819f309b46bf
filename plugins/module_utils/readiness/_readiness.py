# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readiness module's logic: the five reads of one container and the verify role's verdicts.

Shared by the readiness module (run in the container by Ansible) and node_readiness (run on a
Proxmox VE node, which starts this code in each of its containers, see transport._bootstrap). Nothing here
imports ansible.module_utils: ``run(argv) -> (rc, stdout, stderr)`` and ``which(name)`` are given.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import posixpath
import re
import threading
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import CACHE_NAMES, TorchCache
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._findings import check_record
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state import GpuState
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._libraries import VenvIndex, mapped_libraries, wrong
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness, throughput
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import MIN_FRACTION
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import Scope, find_processes
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import BY_NAME, value
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import Venv, canonical_name, inventory

READS = ("processes", "gpu_state", "cuda_contamination", "pip_inventory", "torch_cache", "gpu_health")


def skipped(reason):
    return {"changed": False, "skipped": True, "skip_reason": reason}


def failed(msg, **partial):
    partial.pop("diff", None)
    partial.update(changed=False, failed=True, msg=msg)
    return partial


def read_processes(p, warnings):
    if not p["job_patterns"]:
        return skipped("no job_patterns")
    try:
        scope = Scope(cmdline=p["job_patterns"], users=p["job_users"] or None)
        protected = []
        found = find_processes(scope, protected=protected)
    except GpufleetError as exc:
        return failed(exc.msg, **exc.partial)
    warnings.extend(scope.notes)
    return {"changed": False, "processes": found, "count": len(found), "protected": protected}


# The options that say how the job is launched, and the host paths each must name.
CONFIG_OPTIONS = ("venv", "job_workdir", "job_command", "job_log")


def read_config(p):
    """What the read can tell is wrong with the job as the options describe it, before anything
    acts on it: ``[{option, variable, value, problem}]`` (``variable``: the inventory variable the
    verify role takes the option from). A venv that is missing or no venv, a working directory
    that is not one, a log whose directory is missing, a program that is not there to run."""
    out = []

    def bad(name, value, problem):
        out.append({"option": name, "variable": BY_NAME[name].inventory, "value": value, "problem": problem})

    def missing(path):
        return "does not exist" if not _root.lexists(path) else "is not a directory"

    venv = p.get("venv")
    if venv:
        if not _root.isdir(venv):
            bad("venv", venv, missing(venv))
        elif not any(_root.executable(posixpath.join(venv, "bin", name)) for name in ("python", "python3")):
            bad("venv", venv, "has no bin/python: it is not a virtual environment")
    workdir = p.get("job_workdir")
    if workdir and not _root.isdir(workdir):
        bad("job_workdir", workdir, missing(workdir))
    log = p.get("job_log")
    if log and not _root.isdir(posixpath.dirname(log) or "/"):
        bad("job_log", log, "its directory %s %s" % (posixpath.dirname(log), missing(posixpath.dirname(log))))
    command = p.get("job_command") or []
    program = command[0] if command else ""
    if "/" in program:
        path = program if program.startswith("/") else posixpath.join(workdir, program) if workdir else None
        if path and not _root.executable(path):
            bad("job_command", program, "does not exist" if not _root.exists(path) else "is not a file that may be run")
    return out


def read_gpus(p, nvidia_smi, check_mode, warnings, reading=None):
    backend = "nvidia-smi" if p["nvidia_smi"] else "auto"  # as gpu_state: a named nvidia-smi is what is asked
    state = GpuState(backend=backend, nvidia_smi=nvidia_smi, command_timeout=p["command_timeout"], vantage="auto",
                     device_patterns=p["device_patterns"],
                     threshold_mib=p["threshold_mib"], reading=reading)
    try:
        result = state.run(state="query", wanted=[], check_mode=check_mode, require_gpu=p["require_gpu"])
    except GpufleetError as exc:
        return failed(exc.msg, **exc.partial)
    warnings.extend(state.notes)
    return result


def read_gpu_health(p, nvidia_smi):
    """The cheap health read (NVML, else one nvidia-smi query): never raises for a GPU in trouble."""
    source = "query" if p["nvidia_smi"] else "auto"  # as gpu_state: a named nvidia-smi is what is asked
    health = read_health(source=source, nvidia_smi=nvidia_smi, timeout=p["command_timeout"], pin=p.get("gpu_driver_pin"))
    health["changed"] = False
    return health


def job_pids(result):
    """The job's processes and every GPU holder: the PIDs whose mapped libraries are judged."""
    pids = set(f["pid"] for f in result["processes"].get("processes") or ())
    for gpu in result["gpu_state"].get("gpus") or ():
        pids.update(h["pid"] for h in gpu.get("processes") or () if isinstance(h.get("pid"), int))
    return sorted(pids)


def read_libraries(p, result, env, seconds):
    """What the job's processes and the GPU holders map of CUDA (job/_libraries), with the
    contamination check's reference and the venv's RECORD index; skipped without the venv's
    reference, or with job_libraries=false."""
    if not value(p, "job_libraries"):
        return skipped("job_libraries=false")
    if not p.get("venv") or result["processes"].get("skipped"):
        return skipped("no venv or no job_patterns")
    if env is None:
        return failed("the venv was not read within read_timeout: the libraries the job maps could not be judged")
    cuda = result["cuda_contamination"]
    started = time.monotonic()
    try:
        index = VenvIndex(env.distributions, cuda.get("clobbered") or ())
        found = mapped_libraries(job_pids(result), index=index, seconds=seconds)
    except GpufleetError as exc:
        return failed(exc.msg, **exc.partial)
    # Without the venv's reference (no torch, or one that says no CUDA: venv_clean fails on it and
    # says what to set) the majors are not judged; a deleted library or one from outside the venv still is.
    found.update(changed=False, reference=cuda.get("reference"), read_s=round(time.monotonic() - started, 4))
    if "reference" not in cuda:
        found["unjudged"] = cuda.get("msg", "cuda_contamination failed")
    return found


def read_liveness(p, result):
    """Whether the job makes progress, and GPU holders left behind by a job that is gone (job/_liveness)."""
    if result["processes"].get("skipped") or result["processes"].get("failed") or "gpus" not in result["gpu_state"]:
        return skipped("no job_patterns, or the processes or the GPUs could not be read")
    live = liveness(result["processes"], result["gpu_state"]["gpus"], p["job_log"], p["stall_after"],
                    users=p["job_users"], leftover_users=p.get("leftover_users"), launch_user=p.get("cache_user"),
                    venv=p.get("venv"))
    if p["job_log"]:
        live["throughput"] = throughput(p["job_log"], p.get("job_throughput_pattern"), p.get("job_baseline_tokens_per_s"))
    return live


# The venv's three readers share one Venv (env), resolved once for the read: its interpreter is
# started at most once, its distributions read once.


def read_venv(p, env, check_mode, warnings):
    try:
        result = Contamination(env, env.run, expected_cuda=p["expected_cuda"], check_mode=check_mode,
                               evidence_cache=value(p, "evidence_cache")).scan()[0]
    except GpufleetError as exc:
        return failed(exc.msg, **exc.partial)
    result["changed"] = False
    warnings.extend(result.pop("warnings", []))
    return result


def read_packages(p, env):
    try:
        return inventory(env, None, p["baseline"], p["verify_files"], env.run)
    except GpufleetError as exc:
        return failed(exc.msg, **exc.partial)


def read_caches(p, env, check_mode, warnings):
    job = None
    try:
        job = TorchCache(list(CACHE_NAMES), state="present", venv=env, user=p["cache_user"],
                         environment=p["cache_environment"], check_mode=check_mode, run=env.run)
        result = job.execute()
    except GpufleetError as exc:
        warnings.extend(job.warnings if job else [])
        return failed(exc.msg, **exc.partial)
    warnings.extend(job.warnings)
    result.pop("diff", None)
    return result


# ---------------------------------------------------------------------------- the verdicts
# The checks of the verify role, judged here on the target so that the controller only records
# them (templating them in Jinja cost the controller more than the reads). Each check is
# {name, severity, ok, summary}; the summaries are the role's one line per check.


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


def _late(name, seconds):
    return failed("%s did not finish within %ss (read_timeout): left unread; a file or a command on this host "
                  "does not answer (see the other reads' problems)" % (name, seconds))


def read(p, run, which, check_mode=False, gpu_reading=None, health_reading=None):
    """Every read of one container and their verdicts: the readiness module's result, with
    ``warnings`` (each "<read>: <text>") for the caller to show. ``p`` are validated options;
    ``gpu_reading``, the node's reading of its GPUs (node_readiness), replaces this nvidia-smi's;
    ``health_reading()``, the node's health reading of this container's GPUs, replaces read_health here.

    The reads run in two threads (the GPUs, and /proc then the venv) under one deadline,
    ``read_timeout`` seconds: a read still running then is reported as failed and left behind,
    so one container's stalled file system or driver never stalls the caller."""
    notes = {name: [] for name in READS}
    result = {"changed": False}
    seconds = p.get("read_timeout") or BY_NAME["read_timeout"].default
    deadline = time.monotonic() + seconds
    done = {}
    lock = threading.Lock()
    crashed = []

    def keep(name, value):
        with lock:
            if not done.get("late"):
                done[name] = value

    # The GPUs are read in a thread while the other scans /proc and the venv: nvidia-smi waits on
    # the driver, and that wait overlaps the reading of files.
    nvidia_smi = p["nvidia_smi"] or which("nvidia-smi")

    def read_gpus_into_gpu():
        try:
            keep("gpu_state", read_gpus(p, nvidia_smi, check_mode, notes["gpu_state"], gpu_reading))
        except Exception as exc:  # noqa: BLE001 - raised again in the calling thread, as gpu_state itself would
            crashed.append(exc)

    def read_the_rest():
        try:
            if any(p.get(name) for name in CONFIG_OPTIONS):
                keep("job_config", read_config(p))
            keep("processes", read_processes(p, notes["processes"]))
            if p["venv"]:
                env = Venv(p["venv"], run)
                keep("venv", env)
                keep("cuda_contamination", read_venv(p, env, check_mode, notes["cuda_contamination"]))
                keep("pip_inventory", read_packages(p, env) if p["baseline"] or p["verify_files"]
                     else skipped("neither baseline nor verify_files"))
                keep("torch_cache", read_caches(p, env, check_mode, notes["torch_cache"]) if p["caches"] else skipped("caches=false"))
            else:
                for name in ("cuda_contamination", "pip_inventory", "torch_cache"):
                    keep(name, skipped("no venv"))
        except Exception as exc:  # noqa: BLE001 - raised again in the calling thread
            crashed.append(exc)

    # Daemon threads: one still blocked at the deadline does not keep the process alive.
    def read_health_into_health():
        try:
            keep("gpu_health", health_reading() if health_reading else read_gpu_health(p, nvidia_smi))
        except Exception as exc:  # noqa: BLE001 - raised again in the calling thread
            crashed.append(exc)

    # The health read has a thread of its own when asked: NVML or nvidia-smi waits on the driver too.
    targets = (read_gpus_into_gpu, read_the_rest) + ((read_health_into_health,) if p.get("gpu_health") else ())
    if not p.get("gpu_health"):
        keep("gpu_health", skipped("gpu_health=false"))
    # Each thread reads where this one does (a container's root, when its node reads it: fs/_root).
    readers = [threading.Thread(target=_root.carried(target), daemon=True) for target in targets]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    if crashed:
        raise crashed[0]
    with lock:
        done["late"] = True
        for name in READS:
            result[name] = done[name] if name in done else _late(name, seconds)
        if "job_config" in done:
            result["job_config"] = done["job_config"]
        env = done.get("venv") if "cuda_contamination" in done else None
    # After the other reads (they need their processes, GPU holders and reference), in what is left
    # of read_timeout (a second at least: a maps read is milliseconds), in a thread of their own:
    # a job log or a /proc file that does not answer leaves them behind, never the caller.
    later = {}

    def read_job():
        try:
            later["liveness"] = read_liveness(p, result)
            later["job_libraries"] = read_libraries(p, result, env, max(0.5, deadline - time.monotonic()))
        except Exception as exc:  # noqa: BLE001 - raised again in the calling thread
            crashed.append(exc)

    job_reader = threading.Thread(target=_root.carried(read_job), daemon=True)
    job_reader.start()
    job_reader.join(max(1.0, deadline - time.monotonic()))
    if crashed:
        raise crashed[0]
    for name in ("liveness", "job_libraries"):
        result[name] = later.get(name) or _late(name, seconds)
    result["checks"] = judge(result, p["allow_running_job"], value(p, "strict_baseline"))
    result["ready"] = all(c["ok"] for c in result["checks"])
    result["running_job"] = bool(result["processes"].get("processes"))
    with lock:
        result["warnings"] = ["%s: %s" % (name, warning) for name in READS for warning in list(notes[name])]
    return result
