# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""An incident's phases: what earlier runs found and did, beside this run's verdict.

A phase is a file an earlier run wrote: a fleet report (report.json, of preflight for example) or
the outcome of a repair run (the gpufleet.hygiene.outcome callback's file, of remediate). Each is
read as input, not trusted: a report's records go through the report's own checks, an outcome's
entries are typed and bounded the same way. Every phase becomes one cell per host: a state
(pass, fail, fix, err or na) and the lines that say why.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import json
import os

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._merge import check_report, load_json, report_path
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import record_cell
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import ITEMS_MAX, NAME_MAX, TEXT_MAX, ReportError, normalize_hosts

OUTCOME_KIND = "gpufleet.hygiene.outcome"
OUTCOME_VERSION = 1
PHASES_MAX = 16


def _text(path, key, value, limit=TEXT_MAX):
    if not isinstance(value, str) or len(value) > limit:
        raise ReportError("outcome %s: %s must be a string of at most %d characters" % (path, key, limit))
    return value


def _outcome(path, data):
    """The cells of a repair run's outcome file: what it did (or, under --check, would do) on each host."""
    if data.get("version") != OUTCOME_VERSION:
        raise ReportError("outcome %s has version %s, this collection writes %d"
                          % (path, json.dumps(data.get("version")), OUTCOME_VERSION))
    hosts = data.get("hosts")
    if not isinstance(hosts, list) or len(hosts) > ITEMS_MAX:
        raise ReportError("outcome %s: hosts must be a list of at most %d entries" % (path, ITEMS_MAX))
    check = data.get("check") is True
    cells = {}
    for i, h in enumerate(hosts):
        if not isinstance(h, dict):
            raise ReportError("outcome %s: hosts[%d] must be a dict" % (path, i))
        name = _text(path, "hosts[%d].host" % i, h.get("host"), NAME_MAX)
        actions = h.get("actions") or []
        if not isinstance(actions, list) or len(actions) > ITEMS_MAX:
            raise ReportError("outcome %s: hosts[%d].actions must be a list" % (path, i))
        lines = [_text(path, "hosts[%d].actions[%d]" % (i, j), a) for j, a in enumerate(actions)]
        failed = h.get("failed")
        if failed is not None:
            lines.append("FAILED at " + _text(path, "hosts[%d].failed" % i, failed))
        state = "fail" if failed is not None else "fix" if lines else "pass"
        cells[name] = {"state": state, "lines": lines or ["nothing to do"]}
    return {"kind": "outcome", "check": check, "when": data.get("finished") if isinstance(data.get("finished"), str) else None,
            "cells": cells}


def load_phase(label, path):
    """One phase, {label, source, kind, when, cells: {host: {state, lines}}}; ReportError when unreadable."""
    if not isinstance(label, str) or not label.strip() or len(label) > NAME_MAX:
        raise ReportError("phases: each needs a label (a short text such as 'preflight found'), got %s" % json.dumps(label))
    source = report_path(path)
    if not os.path.exists(source):
        raise ReportError("phase %s: %s is missing (the run that writes it did not run, or wrote elsewhere)" % (json.dumps(label), source))
    data = load_json(source, "phase %s:" % json.dumps(label))
    if data.get("kind") == OUTCOME_KIND:
        phase = _outcome(source, data)
    else:
        run = check_report(source, data, "phase %s:" % json.dumps(label))
        hosts, _warnings = normalize_hosts(run["hosts"], ["phase report %s" % source] * len(run["hosts"]))
        phase = {"kind": "report", "check": False, "when": run.get("run_started"), "cells": {h["host"]: record_cell(h) for h in hosts}}
    phase.update(label=label.strip(), source=os.path.abspath(source))
    return phase


def load_phases(phases):
    """The phases option, in order; ReportError naming the first that cannot be read."""
    if len(phases) > PHASES_MAX:
        raise ReportError("phases: at most %d, got %d" % (PHASES_MAX, len(phases)))
    return [load_phase(p.get("label"), p.get("path")) for p in phases]
