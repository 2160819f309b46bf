# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a run says when it cannot do what it was asked, on the simulated fleet.

One fleet for the module (2 nodes x 2 containers, scenario `basic`: train-100 and train-101 on
pve1, train-200 and train-201 on pve2). The playbooks, run as a user would:

- a host pattern and --limit that select no container (no -i, a mistyped gpufleet_hosts, a limit
  of a node alone) fail the run in its fleet plan, naming the pattern, the limit and the inventory
  sources, before any host is read;
- an option out of range or of the wrong type fails the run once, at the start, naming the
  variable as it was set, nothing read (not every container NOT READY on every check);
- a vmid the node does not have is named so (not "stopped; start it"), in the node read and
  through the pct connection, beside a container that really is stopped;
- a node whose sshd is down is counted unreachable in the recap; with the canary on it, remediate
  stops and the end of the run lists the containers it never attempted.

Needs root. Own fleet: $GPUFLEET_RUNERR_STATE (default /var/tmp/gpufleet-sim-runerr) and
$GPUFLEET_RUNERR_PORT (default 2976), so it runs beside the suite's other fleets.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STATE = os.path.abspath(os.environ.get("GPUFLEET_RUNERR_STATE", "/var/tmp/gpufleet-sim-runerr"))
PORT = os.environ.get("GPUFLEET_RUNERR_PORT", "2976")
FLEET = os.path.join(REPO, "tests", "sim", "fleet")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
PREFLIGHT = "playbooks/preflight.yml"
REMEDIATE = "playbooks/remediate.yml"
HYGIENE = "playbooks/hygiene.yml"
# Short waits: nothing here should wait for a job or a lock.
QUICK = ["-e", "kill_grace_period=2", "-e", "kill_drain_timeout=15", "-e", "relaunch_settle_seconds=0",
         "-e", "gpufleet_lock_timeout=1"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("runerr")
    with simfleet.running(STATE, nodes=2, containers=2, scenario="basic", inventory=work / "inventory", port=PORT,
                          timeout=300) as (info, env):
        inventory = str(work / "inventory" / "fleet.yml")
        cts = {ct["name"]: dict(ct, node=node["name"]) for node in info["nodes"] for ct in node["containers"]}
        yield {"env": env, "inventory": inventory, "cts": cts, "nodes": {n["name"]: n for n in info["nodes"]},
               "work": work}


def run(fleet, tool, *args, inventories=None, timeout=300):
    """An ansible CLI from the repository root (ansible.cfg applies): (rc, output, stderr and stdout
    together). inventories: the -i sources (default: the fleet's; [] for none at all)."""
    env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    sources = [fleet["inventory"]] if inventories is None else inventories
    argv = [os.path.join(VENV_BIN, tool)] + [a for s in sources for a in ("-i", s)] + list(args)
    res = subprocess.run(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=timeout, check=False)
    logs = os.path.join(str(fleet["work"]), "logs")
    os.makedirs(logs, exist_ok=True)
    test = os.environ.get("PYTEST_CURRENT_TEST", "run").split("::")[-1].split(" ")[0]
    name = "%02d-%s.log" % (len(os.listdir(logs)), re.sub(r"[^\w.-]+", "_", test))
    with open(os.path.join(logs, name), "w") as f:
        f.write("%s\n%s" % (" ".join(argv), res.stdout))
    return res.returncode, res.stdout


def flat(out):
    """The output with the YAML callback's folded lines joined again."""
    return re.sub(r"\n\s+", " ", out)


def recap(out):
    """{host: {ok, changed, unreachable, failed, ...}} of the run's PLAY RECAP."""
    rows = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", out.split("PLAY RECAP", 1)[-1], re.MULTILINE):
        rows[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return rows


def summary(out):
    """The fleet summary's lines, as preflight prints them."""
    part = flat(out).split("TASK [Fleet summary, one line per container]", 1)[1].split("TASK [", 1)[0]
    return re.findall(r"- '([^']*)'", part)


# ------------------------------------------------------------------ nothing selected


def test_no_inventory_fails_saying_to_give_one(fleet):
    """Without -i only the implicit localhost is there: preflight used to pass with 0 of 0 ready."""
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT, inventories=[])
    assert rc != 0, out
    text = flat(out)
    assert "nothing to do: no container selected by the host pattern gpufleet_hosts=pve_containers (inventory: " in text, out
    assert "the inventory has no hosts. Give the fleet's inventory with -i" in text, out
    assert "0 of 0 ready" not in text and list(recap(out)) == ["localhost"], out


@pytest.mark.parametrize("playbook", [PREFLIGHT, REMEDIATE, HYGIENE])
def test_a_mistyped_pattern_fails_naming_the_pattern_sources_and_groups(fleet, playbook):
    rc, out = run(fleet, "ansible-playbook", playbook, "-e", "gpufleet_hosts=pve_contianers", *QUICK)
    assert rc != 0, out
    text = flat(out)
    assert ("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_contianers (inventory: %s): "
            "the pattern matches no host of the inventory. Did you mean pve_containers?" % fleet["inventory"]) in text, out
    assert "Its groups (hosts): " in text and "pve_containers (4)" in text and "pve_nodes (2)" in text, out
    assert list(recap(out)) == ["localhost"], out  # nothing read, nothing changed


def test_an_empty_selection_passes_when_allowed_as_a_slice_s_may(fleet):
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT, "-e", "gpufleet_hosts=pve_contianers",
                  "-e", "gpufleet_allow_empty_selection=true")
    assert rc == 0, out
    assert "0 of 0 ready" in out and "nothing to do" not in out, out


def test_a_limit_that_leaves_out_every_container_and_localhost_fails_too(fleet):
    """--limit without localhost skips the fleet plan's play: its checks run in the next play, once."""
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT, "--limit", "pve1")
    assert rc != 0, out
    text = flat(out)
    assert ("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_containers within --limit pve1 "
            "(inventory: %s): the pattern selects 4 host(s)" % fleet["inventory"]) in text, out
    assert len(re.findall(r"^fatal: ", out, re.MULTILINE)) == 1, out  # once, for the first host, on localhost
    assert "TASK [gpufleet.hygiene.verify" not in out, out


# ------------------------------------------------------------------ options


@pytest.mark.parametrize("playbook", [PREFLIGHT, REMEDIATE])
def test_an_option_out_of_range_fails_once_at_the_start_naming_the_variable(fleet, playbook):
    """It used to make every container NOT READY on every check, naming stall_after, and remediate's
    canary then stopped because 'its GPUs cannot be read'."""
    rc, out = run(fleet, "ansible-playbook", playbook, "-e", "gpufleet_stall_after=-5", *QUICK)
    assert rc == 2, out
    text = flat(out)
    want = ("configuration error, nothing was read or changed: gpufleet_stall_after=-5 must be at least 1 (seconds "
            "without the log growing after which a job counts as stalled)")
    assert want in text, out
    assert len(re.findall(r"^fatal: ", out, re.MULTILINE)) == 1, out  # once, on localhost
    assert list(recap(out)) == ["localhost"] and recap(out)["localhost"]["failed"] == 1, out
    assert "stall_after must be" not in text.replace("gpufleet_stall_after", ""), out
    assert "TASK [gpufleet.hygiene.verify" not in out, out


def test_a_container_s_own_value_is_named_with_its_host(fleet, tmp_path):
    extra = tmp_path / "bad.yml"
    extra.write_text(json.dumps({"all": {"hosts": {"train-201": {"gpufleet_nvidia_smi_timeout": 0}}}}))
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT, "-e", "gpufleet_batch=0",
                  inventories=[fleet["inventory"], str(extra)])
    assert rc == 2, out
    text = flat(out)
    assert ("configuration error, nothing was read or changed: gpufleet_batch=0 must be a number of containers of at "
            "least 1, a percentage from 1% to 100%, or a list of them (remediate's batches: Ansible's serial); "
            "gpufleet_nvidia_smi_timeout=0 must be more than 0 (seconds one nvidia-smi call may take before it is killed "
            "and the module fails) (set for train-201)") in text, out
    assert list(recap(out)) == ["localhost"], out


def test_a_limit_to_one_container_without_localhost_still_sums_it_up_and_reports_it(fleet, tmp_path):
    """The plays on localhost (the summary, the report) run once on a host of the run, delegated to
    localhost, when --limit leaves localhost out: the container limited to is summed up and reported."""
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT, "--limit", "train-100", "-e", "gpufleet_report_dir=%s" % tmp_path)
    text = flat(out)
    section = text.split("TASK [Fleet summary, one line per container]", 1)[1].split("PLAY [", 1)[0]
    assert "[train-100 -> localhost]" in section and "'train-100 - " in section and " of 1 ready" in section, out
    assert "train-101" not in section and "train-200" not in section, section
    with open(tmp_path / "report.json") as f:
        assert [h["host"] for h in json.load(f)["hosts"]] == ["train-100"]
    assert list(recap(out)) == ["train-100"], out


def test_a_hygiene_run_limited_to_one_container_without_localhost_writes_its_report(fleet, tmp_path):
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "--limit", "train-100", "-e", "gpufleet_report_dir=%s" % tmp_path,
                  "-e", "gpufleet_hygiene_remediate=false")
    assert rc == 0, out
    assert "[train-100 -> localhost]" in flat(out).split("TASK [Write JSON, JUnit XML", 1)[1], out
    with open(tmp_path / "report.json") as f:
        assert [h["host"] for h in json.load(f)["hosts"]] == ["train-100"]


# This fleet's venvs hold no torch and its inventory names no expected_cuda: every idle container is
# not ready, and every repair fails in its purge step (no reference CUDA), on every container.
NO_REFERENCE = "no reference CUDA: torch is not installed in this environment"


@pytest.mark.parametrize("read_by", ["node", "container"])
def test_a_hygiene_run_whose_every_repair_fails_writes_its_report_then_fails_them(fleet, read_by, tmp_path):
    """It used to end in the repair play (Ansible stops a playbook whose play lost all its hosts):
    no report, on the run that most needed one."""
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "-e", "gpufleet_read_by=%s" % read_by,
                  "-e", "gpufleet_report_dir=%s" % tmp_path, *QUICK)
    assert rc == 2, out
    with open(tmp_path / "report.json") as f:
        report = json.load(f)
    hosts = {h["host"]: h for h in report["hosts"]}
    assert set(hosts) == set(fleet["cts"]), hosts.keys()
    for h in hosts.values():
        assert not h["ready"] and h["repair_error"] and h["repair_error"].startswith(NO_REFERENCE), h
    assert report["summary"]["repair_failed"] == len(fleet["cts"]), report["summary"]
    with open(tmp_path / "gpufleet_hygiene.prom") as f:
        prom = f.read()
    assert prom.count("gpufleet_hygiene_host_repair_failed{") == len(fleet["cts"]), prom
    assert not re.search(r"^gpufleet_hygiene_host_repair_failed\{.*\} 0$", prom, re.MULTILINE), prom
    # then each container fails, after the report, with what its repair left
    part = flat(out).split("PLAY [Hygiene - count the unreachable, fail the containers whose repair failed]", 1)[1]
    for host in fleet["cts"]:
        assert "fatal: [%s]: FAILED! %s" % (host, NO_REFERENCE) in part, part
    rows = recap(out)
    for host in fleet["cts"]:
        assert rows[host]["failed"] == 1 and rows[host]["rescued"] == 1, rows


def test_a_limited_hygiene_run_whose_repair_fails_still_writes_its_report(fleet, tmp_path):
    """--limit without localhost: the report is written by the limited container itself, which the
    repair used to have failed (no host left for the report's play)."""
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "--limit", "train-100", "-e", "gpufleet_report_dir=%s" % tmp_path,
                  *QUICK)
    assert rc == 2, out
    with open(tmp_path / "report.json") as f:
        (h,) = json.load(f)["hosts"]
    assert h["host"] == "train-100" and h["repair_error"].startswith(NO_REFERENCE), h
    assert recap(out)["train-100"]["failed"] == 1, out


def test_a_wrong_option_under_a_limit_without_localhost_fails_once(fleet):
    rc, out = run(fleet, "ansible-playbook", REMEDIATE, "--limit", "train-100", "-e", "gpufleet_read_by=nodes", *QUICK)
    assert rc == 2, out
    text = flat(out)
    assert "gpufleet_read_by=nodes must be one of auto, node, container" in text, out
    assert "TASK [gpufleet.hygiene.verify" not in out and "TASK [Repair" not in out, out


# ------------------------------------------------------------------ a vmid the node does not have


@pytest.fixture
def ghost(fleet, tmp_path):
    """An inventory beside the fleet's naming container 999 on pve1, as train-100 is named
    (pve1 has no container 999); train-101 stopped meanwhile."""
    with open(fleet["inventory"]) as f:
        inv = json.loads(f.read().split("\n", 1)[1])
    like = inv["all"]["children"]["pve_containers"]["children"]["node_pve1"]["hosts"]["train-100"]
    ghost_vars = dict(like, ansible_pct_vmid=999, gpufleet_job={}, pve_gpus=[])
    extra = tmp_path / "ghost.yml"
    extra.write_text(json.dumps({"all": {"children": {"pve_containers": {"children": {"node_pve1": {"hosts": {
        "ghost-999": ghost_vars, "ghost-999-attach": dict(ghost_vars, ansible_pct_method="lxc-attach")}}}}}}}))
    path = simfleet.lxcpath(STATE, "pve1")
    subprocess.run(["lxc-stop", "-n", "101", "-P", path, "-k"], check=True, timeout=60)
    try:
        yield [fleet["inventory"], str(extra)]
    finally:
        subprocess.run(["lxc-start", "-n", "101", "-P", path], check=True, timeout=60)
        subprocess.run(["lxc-wait", "-n", "101", "-P", path, "-s", "RUNNING", "-t", "30"], check=True, timeout=60)


FIX = ("check the vmid (ansible_pct_vmid) and the node (pve_node, ansible_pct_node_host) the inventory gives it; pct list "
       "on that node lists its containers, and a container migrated to another node is listed there")


@pytest.mark.parametrize("read_by", ["node", "container"])
def test_a_vmid_the_node_does_not_have_is_named_so_in_the_node_read(fleet, ghost, read_by):
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT, "-e", "gpufleet_hosts=ghost-999:train-100:train-101",
                  "-e", "gpufleet_read_by=%s" % read_by, inventories=ghost)
    assert rc != 0, out
    lines = summary(out)
    ghost_line = next(line for line in lines if line.startswith("ghost-999 "))
    assert ghost_line == "ghost-999 - NOT READY, not read: container 999 does not exist on node pve1: " + FIX, lines
    stopped = next(line for line in lines if line.startswith("train-101 "))
    assert stopped.startswith("train-101 - NOT READY, not read: container 101 is not running (stopped); start it "
                              "(pct start 101) and run again"), lines
    assert "pct start 999" not in out, out
    # Each fails by name, neither is unreachable: the node answered.
    rows = recap(out)
    assert rows["ghost-999"]["failed"] == 1 and rows["ghost-999"]["unreachable"] == 0, rows
    assert rows["train-101"]["failed"] == 1 and rows["train-101"]["unreachable"] == 0, rows


def test_a_vmid_the_node_does_not_have_is_named_so_through_the_connection(fleet, ghost):
    rc, out = run(fleet, "ansible", "ghost-999:ghost-999-attach:train-101", "-m", "ansible.builtin.ping", inventories=ghost)
    assert rc != 0, out
    text = flat(out)
    node = fleet["nodes"]["pve1"]
    for host in ("ghost-999", "ghost-999-attach"):
        m = re.search(r"%s \| UNREACHABLE! => .*?gpufleet\.hygiene\.pct: (container 999 .*?)(?:\"|'|$)" % host, text)
        assert m, (host, out)
        assert m.group(1).startswith("container 999 does not exist on node pve1 (root@%s:%s): %s"
                                     % (node["address"], node["port"], FIX)), m.group(1)
    assert re.search(r"train-101 \| UNREACHABLE! => .*container 101 on node root@%s:%s is not running \(stopped\)"
                     % (re.escape(node["address"]), node["port"]), text), out


# ------------------------------------------------------------------ unreachable nodes


@pytest.fixture
def pve1_down(fleet):
    subprocess.run([FLEET, "sshd", "pve1", "stop"], cwd=REPO, env=fleet["env"], check=True, timeout=60)
    try:
        yield
    finally:
        subprocess.run([FLEET, "sshd", "pve1", "start"], cwd=REPO, env=fleet["env"], check=True, timeout=60)


def play_order(fleet):
    rc, out = run(fleet, "ansible", "pve_containers", "--list-hosts")
    assert rc == 0, out
    return [line.strip() for line in out.splitlines()[1:] if line.strip()]


def test_an_unreachable_canary_is_counted_unreachable_and_the_rest_is_listed_never_attempted(fleet, pve1_down):
    order = play_order(fleet)
    assert fleet["cts"][order[0]]["node"] == "pve1", order  # the canary lives on the node that is down
    rc, out = run(fleet, "ansible-playbook", REMEDIATE, *QUICK)
    assert rc == 4, out  # ansible-playbook's status for unreachable hosts
    rows = recap(out)
    assert rows[order[0]]["unreachable"] == 1 and rows[order[0]]["failed"] == 0, rows
    for host in order[1:]:
        assert rows.get(host, {}).get("ok", 0) == 0 and rows.get(host, {}).get("unreachable", 0) == 0, rows  # never started
    text = flat(out)
    assert "%s was not read: its node could not be reached: " % order[0] in text, out
    end = text.split("PLAY RECAP", 1)[1]
    assert ("NEVER ATTEMPTED: 3 container(s) of this run's plan, nothing read or changed on them: %s. The run stopped "
            "early, after %s (unreachable): fix that and run again" % (", ".join(order[1:]), order[0])) in end, out


def test_preflight_counts_an_unreachable_node_and_its_containers_unreachable(fleet, pve1_down):
    """Read by node (the nodes are hosts of the run): pve1 and its containers are unreachable, each
    summed up by name first; pve2's containers are read and judged as usual."""
    rc, out = run(fleet, "ansible-playbook", PREFLIGHT)
    assert rc == 4, out
    rows = recap(out)
    assert rows["pve1"]["unreachable"] == 1, rows
    for host in ("train-100", "train-101"):
        assert rows[host]["unreachable"] == 1 and rows[host]["failed"] == 0, rows
    for host in ("pve2",):
        assert rows[host]["unreachable"] == 0 and rows[host]["failed"] == 0, rows
    # pve2's containers are not ready (no torch, no expected_cuda): their verdict is given too. It
    # used not to be: the play of the unreachable lost all its hosts, and Ansible ran no later play.
    for host in ("train-200", "train-201"):
        assert rows[host]["unreachable"] == 0 and rows[host]["failed"] == 1, rows
    assert re.search(r"^fatal: \[train-200\]: FAILED! train-200 is not ready: ", out, re.MULTILINE), out
    lines = summary(out)
    for host in ("train-100", "train-101"):
        assert any(line.startswith("%s - NOT READY, not read: reading through node pve1 could not be reached" % host)
                   for line in lines), lines
    assert "pve1 could not be reached to read its containers (train-100, train-101): " in flat(out), out
    assert "NEVER ATTEMPTED" not in out, out  # every container was read, by its node


def test_hygiene_reports_an_unreachable_node_s_containers_then_counts_them_unreachable(fleet, pve1_down, tmp_path):
    """Read by node: the report is written with every container's row (pve1's not read), and the
    last play counts pve1 and its containers unreachable. Report only: this fleet's venvs hold no
    torch, which no repair fixes."""
    report = tmp_path / "report"
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "-e", "gpufleet_report_dir=%s" % report,
                  "-e", "gpufleet_hygiene_remediate=false", *QUICK)
    assert rc == 4, out
    with open(report / "report.json") as f:
        hosts = {h["host"]: h for h in json.load(f)["hosts"]}
    assert set(hosts) == set(fleet["cts"]), hosts.keys()
    for host in ("train-100", "train-101"):
        assert not hosts[host]["ready"] and "reading through node pve1 could not be reached" in hosts[host]["error"], hosts[host]
    rows = recap(out)
    for host in ("pve1", "train-100", "train-101"):
        assert rows[host]["unreachable"] == 1 and rows[host]["failed"] == 0, rows
    assert rows["pve2"]["unreachable"] == 0, rows


def test_hygiene_with_a_node_down_and_repairs_that_fail_reports_then_counts_and_fails_each(fleet, pve1_down, tmp_path):
    """Read by node, repairs on: pve2's containers' repairs fail (no reference CUDA), pve1's are not
    read. The report has them all; then pve1 and its containers are unreachable and pve2's failed -
    in one play, since a play of the failed alone would lose all its hosts and end the run."""
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "-e", "gpufleet_report_dir=%s" % tmp_path, *QUICK)
    assert rc == 4, out
    with open(tmp_path / "report.json") as f:
        hosts = {h["host"]: h for h in json.load(f)["hosts"]}
    assert set(hosts) == set(fleet["cts"]), hosts.keys()
    for host in ("train-200", "train-201"):
        assert hosts[host]["repair_error"].startswith(NO_REFERENCE), hosts[host]
    rows = recap(out)
    for host in ("pve1", "train-100", "train-101"):
        assert rows[host]["unreachable"] == 1 and rows[host]["failed"] == 0, rows
    for host in ("train-200", "train-201"):
        assert rows[host]["unreachable"] == 0 and rows[host]["failed"] == 1, rows


def test_a_hygiene_run_whose_job_is_misconfigured_everywhere_writes_its_report_then_fails_them(fleet, tmp_path):
    """A configuration error stops the repair before anything changes (no repair would start the
    job again); in hygiene it is recorded like a failed repair, so that the report is written."""
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "-e", "gpufleet_venv=/opt/venv-typo",
                  "-e", "gpufleet_report_dir=%s" % tmp_path, *QUICK)
    assert rc == 2, out
    with open(tmp_path / "report.json") as f:
        hosts = {h["host"]: h for h in json.load(f)["hosts"]}
    assert set(hosts) == set(fleet["cts"]), hosts.keys()
    for host, h in hosts.items():
        assert h["repair_error"].startswith("%s: nothing was stopped or changed: the job's configuration is wrong" % host), h
        assert "gpufleet_venv=/opt/venv-typo" in h["repair_error"], h
    rows = recap(out)
    for host in fleet["cts"]:
        assert rows[host]["failed"] == 1 and rows[host]["changed"] == 0, rows


def test_hygiene_repairs_nothing_on_containers_whose_node_is_down(fleet, pve1_down, tmp_path):
    """Read by container, repairs on: pve1's containers are not tried (no lock taken, nothing run
    through the node that is down), their rows are in the report, and they end unreachable."""
    report = tmp_path / "report"
    rc, out = run(fleet, "ansible-playbook", HYGIENE, "--limit", "train-100,train-101,localhost",
                  "-e", "gpufleet_read_by=container", "-e", "gpufleet_report_dir=%s" % report, *QUICK)
    assert rc == 4, out
    assert "TASK [gpufleet.hygiene.repair" not in out, out
    with open(report / "report.json") as f:
        assert sorted(h["host"] for h in json.load(f)["hosts"]) == ["train-100", "train-101"]
    rows = recap(out)
    for host in ("train-100", "train-101"):
        assert rows[host]["unreachable"] == 1 and rows[host]["failed"] == 0, rows
