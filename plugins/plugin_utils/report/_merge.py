# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run from the reports of its slices (AWX job slicing, or concurrent ansible-runner jobs).

Each slice of a sliced run writes its own report.json; merged, their records make the report
of the whole run, host for host, as one unsliced run would have written it. A host reported by
two slices or a slice's report that is missing is an error: the merged report must hold every
host exactly once.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import json
import os
import re

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._report import FILENAMES, read_text
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import SCHEMA_VERSION, TIME_FORMAT, parse_timestamp
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import ReportError

# The deepest nesting of arrays and objects a slice's report.json may have (a report's own nests
# 12 deep at most: a MIG instance's holders in a gpu_healthy check).
JSON_DEPTH_MAX = 32
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def json_depth(text):
    """How deep arrays and objects nest in a JSON text (strings skipped), counted without parsing."""
    depth = deepest = 0
    for m in _JSON_TOKEN.finditer(text):
        token = m.group(0)
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def report_path(path):
    """A slice is named by its report.json or by the directory that holds it."""
    return os.path.join(path, FILENAMES["json"]) if os.path.isdir(path) else path


def load_json(path, what="slice report"):
    """The JSON a report file holds, its nesting checked before it is parsed; ReportError when it is not JSON."""
    text = read_text(path)
    if text is None:
        raise ReportError("%s %s is missing" % (what, path))
    depth = json_depth(text)
    if depth > JSON_DEPTH_MAX:
        raise ReportError("%s %s nests arrays and objects %d deep, more than a fleet report's %d at most; "
                          "it is not one of this collection's reports" % (what, path, depth, JSON_DEPTH_MAX))
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ReportError("%s %s is not JSON: %s" % (what, path, exc)) from exc
    if not isinstance(data, dict):
        raise ReportError("%s %s is not a fleet report (not a JSON object)" % (what, path))
    return data


def check_report(path, run, what="slice report"):
    """run, when it is a fleet report of this schema; ReportError naming path otherwise."""
    if not isinstance(run.get("hosts"), list):
        raise ReportError("%s %s is not a fleet report (no hosts list)" % (what, path))
    if run.get("schema_version") != SCHEMA_VERSION:
        raise ReportError("%s %s has schema_version %s, this collection writes %d"
                          % (what, path, json.dumps(run.get("schema_version")), SCHEMA_VERSION))
    return run


def load_slice(path):
    """The run a slice's report.json holds; ReportError when it is not one."""
    return check_report(path, load_json(path))


def _name(rec):
    """The host a record names, when it names one (a string); else None: the report checks the
    record and shows it as unreadable."""
    name = rec.get("host") if isinstance(rec, dict) else None
    return name if isinstance(name, str) else None


def merge_slices(paths, hosts=(), missing="fail", origins=None):
    """Merge the slices' reports (and the records in hosts, if any) into one list of records.

    Returns (records, slices, warnings): slices describes each path (its report, whether it was
    found, how many hosts it held, its run_started). A host in two places is an error; a missing
    slice is one too unless missing is "warn", when it is named in a warning and left out. When
    origins is a list, it is filled with where each record came from (for the report's errors).
    """
    if missing not in ("fail", "warn"):
        raise ReportError("merge_missing must be 'fail' or 'warn', got %s" % json.dumps(missing))
    records = list(hosts)
    where = dict((_name(r), "hosts[%d]" % i) for i, r in enumerate(records) if _name(r) is not None)
    if origins is not None:
        origins[:] = ["hosts[%d]" % i for i in range(len(records))]
    slices, warnings, absent = [], [], []
    for path in map(report_path, paths):
        if not os.path.exists(path):
            absent.append(path)
            slices.append({"path": path, "found": False, "hosts": 0, "run_started": None})
            continue
        run = load_slice(path)
        for i, rec in enumerate(run["hosts"]):
            name = _name(rec)
            if name is not None and name in where:
                raise ReportError("host %s is in two slices: %s and %s (the slices must not overlap)"
                                  % (json.dumps(name), where[name], path))
            if name is not None:
                where[name] = path
            records.append(rec)
            if origins is not None:
                origins.append("slice report %s, its hosts[%d]" % (path, i))
        slices.append({"path": path, "found": True, "hosts": len(run["hosts"]), "run_started": run.get("run_started")})
    if absent:
        msg = "%d of %d slice reports missing: %s" % (len(absent), len(slices), ", ".join(absent))
        if missing == "fail":
            raise ReportError(msg + " (a slice that did not finish; merge_missing=warn writes the report without it)")
        warnings.append(msg + "; their hosts are not in the report")
    return records, slices, warnings


def earliest_start(slices):
    """The start of the whole run: the earliest of the slices' run_started (None when none has one)."""
    times = [parse_timestamp(s["run_started"]) for s in slices if s["found"] and s["run_started"]]
    return min(times).strftime(TIME_FORMAT) if times else None
