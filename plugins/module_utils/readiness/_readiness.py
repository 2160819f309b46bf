# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readiness module's logic: the reads of one container, each judged by readiness/_checks.py.

Shared by the readiness module (run in the container by Ansible) and node_readiness (run on a
Proxmox VE node, which starts this code in each of its containers, see transport._bootstrap). Nothing here
imports ansible.module_utils: ``run(argv) -> (rc, stdout, stderr)`` and ``which(name)`` are given.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import posixpath
import threading
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import CACHE_NAMES, TorchCache
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state import GpuState
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._libraries import VenvIndex, mapped_libraries
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness, throughput
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import find_processes
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._scope import Scope
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._checks import judge
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import BY_NAME, value
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._inventory import inventory
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv

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
