# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run as one self-contained HTML page, from templates/report.html.j2.

The template lays the page out; this module decides what each part says (the state of a cell,
the colour of a GPU bar, what needs attention), so the template holds no logic of its own.
Autoescaping is on: every value reaches the page as text, whatever a container or process is named.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import os

import jinja2

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import check_state, record_cell, started
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import UNREADABLE

TEMPLATES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
# The throughput gate's default min_fraction (job/_throughput.Gate, the relaunch role's
# relaunch_min_fraction): below it the page marks the job's tok/s as low, as the alert rules do.
GATE_FRACTION = 0.9
# A cell's state in words, for screen readers and tooltips.
STATE_WORDS = {"job": "in use by the running job", "pass": "passed", "fail": "failed", "warn": "warning", "na": "not run",
               "fix": "repaired", "err": "unreachable or unreadable"}


# What to do about a failed check, as docs/checks.md says it; {host} is the host's name. A check
# named here that the page does not know gets the generic line.
REMEDIES = {
    "gpu_idle": "a process holds GPU memory: see what would stop with ansible-playbook remediate.yml --limit {host},localhost "
                "--check --diff, then run it; if the holder is the job you want running, pass -e gpufleet_allow_running_job=true",
    "job_live": "the job is down, stalled or slow: remediate.yml relaunches it (a stalled one is stopped only with "
                "-e gpufleet_repair_stalled=true)",
    "job_libraries": "the job mapped CUDA libraries not of its venv: remediate.yml stops it, purges the venv and relaunches it",
    "venv_clean": "remediate.yml removes the packages built for another CUDA and restores the files they clobbered "
                  "(--check --diff lists them first)",
    "packages": "reinstall the venv's baseline (a missing package or another version); remediate.yml then verifies it",
    "caches_fresh": "remediate.yml clears the compile caches built for another torch, Triton, CUDA or FlashInfer",
    "job_config": "fix the inventory variable the check names; no repair runs on this container until it is fixed",
    "gpu_healthy": "a GPU or driver fault no repair fixes: see the GPU health section for each finding's action",
}
REMEDY_OTHER = "see docs/checks.md for this check; preflight.yml -v shows its whole record"
REMEDY_UNREACHABLE = ("the run could not read it: check that its node answers (ansible NODE -m ping) and that the container "
                      "runs (pct status {vmid})")
REMEDY_REPAIR = ("the repair failed part-way: fix what its message names, then see what a repair would do with "
                 "ansible-playbook remediate.yml --limit {host},localhost --check --diff")
REMEDY_UNREADABLE = "its record failed the report's checks: the error names the key; read the host again with preflight.yml"


def gib(mib):
    return "%.1f" % (mib / 1024.0)


def human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return "%.1f TiB" % n


def error_word(h):
    """What a host's error is called on the page: a record the report could not read (its check
    failed), else a host that could not be reached or read."""
    return "unreadable record" if (h["error"] or "").startswith(UNREADABLE) else "unreachable"


def host_ok(h):
    return h["ready"] and not h["error"] and not h["repair_error"] and all(c["ok"] for c in h["checks"])


def _cells(h, checks):
    """One (state, text, tooltip) per check column; None for a host that could not be read at all."""
    if h["error"] and not h["checks"]:
        return None
    by_name = dict((c["name"], c) for c in h["checks"])
    cells = []
    for name in checks:
        c = by_name.get(name)
        if c is None:
            cells.append(("na", "", "%s: not run on %s" % (name, h["host"])))
            continue
        state = check_state(c)
        text = c["summary"] if state != "pass" else "ok"
        # GPUs held by the healthy job pass, but the reader should see why they are busy.
        if state == "pass" and h["running_job"] and name.startswith("gpu"):
            state, text = "job", "in use by the job"
        cells.append((state, text, "%s \u2014 %s: %s" % (h["host"], name, c["summary"] or STATE_WORDS[state])))
    return cells


def _bar(h, g):
    """The colour of a GPU's memory bar: idle, the job's (busy), a stale holder's, or just used."""
    if not g["memory_used_mib"] and not g["processes"]:
        return "idle"
    if h["running_job"]:
        return "busy"
    if any(not c["ok"] for c in h["checks"] if c["name"].startswith("gpu")):
        return "stale"
    return "used"


def _gpus(h):
    out = []
    for g in sorted(h["gpus"], key=lambda g: g["index"]):
        total = g["memory_total_mib"]
        util = "" if g["utilization_pct"] is None else " \u00b7 %d%% util" % g["utilization_pct"]
        out.append({
            "index": g["index"], "name": g["name"], "util": util,
            "used_gib": gib(g["memory_used_mib"]), "total_gib": gib(total),
            "tip": "GPU %d %s %s: %d of %d MiB used%s" % (g["index"], g["name"], g["uuid"], g["memory_used_mib"], total, util),
            "bar": _bar(h, g),
            "pct": "%.1f" % (0.0 if not total else min(100.0, 100.0 * g["memory_used_mib"] / total)),
            "procs": [{"name": p["name"] or "?", "pid": p["pid"],
                       "mem": "" if p["used_memory_mib"] is None else " \u00b7 %s GiB" % gib(p["used_memory_mib"])}
                      for p in g["processes"]],
        })
    return out


def _check(h, name):
    return next((c for c in h["checks"] if c["name"] == name), None)


def _rate(h):
    """The job's last tok/s against its baseline (job_live's throughput), or None without a reading."""
    c = _check(h, "job_live")
    t = (c or {}).get("throughput") or {}
    if t.get("tokens_per_s") is None:
        return None
    rate = {"value": "{:,.0f}".format(t["tokens_per_s"]), "of": "", "state": "na",
            "tip": "%s: last reading %.1f tok/s in the job's log" % (h["host"], t["tokens_per_s"])}
    if t.get("ratio") is not None and t.get("baseline"):
        rate["of"] = "%.0f%% of %s" % (t["ratio"] * 100, "{:,.0f}".format(t["baseline"]))
        rate["state"] = "low" if t["ratio"] < GATE_FRACTION else "ok"
        rate["tip"] += ", %.0f%% of the %.0f baseline (the gate wants %.0f%%)" % (t["ratio"] * 100, t["baseline"], GATE_FRACTION * 100)
    return rate


def _health(h):
    """gpu_healthy's record of a host for the GPU health section: the driver against its pin, each
    GPU healthy or its findings with what to do; None when the check did not run there."""
    c = _check(h, "gpu_healthy")
    if c is None or not isinstance(c.get("gpus"), list):
        return None
    driver = c.get("driver") if isinstance(c.get("driver"), dict) else {}
    version, pin = driver.get("version"), driver.get("pin")
    gpus, findings = [], []
    for g in c["gpus"]:
        if not isinstance(g, dict):
            continue
        own = [_said(f, "GPU%s: " % g.get("index")) for f in (g.get("findings") or []) if isinstance(f, dict)]
        findings.extend(own)
        states = {f["state"] for f in own}
        gpus.append({
            "index": g.get("index"), "name": g.get("name") or "", "uuid": g.get("uuid") or "",
            "state": "fail" if not g.get("healthy") or "fail" in states else "warn" if "warn" in states else "pass",
        })
    findings.extend(_said(f, "") for f in (c.get("findings") or []) if isinstance(f, dict))
    return {
        "host": h["host"], "node": h["node"], "ok": c["ok"], "error": c.get("error") if isinstance(c.get("error"), str) else None,
        "driver": version or "unknown", "pin": pin, "pin_ok": not pin or version == pin, "gpus": gpus,
        # fail first, then warn, then info (which is no problem, so it shows only beside one)
        "findings": sorted(findings, key=lambda f: ("fail", "warn", "na").index(f["state"])),
    }


def _said(f, where):
    """A gpu_healthy finding as the page says it: its state (fail, warn, or na for info), what, what to do."""
    state = {"fail": "fail", "warn": "warn"}.get(f.get("severity"), "na")
    return {"state": state, "what": where + (f.get("what") or f.get("code") or ""), "action": f.get("action") or ""}


def _finding(h):
    """What needs attention on a host, or None."""
    f = {
        "host": h["host"],
        "where": " \u00b7 ".join(x for x in (h["node"] and "node %s" % h["node"], h["vmid"] is not None and "vmid %d" % h["vmid"]) if x),
        "error": h["error"],
        # an unreadable record's error says so itself
        "error_label": "unreachable" if error_word(h) == "unreachable" else "",
        "repair_error": h["repair_error"],
        "checks": [(c["name"], check_state(c), c["summary"]) for c in h["checks"] if not c["ok"]],
        "contaminants": h["contaminants"],
        "stale_caches": [dict(c, size=human_bytes(c["size_bytes"])) for c in h["caches"] if c["fresh"] is False],
        "warn_only": not h["error"] and not h["repair_error"] and all(c["ok"] or c["severity"] == "warn" for c in h["checks"]),
    }
    if not (f["error"] or f["repair_error"] or f["checks"] or f["contaminants"] or f["stale_caches"]):
        return None
    f["todo"] = _todo(h)
    return f


def _todo(h):
    """What to do about a host that needs attention: one line per failed check (warnings included), in order."""
    if h["error"]:
        if error_word(h) == "unreachable":
            return [REMEDY_UNREACHABLE.format(vmid=h["vmid"] if h["vmid"] is not None else "VMID")]
        return [REMEDY_UNREADABLE]
    todo = [REMEDY_REPAIR.format(host=h["host"])] if h["repair_error"] else []
    for c in h["checks"]:
        line = REMEDIES.get(c["name"], REMEDY_OTHER).format(host=h["host"])
        if not c["ok"] and line not in todo:
            todo.append(line)
    if not todo and (h["contaminants"] or any(c["fresh"] is False for c in h["caches"])):
        todo.append(REMEDIES["venv_clean" if h["contaminants"] else "caches_fresh"])
    return todo


def _groups(hosts, checks):
    """Hosts by node (they come sorted by node), each a row of the matrix."""
    groups = []
    for h in hosts:
        if not groups or groups[-1]["node"] != h["node"]:
            groups.append({"node": h["node"], "rows": []})
        groups[-1]["rows"].append(dict(h, ok=host_ok(h), cells=_cells(h, checks), gpu_view=_gpus(h), rate=_rate(h),
                                       error_word=error_word(h)))
    for g in groups:
        g["ok"] = all(r["ok"] for r in g["rows"])
        g["ready"] = sum(1 for r in g["rows"] if r["ready"])
    return groups


def _environment():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals["state_words"] = STATE_WORDS
    return env


def _cards(run):
    """The counts on top: a preflight's are about readiness (it changes nothing); a repair run's say what it left
    alone and what it repaired."""
    s = run["summary"]
    cards = [("ready", s["ready"], "ready"), ("notready", s["not_ready"], "not ready")]
    if run.get("run_kind") == "preflight":
        cards.append(("fix" if s["checks_failed"] else "ready", s["checks_failed"], "checks failed"))
        if s["checks_warned"]:
            cards.append(("job", s["checks_warned"], "checks warned"))
    else:
        cards += [("job", s["running_job"], "running jobs left alone"), ("fix", s["remediated"], "remediated this run")]
        if s["repair_failed"]:
            cards.append(("err", s["repair_failed"], "repairs failed"))
    return cards


def _phases(run, groups):
    """The incident, phase by phase: a row per host (this run's order, then hosts only earlier phases had), a
    column per earlier phase and one for this run."""
    phases = run.get("phases") or []
    if not phases:
        return None
    now = {r["host"]: record_cell(r) for g in groups for r in g["rows"]}
    hosts = list(now)
    for p in phases:
        hosts += [h for h in p["cells"] if h not in hosts]
    missing = {"state": "na", "lines": ["not in this run"]}
    columns = [{"label": p["label"] + (" (check mode)" if p.get("check") else ""), "when": p.get("when") or ""} for p in phases]
    columns.append({"label": run["title"], "when": run["run_started"]})
    rows = [{"host": h, "cells": [p["cells"].get(h, missing) for p in phases] + [now.get(h, missing)]} for h in hosts]
    return {"columns": columns, "rows": rows}


def render_html(run, links=()):
    """The page; links are (label, file name) of the run's other files, named in the footer."""
    s = run["summary"]
    cards = _cards(run)
    if s["error"]:
        unreadable = any(error_word(h) != "unreachable" for h in run["hosts"] if h["error"])
        cards.append(("err", s["error"], "unreachable or unreadable" if unreadable else "unreachable"))
    findings = [f for f in (_finding(h) for h in run["hosts"]) if f]
    groups = _groups(run["hosts"], run["checks"])
    health = [x for x in (_health(h) for h in run["hosts"]) if x]
    return _environment().get_template("report.html.j2").render(
        run=run, started=started(run), all_ok=s["not_ready"] == 0 and s["error"] == 0, cards=cards,
        groups=groups, findings=findings, links=list(links), health=health, phases=_phases(run, groups),
        show_rate=any(r["rate"] for g in groups for r in g["rows"]))
