# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Sliced runs over the session's simulated fleet: preflight and hygiene as three concurrent
ansible-runner jobs (contrib/awx/run_sliced.py, AWX's slices), their reports merged into one
(playbooks/merge_reports.yml). The merged records must be those of one unsliced run, byte for
byte, every host exactly once; a slice whose node cannot be reached still merges, its hosts
reported with their error."""

from __future__ import annotations

import importlib.util
import json
import os
import xml.etree.ElementTree as ET

import pytest
import yaml
from conftest import INVENTORY, REPO, VENV_BIN

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record import NO_RESULT

_spec = importlib.util.spec_from_file_location("run_sliced", os.path.join(REPO, "contrib", "awx", "run_sliced.py"))
run_sliced = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_sliced)

# The jobs find the collection and ansible-inventory as a user's would: the checkout's
# configuration, the venv's tools first on PATH.
ENV = {"ANSIBLE_CONFIG": os.path.join(REPO, "ansible.cfg"), "PATH": VENV_BIN + os.pathsep + os.environ["PATH"],
       "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
# Report-only: a hygiene run that repairs would change what the next run reads.
READ_ONLY = {"gpufleet_hygiene_remediate": "false"}


@pytest.fixture(autouse=True)
def environment(monkeypatch):
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)


def load(path):
    with open(path) as f:
        return json.load(f)


def sliced(inventory, count, playbook, out):
    slices = run_sliced.run_slices(inventory, count, playbook, str(out), extravars=READ_ONLY)
    merged = run_sliced.merge(slices, str(out), str(out / "report"), extravars=READ_ONLY)
    assert merged.rc == 0, merged.stdout.read()[-3000:]
    return slices, load(os.path.join(str(out), "report", "report.json"))


def containers(fleet):
    return sorted(ct["name"] for node in fleet["nodes"] for ct in node["containers"])


def ended_early(slices):
    """The hosts of slices whose run ended before their playbook wrote a report (Ansible stops a
    run at a play whose every host is unreachable): slice.yml's own record of them stands."""
    out = set()
    for s in slices:
        hosts = load(os.path.join(s["report"], "report.json"))["hosts"]
        if hosts and all(h["error"] == NO_RESULT for h in hosts):
            out.update(h["host"] for h in hosts)
    return out


def assert_same_records(merged, whole, early=frozenset()):
    """Every key but run_started (the only time in the report) the same; the records byte for byte,
    but for the hosts of a slice that ended early: unreachable in both, their error there says
    that no result came instead of ssh's words."""
    assert [h["host"] for h in merged["hosts"]] == [h["host"] for h in whole["hosts"]]
    worded = False
    for m, w in zip(merged["hosts"], whole["hosts"]):
        if m["host"] in early:
            assert w["error"] and not w["ready"] and not w["checks"], w
            assert m == dict(w, error=NO_RESULT), m["host"]
            continue
        if w["error"] and not w["checks"]:
            # Not read in both (a node that cannot be reached): the same record but for the
            # connection's own words, which differ with who reached for the node (the node as a
            # host of the slice, or a container through the pct connection).
            assert m["error"] and not m["checks"] and not m["ready"], m
            assert dict(m, error=None) == dict(w, error=None), m["host"]
            worded = True
            continue
        assert json.dumps(m, sort_keys=False) == json.dumps(w, sort_keys=False), m["host"]
    same = ("summary", "schema_version", "title")
    assert {k: merged.get(k) for k in same} == {k: whole.get(k) for k in same}
    if not early and not worded:
        assert {k: v for k, v in merged.items() if k != "run_started"} == {k: v for k, v in whole.items() if k != "run_started"}


@pytest.mark.parametrize("playbook", ["preflight", "hygiene"])
def test_three_slices_merge_into_the_unsliced_report(fleet, tmp_path, playbook):
    # The unsliced run: one job over the whole inventory, as run_sliced.py runs a job sliced once.
    [one], whole = sliced(INVENTORY, 1, playbook, tmp_path / "whole")
    if playbook == "preflight":
        assert one["status"] == "failed", one  # this fleet's venvs have no reference CUDA: none is ready
    slices, merged = sliced(INVENTORY, 3, playbook, tmp_path / "sliced")
    everyone = run_sliced.inventory_hosts(INVENTORY)
    # AWX's slices: the inventory's hosts by name, dealt out in turn; together every host once.
    assert [s["hosts"] for s in slices] == [sorted(everyone)[k::3] for k in range(3)]
    assert sorted(h for s in slices for h in s["hosts"]) == sorted(everyone)
    assert all(s["hosts"] for s in slices)
    # Each container's record comes from the one slice that holds it.
    for s in slices:
        mine = [h["host"] for h in load(os.path.join(s["report"], "report.json"))["hosts"]]
        assert sorted(mine) == [h for h in s["hosts"] if h in set(containers(fleet))], s
    assert sorted(h["host"] for h in merged["hosts"]) == containers(fleet)
    assert_same_records(merged, whole, ended_early(slices))
    report = tmp_path / "sliced" / "report"
    suite = ET.parse(str(report / "report.junit.xml")).getroot()
    assert sorted(set(c.get("classname").rsplit(".", 1)[1] for c in suite.iter("testcase"))) == containers(fleet)
    prom = (report / "gpufleet_hygiene.prom").read_text()
    assert 'gpufleet_hygiene_hosts{state="ready"} %d' % merged["summary"]["ready"] in prom, prom
    page = (report / "report.html").read_text()
    assert all(name in page for name in containers(fleet))


def test_a_slice_whose_node_is_unreachable_still_merges(fleet, tmp_path):
    """One node is at a port nothing listens on (as its containers' node and as a host): the
    slices holding its containers fail, the merge still writes the report, those containers in
    it not read with their error, and the records are the unsliced run's over the same inventory."""
    with open(INVENTORY, encoding="utf-8") as f:
        inv = yaml.safe_load(f)  # JSON under a comment line
    groups = inv["all"]["children"]["pve_containers"]["children"]
    lost = min(g for g in groups if groups[g]["hosts"])
    for host in groups[lost]["hosts"].values():
        host["ansible_pct_node_port"] = 1
        inv["all"]["children"]["pve_nodes"]["hosts"][host["pve_node"]]["ansible_port"] = 1
    broken = tmp_path / "broken.yml"
    broken.write_text(json.dumps(inv))
    unreachable = sorted(groups[lost]["hosts"])
    [one], whole = sliced(str(broken), 1, "preflight", tmp_path / "whole")
    slices, merged = sliced(str(broken), 3, "preflight", tmp_path / "sliced")
    for s in slices:
        if set(s["hosts"]) & set(unreachable):
            assert s["status"] == "failed", s
    assert sorted(h["host"] for h in merged["hosts"]) == containers(fleet)
    by_host = dict((h["host"], h) for h in merged["hosts"])
    for host in unreachable:
        assert by_host[host]["error"] and not by_host[host]["ready"] and not by_host[host]["checks"], by_host[host]
    assert merged["summary"]["error"] >= len(unreachable)
    assert_same_records(merged, whole, ended_early(slices))
