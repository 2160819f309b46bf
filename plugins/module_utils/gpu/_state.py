# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_state module's logic: one reading per GPU with its holders, drain, ensure idle.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import read_gpus
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import NO_GPU_KINDS, GpuError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import (
    PROC,
    STUCK_ADVICE,
    ancestors,
    describe,
    detect_vantage,
    device_minor,
    driver_minor_uuids,
    protection,
    scan_device_holders,
    stuck_text,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._scope import ProcError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._terminate import terminate

# Where a container's device files are (container_view); tests point it elsewhere.
DEV = "/dev"
PROCESS_KEYS = ("pid", "name", "used_memory_mib", "vmid", "container_pid", "user", "cmdline", "start_time")


class DrainTimeout(GpuError):
    """The GPUs did not drain in time; ``result`` (the partial result) is the last reading."""

    def __init__(self, msg, result):
        super(DrainTimeout, self).__init__(msg, kind="drain_timeout", partial=result)
        self.result = self.partial  # one dict: what is added to it is returned with the failure


class DrainPending(GpufleetError):
    """This call's share of a drain wait ran out, the whole wait not over (a window of the run): no
    failure, caught by the run, which returns result() - the last reading, pending, what it waits for."""

    def __init__(self, reading, waited, msg):
        super(DrainPending, self).__init__(msg, partial=reading)
        self.waited = waited

    def result(self, **extra):
        return dict(self.partial, pending=True, waited=self.waited, msg=self.msg, **extra)


def _process(pid, info, name=None, used=None):
    entry = dict.fromkeys(PROCESS_KEYS)
    entry["pid"] = pid
    entry["used_memory_mib"] = used
    if info is not None:
        for key in ("vmid", "container_pid", "user", "cmdline", "start_time"):
            entry[key] = info[key]
        entry["name"] = name or info["comm"]
        entry["comm"] = info["comm"]
        entry["uid"] = info["uid"]
        entry["state"] = info.get("state")
    else:
        entry["name"] = name
    return entry


def _label(gpu):
    return "GPU %s (%s, %s)" % (gpu["index"], gpu["name"] or "unknown model", gpu["uuid"] or "no UUID")


def _holder_text(p):
    text = "pid %s %s" % (p["pid"], p["name"] or "?")
    where = []
    if p.get("vmid") is not None:
        where.append("vmid %s" % p["vmid"])
        if p.get("container_pid") is not None:
            where.append("pid %s in the container" % p["container_pid"])
    if p.get("used_memory_mib") is not None:
        where.append("%s MiB" % p["used_memory_mib"])
    if p.get("start_time") is None:
        where.append("not visible in this /proc")
    elif p.get("state") == "D":
        where.append(stuck_text(p["pid"]) or "state D (uninterruptible sleep)")
    return text + (" (%s)" % ", ".join(where) if where else "")


class GpuState(object):
    window = None  # run()'s: a share of the drain's wait per call (common/_waits.Slice), or all of it

    def __init__(self, backend="auto", nvidia_smi=None, command_timeout=15, vantage="auto",
                 device_patterns=None, threshold_mib=64, proc=PROC, pynvml=None, reading=None):
        self.backend = backend
        self.nvidia_smi = nvidia_smi
        self.command_timeout = command_timeout
        self.vantage = vantage
        self.device_patterns = list(device_patterns or ["/dev/nvidia*"])
        self.threshold_mib = threshold_mib
        self.proc = proc
        self.pynvml = pynvml
        # The node's reading (node_readiness): the first snapshot takes it instead of asking nvidia-smi.
        self.reading = reading
        self.notes = []
        self._decided = None

    # ------------------------------------------------------------------ one reading

    def snapshot(self):
        vantage = self._decided or (self.vantage if self.vantage != "auto" else detect_vantage())
        # In a container the holders are found through /proc/*/fd; nvidia-smi's process list only
        # adds their memory (where it names the same PIDs), so it is asked only if a GPU's device
        # file is held: a container whose GPUs are idle costs one nvidia-smi run, not two. The
        # scan runs while nvidia-smi reads the GPUs, and the process list, when asked, beside it.
        scan = []

        def held(own):  # own: the PID of the nvidia-smi reading the GPUs now (it opens them too)
            scan.append(scan_device_holders(self.device_patterns, self.proc, exclude={os.getpid()} | own))
            return any(device_minor(dev) is not None for devs in scan[0][0].values() for dev in devs)

        # The node's reading failed (node_readiness): this container's GPUs cannot be read either.
        if self.reading and self.reading.get("error"):
            error, self.reading = self.reading["error"], None
            raise GpuError(error["msg"], kind=error.get("kind") or "failed", rc=error.get("rc"))
        # A container that sees none of the node's GPUs asks its own nvidia-smi: it says why.
        given, self.reading = (self.reading and container_view(self.reading, self.proc)), None
        if given and given[0]:
            gpus, apps, backend, seconds = given
            if vantage == "container" and not held(set()):
                apps = None
        else:
            gpus, apps, backend, seconds = read_gpus(self.backend, self.nvidia_smi, self.command_timeout,
                                                     pynvml=self.pynvml, apps=held if vantage == "container" else True)
        for gpu in gpus:
            gpu["processes"] = []
        if vantage == "node":
            unresolved = self._node_holders(gpus, apps)
            if unresolved and self.vantage == "auto" and not self._decided and len(unresolved) == len(apps):
                self._note("nvidia-smi named PIDs this /proc does not have (%s): holders were found "
                           "through open device handles instead" % ", ".join(str(p) for p in unresolved))
                for gpu in gpus:
                    gpu["processes"] = []
                vantage = "container"
        if vantage == "container":
            self._container_holders(gpus, apps, scan[0] if scan else None)
        self._decided = vantage  # later readings (drain polls) keep the same vantage
        for gpu in gpus:
            used = gpu["memory_used_mib"]
            gpu["idle"] = (used is None or used <= self.threshold_mib) and not gpu["processes"]
        return {"gpus": gpus, "vantage": vantage, "backend": backend, "query_seconds": round(seconds, 4)}

    def _note(self, text):
        if text not in self.notes:
            self.notes.append(text)

    def _node_holders(self, gpus, apps):
        by_uuid = dict((g["uuid"], g) for g in gpus)
        unresolved = []
        for app in apps:
            info = describe(app["pid"], self.proc)
            if info is None:
                unresolved.append(app["pid"])
            gpu = by_uuid.get(app["gpu_uuid"])
            if gpu is None and len(gpus) == 1:
                gpu = gpus[0]
            if gpu is not None:
                gpu["processes"].append(_process(app["pid"], info, app["name"], app["used_memory_mib"]))
        return unresolved

    def _container_holders(self, gpus, apps, scan=None):
        """Each GPU's holders from the open device files (scan: scan_device_holders' answer, when
        the reading made it); apps is None when no device file of a GPU was held."""
        holders, unreadable = scan or scan_device_holders(self.device_patterns, self.proc, exclude={os.getpid()})
        if unreadable:
            self._note("the open files of %d processes could not be read (run as root to see every holder)"
                       % unreadable)
        by_uuid = dict((g["uuid"], g) for g in gpus)
        by_index = dict((g["index"], g) for g in gpus)
        minor_uuid = driver_minor_uuids(self.proc)
        used = dict(((a["pid"], a["gpu_uuid"]), a["used_memory_mib"]) for a in apps or ())
        for pid in sorted(holders):
            info = describe(pid, self.proc)
            if info is None:
                continue  # exited since the scan
            for dev in holders[pid]:
                minor = device_minor(dev)
                if minor is None:
                    continue  # nvidiactl, nvidia-uvm: not one GPU
                gpu = by_uuid.get(minor_uuid.get(minor)) or by_index.get(minor)
                if gpu is None and len(gpus) == 1 and not minor_uuid:
                    gpu = gpus[0]  # one GPU passed through under its host minor (e.g. /dev/nvidia3)
                if gpu is None or any(p["pid"] == pid for p in gpu["processes"]):
                    continue
                entry = _process(pid, info, None, used.get((pid, gpu["uuid"])))
                entry["devices"] = [dev]
                gpu["processes"].append(entry)

    # ------------------------------------------------------------------ selection

    @staticmethod
    def select(gpus, wanted):
        if not wanted:
            return list(gpus)
        chosen = []
        for item in wanted:
            w = str(item).strip()
            match = [g for g in gpus if str(g["index"]) == w or (g["uuid"] and g["uuid"].lower() == w.lower())]
            if not match:
                have = ", ".join("%s (%s)" % (g["index"], g["uuid"]) for g in gpus) or "none"
                raise GpuError("GPU %r was not found; this host has: %s" % (w, have), kind="selection")
            for g in match:
                if g not in chosen:
                    chosen.append(g)
        return chosen

    # ------------------------------------------------------------------ drain

    def wait_drain(self, wanted, timeout, interval, started=None, said=None):
        """Poll until every wanted GPU is idle. Returns (snapshot, selected, seconds). ``said``: the
        timeout a failure names (the whole wait's, when this call waits only a slice of it)."""
        started = time.monotonic() if started is None else started
        deadline = time.monotonic() + timeout
        while True:
            snap = self.snapshot()
            selected = self.select(snap["gpus"], wanted)
            busy = [g for g in selected if not g["idle"]]
            if not busy:
                return snap, selected, time.monotonic() - started
            if time.monotonic() >= deadline:
                raise DrainTimeout(self._drain_message(busy, timeout if said is None else said), self._result(snap, selected))
            time.sleep(max(0.0, min(interval, deadline - time.monotonic())))

    def _drain(self, wanted, timeout, interval, window, started=None):
        """wait_drain, for this call's share of the wait with a window (common/_waits.Slice): when the
        share runs out with the whole wait not over, DrainPending says what it waits for."""
        if window is None:
            return self.wait_drain(wanted, timeout, interval, started=started)
        t0 = time.monotonic()
        try:
            return self.wait_drain(wanted, window.budget, interval, started=started, said=window.total)
        except DrainTimeout as exc:
            spent = time.monotonic() - t0
            if not window.pending(spent):
                raise
            busy = [g for g in exc.result["gpus"] if not g["idle"]]
            waiting = "; ".join("%s: %s MiB used (threshold %s MiB)%s" % (
                _label(g), g["memory_used_mib"], self.threshold_mib,
                ", held by " + ", ".join(_holder_text(p) for p in g["processes"]) if g["processes"] else ", no holder")
                for g in busy)
            raise DrainPending(exc.result, window.waited(spent), "waiting for the GPUs to drain, %.0f of %.0f s: %s"
                               % (window.waited(spent), window.total, waiting)) from None

    def _drain_message(self, busy, timeout):
        parts, advice = [], []
        holders = [p for gpu in busy for p in gpu["processes"]]
        if any(p.get("state") == "D" for p in holders):
            advice.append(STUCK_ADVICE)
        elif holders:
            advice.append("Stop the holders named here (or widen the scope if they belong to the job), then run again")
        if any(not gpu["processes"] for gpu in busy):
            advice.append("If the memory of a process that exited is never released, the driver or the GPU is in "
                          "trouble: check the node's kernel log (dmesg, Xid errors) and reset the GPU or reboot the "
                          "node; if it is only slow, raise timeout")
        for gpu in busy:
            text = "%s did not drain within %ss: %s MiB used (threshold %s MiB)" % (
                _label(gpu), timeout, gpu["memory_used_mib"], self.threshold_mib)
            if gpu["processes"]:
                text += ", held by " + "; ".join(_holder_text(p) for p in gpu["processes"])
            else:
                text += (", no holder visible from this vantage (memory not yet released by the driver, "
                         "or held from another container)")
            parts.append(text)
        return ". ".join(parts + advice)

    def _result(self, snap, selected):
        return {"gpus": selected, "idle": all(g["idle"] for g in selected), "vantage": snap["vantage"],
                "backend": snap["backend"], "query_seconds": snap["query_seconds"], "gpu_available": True}

    # ------------------------------------------------------------------ the module's run

    def run(self, state="query", wanted=None, scope=None, grace=10.0, timeout=60.0, interval=0.25,
            check_mode=False, require_gpu=True, window=None):
        """The gpu_state module's result. With ``require_gpu=False`` a host without a usable GPU
        (NO_GPU_KINDS) is a result saying so, with a note, instead of a GpuError. With ``window``
        (common/_waits.Slice of the timeout) the drain waits this call's share of the wait; a result
        with ``pending`` says what it waits for when the share ran out first."""
        self.window = window
        try:
            return self._run(state, wanted, scope, grace, timeout, interval, check_mode)
        except GpuError as exc:
            fallback = None if require_gpu else no_gpu_result(exc)
            if fallback is None:
                raise
            self._note("no usable GPU, passing because require_gpu=false: %s" % exc)
            return fallback

    def _run(self, state, wanted, scope, grace, timeout, interval, check_mode):
        snap = self.snapshot()
        selected = self.select(snap["gpus"], wanted)
        result = self._result(snap, selected)
        result["changed"] = False
        if state == "query":
            return result
        if state == "drained":
            try:
                snap, selected, seconds = self._drain(wanted, timeout, interval, self.window)
            except DrainPending as pending:
                return pending.result(changed=False)
            result = self._result(snap, selected)
            result.update(changed=False, drain_seconds=round(seconds, 3))
            return result
        return self._ensure_idle(result, selected, wanted, scope, grace, timeout, interval, check_mode)

    def _ensure_idle(self, result, selected, wanted, scope, grace, timeout, interval, check_mode):
        if scope is None or scope.empty():
            raise ProcError("state=idle needs a scope (name, cmdline, users, vmids, pids or tmux_session): "
                            "the module never terminates processes outside one")
        own = ancestors(proc=self.proc)
        targets, out_of_scope, protected, seen = [], [], [], set()
        for gpu in selected:
            for p in gpu["processes"]:
                if p["pid"] in seen:
                    continue
                seen.add(p["pid"])
                entry = dict((k, p.get(k)) for k in PROCESS_KEYS)
                entry["gpu"] = gpu["index"]
                if p["start_time"] is None:
                    entry["reason"] = "not visible in this /proc: cannot be checked or signalled"
                    out_of_scope.append(entry)
                    continue
                ok, why = scope.matches(p, p.get("name"))
                if not ok:
                    entry["reason"] = why
                    out_of_scope.append(entry)
                    continue
                why = protection(p, own)  # the rule the processes module applies too
                if why:
                    entry["reason"] = why
                    protected.append(entry)
                else:
                    targets.append(entry)
        for note in scope.notes:
            self._note(note)
        result.update(out_of_scope=out_of_scope, protected=protected)
        if check_mode:
            for t in targets:
                t.update(signals=[], outcome="would_signal")
            result.update(terminated=targets, changed=bool(targets))
            return result
        started = time.monotonic()
        outcomes = terminate(targets, grace, proc=self.proc) if targets else {}
        for t in targets:
            t.update(outcomes[t["pid"]])
        result["terminated"] = targets
        result["changed"] = any(t["signals"] for t in targets)
        result["terminate_seconds"] = round(time.monotonic() - started, 3)
        try:
            snap, selected, seconds = self._drain(wanted, timeout, interval, self.window, started=started)
        except DrainPending as pending:
            return pending.result(terminated=targets, out_of_scope=out_of_scope, protected=protected,
                                  changed=result["changed"], terminate_seconds=result["terminate_seconds"])
        except DrainTimeout as exc:
            exc.result.update(terminated=targets, out_of_scope=out_of_scope, protected=protected,
                              changed=result["changed"], terminate_seconds=result["terminate_seconds"])
            raise
        result.update(self._result(snap, selected))
        result["drain_seconds"] = round(seconds, 3)
        return result


def container_view(reading, proc=PROC, dev=None):
    """(gpus, apps, backend, seconds) of the node's reading as this container's nvidia-smi gives them: the GPUs whose
    device file the container has (by the driver's minor -> UUID, else minor = node index),
    numbered from 0 in the node's order; the apps (node_readiness gave only this container's, with
    their PIDs in it) of those GPUs."""
    try:
        minors = set(m for m in (device_minor(name) for name in _root.listdir(dev or DEV) if name.startswith("nvidia")) if m is not None)
    except OSError:
        minors = set()
    uuids = driver_minor_uuids(proc)
    wanted = set(uuids[m] for m in minors if m in uuids)
    gpus = [dict(g) for g in reading["gpus"] if g["uuid"] in wanted or (not uuids and g["index"] in minors)]
    for number, gpu in enumerate(gpus):
        gpu["index"] = number
    kept = set(g["uuid"] for g in gpus)
    return gpus, [dict(a) for a in reading["apps"] if a["gpu_uuid"] in kept], reading["backend"], reading["seconds"]


def no_gpu_result(exc):
    """The result for a host without a GPU when require_gpu=false; None when exc is not that."""
    if exc.kind not in NO_GPU_KINDS:
        return None
    return {"changed": False, "gpus": [], "idle": True, "gpu_available": False, "vantage": None,
            "backend": None, "query_seconds": None, "reason": str(exc)}
