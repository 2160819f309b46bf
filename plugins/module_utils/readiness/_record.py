# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The record of a reading: the one per-host dict the verify role registers and the reports read.

One builder for every path that records a host (docs/reports.md): the readiness module and its
action (a reading, a failed call, an unreachable container), node_readiness (brief readings of a
node's containers), the verify_record and fleet_records filters (the verify role's read and the
playbooks' reports). ``brief()`` runs on the target too (the bootstrap ships this file with
_readiness), so: standard library only, nothing imported from the rest of the collection.

Private to gpufleet.hygiene (leading underscore): not a public API.
"""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import value

# What a record keeps of a brief reading, besides who it is of and what happened to it.
RECORD_KEYS = ("ready", "running_job", "checks", "gpus", "contaminants", "caches")

# Every key of a host's record, in the reports' order (the fleet report takes its list from here).
HOST_KEYS = ("host", "node", "vmid", "ready", "running_job", "remediated", "checks", "gpus", "contaminants", "caches", "error",
             "repair_error")

# What a host without any reading is recorded with when nothing says why.
NO_RESULT = "no result: the host was unreachable or failed before its checks ran"


def failed_checks(p, msg):
    """The checks a reading with options p would have made, each failed with msg: the reading
    itself failed (the container stopped, no Python there, bad options). Options left out take
    the readiness module's defaults (no venv, no baseline, verify_files false, caches true)."""
    names = ["gpu_idle"] + (["job_live"] if p.get("job_patterns") else [])
    if p.get("job_patterns") and p.get("venv") and value(p, "job_libraries"):
        names.append("job_libraries")
    if p.get("venv"):
        names.append("venv_clean")
        if p.get("baseline") or p.get("verify_files"):
            names.append("packages")
        if value(p, "caches"):
            names.append("caches_fresh")
    if p.get("gpu_health"):
        names.append("gpu_healthy")
    checks = [dict({"name": name, "severity": "fail", "ok": False, "error": True, "summary": msg},
                   **({"libraries": []} if name == "job_libraries" else {})) for name in names]
    for check in checks[-1:]:
        if check["name"] == "gpu_healthy":  # its record's shape: the error's text, no GPU read
            check.update(error=msg, gpus=[], driver={"version": None, "pin": p.get("gpu_driver_pin")}, findings=[])
    return checks


def health_detail(check):
    """What the reports keep of a gpu_healthy check besides its verdict: the error's text, each
    GPU's reading and findings, the driver and the host's findings (absent ones empty)."""
    error = check.get("error")
    return {"error": error if isinstance(error, str) else None,
            "gpus": [g for g in check.get("gpus") or () if isinstance(g, dict)],
            "driver": dict(check.get("driver") or {"version": None, "pin": None}),
            "findings": [f for f in check.get("findings") or () if isinstance(f, dict)]}


def nothing_read(checks=()):
    """The record's keys (RECORD_KEYS) of a host of which nothing was read: not ready, these checks."""
    return {"ready": False, "running_job": False, "checks": list(checks), "gpus": [], "contaminants": [], "caches": []}


def brief(result, p):
    """What the verify role records of a reading (RECORD_KEYS and warnings), from a result of
    _readiness.read() or a failure {failed, msg}; p are the options the reading was asked with."""
    if result.get("failed"):
        msg = result.get("msg") or "readiness failed"
        out = dict(nothing_read(failed_checks(p, msg)), failed=True, msg=msg, warnings=result.get("warnings", []))
        if result.get("not_read"):
            out["not_read"] = True  # a container not running: recorded as not read (of_reading)
        return out
    return {"ready": result["ready"], "running_job": result["running_job"], "checks": result["checks"],
            "gpus": result["gpu_state"].get("gpus", []), "contaminants": result["cuda_contamination"].get("contaminants", []),
            "caches": result["torch_cache"].get("caches", []), "warnings": result.get("warnings", [])}


def brief_of_failure(result, args):
    """brief() of a call that failed before reading ({msg, ...}), asked with the options args as
    given (not validated: failed_checks() takes the defaults of what they leave out)."""
    return brief(dict(result, failed=True), args or {})


def is_brief(reading):
    """Whether a reading carries a brief reading's keys (its checks and GPUs)."""
    return "checks" in reading and "gpus" in reading


def record(reading, host, node=None, vmid=None, error=None):
    """The record (HOST_KEYS) of a brief() reading of the host ``host``; an empty node or VMID is
    recorded as null."""
    out = {"host": host, "node": None if node == "" else node, "vmid": None if vmid == "" else vmid, "remediated": False, "error": error,
           "repair_error": None}
    out.update((key, reading[key]) for key in RECORD_KEYS)
    return out


def unread(host, node=None, vmid=None, error=None):
    """The record of a host of which nothing was read (unreachable, its read refused or never
    run): not ready, no check at all (a network outage is not a held GPU), ``error`` says why."""
    return record(nothing_read(), host, node, vmid, error=error or NO_RESULT)


def of_reading(reading, host, node=None, vmid=None, args=None):
    """The record of what one host's read gave: a brief reading, else a call that failed before
    reading, whose every check these options would have made fails with its message; a host
    that could not be reached (``unreachable``) or a container not running (``not_read``) is
    recorded as not read (unread)."""
    if reading.get("unreachable") or reading.get("not_read"):
        return unread(host, node, vmid, error=reading.get("msg"))
    if not is_brief(reading):
        reading = brief_of_failure({"msg": reading.get("msg")}, args)
    return record(reading, host, node, vmid)


def of_host(host, registered, node=None, vmid=None):
    """A host's record as the reports take it from what its read registered: the record itself
    (with Ansible's result keys, dropped here), else the read's failure (a refused option, a
    template that failed), recorded as not read with its message."""
    registered = registered or {}
    if "checks" in registered and "host" in registered:
        return {key: registered.get(key, False if key == "remediated" else None) for key in HOST_KEYS}
    return unread(host, node, vmid, error=registered.get("msg"))
