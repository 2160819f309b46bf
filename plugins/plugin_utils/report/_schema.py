# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host record as the report takes it: every key checked, typed, bounded and filled in.

A record comes from a container's read or from a slice's file: it is input, not trusted. Every
value the reports write is checked here, before any file is made: numbers are numbers, findings
are dicts with codes, strings and lists are bounded, and only the keys the reports know are kept
(nothing else reaches a file). A record that fails becomes that host's "unreadable record" row:
not ready, no check, its error saying what was wrong where; the other hosts are reported as usual.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import json
import math
import re

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record import HOST_KEYS

SEVERITIES = ("fail", "warn")
THROUGHPUT_KEYS = ("tokens_per_s", "baseline", "ratio")
# The keys every registered task result has, which a record registered from a task (readiness
# with record, as the verify role registers it) carries along: accepted and left out, not warned about.
RESULT_KEYS = ("changed", "failed", "failed_when_result", "failed_when_suppressed_exception", "msg", "rc", "unreachable",
               "warnings", "deprecations", "exception", "attempts", "retries", "ansible_facts", "module_stdout", "module_stderr")

# Bounds: a name (a host, a node, a check, a code, a label) and a free text (a summary, an error,
# what a finding says); the entries of any list (GPUs, checks, findings, processes ...).
NAME_MAX = 256
TEXT_MAX = 16384
ITEMS_MAX = 4096
FINDING_SEVERITIES = ("fail", "warn", "info")
UNREADABLE = "unreadable record"

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
        raise ReportError("%s: %s" % (who, "%s %s" % (key, problem) if key else problem))

    def str(self, key, value, nullable=False, limit=NAME_MAX):
        if value is None:
            if nullable:
                return None
            self.fail(key, "is required (a string)")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(key, "must be a string, got %s" % type(value).__name__)
        value = str(value)
        if len(value) > limit:
            self.fail(key, "is longer than %d characters (%d)" % (limit, len(value)))
        return value

    def text(self, key, value):
        """An optional free text: missing or null is the empty string."""
        return self.str(key, value, nullable=True, limit=TEXT_MAX) or ""

    def dict(self, key, value):
        """An optional dict: missing or null is the empty dict."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.fail(key, "must be a dict, got %s" % type(value).__name__)
        return value

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
            self.fail(key, "must be an integer, got %s" % _shown(value))
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
        self.fail(key, "must be true or false, got %s" % _shown(value))
        return None  # unreachable

    def items(self, key, value):
        """(key[i], dict) for each entry of an optional list of dicts."""
        if value is None:
            return
        if not isinstance(value, (list, tuple)):
            self.fail(key, "must be a list, got %s" % type(value).__name__)
        if len(value) > ITEMS_MAX:
            self.fail(key, "has more than %d entries (%d)" % (ITEMS_MAX, len(value)))
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
        out.update(_health(where, k, c))
    if name == "job_libraries":  # each wrong mapping, for the metric and the JUnit failure
        out["libraries"] = [_library(where, lk, lib) for lk, lib in where.items(k + ".libraries", c.get("libraries"))]
    return out


def _cut(value, limit=TEXT_MAX):
    """A text longer than ``limit`` cut to it, its end saying how much was left out; anything else as it is."""
    if isinstance(value, str) and len(value) > limit:
        tail = " ... (%d more characters)" % (len(value) - limit)
        return value[:limit - len(tail)] + tail
    return value


def _shown(value, limit=80):
    """A value as an error message shows it: JSON, cut short."""
    try:
        text = json.dumps(value, default=repr)
    except (ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _fields(where, k, value, spec):
    """A dict of the known scalar fields it has (spec: {key: "int" | "bool" | "name"}), each checked;
    other keys are left out."""
    value = where.dict(k, value)
    out = {}
    for key, kind in spec.items():
        if key not in value:
            continue
        v, kk = value[key], "%s.%s" % (k, key)
        if kind == "int":
            out[key] = where.int(kk, v, nullable=True)
        elif kind == "bool":
            out[key] = where.bool(kk, v, nullable=True)
        else:
            out[key] = where.str(kk, v, nullable=True)
    return out


def _finding(where, k, f):
    code = where.str(k + ".code", f.get("code"))
    if not code.strip():
        where.fail(k + ".code", "must not be empty")
    severity = where.str(k + ".severity", f.get("severity"))
    if severity not in FINDING_SEVERITIES:
        where.fail(k + ".severity", "must be 'fail', 'warn' or 'info', got %s" % _shown(severity))
    return {"code": code, "severity": severity, "what": where.text(k + ".what", f.get("what")),
            "action": where.text(k + ".action", f.get("action"))}


def _findings(where, k, value):
    return [_finding(where, fk, f) for fk, f in where.items(k, value)]


def _xid_events(where, k, value):
    """{Xid code as digits: count}: the Prometheus file labels by the code and counts by the value."""
    out = {}
    for code, count in where.dict(k, value).items():
        text = str(code)
        if isinstance(code, bool) or not re.match(r"^\d{1,10}$", text):
            where.fail(k, "keys must be Xid codes (digits), got %s" % _shown(code))
        out[str(int(text))] = where.int("%s.%s" % (k, text), count)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0])))


ECC = dict(mode="name", volatile_uncorrected="int", aggregate_uncorrected="int", volatile_corrected="int", aggregate_corrected="int")
REMAPPED = dict(correctable="int", uncorrectable="int", pending="bool", failed="bool")
RETIRED = dict(single_bit="int", double_bit="int", pending="bool")
PCIE = dict(gen="int", max_gen="int", width="int", max_width="int")
MIG_INSTANCE = dict(gpu_instance_id="int", compute_instance_id="int", memory_used_mib="int", memory_total_mib="int")


def _mig(where, k, value):
    mig = where.dict(k, value)
    out = _fields(where, k, mig, dict(current="bool", pending="bool"))
    if "instances" in mig:
        out["instances"] = None
    if mig.get("instances") is not None:
        out["instances"] = []
        for ik, inst in where.items(k + ".instances", mig["instances"]):
            entry = _fields(where, ik, inst, MIG_INSTANCE)
            entry["holders"] = [{"pid": where.int(hk + ".pid", h.get("pid"), nullable=True),
                                 "name": where.str(hk + ".name", h.get("name"), nullable=True),
                                 "used_memory_mib": where.int(hk + ".used_memory_mib", h.get("used_memory_mib"), nullable=True)}
                                for hk, h in where.items(ik + ".holders", inst.get("holders"))]
            out["instances"].append(entry)
    return out


def _throttle(where, k, reasons):
    reasons = reasons or []
    if not isinstance(reasons, (list, tuple)):
        where.fail(k, "must be a list of reasons, got %s" % type(reasons).__name__)
    if len(reasons) > ITEMS_MAX:
        where.fail(k, "has more than %d entries (%d)" % (ITEMS_MAX, len(reasons)))
    return [where.str("%s[%d]" % (k, i), reason) for i, reason in enumerate(reasons)]


# A GPU of gpu_healthy's record: each field the record has, checked by its kind (the others are left out).
HEALTH_GPU = (
    ("uuid", lambda w, k, v: w.str(k, v, nullable=True)),
    ("name", lambda w, k, v: w.str(k, v, nullable=True)),
    ("findings", _findings),
    ("ecc", lambda w, k, v: _fields(w, k, v, ECC)),
    ("remapped_rows", lambda w, k, v: _fields(w, k, v, REMAPPED)),
    ("retired_pages", lambda w, k, v: _fields(w, k, v, RETIRED)),
    ("throttle", _throttle),
    ("pcie", lambda w, k, v: _fields(w, k, v, PCIE)),
    ("persistence_mode", lambda w, k, v: w.bool(k, v, nullable=True)),
    ("mig", _mig),
    ("xid_events", _xid_events),
)


def _health_gpu(where, k, g):
    out = {"index": where.int(k + ".index", g.get("index")), "healthy": where.bool(k + ".healthy", g.get("healthy"))}
    for key, check in HEALTH_GPU:
        if key in g:
            out[key] = check(where, "%s.%s" % (k, key), g[key])
    return out


def _health(where, k, c):
    """What the reports keep of a gpu_healthy check besides its verdict, every field checked: the
    read's error, each GPU's reading and findings, the driver against its pin, the host's findings."""
    error = c.get("error")
    driver = where.dict(k + ".driver", c.get("driver"))
    gpus, seen = [], set()
    for gk, g in where.items(k + ".gpus", c.get("gpus")):
        gpu = _health_gpu(where, gk, g)
        where.unique(seen, gk + ".index", gpu["index"], json.dumps(gpu["index"]))
        gpus.append(gpu)
    return {
        # A failed read's checks carry error: true (no text) on the checks other than this one.
        "error": None if error is None or isinstance(error, bool) else where.text(k + ".error", error) or None,
        "gpus": gpus,
        "driver": {"version": where.str(k + ".driver.version", driver.get("version"), nullable=True),
                   "pin": where.str(k + ".driver.pin", driver.get("pin"), nullable=True)},
        "findings": _findings(where, k + ".findings", c.get("findings")),
    }


def _library(where, k, lib):
    """One wrong mapping of the job_libraries check."""
    lib = where.dict(k, lib)
    reasons = lib.get("reasons")
    if reasons is not None and not isinstance(reasons, (list, tuple)):
        where.fail(k + ".reasons", "must be a list, got %s" % type(reasons).__name__)
    if len(reasons or ()) > ITEMS_MAX:
        where.fail(k + ".reasons", "has more than %d entries (%d)" % (ITEMS_MAX, len(reasons)))
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
        where.fail(key, "must be a number >= 0 or null, got %s" % _shown(value))
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
    if len(host) > NAME_MAX:
        where.fail("host", "is longer than %d characters (%d)" % (NAME_MAX, len(host)))
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
        "error": where.text("error", raw.get("error")) or None,  # a reason: free text, as long as it is
        # what a failed repair left: an installer's or a drain's message may be long, and is cut rather than refused
        "repair_error": where.text("repair_error", _cut(raw.get("repair_error"))) or None,
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


def unreadable(index, raw, problem, origin=None):
    """The row of a record that failed its check: the host it names (when that much is readable,
    else its place in the input), not ready, no check, its error saying what was wrong where."""
    raw = raw if isinstance(raw, dict) else {}
    host = raw.get("host")
    if not isinstance(host, str) or not host.strip() or len(host) > NAME_MAX:
        host = "hosts[%d]" % index
    node = raw.get("node")
    vmid = raw.get("vmid")
    return {
        "host": host,
        "node": node if isinstance(node, str) and node and len(node) <= NAME_MAX else None,
        "vmid": vmid if isinstance(vmid, int) and not isinstance(vmid, bool) and vmid >= 0 else None,
        "ready": False, "running_job": False, "remediated": False,
        "error": "%s%s: %s" % (UNREADABLE, " (%s)" % origin if origin else "", problem), "repair_error": None,
        "checks": [], "gpus": [], "contaminants": [], "caches": [],
    }


def normalize_hosts(hosts, origins=None):
    """Validate every host; return (hosts sorted by node, vmid then name, warnings).

    A record that fails its check is that host's "unreadable record" row (unreadable()), named in
    a warning; origins, when given, says where each record came from (a slice's file) for both.
    Two records of one host are an error: which one is the host's is not known."""
    if not isinstance(hosts, (list, tuple)):
        raise ReportError("hosts must be a list of per-host results, got %s" % type(hosts).__name__)
    out, warnings, names = [], [], {}
    for i, raw in enumerate(hosts):
        origin = origins[i] if origins and i < len(origins) else None
        try:
            h, unknown = normalize_host(i, raw)
        except ReportError as exc:
            h, unknown = unreadable(i, raw, exc.msg, origin), []
            warnings.append("%s; reported as not ready, with this error" % h["error"])
        if h["host"] in names:
            raise ReportError("hosts[%d] (host %s): host appears twice (also hosts[%d])%s"
                              % (i, json.dumps(h["host"]), names[h["host"]], " (%s)" % origin if origin else ""))
        names[h["host"]] = i
        if unknown:
            warnings.append("hosts[%d] (host %s): unknown keys ignored: %s" % (i, json.dumps(h["host"]), ", ".join(unknown)))
        out.append(h)
    out.sort(key=lambda h: (h["node"] is None, _natural(h["node"]), h["vmid"] if h["vmid"] is not None else -1, _natural(h["host"])))
    return out, warnings
