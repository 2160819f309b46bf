# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""node_readiness's work on a Proxmox VE node: read several of its containers at once.

Each listed container is entered as the pct connection enters it (_pct.exec_argv: ``pct exec``
or ``lxc-attach``) and reads itself in its own Python through the bootstrap transport
(transport/_bootstrap); the containers are read concurrently, and one that cannot be read gets a
failed result of its own, worded by _pct. A container listed without a vmid is read here, in the
module's own process.

With gpu_read=node the node's GPUs are read once here (nvidia-smi reports host PIDs), each holder
mapped to its container by /proc/<pid>/cgroup and to its PID there by NSpid (proc/_proc.describe),
and each container gets the reading in its payload instead of running its own nvidia-smi.

Private to gpufleet.hygiene (leading underscore): not a public API. Runs on the node inside the
module (ansible.module_utils is there); nothing of it travels into the containers.
"""

from __future__ import annotations

import copy
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _xid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._findings import assess, fold_node_xid, node_xid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import _Failed, read_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_source as read_gpu_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import read_gpus as query_gpus
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import GpuError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state import container_view
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import describe, holds_device
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import ARGUMENT_SPEC, bad_option
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._readiness import read
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record import brief
from ansible_collections.gpufleet.hygiene.plugins.module_utils.transport import _bootstrap
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _view


def container_args(entry):
    """The container's readiness options, validated as the readiness module validates them;
    (options, None) or (None, message)."""
    outcome = ArgumentSpecValidator(ARGUMENT_SPEC).validate(dict(entry["args"] or {}))
    if outcome.error_messages:
        return None, "bad readiness options for %s: %s" % (entry["host"], "; ".join(outcome.error_messages))
    options = outcome.validated_parameters
    problem = bad_option(options)
    if problem:
        return None, "bad readiness options for %s: %s" % (entry["host"], problem)
    return options, None


def entry_problem(entry, vmid):
    """Why a container's entry (host, vmid, python, method) cannot be read, or None."""
    if entry["vmid"] is not None and vmid is None:
        return _pct.bad_vmid("vmid of %s" % entry["host"], entry["vmid"])
    if entry["method"] not in _pct.METHODS:
        return "method of %s must be one of %s, got %r" % (entry["host"], ", ".join(_pct.METHODS), entry["method"])
    if not os.path.isabs(entry["python"]):
        return "python of %s must be an absolute path, got %r" % (entry["host"], entry["python"])
    return None


def explain(vmid, python, rc, stdout, stderr, method, pct_path="pct"):
    """Why container vmid's bootstrap gave no result: pct's (or lxc-attach's) refusal to enter it,
    else what the bootstrap's exit says."""
    kind = _pct.enter_failure(vmid, rc, stdout, stderr, method, pct_path)
    if kind == _pct.ATTACH_REFUSED:
        # lxc-attach's "Failed to get init pid": no running container of that id.
        kind = _pct.NOT_RUNNING
    if kind:
        return _pct.message(kind, vmid=vmid, tool=_pct.enter_tool(method, pct_path), detail=stderr)
    return _bootstrap.explain_exit("container %s" % vmid, python, rc, stdout, stderr)


def read_one(job, timeout):
    """(host, result) of one container job: its argv run on this node, its stdin the payload."""
    host, argv, data, entry, vmid = job
    try:
        proc = subprocess.run(argv, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return host, {"changed": False, "failed": True, "rc": None,
                      "msg": "reading container %s took more than %s s (container_timeout): %s was stopped on the node, the "
                             "reading in the container may still be running" % (vmid, timeout, argv[0])}
    except (OSError, ValueError, TypeError) as exc:
        return host, {"changed": False, "failed": True, "rc": None, "msg": "cannot run %s on this node: %s" % (argv[0], exc)}
    out = proc.stdout.decode("utf-8", "surrogateescape")
    err = proc.stderr.decode("utf-8", "surrogateescape")
    # Whatever one container printed, it cannot break the reading of the others.
    return host, _bootstrap.outcome("container %s" % vmid, proc.returncode, out,
                                    lambda: explain(vmid, entry["python"], proc.returncode, out, err, entry["method"], entry["pct_path"]))


def read_containers(jobs, max_parallel, timeout):
    """Runs every job (read_one), at most max_parallel at once; {host: result}."""
    with ThreadPoolExecutor(max_workers=max(1, min(max_parallel, len(jobs) or 1))) as pool:
        return dict(pool.map(lambda job: read_one(job, timeout), jobs))


GPU_READS = ("container", "node", "auto")


def node_gpus(nvidia_smi, timeout, proc="/proc"):
    """The node's GPUs, read once: (reading, {vmid: apps}); each app (a GPU holder) with its PID in
    its container, those that are no container's (the node's own) left out, and those whose
    process holds no NVIDIA device file: nvidia-smi prints a process's name as it is, so a name
    holding a newline and a forged row could name another container's process a holder."""
    gpus, apps, backend, seconds = query_gpus("nvidia-smi", nvidia_smi, timeout, apps=True)
    by_vmid = {}
    for app in apps or ():
        info = describe(app["pid"], proc)
        if info and info["vmid"] is not None and info["container_pid"] is not None and holds_device(app["pid"], proc=proc) is not False:
            by_vmid.setdefault(info["vmid"], []).append(dict(app, pid=info["container_pid"]))
    return {"gpus": gpus, "backend": backend, "seconds": round(seconds, 4)}, by_vmid


def gpu_reading(module, gpu_read, nvidia_smi, timeout, containers_read_own=True):
    """The node's GPU reading for its containers (node_gpus), or None when they read their own:
    gpu_read=container, or auto on a node without nvidia-smi; a node reading that fails is a
    warning, and the containers read their own. For the node read (containers_read_own false),
    whose containers never run their own nvidia-smi, a node without it or whose reading failed
    gives the failure itself (node_failure): each container that has GPUs fails its gpu_idle
    check with that message, as its own nvidia-smi failing would."""
    if gpu_read == "container":
        return None
    path = nvidia_smi or module.get_bin_path("nvidia-smi")
    if not path:
        if not containers_read_own:
            return node_failure(GpuError("nvidia-smi was not found on this node: install the NVIDIA driver's tools on the "
                                         "node, or name them with nvidia_smi (the node read runs nothing in a container)",
                                         kind="missing"))
        if gpu_read == "node":
            module.warn("gpu_read=node: nvidia-smi was not found on this node; each container reads its own GPUs")
        return None
    try:
        return node_gpus(path, timeout)
    except GpuError as exc:
        if not containers_read_own:
            return node_failure(exc)
        module.warn("reading the GPUs on this node failed, each container reads its own: %s" % exc)
        return None


def node_failure(exc):
    """The node's GPU reading that failed, as node_gpus' result: ({"error": ...}, {})."""
    return {"error": {"msg": "reading the GPUs on the node: %s" % exc.msg, "kind": exc.kind, "rc": exc.rc}}, {}


def asks_health(entry):
    """Whether a container entry's options (as given, not validated yet) ask for gpu_health."""
    return str((entry.get("args") or {}).get("gpu_health")).lower() in ("true", "yes", "1", "on")


def fold_node_health(module, results, containers, nvidia_smi, timeout, since=_xid.DEFAULT_SINCE_SECONDS, reading=None):
    """With the GPUs read on the node: the node's kernel log, read once here as root (a
    container's root seldom may: dmesg_restrict, an unprivileged container), its Xid events folded
    into the gpu_healthy check of each container that asked for gpu_health, matched by GPU UUID
    (_health.fold_node_xid); a check that fails now makes its container not ready. The number of
    Xid events the log holds, or None when it was not read (nobody asked, or it could not be).
    ``since`` (an aware datetime, None for the whole buffer, or a number of seconds before now;
    by default the last 24 hours) bounds how far back the log is read. ``reading``: the node's GPU
    health already read for its containers (node_health), so that nvidia-smi is not asked twice."""
    asked = [e["host"] for e in containers if asks_health(e)]
    if not asked:
        return None
    if isinstance(since, (int, float)):
        since = _xid.parse_since(str(since))
    if reading is not None and not isinstance(reading, _Failed):
        driver, gpus, _source = reading
        gpus = copy.deepcopy(gpus)  # assess() adds each GPU's Xid events and findings
        events, problem = _xid.read_xid_events(since=since, dmesg=module.get_bin_path("dmesg"), timeout=timeout)
        assess(gpus, driver, None, events, problem, True)
        health = {"gpus": gpus, "kernel_log": {"read": problem is None, "problem": problem, "events": events}}
    else:
        health = read_health(source="auto", nvidia_smi=nvidia_smi or module.get_bin_path("nvidia-smi"), timeout=timeout,
                             kernel_log=True, since=since, dmesg=module.get_bin_path("dmesg"))
    if not health["kernel_log"]["read"]:
        module.warn("the node's kernel log could not be read, Xid events not checked: %s" % health["kernel_log"]["problem"])
        return None
    by_uuid = node_xid(health)
    for host in asked:
        result = results.get(host) or {}
        for check in result.get("checks") or ():
            if check.get("name") == "gpu_healthy" and fold_node_xid(check, by_uuid) and not check["ok"]:
                result["ready"] = False
    return len(health["kernel_log"]["events"])


def read_node(module, containers, max_parallel, timeout, as_brief=False, gpus=None, read_from="container", nvidia_smi=None,
              command_timeout=15, health=None):
    """Read every container entry (node_readiness's options), return (results by host, summary):
    each result as the readiness module gives it, plus its warnings as a list (with as_brief: brief()'s
    part of it), each warning also given to module.warn(); the summary counts the containers, the
    failed ones and the seconds taken. A container without a vmid is read with the module's
    run_command and get_bin_path."""
    started = time.monotonic()
    results, jobs, local, validated, node_jobs, lxc_paths, pct_paths = {}, [], [], {}, [], {}, {}
    blobs = None
    for entry in containers:
        options, problem = container_args(entry)
        if options is not None:
            validated[entry["host"]] = options
        vmid = _pct.parse_vmid(entry["vmid"])
        problem = problem or entry_problem(entry, vmid)
        if problem:
            results[entry["host"]] = {"changed": False, "failed": True, "rc": None, "msg": problem}
        elif vmid is None:
            local.append((entry["host"], options))
        elif read_from == "node":
            node_jobs.append((entry["host"], options, vmid))
            lxc_paths[vmid] = entry["lxc_path"]
            pct_paths[vmid] = entry["pct_path"]
        else:
            if blobs is None:
                blobs = _bootstrap.module_blobs(_bootstrap.module_sources(_bootstrap.loaded_source))
            argv = _pct.exec_argv(vmid, _bootstrap.launcher_argv(entry["python"]), entry["method"], entry["pct_path"], entry["lxc_path"])
            given = None if gpus is None else dict(gpus[0], apps=gpus[1].get(vmid, []))
            jobs.append((entry["host"], argv, _bootstrap.payload(blobs[0], blobs[1], options, module.check_mode, gpu_reading=given),
                         entry, vmid))

    if jobs:
        results.update(read_containers(jobs, max_parallel or os.cpu_count() or 1, timeout))
    if node_jobs:
        results.update(read_from_node(module, node_jobs, max_parallel, gpus, nvidia_smi, command_timeout, lxc_paths, health=health,
                                      pct_paths=pct_paths))
    for host, options in local:
        results[host] = read(options, module.run_command, module.get_bin_path, module.check_mode)
    for entry in containers:
        host = entry["host"]
        for warning in results[host].setdefault("warnings", []):
            module.warn("%s: %s" % (host, warning))
        if as_brief:
            # A failed container's checks are those its options asked for: validated when they were valid.
            results[host] = brief(results[host], validated.get(host, entry["args"] or {}))
    failed = sum(1 for r in results.values() if r.get("failed"))
    return results, {"containers": len(results), "failed": failed, "seconds": round(time.monotonic() - started, 3),
                     "gpus": "node" if gpus is not None or read_from == "node" else "container", "from": read_from}


# ------------------------------------------------------------------------------------------------
# The node read: every container read here, in this process, through its root directory handle
# (view/_view); nothing of a container runs, nothing of it is taken for code.

READ_FROM = ("node", "container")


def _refuse_run(argv):
    """The node read runs no program: what a reader would have run is its failure."""
    return 126, "", "the node read runs no program of the container (asked for %s)" % (argv[0] if argv else "?")


def _no_tool(_name):
    return None


def node_health(nvidia_smi, timeout, pin=None):
    """The node's GPU health, read once for its containers: (driver, gpus, source) or a _Failed."""
    try:
        return read_gpu_health("query" if nvidia_smi else "auto", nvidia_smi, timeout, None, __import__("ctypes").CDLL)
    except _Failed as exc:
        return exc


def container_health(raw, gpus, pin):
    """read_health()'s result for one container from the node's reading ``raw``: the GPUs it has
    (``gpus``, its view of the node's reading, numbered from 0), assessed as it would assess them."""
    result = {"gpus": [], "driver": {"version": None, "pin": pin or None}, "findings": [], "source": None, "error": None,
              "kernel_log": {"read": False, "problem": None, "events": []}, "changed": False}
    if isinstance(raw, _Failed):
        result.update(error=raw.msg, source=raw.source)
        result["findings"].append(raw.finding)
        mine = []
    else:
        driver, every, result["source"] = raw
        result["driver"]["version"] = driver
        index = dict((g["uuid"], g["index"]) for g in gpus)
        mine = [dict(g, index=index[g["uuid"]]) for g in every if g.get("uuid") in index]
        mine.sort(key=lambda g: g["index"])
    result["findings"].extend(assess(mine, result["driver"]["version"], pin))
    result["gpus"] = mine
    result["healthy"] = result["error"] is None and all(g["healthy"] for g in mine) and not any(
        f["severity"] == "fail" for f in result["findings"])
    return result


def not_running(vmid, why):
    """A container that is not running: not read (its record has no check, only why)."""
    return {"changed": False, "failed": True, "rc": None, "not_read": True,
            "msg": _pct.message(_pct.NOT_RUNNING, vmid=vmid) + " (%s)" % why}


def no_container(vmid, pct_said):
    """A container this node does not have: not read, and no start would help."""
    return {"changed": False, "failed": True, "rc": None, "not_read": True,
            "msg": _pct.message(_pct.NO_CONTAINER, vmid=vmid, detail=pct_said)}


# Where a Proxmox VE node keeps its own containers' configs (pmxcfs: /etc/pve/nodes/<node>/lxc).
PVE_LXC_DIR = "/etc/pve/lxc"


def on_this_node(vmid, pct_path, timeout):
    """Whether this node has container vmid, which runs no process: (True, "") for a stopped one
    (its config is in PVE_LXC_DIR, or ``pct status`` answers a status), (False, pct's words) when
    pct says its config does not exist, (None, why) when it cannot be told (no pct here)."""
    if os.path.exists(os.path.join(PVE_LXC_DIR, "%d.conf" % vmid)):
        return True, ""
    try:
        proc = subprocess.run(_pct.status_argv(vmid, pct_path), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return None, "%s status %d did not answer within %s s" % (pct_path, vmid, timeout)
    except OSError as exc:
        return None, "%s cannot be run here: %s" % (pct_path, exc.strerror or exc)
    out = proc.stdout.decode("utf-8", "replace")
    err = proc.stderr.decode("utf-8", "replace")
    if _pct.enter_failure(vmid, proc.returncode, out, err, "pct", pct_path) == _pct.NO_CONTAINER:
        return False, err
    return (True, "") if _pct.parse_status(out) else (None, (err or out).strip())


def not_read(vmid, why, pct_path="pct", timeout=15):
    """The result of a container open_views() has no view of: not running, or, with no process
    at all, not on this node when its node says so."""
    if isinstance(why, _view.NoProcess):
        exists, said = on_this_node(vmid, pct_path, timeout)
        if exists is False:
            return no_container(vmid, said)
    return not_running(vmid, why)


# What a container's read may take beyond its own read_timeout before it is left behind: the
# checks are judged after the reads, in memory.
VIEW_GRACE = 5.0


def read_in_view(view, options, check_mode, gpus, health):
    """One container's readiness result, read through its view (in a thread inside the
    container's root, view/_view.run); a read that fails, or that has not finished by its
    read_timeout (and VIEW_GRACE), is this container's failed result."""
    given = None if gpus is None else dict(gpus[0], apps=gpus[1].get(view.vmid, []))
    if given is not None and given.get("error"):
        health = None  # nothing to assess: its gpu_idle check fails with the node's reason
    if given is None:
        # The node has no GPU reading: its containers have none either (their nvidia-smi is never run).
        given = {"gpus": [], "apps": [], "backend": None, "seconds": 0.0}
    options = dict(options, evidence_cache=False)  # the node read writes nothing in a container

    def work():
        mine = container_view(given)[0] if health is not None else []
        reading = (lambda: container_health(health, mine, options.get("gpu_driver_pin"))) if health is not None else None
        return read(options, _refuse_run, _no_tool, check_mode, gpu_reading=given, health_reading=reading)

    seconds = (options.get("read_timeout") or ARGUMENT_SPEC["read_timeout"]["default"]) + VIEW_GRACE
    try:
        result = _view.run(view, work, seconds)
    except _view.Late as exc:
        return {"changed": False, "failed": True, "rc": None, "unreadable": True, "msg": exc.msg}
    except Exception as exc:  # noqa: BLE001 - one container's failure is its own result
        return {"changed": False, "failed": True, "rc": None,
                "msg": "reading container %s from its node failed: %s" % (view.vmid, exc)}
    for problem in view.problems:
        result.setdefault("warnings", []).append("node read: %s" % problem)
    return result


def read_from_node(module, jobs, max_parallel, gpus, nvidia_smi, timeout, lxc_paths=None, health=None, pct_paths=None):
    """{host: result} of the jobs ``(host, options, vmid)``, every container read in this process
    through its view; one scan of the node's /proc finds them all (``lxc_paths``: {vmid: the
    container's LXC path}, where one is given; ``pct_paths``: {vmid: pct on this node}, asked
    whether a container without a process exists). ``health``: the node's GPU health
    (node_health), read here when a container asks for it and it was not given."""
    views, missing = _view.open_views(set(vmid for _host, _options, vmid in jobs), lxc_paths=lxc_paths)
    if health is None and any(options.get("gpu_health") for _host, options, _vmid in jobs):
        health = node_health(nvidia_smi or module.get_bin_path("nvidia-smi"), timeout)

    def one(job):
        host, options, vmid = job
        if vmid in missing:
            return host, not_read(vmid, missing[vmid], (pct_paths or {}).get(vmid) or "pct", timeout)
        return host, read_in_view(views[vmid], options, module.check_mode, gpus, health)

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(max_parallel or os.cpu_count() or 1, len(jobs) or 1))) as pool:
            return dict(pool.map(one, jobs))
    finally:
        for view in views.values():
            view.close()
