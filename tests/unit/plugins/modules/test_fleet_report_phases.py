# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_report's phases and run_kind: an incident on one page (what preflight found, what remediate
did, the verdict now), a preflight's counts about readiness, what to do beside every attention item."""

from __future__ import annotations

import copy
import html
import json
import os
import re

import pytest
from ansible.errors import AnsibleActionFail
from fleet_sample import HOSTILE_NAME, VENV_SUMMARY, realistic_fleet
from test_fleet_report import FILES, args, run_fleet_report

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report import _html

CSS = os.path.join(os.path.dirname(_html.__file__), "templates", "report.css")


def outcome(hosts, check=False, **extra):
    data = {"kind": "gpufleet.hygiene.outcome", "version": 1, "check": check, "playbook": "remediate.yml",
            "finished": "2025-06-01T02:40:00Z", "hosts": hosts}
    data.update(extra)
    return data


def after_repair():
    """The fleet after remediate: the three broken containers repaired and running their jobs."""
    fleet = realistic_fleet()
    for h in fleet:
        if h["host"] in ("train-a1", "train-b1", "train-c1"):
            h.update(ready=True, running_job=True, contaminants=[], caches=[],
                     checks=[dict(c, ok=True, summary="") for c in h["checks"]])
    return fleet


@pytest.fixture
def incident(tmp_path):
    """A preflight report of the realistic fleet and remediate's outcome file, as make run leaves them."""
    run_fleet_report(args(tmp_path / "preflight", title="Preflight before the repair", run_kind="preflight"))
    (tmp_path / "remediate.json").write_text(json.dumps(outcome([
        {"host": "train-a1", "actions": ["removed nvidia-nccl-cu13 2.28.9", "relaunched `python train.py`"], "failed": None},
        {"host": "train-b1", "actions": ["stopped pid 40170 /opt/venv/bin/python3"], "failed": None},
        {"host": "train-c1", "actions": [], "failed": "Clear the compile caches: permission denied"},
        {"host": "train-a2", "actions": [], "failed": None},
    ])))
    return tmp_path


def phases(base):
    return [{"label": "preflight found", "path": str(base / "preflight")},
            {"label": "remediate did", "path": str(base / "remediate.json")}]


def phase_rows(page):
    table = page[page.index('<table id="phases">'):]
    table = table[:table.index("</table>")]
    rows = {}
    for row in table.split("<tr>")[2:]:
        name = html.unescape(row.split('<th class="who">', 1)[1].split("</th>", 1)[0])
        rows[name] = [(m.group(1), html.unescape(m.group(2))) for m in
                      re.finditer(r'<div class="cell (\w+)"[^>]*><span class="i"[^>]*>[^<]*</span><span class="t">(.*?)</span></div>', row)]
    return table, rows


def test_the_page_shows_the_incident_phase_by_phase(incident):
    res = run_fleet_report(args(incident / "now", records=after_repair(), phases=phases(incident)))
    assert not res.get("failed"), res
    page = (incident / "now" / FILES["html"]).read_text()
    assert "This incident, phase by phase" in page
    table, rows = phase_rows(page)
    head = table[:table.index("</thead>")]
    assert head.index("preflight found") < head.index("remediate did") < head.index("Nightly GPU hygiene")
    assert len(rows) == 12  # every host of the run, in the run's order
    assert rows["train-a1"] == [("fail", "venv_clean: " + VENV_SUMMARY),
                                ("fix", "removed nvidia-nccl-cu13 2.28.9; relaunched `python train.py`"),
                                ("pass", "ready, its job running")]
    assert rows["train-b1"][1] == ("fix", "stopped pid 40170 /opt/venv/bin/python3")
    assert rows["train-c1"][1] == ("fail", "FAILED at Clear the compile caches: permission denied")
    assert rows["train-a2"] == [("pass", "ready"), ("pass", "nothing to do"), ("pass", "ready")]
    # a host remediate's outcome does not list was not in that run
    assert rows["train-a4"][1] == ("na", "not in this run")
    assert rows["train-c4"][0][0] == "err" and rows["train-c4"][2][0] == "err"
    # report.json holds the phases as the page shows them
    data = json.loads((incident / "now" / FILES["json"]).read_text())
    assert [p["label"] for p in data["phases"]] == ["preflight found", "remediate did"]
    assert [p["kind"] for p in data["phases"]] == ["report", "outcome"]
    assert data["phases"][1]["cells"]["train-b1"] == {"state": "fix", "lines": ["stopped pid 40170 /opt/venv/bin/python3"]}


def test_without_phases_the_page_and_json_are_as_before(tmp_path):
    run_fleet_report(args(tmp_path))
    assert "phase by phase" not in (tmp_path / FILES["html"]).read_text()
    assert "phases" not in json.loads((tmp_path / FILES["json"]).read_text())


@pytest.mark.parametrize("bad, message", [
    (lambda base: [{"label": "remediate did", "path": str(base / "absent.json")}], "absent.json is missing"),
    (lambda base: [{"label": "x", "path": str(base / "garbage.json")}], "is not JSON"),
    (lambda base: [{"label": "x", "path": str(base / "old.json")}], "has version 0, this collection writes 1"),
    (lambda base: [{"label": "x", "path": str(base / "notlist.json")}], "hosts[0].actions must be a list"),
    (lambda base: [{"label": "x", "path": str(base / "longname.json")}], "hosts[0].host must be a string of at most 256"),
    (lambda base: [{"label": "x", "path": str(base / "other.json")}], "is not a fleet report (no hosts list)"),
    (lambda base: [{"label": " ", "path": str(base / "preflight")}], "each needs a label"),
])
def test_a_phase_that_cannot_be_read_fails_the_task_and_names_it(incident, bad, message):
    (incident / "garbage.json").write_text("{not json")
    (incident / "old.json").write_text(json.dumps(outcome([], version=0)))
    (incident / "notlist.json").write_text(json.dumps(outcome([{"host": "a", "actions": "rm -rf /", "failed": None}])))
    (incident / "longname.json").write_text(json.dumps(outcome([{"host": "a" * 300, "actions": [], "failed": None}])))
    (incident / "other.json").write_text(json.dumps({"title": "something else"}))
    res = run_fleet_report(args(incident / "now", phases=bad(incident)))
    assert res.get("failed") and message in res["msg"], res
    assert not (incident / "now").exists()  # nothing written


def test_a_phase_s_records_are_checked_like_any_record(incident):
    """A preflight report edited by hand (a record that fails the report's checks) is that host's
    unreadable cell, not a crash and not its forged content."""
    path = incident / "preflight" / FILES["json"]
    data = json.loads(path.read_text())
    data["hosts"][0]["checks"] = "forged"
    path.write_text(json.dumps(data))
    res = run_fleet_report(args(incident / "now", phases=phases(incident)))
    assert not res.get("failed"), res
    _table, rows = phase_rows((incident / "now" / FILES["html"]).read_text())
    state, text = rows[data["hosts"][0]["host"]][0]
    assert state == "err" and text.startswith("unreadable record (phase report ") and "checks must be a list" in text


def test_hostile_text_in_an_outcome_stays_text(incident):
    (incident / "hostile.json").write_text(json.dumps(outcome([{"host": HOSTILE_NAME, "actions": [HOSTILE_NAME], "failed": None}])))
    run_fleet_report(args(incident / "now", phases=[{"label": HOSTILE_NAME[:40], "path": str(incident / "hostile.json")}]))
    page = (incident / "now" / FILES["html"]).read_text()
    assert "<script>alert" not in page and "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page


def cards(page):
    return re.findall(r'<div class="n">(\d+)</div><div class="l">([^<]+)</div>', page)


def test_a_preflight_s_counts_are_about_readiness(tmp_path):
    run_fleet_report(args(tmp_path / "pre", run_kind="preflight"))
    run_fleet_report(args(tmp_path / "hyg"))
    pre, hyg = ((tmp_path / d / FILES["html"]).read_text() for d in ("pre", "hyg"))
    assert cards(pre) == [("8", "ready"), ("4", "not ready"), ("4", "checks failed"), ("2", "checks warned"), ("1", "unreachable")]
    assert cards(hyg) == [("8", "ready"), ("4", "not ready"), ("1", "running jobs left alone"), ("1", "remediated this run"),
                          ("1", "unreachable")]
    assert json.loads((tmp_path / "pre" / FILES["json"]).read_text())["run_kind"] == "preflight"
    with pytest.raises(AnsibleActionFail, match="run_kind must be one of: preflight, remediate, hygiene, got: nightly"):
        run_fleet_report(args(tmp_path / "bad", run_kind="nightly"))


def test_every_attention_item_says_what_to_do(tmp_path):
    run_fleet_report(args(tmp_path))
    page = (tmp_path / FILES["html"]).read_text()
    section = page[page.index("<h2>What needs attention</h2>"):]
    items = section.split('<div class="finding')[1:]
    assert len(items) == 6
    for item in items:
        todo = [html.unescape(t) for t in re.findall(r'<li class="todo"><span class="act">→ (.*?)</span></li>', item)]
        assert todo, item
        host = item.split("<h3>", 1)[1].split("<", 1)[0]
        if host == "train-a1":
            assert todo == [_html.REMEDIES["venv_clean"]]
        if host == "train-b1":
            assert "--limit train-b1,localhost --check --diff" in todo[0]
        if host == "train-c4":
            assert todo == [("the run could not read it: check that its node answers (ansible NODE -m ping) and that the container "
                            "runs (pct status 304)")]


def test_no_cell_cuts_what_it_says():
    """GPU and check cells wrap their text: nothing is clamped to a few lines or cut with an ellipsis."""
    with open(CSS) as f:
        css = f.read()
    assert "line-clamp" not in css and "ellipsis" not in css
    # only the short pills and the verdict keep to one line
    assert [rule.split("{")[0].strip() for rule in css.split("}") if "nowrap" in rule] == ["header .verdict", ".pill"]


def test_the_phase_cells_of_a_check_mode_run_say_so(incident):
    data = json.loads((incident / "remediate.json").read_text())
    (incident / "plan.json").write_text(json.dumps(dict(copy.deepcopy(data), check=True)))
    run_fleet_report(args(incident / "now", phases=[{"label": "remediate would do", "path": str(incident / "plan.json")}]))
    table, _rows = phase_rows((incident / "now" / FILES["html"]).read_text())
    assert "remediate would do (check mode)" in table
