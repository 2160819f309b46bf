# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fleet hygiene reports: validate per-host results, render JSON, JUnit XML, Prometheus and HTML.

Private to gpufleet.hygiene (not a public API). Standard library only.
"""

from __future__ import annotations

import contextlib
import datetime
import html
import json
import os
import re
import tempfile
import xml.etree.ElementTree as ET

SCHEMA_VERSION = 1
FORMATS = ("json", "junit", "prometheus", "html")
FILENAMES = {
    "json": "report.json",
    "junit": "report.junit.xml",
    "prometheus": "gpufleet_hygiene.prom",
    "html": "report.html",
}
# Checks the verify role produces, shown first and in this order; others follow as first seen.
KNOWN_CHECKS = ("gpu_idle", "venv_clean", "packages", "caches_fresh")
SEVERITIES = ("fail", "warn")
MIB = 1024 * 1024


class ReportError(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Validation


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


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


def _str(where, key, value, nullable=False, required=True):
    if value is None:
        if nullable or not required:
            return None
        where.fail(key, "is required (a string)")
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        where.fail(key, "must be a string, got %s" % type(value).__name__)
    return str(value)


def _int(where, key, value, nullable=False, minimum=None):
    if value is None:
        if nullable:
            return None
        where.fail(key, "is required (an integer)")
    if isinstance(value, bool):
        where.fail(key, "must be an integer, got a boolean")
    integral = isinstance(value, str) and re.match(r"^\s*-?\d+\s*$", value)
    if integral or (isinstance(value, float) and value.is_integer()):
        value = int(value)
    if not isinstance(value, int):
        where.fail(key, "must be an integer, got %s" % json.dumps(value, default=repr))
    if minimum is not None and value < minimum:
        where.fail(key, "must be >= %d, got %d" % (minimum, value))
    return value


def _bool(where, key, value, nullable=False):
    if value is None:
        if nullable:
            return None
        where.fail(key, "is required (true or false)")
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    where.fail(key, "must be true or false, got %s" % json.dumps(value, default=repr))
    return None  # unreachable


def _list(where, key, value):
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        where.fail(key, "must be a list, got %s" % type(value).__name__)
    return list(value)


def _dict(where, key, value):
    if not isinstance(value, dict):
        where.fail(key, "must be a dict, got %s" % type(value).__name__)
    return value


HOST_KEYS = ("host", "node", "vmid", "ready", "running_job", "remediated", "checks", "gpus", "contaminants", "caches", "error")
# The keys every registered task result has, which a record registered from a task (readiness
# with record, as the verify role registers it) carries along: accepted and left out, not warned about.
RESULT_KEYS = ("changed", "failed", "failed_when_result", "failed_when_suppressed_exception", "msg", "rc", "unreachable",
               "warnings", "deprecations", "exception", "attempts", "retries", "ansible_facts", "module_stdout", "module_stderr")


def normalize_host(index, raw):
    """Validate one per-host result and return it with every key present and typed."""
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
        "node": _str(where, "node", raw.get("node"), nullable=True),
        "vmid": _int(where, "vmid", raw.get("vmid"), nullable=True, minimum=0),
        "ready": _bool(where, "ready", raw.get("ready")),
        "running_job": _bool(where, "running_job", raw.get("running_job")),
        "remediated": _bool(where, "remediated", raw.get("remediated")),
        "error": _str(where, "error", raw.get("error"), nullable=True),
        "checks": [],
        "gpus": [],
        "contaminants": [],
        "caches": [],
    }
    if out["node"] == "":
        out["node"] = None
    if "checks" not in raw:
        where.fail("checks", "is required (a list, possibly empty)")
    seen = set()
    for i, item in enumerate(_list(where, "checks", raw["checks"])):
        k = "checks[%d]" % i
        c = _dict(where, k, item)
        name = _str(where, k + ".name", c.get("name"))
        if not name:
            where.fail(k + ".name", "must not be empty")
        if name in seen:
            where.fail(k + ".name", "%s appears twice" % json.dumps(name))
        seen.add(name)
        severity = _str(where, k + ".severity", c.get("severity", "fail"))
        if severity not in SEVERITIES:
            where.fail(k + ".severity", "must be 'fail' or 'warn', got %s" % json.dumps(severity))
        out["checks"].append({
            "name": name,
            "ok": _bool(where, k + ".ok", c.get("ok")),
            "severity": severity,
            "summary": _str(where, k + ".summary", c.get("summary", ""), nullable=True) or "",
        })
    seen = set()
    for i, item in enumerate(_list(where, "gpus", raw.get("gpus"))):
        k = "gpus[%d]" % i
        g = _dict(where, k, item)
        gpu = {
            "index": _int(where, k + ".index", g.get("index"), minimum=0),
            "name": _str(where, k + ".name", g.get("name", ""), nullable=True) or "",
            "uuid": _str(where, k + ".uuid", g.get("uuid", ""), nullable=True) or "",
            "memory_used_mib": _int(where, k + ".memory_used_mib", g.get("memory_used_mib"), minimum=0),
            "memory_total_mib": _int(where, k + ".memory_total_mib", g.get("memory_total_mib"), minimum=0),
            "utilization_pct": _int(where, k + ".utilization_pct", g.get("utilization_pct"), nullable=True, minimum=0),
            "processes": [],
        }
        if gpu["index"] in seen:
            where.fail(k + ".index", "%d appears twice" % gpu["index"])
        seen.add(gpu["index"])
        for j, proc in enumerate(_list(where, k + ".processes", g.get("processes"))):
            pk = "%s.processes[%d]" % (k, j)
            p = _dict(where, pk, proc)
            gpu["processes"].append({
                "pid": _int(where, pk + ".pid", p.get("pid"), minimum=0),
                "name": _str(where, pk + ".name", p.get("name", ""), nullable=True) or "",
                "used_memory_mib": _int(where, pk + ".used_memory_mib", p.get("used_memory_mib"), nullable=True, minimum=0),
            })
        out["gpus"].append(gpu)
    for i, item in enumerate(_list(where, "contaminants", raw.get("contaminants"))):
        k = "contaminants[%d]" % i
        c = _dict(where, k, item)
        out["contaminants"].append({
            "name": _str(where, k + ".name", c.get("name")),
            "version": _str(where, k + ".version", c.get("version", ""), nullable=True) or "",
            "cuda_major": _int(where, k + ".cuda_major", c.get("cuda_major"), nullable=True, minimum=0),
        })
    seen = set()
    for i, item in enumerate(_list(where, "caches", raw.get("caches"))):
        k = "caches[%d]" % i
        c = _dict(where, k, item)
        cache = {
            "name": _str(where, k + ".name", c.get("name")),
            "path": _str(where, k + ".path", c.get("path", ""), nullable=True) or "",
            "size_bytes": _int(where, k + ".size_bytes", c.get("size_bytes", 0), minimum=0),
            "entries": _int(where, k + ".entries", c.get("entries", 0), minimum=0),
            "fresh": _bool(where, k + ".fresh", c.get("fresh"), nullable=True),
        }
        if cache["name"] in seen:
            where.fail(k + ".name", "%s appears twice" % json.dumps(cache["name"]))
        seen.add(cache["name"])
        out["caches"].append(cache)
    unknown = sorted(set(raw) - set(HOST_KEYS) - set(RESULT_KEYS))
    return out, unknown


def _natural(s):
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", s or "")]


def normalize_hosts(hosts):
    """Validate every host; return (hosts sorted by node then name, warnings)."""
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


def parse_timestamp(value, now=None):
    """ISO 8601 (a trailing Z, an offset, or none meaning UTC) -> aware UTC datetime, whole seconds."""
    if value is None or value == "":
        ts = now or datetime.datetime.now(datetime.timezone.utc)
    else:
        text = str(value).strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            ts = datetime.datetime.fromisoformat(text)
        except ValueError as exc:
            raise ReportError("run_started must be an ISO 8601 timestamp such as 2025-06-01T03:00:00Z, got %s" % json.dumps(value)) from exc
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=datetime.timezone.utc)
    return ts.astimezone(datetime.timezone.utc).replace(microsecond=0)


# --------------------------------------------------------------------------------------------
# The run


def check_names(hosts):
    seen = []
    for h in hosts:
        for c in h["checks"]:
            if c["name"] not in seen:
                seen.append(c["name"])
    known = [n for n in KNOWN_CHECKS if n in seen]
    return known + [n for n in seen if n not in known]


def check_state(check):
    if check["ok"]:
        return "pass"
    return check["severity"]


def summarize(hosts):
    return {
        "hosts": len(hosts),
        "ready": sum(1 for h in hosts if h["ready"]),
        "not_ready": sum(1 for h in hosts if not h["ready"]),
        "running_job": sum(1 for h in hosts if h["running_job"]),
        "remediated": sum(1 for h in hosts if h["remediated"]),
        "error": sum(1 for h in hosts if h["error"]),
        "checks_failed": sum(1 for h in hosts for c in h["checks"] if check_state(c) == "fail"),
        "checks_warned": sum(1 for h in hosts for c in h["checks"] if check_state(c) == "warn"),
        "nodes": len(set(h["node"] for h in hosts if h["node"] is not None)),
        "gpus": sum(len(h["gpus"]) for h in hosts),
        "contaminants": sum(len(h["contaminants"]) for h in hosts),
    }


def build_run(hosts, title, run_started):
    return {
        "schema_version": SCHEMA_VERSION,
        "title": title,
        "run_started": run_started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "summary": summarize(hosts),
        "checks": check_names(hosts),
        "hosts": hosts,
    }


def _run_ts(run):
    return parse_timestamp(run["run_started"])


# --------------------------------------------------------------------------------------------
# JSON


def render_json(run):
    return json.dumps(run, indent=2, sort_keys=False, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------------------------
# JUnit XML

# XML 1.0 cannot carry these characters even escaped.
_XML_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value):
    return _XML_INVALID.sub("\ufffd", "" if value is None else str(value))


def _classname(h):
    parts = ["gpufleet"]
    if h["node"]:
        parts.append(h["node"])
    parts.append(h["host"])
    return ".".join(p.replace(".", "_") for p in parts)


def render_junit(run):
    """One <testsuite> for the run; a <testcase> per host x check. Warnings pass (noted in system-out)."""
    hosts = run["hosts"]
    suite = ET.Element("testsuite")
    tests = failures = errors = 0
    for h in hosts:
        if h["error"]:
            tests += 1
            errors += 1
            tc = ET.SubElement(suite, "testcase", {"classname": _x(_classname(h)), "name": "reachable", "time": "0"})
            el = ET.SubElement(tc, "error", {"message": _x(h["error"]), "type": "error"})
            el.text = _x(h["error"])
        for c in h["checks"]:
            tests += 1
            tc = ET.SubElement(suite, "testcase", {"classname": _x(_classname(h)), "name": _x(c["name"]), "time": "0"})
            state = check_state(c)
            if state == "fail":
                failures += 1
                el = ET.SubElement(tc, "failure", {"message": _x(c["summary"]), "type": "fail"})
                el.text = _x("%s on %s: %s" % (c["name"], h["host"], c["summary"]))
            elif state == "warn":
                out = ET.SubElement(tc, "system-out")
                out.text = _x("warning: %s" % c["summary"])
            elif c["summary"]:
                out = ET.SubElement(tc, "system-out")
                out.text = _x(c["summary"])
    ts = _run_ts(run)
    attrs = [
        ("name", _x(run["title"])),
        ("tests", str(tests)),
        ("failures", str(failures)),
        ("errors", str(errors)),
        ("skipped", "0"),
        ("time", "0"),
        ("timestamp", ts.strftime("%Y-%m-%dT%H:%M:%S")),
        ("hostname", "controller"),
    ]
    for k, v in attrs:
        suite.set(k, v)
    root = ET.Element("testsuites", {"name": _x(run["title"]), "tests": str(tests), "failures": str(failures),
                                     "errors": str(errors), "time": "0"})
    root.append(suite)
    _indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _indent(elem, level=0):
    # ElementTree.indent is Python 3.9+, but keep attribute order stable and predictable here.
    pad = "\n" + "  " * level
    if len(elem):
        if not (elem.text or "").strip():
            elem.text = pad + "  "
        for child in elem:
            _indent(child, level + 1)
        if not (child.tail or "").strip():
            child.tail = pad
    if level and not (elem.tail or "").strip():
        elem.tail = pad


# --------------------------------------------------------------------------------------------
# Prometheus text exposition format


def prom_label_value(value):
    return ("" if value is None else str(value)).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _prom_help(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(pairs):
    return "{" + ",".join('%s="%s"' % (k, prom_label_value(v)) for k, v in pairs) + "}" if pairs else ""


def _num(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


METRICS = (
    ("last_run_timestamp_seconds", "Start of the last hygiene run, in seconds since the epoch."),
    ("hosts", "Hosts of the last run by state (ready, not_ready, running_job, remediated, error)."),
    ("host_ready", "1 when the host passed every fail-severity check of the last run."),
    ("host_running_job", "1 when a healthy training job was running on the host (hygiene leaves it alone)."),
    ("host_remediated", "1 when the last run changed something on the host."),
    ("host_error", "1 when the host was unreachable or a check failed to run."),
    ("check_ok", "1 when the check passed on the host, 0 when it failed or warned."),
    ("contaminants", "Packages built for another CUDA major than the venv's torch."),
    ("gpu_memory_used_bytes", "GPU memory in use."),
    ("gpu_memory_total_bytes", "GPU memory in total."),
    ("gpu_utilization_ratio", "GPU utilization (0 to 1), where the driver reports it."),
    ("gpu_processes", "Processes holding the GPU."),
    ("cache_size_bytes", "Size of a compile cache."),
    ("cache_fresh", "1 when the compile cache matches the environment it was built for (absent when unknown)."),
)


def render_prometheus(run):
    samples = dict((m[0], []) for m in METRICS)
    summary = run["summary"]
    samples["last_run_timestamp_seconds"].append(([], int(_run_ts(run).timestamp())))
    for state in ("ready", "not_ready", "running_job", "remediated", "error"):
        samples["hosts"].append(([("state", state)], summary[state]))
    for h in run["hosts"]:
        base = [("host", h["host"]), ("node", h["node"]), ("vmid", h["vmid"])]
        samples["host_ready"].append((base, h["ready"]))
        samples["host_running_job"].append((base, h["running_job"]))
        samples["host_remediated"].append((base, h["remediated"]))
        samples["host_error"].append((base, bool(h["error"])))
        for c in h["checks"]:
            samples["check_ok"].append((base + [("check", c["name"]), ("severity", c["severity"])], c["ok"]))
        samples["contaminants"].append((base, len(h["contaminants"])))
        for g in h["gpus"]:
            gl = base + [("gpu", g["index"]), ("name", g["name"])]
            samples["gpu_memory_used_bytes"].append((gl, g["memory_used_mib"] * MIB))
            samples["gpu_memory_total_bytes"].append((gl, g["memory_total_mib"] * MIB))
            if g["utilization_pct"] is not None:
                samples["gpu_utilization_ratio"].append((gl, g["utilization_pct"] / 100.0))
            samples["gpu_processes"].append((gl, len(g["processes"])))
        for c in h["caches"]:
            cl = base + [("cache", c["name"])]
            samples["cache_size_bytes"].append((cl, c["size_bytes"]))
            if c["fresh"] is not None:
                samples["cache_fresh"].append((cl, c["fresh"]))
    lines = []
    for name, help_text in METRICS:
        if not samples[name]:
            continue
        full = "gpufleet_hygiene_" + name
        lines.append("# HELP %s %s" % (full, _prom_help(help_text)))
        lines.append("# TYPE %s gauge" % full)
        for labels, value in samples[name]:
            lines.append("%s%s %s" % (full, _labels(labels), _num(value)))
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# HTML


def e(value):
    return html.escape("" if value is None else str(value), quote=True)


def _gib(mib):
    return "%.1f" % (mib / 1024.0)


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return ""


_CSS = """
:root{--bg:#f4f6f9;--card:#fff;--ink:#1c2330;--muted:#667085;--line:#e3e7ee;
--pass:#1f9d55;--pass-bg:#e7f6ed;--fail:#d92d20;--fail-bg:#fdecea;--warn:#b54708;--warn-bg:#fef4e6;
--job:#1d63d8;--job-bg:#e8f0fd;--fix:#7a3fd1;--fix-bg:#f1eafc;--na:#98a2b3;--na-bg:#f2f4f7}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
header{background:#111827;color:#f9fafb;padding:18px 28px;display:flex;justify-content:space-between;align-items:flex-end;gap:24px}
header h1{margin:0;font-size:22px;font-weight:650;letter-spacing:.2px}
header .meta{color:#cbd5e1;font-size:13px;margin-top:4px}
header .verdict{font-weight:600;font-size:14px;padding:6px 12px;border-radius:999px;white-space:nowrap}
.verdict.ok{background:#14532d;color:#dcfce7}.verdict.bad{background:#7f1d1d;color:#fee2e2}
main{padding:18px 28px 28px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-bottom:18px}
.card{background:var(--card);border:1px solid var(--line);border-left:5px solid var(--na);border-radius:10px;padding:10px 14px}
.card .n{font-size:30px;font-weight:700;line-height:1.1}
.card .l{color:var(--muted);font-size:12.5px;text-transform:uppercase;letter-spacing:.5px}
.card.ready{border-left-color:var(--pass)}.card.ready .n{color:var(--pass)}
.card.notready{border-left-color:var(--fail)}.card.notready .n{color:var(--fail)}
.card.job{border-left-color:var(--job)}.card.job .n{color:var(--job)}
.card.fix{border-left-color:var(--fix)}.card.fix .n{color:var(--fix)}
.card.err .n{color:#475467}
.panel{background:var(--card);border:1px solid var(--line);border-radius:10px;overflow:hidden}
.toolbar{display:flex;justify-content:space-between;align-items:center;padding:10px 14px;border-bottom:1px solid var(--line);gap:16px;flex-wrap:wrap}
.toolbar label{font-size:13px;color:var(--muted);cursor:pointer}
.legend{display:flex;gap:12px;font-size:12.5px;color:var(--muted);align-items:center}
table{border-collapse:collapse;width:100%;table-layout:fixed}
col.who{width:150px}col.state{width:125px}col.g{width:350px}
th,td{text-align:left;vertical-align:top;padding:7px 10px;border-bottom:1px solid var(--line)}
thead th{font-size:12px;text-transform:uppercase;letter-spacing:.5px;color:var(--muted);background:#fafbfc;font-weight:600}
tr.node th{background:#eef1f6;font-size:13px;color:#344054;padding:6px 10px}
tr.node th .sub{color:var(--muted);font-weight:400;margin-left:8px}
th.who{font-weight:600;overflow-wrap:anywhere}
th.who .vmid{display:inline-block;margin-left:6px;font-size:11.5px;color:var(--muted);font-weight:500;background:var(--na-bg);border-radius:4px;padding:0 5px}
.pill{display:inline-block;border-radius:999px;padding:1px 9px;font-size:12px;font-weight:600;margin:0 4px 3px 0;white-space:nowrap}
.pill.ready{background:var(--pass-bg);color:var(--pass)}.pill.notready{background:var(--fail-bg);color:var(--fail)}
.pill.job{background:var(--job-bg);color:var(--job)}.pill.fix{background:var(--fix-bg);color:var(--fix)}
.pill.err{background:#475467;color:#fff}
td.c{padding:6px 6px}
.cell{display:flex;gap:7px;align-items:flex-start;border-radius:7px;padding:5px 8px;font-size:12.5px}
.cell .i{flex:none;width:18px;height:18px;border-radius:50%;display:inline-flex;align-items:center;justify-content:center;
font-size:12px;font-weight:700;color:#fff}
.cell .t{overflow:hidden;display:-webkit-box;-webkit-line-clamp:3;-webkit-box-orient:vertical}
.cell.pass{background:transparent;color:#3f7a57;padding:3px 8px}.cell.pass .i{background:var(--pass)}
.cell.fail{background:var(--fail-bg);color:#7a1a12}.cell.fail .i{background:var(--fail)}
.cell.warn{background:var(--warn-bg);color:#7a3306}.cell.warn .i{background:#f79009}
.cell.job{background:transparent;color:var(--job);padding:3px 8px}.cell.job .i{background:var(--job)}
.cell.na{background:var(--na-bg);color:var(--muted)}.cell.na .i{background:var(--na)}
td.errmsg .cell{max-width:none}

.gpu{margin-bottom:6px}
.gpu:last-child{margin-bottom:0}
.gh{display:flex;justify-content:space-between;font-size:12px;color:#344054}
.gh b{font-weight:600}.gh span{color:var(--muted);font-variant-numeric:tabular-nums}
.bar{height:9px;background:#e9edf3;border-radius:5px;overflow:hidden;margin:2px 0}
.bar i{display:block;height:100%;border-radius:5px}
.bar i.idle{background:#98a2b3}.bar i.busy{background:var(--job)}.bar i.stale{background:var(--fail)}.bar i.used{background:#f79009}
.procs{font-size:11.5px;color:var(--muted);white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.procs code{font:11.5px ui-monospace,SFMono-Regular,Menlo,"DejaVu Sans Mono",monospace;color:#344054}
.none{color:var(--na);font-size:12px}
body.only-problems tr.h.ok{display:none}
body.only-problems tr.node.ok{display:none}
h2{font-size:16px;margin:22px 0 10px}
.findings{display:grid;grid-template-columns:repeat(auto-fill,minmax(380px,1fr));gap:12px}
.finding{background:var(--card);border:1px solid var(--line);border-top:4px solid var(--fail);border-radius:10px;padding:10px 14px}
.finding.warnonly{border-top-color:#f79009}
.finding h3{margin:0 0 6px;font-size:14px}
.finding h3 .sub{color:var(--muted);font-weight:400;font-size:12.5px;margin-left:6px}
.finding ul{margin:4px 0 0;padding-left:18px;font-size:13px}
.finding li{margin:2px 0}
.finding .k{font-weight:600}
footer{color:var(--muted);font-size:12px;padding:0 28px 24px}
footer a{color:var(--muted)}
"""

_JS = """
(function(){var b=document.getElementById('only-problems');if(!b)return;
function f(){document.body.classList.toggle('only-problems',b.checked);}b.addEventListener('change',f);f();})();
"""

# Nothing is fetched from anywhere: no scripts, styles, fonts or images but the inline ones.
_CSP = "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"

_ICONS = {"job": "\u25b6", "pass": "\u2713", "fail": "\u2715", "warn": "!", "na": "\u2013"}
_STATE_WORD = {"job": "in use by the running job", "pass": "passed", "fail": "failed", "warn": "warning", "na": "not run"}


def _cell(state, text, tip):
    return '<div class="cell %s" title="%s"><span class="i" aria-label="%s">%s</span><span class="t">%s</span></div>' % (
        state, e(tip), _STATE_WORD[state], _ICONS[state], e(text))


def _gpu_bar_class(h, g):
    if not g["memory_used_mib"] and not g["processes"]:
        return "idle"
    if h["running_job"]:
        return "busy"
    gpu_checks = [c for c in h["checks"] if c["name"].startswith("gpu")]
    if any(not c["ok"] for c in gpu_checks):
        return "stale"
    return "used"


def _gpu_strip(h):
    if not h["gpus"]:
        return '<span class="none">no GPU reported</span>'
    parts = []
    for g in sorted(h["gpus"], key=lambda g: g["index"]):
        total = g["memory_total_mib"]
        pct = 0.0 if not total else min(100.0, 100.0 * g["memory_used_mib"] / total)
        util = "" if g["utilization_pct"] is None else " \u00b7 %d%% util" % g["utilization_pct"]
        tip = "GPU %d %s %s: %d of %d MiB used%s" % (g["index"], g["name"], g["uuid"], g["memory_used_mib"], total, util)
        procs = []
        for p in g["processes"]:
            mem = "" if p["used_memory_mib"] is None else " %s GiB" % _gib(p["used_memory_mib"])
            procs.append("<code>%s</code> \u00b7 pid %d%s" % (e(p["name"] or "?"), p["pid"], e(mem and " \u00b7" + mem)))
        parts.append(
            '<div class="gpu" title="%s"><div class="gh"><b>GPU%d <small>%s</small></b><span>%s / %s GiB%s</span></div>'
            '<div class="bar"><i class="%s" style="width:%.1f%%"></i></div>%s</div>' % (
                e(tip), g["index"], e(g["name"]), _gib(g["memory_used_mib"]), _gib(total), e(util),
                _gpu_bar_class(h, g), pct,
                "".join('<div class="procs">%s</div>' % p for p in procs) if procs else ""))
    return "".join(parts)


def _state_pills(h):
    pills = []
    if h["error"]:
        pills.append('<span class="pill err">unreachable</span>')
    pills.append('<span class="pill ready">ready</span>' if h["ready"] else '<span class="pill notready">not ready</span>')
    if h["running_job"]:
        pills.append('<span class="pill job" title="a healthy training job is running; hygiene leaves it alone">job running</span>')
    if h["remediated"]:
        pills.append('<span class="pill fix" title="this run changed something on it">remediated</span>')
    return "".join(pills)


def _host_ok(h):
    return h["ready"] and not h["error"] and all(c["ok"] for c in h["checks"])


def _row(h, checks):
    by_name = dict((c["name"], c) for c in h["checks"])
    vmid = '<span class="vmid">%d</span>' % h["vmid"] if h["vmid"] is not None else ""
    cells = []
    if h["error"] and not h["checks"]:
        cells.append('<td class="c errmsg" colspan="%d">%s</td>' % (
            max(1, len(checks)), _cell("fail", h["error"], "%s: %s" % (h["host"], h["error"]))))
    else:
        for name in checks:
            c = by_name.get(name)
            if c is None:
                cells.append('<td class="c">%s</td>' % _cell("na", "", "%s: not run on %s" % (name, h["host"])))
                continue
            state = check_state(c)
            text = c["summary"] if state != "pass" else "ok"
            if state == "pass" and h["running_job"] and name.startswith("gpu"):
                state, text = "job", "in use by the job"
            cells.append('<td class="c">%s</td>' % _cell(state, text, "%s \u2014 %s: %s" % (
                h["host"], name, c["summary"] or _STATE_WORD[state])))
    return '<tr class="h %s"><th class="who" title="%s">%s%s</th><td class="state">%s</td>%s<td class="g">%s</td></tr>' % (
        "ok" if _host_ok(h) else "bad", e(h["host"]), e(h["host"]), vmid, _state_pills(h), "".join(cells), _gpu_strip(h))


def _finding(h):
    items = []
    if h["error"]:
        items.append('<li><span class="k">unreachable:</span> %s</li>' % e(h["error"]))
    for c in h["checks"]:
        state = check_state(c)
        if state != "pass":
            items.append('<li><span class="k">%s</span> (%s): %s</li>' % (e(c["name"]), state, e(c["summary"])))
    for c in h["contaminants"]:
        cuda = "" if c["cuda_major"] is None else ", CUDA %d" % c["cuda_major"]
        items.append('<li>contaminant <code>%s %s</code>%s</li>' % (e(c["name"]), e(c["version"]), e(cuda)))
    for c in h["caches"]:
        if c["fresh"] is False:
            items.append('<li>stale cache <span class="k">%s</span> <code>%s</code> (%s, %d entries)</li>' % (
                e(c["name"]), e(c["path"]), _bytes(c["size_bytes"]), c["entries"]))
    if not items:
        return ""
    warn_only = not h["error"] and all(c["ok"] or c["severity"] == "warn" for c in h["checks"])
    where = " \u00b7 ".join(x for x in (h["node"] and "node %s" % h["node"], h["vmid"] is not None and "vmid %d" % h["vmid"]) if x)
    return '<div class="finding%s"><h3>%s<span class="sub">%s</span></h3><ul>%s</ul></div>' % (
        " warnonly" if warn_only else "", e(h["host"]), e(where), "".join(items))


def render_html(run, links=None):
    hosts, checks, s = run["hosts"], run["checks"], run["summary"]
    ts = _run_ts(run)
    all_ok = s["not_ready"] == 0 and s["error"] == 0
    verdict = ('<span class="verdict ok">all %d ready</span>' % s["hosts"]) if all_ok else (
        '<span class="verdict bad">%d of %d not ready</span>' % (s["not_ready"], s["hosts"]))
    meta = "Run started %s UTC \u00b7 %d hosts on %d nodes \u00b7 %d GPUs" % (
        ts.strftime("%Y-%m-%d %H:%M:%S"), s["hosts"], s["nodes"], s["gpus"])
    cards = [
        ("ready", s["ready"], "ready"),
        ("notready", s["not_ready"], "not ready"),
        ("job", s["running_job"], "running jobs left alone"),
        ("fix", s["remediated"], "remediated this run"),
    ]
    if s["error"]:
        cards.append(("err", s["error"], "unreachable"))
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        _CSP,
        "<title>%s \u2014 %s</title>" % (e(run["title"]), e(ts.strftime("%Y-%m-%d %H:%M UTC"))),
        "<style>%s</style></head>" % _CSS,
        "<body>",
        '<header><div><h1>%s</h1><div class="meta">%s</div></div>%s</header>' % (e(run["title"]), e(meta), verdict),
        "<main>",
        '<section class="cards">%s</section>' % "".join(
            '<div class="card %s"><div class="n">%d</div><div class="l">%s</div></div>' % (cls, n, e(label)) for cls, n, label in cards),
        '<section class="panel"><div class="toolbar"><label><input type="checkbox" id="only-problems"> '
        "only hosts that need attention</label>"
        '<div class="legend">%s%s%s%s</div></div>' % (
            _cell("pass", "pass", "the check passed"), _cell("warn", "warn", "the check warned (does not block readiness)"),
            _cell("fail", "fail", "the check failed"), _cell("na", "not run", "the check did not run on this host")),
        '<table id="matrix"><colgroup><col class="who"><col class="state">%s<col class="g"></colgroup>' % ('<col>' * len(checks)) +
        '<thead><tr><th>Host</th><th>State</th>%s<th>GPU memory and holders</th></tr></thead>' % "".join(
            "<th>%s</th>" % e(n.replace("_", " ")) for n in checks),
    ]
    groups = []
    for h in hosts:
        if not groups or groups[-1][0] != h["node"]:
            groups.append((h["node"], []))
        groups[-1][1].append(h)
    for node, members in groups:
        ready = sum(1 for h in members if h["ready"])
        label = ("node %s" % node) if node is not None else "plain hosts"
        out.append('<tbody><tr class="node %s"><th colspan="%d">%s<span class="sub">%d hosts \u00b7 %d ready</span></th></tr>' % (
            "ok" if all(_host_ok(h) for h in members) else "bad", len(checks) + 3, e(label), len(members), ready))
        out.extend(_row(h, checks) for h in members)
        out.append("</tbody>")
    out.append("</table></section>")
    findings = [f for f in (_finding(h) for h in hosts) if f]
    if findings:
        out.append("<h2>What needs attention</h2><section class=\"findings\">%s</section>" % "".join(findings))
    out.append("</main>")
    link_html = ""
    if links:
        link_html = " \u00b7 also: " + ", ".join('<a href="%s">%s</a>' % (e(href), e(label)) for label, href in links)
    out.append("<footer>gpufleet.hygiene fleet_report \u00b7 schema %d%s</footer>" % (run["schema_version"], link_html))
    out.append("<script>%s</script>" % _JS)
    out.append("</body></html>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------------------------
# Files


def render(run, formats):
    """Return {format: text} for the formats asked."""
    texts = {}
    for fmt in formats:
        if fmt == "json":
            texts[fmt] = render_json(run)
        elif fmt == "junit":
            texts[fmt] = render_junit(run)
        elif fmt == "prometheus":
            texts[fmt] = render_prometheus(run)
        elif fmt == "html":
            links = [(f, FILENAMES[f]) for f in ("json", "junit", "prometheus") if f in formats]
            texts[fmt] = render_html(run, links)
    return texts


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except (IOError, OSError) as exc:
        raise ReportError("%s cannot be read: %s" % (path, exc.strerror or exc)) from exc


def write_atomic(path, text, mode=0o644):
    """Write text to path through a temporary file in the same directory and a rename.

    The temporary name starts with a dot and does not end in .prom, so a textfile collector
    scanning the directory never reads a half-written file.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class FleetReport(object):
    """Plan and write the report files; a file is rewritten only when its content differs."""

    def __init__(self, hosts, dest, formats=FORMATS, title="GPU fleet hygiene", run_started=None,
                 prometheus_file=None, check_mode=False, now=None):
        if not title or not str(title).strip():
            raise ReportError("title must not be empty")
        self.hosts, self.warnings = normalize_hosts(hosts)
        self.dest = dest
        self.formats = [f for f in FORMATS if f in formats]
        unknown = sorted(set(formats) - set(FORMATS))
        if unknown:
            raise ReportError("formats: unknown %s (choose from %s)" % (", ".join(unknown), ", ".join(FORMATS)))
        if prometheus_file and "prometheus" not in self.formats:
            raise ReportError("prometheus_file is set but 'prometheus' is not in formats")
        self.prometheus_file = prometheus_file
        self.check_mode = check_mode
        self.started = parse_timestamp(run_started, now=now)
        self.run = build_run(self.hosts, str(title), self.started)

    def targets(self):
        out = [(fmt, os.path.join(self.dest, FILENAMES[fmt])) for fmt in self.formats]
        if self.prometheus_file:
            path = self.prometheus_file
            if os.path.isdir(path):
                path = os.path.join(path, FILENAMES["prometheus"])
            elif not path.endswith(".prom"):
                self.warnings.append("prometheus_file %s does not end in .prom; a textfile collector ignores it" % path)
            out.append(("prometheus", path))
        return out

    def _check_dirs(self, paths):
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise ReportError("dest %s exists and is not a directory" % self.dest)
        for path in paths:
            parent = os.path.dirname(os.path.abspath(path))
            if parent != os.path.abspath(self.dest) and not os.path.isdir(parent):
                raise ReportError("the directory of %s does not exist" % path)
            if os.path.isdir(path):
                raise ReportError("%s is a directory" % path)

    def apply(self):
        texts = render(self.run, self.formats)
        targets = self.targets()
        self._check_dirs([p for _f, p in targets])
        files, diffs = [], []
        for fmt, path in targets:
            text = texts[fmt]
            before = read_text(path)
            changed = before != text
            files.append({"format": fmt, "path": path, "changed": changed, "size": len(text.encode("utf-8"))})
            if changed:
                if fmt == "html":
                    diffs.append({"before_header": path, "after_header": path,
                                  "before": "" if before is None else "(HTML, %d characters)\n" % len(before),
                                  "after": "(HTML, %d characters)\n" % len(text)})
                else:
                    diffs.append({"before_header": path, "after_header": path, "before": before or "", "after": text})
        if not self.check_mode and any(f["changed"] for f in files):
            try:
                if not os.path.isdir(self.dest):
                    os.makedirs(self.dest)
                for f in files:
                    if f["changed"]:
                        write_atomic(f["path"], texts[f["format"]])
            except (IOError, OSError) as exc:
                where = getattr(exc, "filename", None) or self.dest
                raise ReportError("cannot write the report: %s: %s" % (where, exc.strerror or exc)) from exc
        not_ready = [h["host"] for h in self.hosts if not h["ready"]]
        return {
            "changed": any(f["changed"] for f in files),
            "files": files,
            "summary": self.run["summary"],
            "run_started": self.run["run_started"],
            "not_ready": not_ready,
            "diff": diffs,
        }
