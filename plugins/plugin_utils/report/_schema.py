# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host record as the report takes it: every key checked, typed and filled in.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import json
import math
import re

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record import HOST_KEYS, health_detail

SEVERITIES = ("fail", "warn")
THROUGHPUT_KEYS = ("tokens_per_s", "baseline", "ratio")
# The keys every registered task result has, which a record registered from a task (readiness
# with record, as the verify role registers it) carries along: accepted and left out, not warned about.
RESULT_KEYS = ("changed", "failed", "failed_when_result", "failed_when_suppressed_exception", "msg", "rc", "unreachable",
               "warnings", "deprecations", "exception", "attempts", "retries", "ansible_facts", "module_stdout", "module_stderr")

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


class ReportError(GpufleetError):
    pass


class _Where(object):
    """Names the place of a value in the input, for error messages."""

    def __init__(self, index, host=None):
        self.index = index
        self.host = host

    def fail(self, key, problem):
        who = "hosts[%d]" % self.index
        if self.host:
            who += " (host %s)" % json.dumps(self.host)
        raise ReportError("%s: %s %s" % (who, key, problem))

    def str(self, key, value, nullable=False):
        if value is None:
            if nullable:
                return None
            self.fail(key, "is required (a string)")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(key, "must be a string, got %s" % type(value).__name__)
        return str(value)

    def text(self, key, value):
        """An optional free text: missing or null is the empty string."""
        return self.str(key, value, nullable=True) or ""

    def int(self, key, value, nullable=False, minimum=0):
        if value is None:
            if nullable:
                return None
            self.fail(key, "is required (an integer)")
        if isinstance(value, bool):
            self.fail(key, "must be an integer, got a boolean")
        integral = isinstance(value, str) and re.match(r"^\s*-?\d+\s*$", value)
        if integral or (isinstance(value, float) and value.is_integer()):
            value = int(value)
        if not isinstance(value, int):
            self.fail(key, "must be an integer, got %s" % json.dumps(value, default=repr))
        if minimum is not None and value < minimum:
            self.fail(key, "must be >= %d, got %d" % (minimum, value))
        return value

    def bool(self, key, value, nullable=False):
        if value is None:
            if nullable:
                return None
            self.fail(key, "is required (true or false)")
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        self.fail(key, "must be true or false, got %s" % json.dumps(value, default=repr))
        return None  # unreachable

    def items(self, key, value):
        """(key[i], dict) for each entry of an optional list of dicts."""
        if value is None:
            return
        if not isinstance(value, (list, tuple)):
            self.fail(key, "must be a list, got %s" % type(value).__name__)
        for i, item in enumerate(value):
            k = "%s[%d]" % (key, i)
            if not isinstance(item, dict):
                self.fail(k, "must be a dict, got %s" % type(item).__name__)
            yield k, item

    def unique(self, seen, key, value, shown):
        if value in seen:
            self.fail(key, "%s appears twice" % shown)
        seen.add(value)


def _check(where, k, c):
    name = where.str(k + ".name", c.get("name"))
    if not name:
        where.fail(k + ".name", "must not be empty")
    severity = where.str(k + ".severity", c.get("severity", "fail"))
    if severity not in SEVERITIES:
        where.fail(k + ".severity", "must be 'fail' or 'warn', got %s" % json.dumps(severity))
    out = {
        "name": name,
        "ok": where.bool(k + ".ok", c.get("ok")),
        "severity": severity,
        "summary": where.text(k + ".summary", c.get("summary", "")),
    }
    if c.get("throughput") is not None:  # job_live's last reading of the job's log
        t = c["throughput"]
        if not isinstance(t, dict):
            where.fail(k + ".throughput", "must be a dict, got %s" % type(t).__name__)
        out["throughput"] = dict((key, _number(where, "%s.throughput.%s" % (k, key), t.get(key))) for key in THROUGHPUT_KEYS)
    if name == "gpu_healthy":  # its per-GPU detail feeds the GPU health metrics and the page
        out.update(health_detail(c))
    if name == "job_libraries":  # each wrong mapping, for the metric and the JUnit failure
        out["libraries"] = [_library(where, lk, lib) for lk, lib in where.items(k + ".libraries", c.get("libraries"))]
    return out


def _library(where, k, lib):
    """One wrong mapping of the job_libraries check."""
    reasons = lib.get("reasons")
    if reasons is not None and not isinstance(reasons, (list, tuple)):
        where.fail(k + ".reasons", "must be a list, got %s" % type(reasons).__name__)
    return {
        "pid": where.int(k + ".pid", lib.get("pid")),
        "comm": where.text(k + ".comm", lib.get("comm")),
        "path": where.str(k + ".path", lib.get("path")),
        "package": where.str(k + ".package", lib.get("package"), nullable=True),
        "package_version": where.str(k + ".package_version", lib.get("package_version"), nullable=True),
        "cuda_major": where.int(k + ".cuda_major", lib.get("cuda_major"), nullable=True),
        "deleted": where.bool(k + ".deleted", lib.get("deleted", False)),
        "reasons": [where.str("%s.reasons[%d]" % (k, i), r) for i, r in enumerate(reasons or ())],
    }


def _number(where, key, value):
    """An optional number (a float; digits as text are taken), finite and not negative."""
    if value is None:
        return None
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number) or number < 0:
        where.fail(key, "must be a number >= 0 or null, got %s" % json.dumps(value, default=repr))
    return number


def _gpu(where, k, g):
    return {
        "index": where.int(k + ".index", g.get("index")),
        "name": where.text(k + ".name", g.get("name", "")),
        "uuid": where.text(k + ".uuid", g.get("uuid", "")),
        "memory_used_mib": where.int(k + ".memory_used_mib", g.get("memory_used_mib")),
        "memory_total_mib": where.int(k + ".memory_total_mib", g.get("memory_total_mib")),
        "utilization_pct": where.int(k + ".utilization_pct", g.get("utilization_pct"), nullable=True),
        "processes": [{
            "pid": where.int(pk + ".pid", p.get("pid")),
            "name": where.text(pk + ".name", p.get("name", "")),
            "used_memory_mib": where.int(pk + ".used_memory_mib", p.get("used_memory_mib"), nullable=True),
        } for pk, p in where.items(k + ".processes", g.get("processes"))],
    }


def _contaminant(where, k, c):
    return {
        "name": where.str(k + ".name", c.get("name")),
        "version": where.text(k + ".version", c.get("version", "")),
        "cuda_major": where.int(k + ".cuda_major", c.get("cuda_major"), nullable=True),
    }


def _cache(where, k, c):
    return {
        "name": where.str(k + ".name", c.get("name")),
        "path": where.text(k + ".path", c.get("path", "")),
        "size_bytes": where.int(k + ".size_bytes", c.get("size_bytes", 0)),
        "entries": where.int(k + ".entries", c.get("entries", 0)),
        "fresh": where.bool(k + ".fresh", c.get("fresh"), nullable=True),
    }


def normalize_host(index, raw):
    """Validate one per-host result; return (it with every key present and typed, its unknown keys)."""
    where = _Where(index)
    if not isinstance(raw, dict):
        where.fail("", "must be a dict (one host's result), got %s" % type(raw).__name__)
    host = raw.get("host")
    if not isinstance(host, str) or not host.strip():
        where.fail("host", "is required: a non-empty string (the inventory_hostname)")
    where.host = host
    for key in ("ready", "running_job", "remediated"):
        if key not in raw:
            where.fail(key, "is required (true or false)")
    out = {
        "host": host,
        "node": where.str("node", raw.get("node"), nullable=True) or None,
        "vmid": where.int("vmid", raw.get("vmid"), nullable=True),
        "ready": where.bool("ready", raw.get("ready")),
        "running_job": where.bool("running_job", raw.get("running_job")),
        "remediated": where.bool("remediated", raw.get("remediated")),
        "error": where.str("error", raw.get("error"), nullable=True),
        "checks": [],
        "gpus": [],
        "contaminants": [],
        "caches": [],
    }
    if "checks" not in raw:
        where.fail("checks", "is required (a list, possibly empty)")
    # Each list's entries in input order, with the key that must be unique among them.
    for key, shape, unique in (("checks", _check, "name"), ("gpus", _gpu, "index"),
                               ("contaminants", _contaminant, None), ("caches", _cache, "name")):
        seen = set()
        for k, item in where.items(key, raw.get(key)):
            entry = shape(where, k, item)
            if unique:
                value = entry[unique]
                where.unique(seen, "%s.%s" % (k, unique), value, json.dumps(value))
            out[key].append(entry)
    unknown = sorted(set(raw) - set(HOST_KEYS) - set(RESULT_KEYS))
    return out, unknown


def _natural(s):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s or "")]


def normalize_hosts(hosts):
    """Validate every host; return (hosts sorted by node, vmid then name, warnings)."""
    if not isinstance(hosts, (list, tuple)):
        raise ReportError("hosts must be a list of per-host results, got %s" % type(hosts).__name__)
    out, warnings, names = [], [], {}
    for i, raw in enumerate(hosts):
        h, unknown = normalize_host(i, raw)
        if h["host"] in names:
            raise ReportError("hosts[%d] (host %s): host appears twice (also hosts[%d])" % (i, json.dumps(h["host"]), names[h["host"]]))
        names[h["host"]] = i
        if unknown:
            warnings.append("hosts[%d] (host %s): unknown keys ignored: %s" % (i, json.dumps(h["host"]), ", ".join(unknown)))
        out.append(h)
    out.sort(key=lambda h: (h["node"] is None, _natural(h["node"]), h["vmid"] if h["vmid"] is not None else -1, _natural(h["host"])))
    return out, warnings
