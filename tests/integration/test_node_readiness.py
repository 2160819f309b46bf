# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role's read (one node_readiness run per node, each container read from its node) over
the session's simulated fleet: the same verify_record as each container read inside itself, one
module run per node, a stopped container reported by name, a node that cannot be reached; and
how preflight and hygiene choose the play's hosts (the containers, or their nodes)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import simfleet
from conftest import INVENTORY, PORT, STATE

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FLEET = os.path.join(REPO, "tests", "sim", "fleet")
COMPARE = os.path.join(REPO, "tests", "integration", "targets", "node_readiness", "compare.yml")
# preflight.yml with the containers as the play's hosts and the verdict on each (the role's main entry point).
NODE_PREFLIGHT = os.path.join(REPO, "tests", "integration", "targets", "node_readiness", "preflight_node.yml")


def containers(fleet, running):
    return [ct for node in fleet["nodes"] for ct in node["containers"] if ct["running"] is running]


@pytest.mark.parametrize("method", ["pct", "lxc-attach"])
def test_node_read_gives_the_same_verify_record_as_per_container(fleet, ansible_cli, tmp_path, method):
    running = [ct["name"] for ct in containers(fleet, True)]
    out = tmp_path / "compare.json"
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, COMPARE, "--limit", ",".join(running + ["localhost"]),
                      "-e", "compare_out=%s" % out, "-e", "ansible_pct_method=%s" % method, "-v")
    assert res.returncode == 0, res.stdout
    both = json.loads(out.read_text())
    assert sorted(both) == sorted(running)
    for host, (inside, per_node) in both.items():
        assert per_node == inside, host
        assert [c["name"] for c in per_node["checks"]][0] == "gpu_idle"
    # One node_readiness run per node that has running containers, by its first container, each time.
    nodes_with_running = {node["name"] for node in fleet["nodes"] if any(ct["running"] for ct in node["containers"])}
    for play in ("PLAY [Read inside each container]", "PLAY [Read from the node]"):
        section = res.stdout.split(play, 1)[1].split(CONTAINER_TASK, 1)[1].split("TASK [", 1)[0]
        ran = [line for line in section.splitlines() if line.startswith("ok: [")]
        assert len(ran) == len(nodes_with_running), section


OLD_NAMES = os.path.join(REPO, "tests", "integration", "targets", "node_readiness", "old_names.yml")


def test_a_playbook_reading_the_records_by_their_names_before_0_3_gets_them_and_a_deprecation(fleet, ansible_cli, tmp_path):
    """verify_result and verify_results, the names of the record and of a node's records before
    0.3.0, still hold them for one release, read in a later play as a 0.2 playbook did; reading
    each warns once, naming the new name. The collection's own plays read only the new names:
    the read itself warns of nothing."""
    running = [ct["name"] for ct in containers(fleet, True)]
    nodes = sorted({node["name"] for node in fleet["nodes"] if any(ct["running"] for ct in node["containers"])})
    out = tmp_path / "names.json"
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, OLD_NAMES, "--limit", ",".join(running + nodes + ["localhost"]),
                      "-e", "old_names_out=%s" % out,
                      "-e", json.dumps({"old_names_containers": running, "old_names_nodes": nodes}))
    assert res.returncode == 0, res.stdout
    names = json.loads(out.read_text())
    assert sorted(names["record"]) == sorted(running)
    assert names["result"] == names["record"]
    assert names["results"] == names["records"]
    # Read by node: every container of those nodes, the stopped one too (not ready, not read).
    of_nodes = {ct["name"] for node in fleet["nodes"] if node["name"] in nodes for ct in node["containers"]}
    assert {host for kept in names["records"].values() for host in kept} == of_nodes
    assert all(r["host"] == host and "ready" in r and r["checks"] for host, r in names["record"].items())
    warned = re.findall(r"\[DEPRECATION WARNING\]: (.*?)\. This feature will be removed from collection 'gpufleet.hygiene' version 0\.4\.0",
                        res.stdout)
    assert sorted(warned) == ["The verify role's verify_result is renamed verify_record",
                              "The verify role's verify_results is renamed verify_records"], res.stdout
    # Before the last play, nothing read an old name.
    assert "DEPRECATION" not in res.stdout.split("PLAY [Read the outputs by both names]", 1)[0], res.stdout


def test_a_stopped_container_is_not_ready_in_preflight_with_how_to_start_it(fleet, ansible_cli):
    """preflight reads each container from its node: a stopped one is not read, and fails by name
    with pct's reason and what to do; its node's other containers are read, nothing is unreachable."""
    [stopped] = containers(fleet, False)
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, os.path.join(REPO, "playbooks", "preflight.yml"))
    assert res.returncode == 2, res.stdout
    assert "DEPRECATION" not in res.stdout  # the collection's plays read no old name (verify_alias)
    assert ("%s is not ready: not read: container %d is not running (stopped); start it (pct start %d) and run again, or leave "
            "it out of the run (--limit)" % (stopped["name"], stopped["vmid"], stopped["vmid"])) in res.stdout.replace("\n        ", " ")
    recap = res.stdout.split("PLAY RECAP", 1)[1]
    line = next(x for x in recap.splitlines() if x.startswith(stopped["name"] + " "))
    assert "failed=1" in line and "unreachable=0" in line, line
    for ct in containers(fleet, True):
        line = next(x for x in recap.splitlines() if x.startswith(ct["name"] + " "))
        assert "unreachable=0" in line and "changed=0" in line, line


def test_a_stopped_container_is_not_read_as_the_container_of_its_vmid_another_lxc_path_runs(fleet, ansible_cli, tmp_path):
    """A second fleet on this host runs its own container of the stopped one's vmid, from its own LXC
    path (the node read sees every container of the host's /proc). The stopped container is given by
    its LXC path (the fleet's inventory sets ansible_pct_lxc_path): it is still not read, and the
    message names the other one; its node's running containers are read as before."""
    [stopped] = containers(fleet, False)
    other_state = STATE + "-other"
    with simfleet.running(other_state, nodes=1, containers=2, scenario="basic", inventory=tmp_path / "other",
                          port=PORT + 40) as (other, _env):
        assert any(ct["vmid"] == stopped["vmid"] and ct["running"] for ct in other["nodes"][0]["containers"])
        res = ansible_cli("ansible-playbook", "-i", INVENTORY, NODE_PREFLIGHT, "--limit", stopped["name"])
    out = res.stdout.replace("\n        ", " ")
    assert res.returncode == 2, res.stdout
    # The other fleet's container, and any that another test's fleet runs meanwhile (pytest-xdist).
    assert re.search(re.escape(
        "%s is not ready: not read: container %d is not running (stopped); start it (pct start %d) and run again, or leave "
        "it out of the run (--limit) (no LXC monitor of %s runs a container %d on this node; the " % (
            stopped["name"], stopped["vmid"], stopped["vmid"], os.path.join(STATE, "nodes", stopped_node(fleet, stopped), "lxc"),
            stopped["vmid"])) + r"(one|\d+) of that name \(cgroup keys? \.%d(-\d+)?(, \.%d-\d+)*\) runs? from another LXC path\)"
        % (stopped["vmid"], stopped["vmid"]), out), res.stdout


def stopped_node(fleet, ct):
    return next(n["name"] for n in fleet["nodes"] if ct in n["containers"])


def failed_checks(ct):
    """The checks a failed read of this container fails: job_live where it has a job (GPUs)."""
    return "gpu_idle, job_live, job_libraries, venv_clean, caches_fresh" if ct["gpus"] else "gpu_idle, venv_clean, caches_fresh"


def test_the_main_entry_point_fails_a_stopped_container_by_name(fleet, ansible_cli, tmp_path):
    """With the containers as the play's hosts, the container is read from its node too: stopped,
    it is not read and fails by name with pct's reason (not unreachable), and the node's other
    containers are read."""
    [stopped] = containers(fleet, False)
    node = next(n for n in fleet["nodes"] if any(c["name"] == stopped["name"] for c in n["containers"]))
    names = [c["name"] for c in node["containers"]]
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, NODE_PREFLIGHT, "--limit", ",".join(names))
    assert res.returncode == 2, res.stdout
    assert ("%s is not ready: not read: container %d is not running (stopped); start it (pct start %d) and run again"
            % (stopped["name"], stopped["vmid"], stopped["vmid"])) in res.stdout.replace("\n        ", " ")
    recap = res.stdout.split("PLAY RECAP", 1)[1]
    for host in names:  # each read; whether the running ones are ready is their own business
        line = next(x for x in recap.splitlines() if x.startswith(host + " "))
        assert "unreachable=0" in line and "changed=0" in line, line


def test_a_node_that_cannot_be_reached_fails_each_of_its_containers_by_name(fleet, ansible_cli):
    node = next(n for n in fleet["nodes"] if len([c for c in n["containers"] if c["running"]]) >= 2)
    names = [c["name"] for c in node["containers"]]
    subprocess.run([FLEET, "sshd", node["name"], "stop"], cwd=REPO, check=True, timeout=60)
    try:
        res = ansible_cli("ansible-playbook", "-i", INVENTORY, NODE_PREFLIGHT, "--limit", ",".join(names))
    finally:
        subprocess.run([FLEET, "sshd", node["name"], "start"], cwd=REPO, check=True, timeout=60)
    recap = {line.split()[0]: line for line in res.stdout.split("PLAY RECAP", 1)[1].splitlines() if line.strip()}
    out = res.stdout.replace("\n        ", " ")
    section = out.split(CONTAINER_TASK, 1)[1].split("TASK [", 1)[0]
    [reader] = [h for h in names if "fatal: [%s]: UNREACHABLE!" % h in section]  # the container that read for its node
    for host in names:
        # Each container fails by name, not read (an outage is not a held GPU), the reader too:
        # none is left without a record.
        assert "failed=1" in recap[host], recap[host]
        by = "" if host == reader else " (by %s)" % reader
        assert "%s is not ready: not read: reading through node %s failed%s: " % (host, node["address"], by) in out, out[-3000:]


def test_preflight_fails_a_bad_value_once_at_the_start_naming_the_variable(fleet, ansible_cli):
    """preflight leaves out ansible-core's validation task of the verify role (a task per host);
    the fleet plan checks the run's options instead, once, on localhost, by the read's own spec:
    a bad one fails the run there, naming the variable as it was set, before any container is read
    (the node still validates each container's options as readiness's, behind it)."""
    ct = containers(fleet, True)[0]
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, os.path.join(REPO, "playbooks", "preflight.yml"),
                      "--limit", ct["name"] + ",localhost", "-e", '{"gpufleet_require_gpu": "perhaps"}')
    assert res.returncode == 2, res.stdout[-3000:]
    out = res.stdout.replace("\n        ", " ").replace("''", "'")
    assert "configuration error, nothing was read or changed: gpufleet_require_gpu=perhaps must be true or false" in out, out[-3000:]
    assert not any(x.startswith(ct["name"] + " ") for x in out.split("PLAY RECAP", 1)[1].splitlines()), out[-3000:]


PREFLIGHT = os.path.join(REPO, "playbooks", "preflight.yml")
HYGIENE = os.path.join(REPO, "playbooks", "hygiene.yml")
NODE_TASK = "TASK [gpufleet.hygiene.verify : Read the containers' processes, GPUs, venvs, packages and caches on the node]"
CONTAINER_TASK = "TASK [gpufleet.hygiene.verify : Read the job's processes, the GPUs, the venv, its packages and the compile caches]"


def verdicts(stdout):
    """The summary's lines and each failed container's message, as preflight printed them."""
    out = stdout.replace("\n        ", " ")
    summary = out.split("TASK [Fleet summary, one line per container]", 1)[1].split("PLAY [", 1)[0]
    lines = [line.strip()[2:].strip("'\"") for line in summary.splitlines() if line.strip().startswith("- ")]
    failed = sorted(line.strip() for line in out.splitlines() if "is not ready: " in line)
    return lines, failed


def read_by(stdout):
    """Which read task ran: the node's or the container's."""
    node, container = NODE_TASK in stdout, CONTAINER_TASK in stdout
    assert node is not container, stdout[-3000:]
    return "node" if node else "container"


def running_and_nodes(fleet):
    running = [ct["name"] for ct in containers(fleet, True)]
    return running, ",".join(running + [n["name"] for n in fleet["nodes"]] + ["localhost"])


def test_preflight_read_by_node_gives_each_container_the_line_and_verdict_of_reading_by_container(fleet, ansible_cli):
    running, limit = running_and_nodes(fleet)
    by_ct = ansible_cli("ansible-playbook", "-i", INVENTORY, PREFLIGHT, "--limit", limit, "-e", "gpufleet_read_by=container")
    by_node = ansible_cli("ansible-playbook", "-i", INVENTORY, PREFLIGHT, "--limit", limit, "-e", "gpufleet_read_by=node")
    assert read_by(by_ct.stdout) == "container" and read_by(by_node.stdout) == "node"
    # One read task per node with running containers, none per container.
    section = by_node.stdout.split(NODE_TASK, 1)[1].split("TASK [", 1)[0]
    nodes = {n["name"] for n in fleet["nodes"] if any(c["running"] for c in n["containers"])}
    assert sorted(line.split("[", 1)[1].split("]", 1)[0] for line in section.splitlines() if line.startswith("ok: [")) == sorted(nodes)
    lines, failed = verdicts(by_ct.stdout)
    assert len(lines) == len(running) + 1 and " ready; not ready: " in lines[-1], lines
    assert verdicts(by_node.stdout) == (lines, failed)
    assert by_node.returncode == by_ct.returncode, (by_ct.stdout[-2000:], by_node.stdout[-2000:])
    # The same containers fail, by name, and nothing else does.
    recaps = [{line.split()[0]: "failed=1" in line for line in res.stdout.split("PLAY RECAP", 1)[1].splitlines() if line.strip()}
              for res in (by_ct, by_node)]
    assert {h: recaps[0][h] for h in running} == {h: recaps[1][h] for h in running}
    assert any(recaps[0][h] for h in running) or by_ct.returncode == 0


def test_hygiene_read_by_node_reports_each_container_as_reading_by_container(fleet, ansible_cli, tmp_path):
    running, limit = running_and_nodes(fleet)
    reports = {}
    for how in ("container", "node"):
        res = ansible_cli("ansible-playbook", "-i", INVENTORY, HYGIENE, "--limit", limit, "-e", "gpufleet_read_by=%s" % how,
                          "-e", "gpufleet_hygiene_remediate=false", "-e", "gpufleet_report_dir=%s" % (tmp_path / how))
        assert res.returncode == 0, res.stdout[-3000:]
        assert read_by(res.stdout) == how
        reports[how] = json.loads((tmp_path / how / "report.json").read_text())
    assert sorted(r["host"] for r in reports["container"]["hosts"]) == sorted(running)
    assert reports["node"]["hosts"] == reports["container"]["hosts"]
    assert reports["node"]["summary"] == reports["container"]["summary"]


def test_auto_reads_by_node_at_any_size_and_by_container_only_without_the_nodes(fleet, ansible_cli):
    running, limit = running_and_nodes(fleet)
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, PREFLIGHT, "--limit", limit)
    assert read_by(res.stdout) == "node"
    assert len(verdicts(res.stdout)[0]) == len(running) + 1
    # One container with its node: by node, that node reading that container alone.
    node = next(n for n in fleet["nodes"] if any(c["name"] == running[0] for c in n["containers"]))
    one = ansible_cli("ansible-playbook", "-i", INVENTORY, PREFLIGHT, "--limit", "%s,%s,localhost" % (running[0], node["name"]))
    assert read_by(one.stdout) == "node"
    assert [line.split(" - ", 1)[0] for line in verdicts(one.stdout)[0][:-1]] == [running[0]]
    # --limit to one container (with localhost, without its node): the container is the play's
    # host, and it is still read from its node (node_readiness, read_from=node).
    alone = ansible_cli("ansible-playbook", "-i", INVENTORY, PREFLIGHT, "--limit", running[0] + ",localhost", "-v")
    assert read_by(alone.stdout) == "container"
    assert [line.split(" - ", 1)[0] for line in verdicts(alone.stdout)[0][:-1]] == [running[0]]
    assert "\n        from: node\n" in alone.stdout.split(CONTAINER_TASK, 1)[1].split("TASK [", 1)[0]
