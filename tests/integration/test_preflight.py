# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""preflight.yml over the session's simulated fleet: any host pattern, --limit, one line per
container in the fleet summary, and a verdict task only for the containers that are not ready;
hygiene.yml's report over a host pattern, found the same way."""

from __future__ import annotations

import json
import os
import re

from conftest import INVENTORY, REPO

PREFLIGHT = os.path.join(REPO, "playbooks", "preflight.yml")
HYGIENE = os.path.join(REPO, "playbooks", "hygiene.yml")


def running(fleet):
    return [ct["name"] for node in fleet["nodes"] for ct in node["containers"] if ct["running"]]


def recap(stdout):
    return {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^(\S+)\s+: ok=(\d+)\s+changed=\d+\s+unreachable=\d+\s+failed=(\d+)", stdout.split("PLAY RECAP", 1)[1], re.MULTILINE)}


def summary(stdout):
    section = stdout.split("TASK [Fleet summary, one line per container]", 1)[1].split("PLAY [", 1)[0]
    return dict(re.findall(r"^\s+- '?([\w.-]+) - (ready|NOT READY)", section, re.MULTILINE)), section


def expect_cuda(tmp_path, host):
    """A second inventory source: the CUDA this container's venv is held to. This fleet's venvs
    hold no torch, so a venv with no CUDA expected is not clean ("no reference CUDA")."""
    extra = tmp_path / "expect-cuda.yml"
    extra.write_text(json.dumps({"all": {"hosts": {host: {"gpufleet_expected_cuda": "12.8"}}}}))
    return str(extra)


def fleet_node(fleet, name):
    """The node of a container of the fleet."""
    return next(n["name"] for n in fleet["nodes"] if any(c["name"] == name for c in n["containers"]))


def test_over_a_host_pattern_only_the_container_that_is_not_ready_runs_the_verdict_and_fails(fleet, ansible_cli, tmp_path):
    bad, good = running(fleet)[:2]
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, "-i", expect_cuda(tmp_path, good), PREFLIGHT,
                      "-e", "gpufleet_hosts=%s:%s" % (bad, good))
    assert res.returncode == 2, res.stdout[-3000:]
    said, section = summary(res.stdout)
    assert said == {bad: "NOT READY", good: "ready"}, section
    assert "1 of 2 ready; not ready: %s" % bad in section, section
    assert re.search(r"%s - NOT READY: \[venv_clean\] no reference CUDA" % re.escape(bad), section), section
    # Read by their nodes (the play's hosts): no task for the ready one, the verdict for the one
    # that is not ready; nothing else of the fleet.
    got = recap(res.stdout)
    nodes = {fleet_node(fleet, bad), fleet_node(fleet, good)}
    assert set(got) == {bad, "localhost"} | nodes and got[bad] == (0, 1), res.stdout[-3000:]
    assert all(got[n][1] == 0 for n in nodes), got
    assert re.search(r"%s is not ready: \[venv_clean\]" % re.escape(bad), res.stdout), res.stdout[-3000:]


def test_the_summary_counts_the_containers_this_run_read(fleet, ansible_cli, tmp_path):
    """With --limit, the containers left out are not counted as not ready."""
    good = running(fleet)[1]
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, "-i", expect_cuda(tmp_path, good), PREFLIGHT, "--limit", "%s,localhost" % good)
    assert res.returncode == 0, res.stdout[-3000:]
    said, section = summary(res.stdout)
    assert said == {good: "ready"} and "1 of 1 ready; not ready: none" in section, section
    # Its node left out of the limit: the container is the play's host, read from its node all
    # the same, and runs no verdict.
    got = recap(res.stdout)
    assert set(got) == {good, "localhost"} and got[good][1] == 0, res.stdout[-3000:]
    assert "Fail when not ready" not in res.stdout


def test_a_container_s_bad_value_fails_the_run_at_its_start_naming_it(fleet, ansible_cli, tmp_path):
    """A value the read cannot take is a configuration error of the run: the fleet plan fails it
    once, on localhost, naming the variable and the container it is set for, before anything is
    read (it used to make that container not ready on every check, naming the read's option)."""
    bad, good = running(fleet)[:2]
    extra = tmp_path / "bad-value.yml"
    extra.write_text(json.dumps({"all": {"hosts": {bad: {"gpufleet_require_gpu": "perhaps"},
                                                   good: {"gpufleet_expected_cuda": "12.8"}}}}))
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, "-i", str(extra), PREFLIGHT, "--limit", "%s,%s,localhost" % (bad, good))
    assert res.returncode == 2, res.stdout[-3000:]
    flat = res.stdout.replace("\n        ", " ").replace("''", "'")  # the YAML callback's wrapping and quoting
    assert ("configuration error, nothing was read or changed: gpufleet_require_gpu=perhaps must be true or false "
            "(set for %s)" % bad) in flat, res.stdout[-3000:]
    assert set(recap(res.stdout)) == {"localhost"}, res.stdout[-3000:]  # no container read


def test_hygiene_reports_the_hosts_of_a_host_pattern(fleet, ansible_cli, tmp_path):
    """gpufleet_hosts is any host pattern (an intersection here, which is no group name): the
    report has every host the pattern selects and no other."""
    bad, good = running(fleet)[:2]
    report = tmp_path / "report"
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, "-i", expect_cuda(tmp_path, good), HYGIENE,
                      "-e", "gpufleet_hosts=%s:%s:&pve_containers" % (bad, good), "-e", "gpufleet_hygiene_remediate=false",
                      "-e", "gpufleet_report_dir=%s" % report)
    assert res.returncode == 0, res.stdout[-3000:]
    with open(report / "report.json") as f:
        hosts = {h["host"]: h for h in json.load(f)["hosts"]}
    assert set(hosts) == {bad, good}, hosts.keys()
    assert hosts[good]["ready"] and not hosts[bad]["ready"] and not hosts[bad]["remediated"]
    assert hosts[good]["node"] and hosts[good]["vmid"] is not None  # pve_node and ansible_pct_vmid, recorded
    assert "1 of 2 ready" in res.stdout, res.stdout[-3000:]
