# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run: its time, the summary counts, the check columns, and the run as JSON.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import datetime
import json

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import ReportError

SCHEMA_VERSION = 1
# Checks the verify role produces, shown first and in this order; others follow as first seen.
KNOWN_CHECKS = ("gpu_idle", "job_live", "job_libraries", "venv_clean", "packages", "caches_fresh", "job_config", "gpu_healthy")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


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


def started(run):
    """The run's start as a datetime (the run holds it as text, as the files do)."""
    return parse_timestamp(run["run_started"])


def check_names(hosts):
    seen = []
    for h in hosts:
        for c in h["checks"]:
            if c["name"] not in seen:
                seen.append(c["name"])
    known = [n for n in KNOWN_CHECKS if n in seen]
    return known + [n for n in seen if n not in known]


def check_state(check):
    """pass, fail or warn."""
    if check["ok"]:
        return "pass"
    return check["severity"]


def record_cell(h):
    """A host's state and lines in a report: its error, repaired, its failed checks, or ready."""
    failed = ["%s: %s" % (c["name"], c["summary"]) if c["summary"] else c["name"] for c in h["checks"] if not c["ok"]]
    if h["error"]:
        return {"state": "err", "lines": [h["error"]]}
    if h["repair_error"]:
        return {"state": "fail", "lines": ["the repair failed: %s" % h["repair_error"]] + failed}
    if h["remediated"]:
        return {"state": "fix" if h["ready"] else "fail", "lines": ["repaired in this run"] + failed}
    if not h["ready"]:
        return {"state": "fail", "lines": failed or ["not ready"]}
    return {"state": "pass", "lines": ["ready, its job running" if h["running_job"] else "ready"] + failed}


def summarize(hosts):
    states = [check_state(c) for h in hosts for c in h["checks"]]
    return {
        "hosts": len(hosts),
        "ready": sum(1 for h in hosts if h["ready"]),
        "not_ready": sum(1 for h in hosts if not h["ready"]),
        "running_job": sum(1 for h in hosts if h["running_job"]),
        "remediated": sum(1 for h in hosts if h["remediated"]),
        "error": sum(1 for h in hosts if h["error"]),
        "repair_failed": sum(1 for h in hosts if h["repair_error"]),
        "checks_failed": states.count("fail"),
        "checks_warned": states.count("warn"),
        "nodes": len(set(h["node"] for h in hosts if h["node"] is not None)),
        "gpus": sum(len(h["gpus"]) for h in hosts),
        "contaminants": sum(len(h["contaminants"]) for h in hosts),
    }


RUN_KINDS = ("preflight", "remediate", "hygiene")


def build_run(hosts, title, run_started, run_kind="hygiene", phases=None):
    """The whole run, as report.json holds it: hosts already normalized, run_started a datetime;
    phases (earlier runs of the same incident, _phases.load_phases) only when there are any."""
    if run_kind not in RUN_KINDS:
        raise ReportError("run_kind must be one of %s, got %s" % (", ".join(RUN_KINDS), json.dumps(run_kind)))
    run = {
        "schema_version": SCHEMA_VERSION,
        "title": title,
        "run_kind": run_kind,
        "run_started": run_started.strftime(TIME_FORMAT),
        "summary": summarize(hosts),
        "checks": check_names(hosts),
        "hosts": hosts,
    }
    if phases:
        run["phases"] = phases
    return run


def render_json(run):
    return json.dumps(run, indent=2, sort_keys=False, ensure_ascii=False) + "\n"
