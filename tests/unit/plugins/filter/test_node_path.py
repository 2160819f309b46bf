# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Reading by node with the nodes as the play's hosts: the plan (fleet_read_plan), each
container's options from its own variables (verify_container_args, the same as the role's
verify__readiness_args on the container), the records a node keeps (verify_node_records) and
fleet_records finding them."""

from __future__ import annotations

import importlib
import os
import re

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.lookup import inventory_hostnames
from ansible.template import Templar
from trustedvars import trusted

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
ROLE = os.path.join(REPO, "roles", "verify")
ARGUMENT_SPEC = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options").ARGUMENT_SPEC
_node = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox._node")
_verify = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.verify")
_fleet = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.fleet")
PCT = "gpufleet.hygiene.pct"


def role_file(*parts):
    with open(os.path.join(ROLE, *parts)) as f:
        return trusted(yaml.safe_load(f))


def role_args(host_vars, play_vars=None):
    """verify__readiness_args as the role templates it on the container: its defaults, the host's
    variables over them, the playbook's role variables over those."""
    variables = dict(role_file("defaults", "main.yml"))
    variables.update(role_file("vars", "main.yml"))
    variables.update(host_vars)
    variables.update(play_vars or {})
    return Templar(loader=DataLoader(), variables=variables).template(variables["verify__readiness_args"])


JOB = {"patterns": [r"^\S*python3? /opt/gpufleet/train_dflash\.py"], "users": ["trainer"], "log": "/var/log/train.log",
       "user": "trainer", "env": {"TRITON_CACHE_DIR": "/scratch/triton", "HF_TOKEN": "secret", "HOME": "/home/trainer"}}


@pytest.mark.parametrize("host_vars, play_vars", [
    ({}, None),
    ({"gpufleet_venv": "/opt/venv", "gpufleet_job": JOB, "gpufleet_nvidia_smi": "/opt/gpufleet/bin/nvidia-smi"},
     {"verify_allow_running_job": True}),
    ({"gpufleet_venv": "/opt/venv", "gpufleet_require_gpu": False, "gpufleet_expected_cuda": 12.8, "gpufleet_baseline": "/etc/lock.txt",
      "gpufleet_strict_baseline": "yes", "gpufleet_stall_after": "600", "gpufleet_nvidia_smi_timeout": 30,
      "gpufleet_gpu_device_patterns": ["/dev/nvidia[0-9]*"]}, None),
    ({"verify_venv": "/srv/venv", "gpufleet_venv": "/opt/venv", "verify_files": True, "verify_caches": False,
      "verify_threshold_mib": "128"}, {"verify_allow_running_job": False}),
])
def test_a_container_read_by_its_node_is_asked_what_the_role_asks_on_the_container(host_vars, play_vars):
    cache_vars = role_file("vars", "main.yml")["verify__cache_vars"]
    # The role gives the values as they are and the read validates them (verify_node_job): compared
    # as the read takes them.
    assert as_read(_verify.verify_container_args(host_vars, cache_vars, play_vars)) == as_read(role_args(host_vars, play_vars))


def as_read(args):
    outcome = ArgumentSpecValidator(ARGUMENT_SPEC).validate(dict(args))
    assert not outcome.error_messages
    return outcome.validated_parameters


@pytest.mark.parametrize("host_vars, option, msg", [
    ({"gpufleet_require_gpu": "perhaps"}, "require_gpu", "argument 'require_gpu' is of type str and we were unable to convert to bool"),
    ({"gpufleet_stall_after": "soon"}, "stall_after", "argument 'stall_after' is of type str and we were unable to convert to int"),
])
def test_a_bad_value_reaches_the_read_as_it_is_and_is_refused_for_its_container_alone(host_vars, option, msg):
    """Not read as false or 0: given as it is, the node refuses it for that container, naming the option."""
    args = _verify.verify_container_args(host_vars, ["HOME"])
    assert args[option] == list(host_vars.values())[0]
    options, problem = _node.container_args({"host": "ct1", "args": args})
    assert options is None and problem.startswith("bad readiness options for ct1: ") and msg in problem, problem


def test_every_readiness_option_of_the_role_has_its_default_here():
    options = set(re.findall(r"\{'(\w+)': verify_", str(role_file("vars", "main.yml")["verify__readiness_args"])))
    options |= set(re.findall(r"'(\w+)': verify_", str(role_file("vars", "main.yml")["verify__readiness_args"])))
    assert {row[0] for row in _verify.ROLE_DEFAULTS} == options
    defaults = role_file("defaults", "main.yml")
    for _option, role_var, inventory_var, default, _kind in _verify.ROLE_DEFAULTS:
        text = str(defaults[role_var])
        if inventory_var:
            assert text.startswith("{{ %s | default(" % inventory_var), (role_var, text)
        else:
            assert defaults[role_var] == default, role_var


def fleet(n_nodes=2, per_node=3, **extra):
    groups = {"all": [], "ungrouped": [], "pve_nodes": [], "pve_containers": []}
    hostvars = {}
    for i in range(1, n_nodes + 1):
        node = "pve%d" % i
        groups["pve_nodes"].append(node)
        hostvars[node] = {"inventory_hostname": node, "ansible_connection": "ssh"}
        for j in range(per_node):
            name = "ct%d%d" % (i, j)
            groups["pve_containers"].append(name)
            hostvars[name] = dict({"inventory_hostname": name, "ansible_connection": PCT, "pve_node": node,
                                   "ansible_pct_vmid": i * 100 + j}, **extra)
    groups["all"] = groups["pve_nodes"] + groups["pve_containers"]
    return hostvars, groups


def hostnames(groups, pattern):
    """A pattern's hosts as the plan's play resolves them (ansible.builtin.inventory_hostnames)."""
    return inventory_hostnames.LookupModule().run([pattern], variables={"groups": groups})


def read_plan(pattern, hostvars, groups, limit, read_by):
    """fleet_read_plan as playbooks/plan.yml calls it: the pattern and the --limit resolved first."""
    resolved = hostnames(groups, limit) if limit and not limit.startswith("@") else None
    return _fleet.fleet_read_plan(hostnames(groups, pattern), hostvars, limit=resolved,
                                  limit_file=bool(limit) and limit.startswith("@"), read_by=read_by)


def test_auto_reads_by_node_whenever_every_container_has_its_node_among_the_hosts():
    """No threshold: the node read is the one read of a container, so auto reads by node at any
    size, one container a node included."""
    hostvars, groups = fleet()
    plan = read_plan("pve_containers", hostvars, groups, None, "auto")
    assert plan["by"] == "node" and plan["container_hosts"] == [] and plan["node_hosts"] == ["pve1", "pve2"]
    assert plan["by_node"] == {"pve1": ["ct10", "ct11", "ct12"], "pve2": ["ct20", "ct21", "ct22"]}
    hostvars, groups = fleet(n_nodes=1, per_node=1)
    assert read_plan("pve_containers", hostvars, groups, None, "auto")["by_node"] == {"pve1": ["ct10"]}
    plan = read_plan("pve_containers", hostvars, groups, None, "container")
    assert plan["by"] == "container" and plan["container_hosts"] == ["ct10"] and plan["node_hosts"] == []


def test_a_limit_counts_only_its_containers_and_must_name_their_nodes():
    hostvars, groups = fleet()
    # One container with its node in the limit: by node, the node reads that container alone.
    plan = read_plan("pve_containers", hostvars, groups, "ct10,pve1,localhost", "auto")
    assert plan["by"] == "node" and plan["by_node"] == {"pve1": ["ct10"]} and plan["node_hosts"] == ["pve1"]
    # Without its node the node cannot be the play's host: one host per container (each still
    # read from its node, through the pct connection).
    plan = read_plan("pve_containers", hostvars, groups, "ct10,localhost", "auto")
    assert plan["by"] == "container" and plan["container_hosts"] == ["ct10"]
    plan = read_plan("pve_containers", hostvars, groups, "ct1*,pve1", "auto")
    assert plan["by"] == "node" and plan["by_node"] == {"pve1": ["ct10", "ct11", "ct12"]}
    assert read_plan("pve_containers", hostvars, groups, "ct1*", "auto")["by"] == "container"
    with pytest.raises(AnsibleFilterError, match="gpufleet_read_by=node, but these containers have no node among this run's hosts .*: ct10"):
        read_plan("pve_containers", hostvars, groups, "ct10", "node")
    # A limit from a file is applied by ansible-core itself, reading by container.
    assert read_plan("pve_containers", hostvars, groups, "@retry", "auto")["by"] == "container"


def test_a_container_without_a_node_keeps_auto_by_container():
    hostvars, groups = fleet()
    hostvars["ct21"]["ansible_connection"] = "ssh"
    assert read_plan("pve_containers", hostvars, groups, None, "auto")["by"] == "container"
    hostvars["ct21"]["ansible_connection"], hostvars["ct21"]["pve_node"] = PCT, "pve9"
    assert read_plan("pve_containers", hostvars, groups, None, "auto")["by"] == "container"


def test_a_bad_choice_says_which_variable():
    hostvars, groups = fleet()
    with pytest.raises(AnsibleFilterError, match="gpufleet_read_by must be one of auto, node, container"):
        read_plan("pve_containers", hostvars, groups, None, "nodes")


CHECK = {"name": "gpu_idle", "severity": "fail", "ok": True, "error": False, "summary": "1 GPU(s) idle"}
BRIEF = {"ready": True, "running_job": False, "checks": [CHECK], "gpus": [], "contaminants": [], "caches": [], "warnings": []}


def node_entries(hostvars, names):
    return _verify.verify_node_entries([hostvars[n] for n in names], ["HOME"], {"verify_allow_running_job": True})


def test_a_node_keeps_each_containers_record_and_fleet_records_finds_it():
    hostvars, groups = fleet(gpufleet_venv="/opt/venv")
    entries = node_entries(hostvars, ["ct10", "ct11"])
    assert entries[0] == {"host": "ct10", "vmid": 100, "python": "/usr/bin/python3", "args": _verify.verify_container_args(
        hostvars["ct10"], ["HOME"], {"verify_allow_running_job": True})}
    assert entries[0]["args"]["allow_running_job"] is True and entries[0]["args"]["venv"] == "/opt/venv"
    read = {"changed": False, "containers": {"ct10": BRIEF, "ct11": {"failed": True, "msg": "container 101 is not running"}}}
    kept = _verify.verify_node_records(read, entries, "pve1")
    assert kept["ct10"] == _verify.verify_record(BRIEF, "ct10", "pve1", 100)
    assert [c["name"] for c in kept["ct11"]["checks"]] == ["gpu_idle", "venv_clean", "caches_fresh"]
    assert {c["summary"] for c in kept["ct11"]["checks"]} == {"container 101 is not running"}
    hostvars["pve1"]["verify_records"] = kept
    hostvars["ct20"]["verify_record"] = dict(_verify.verify_record(BRIEF, "ct20", "pve2", 200), changed=False, failed=False)
    records = _fleet.fleet_records([hostvars[n] for n in groups["pve_containers"]], hostvars)
    assert [r["host"] for r in records] == ["ct10", "ct11", "ct20"]  # ct12, ct21, ct22 were not read
    assert records[0] == kept["ct10"] and records[2] == _verify.verify_record(BRIEF, "ct20", "pve2", 200)
    # Without hostvars (as before), only the containers' own records.
    assert [r["host"] for r in _fleet.fleet_records([hostvars[n] for n in groups["pve_containers"]])] == ["ct20"]


def test_a_node_that_failed_or_could_not_be_reached_fails_each_container_by_name():
    hostvars, _groups = fleet()
    entries = node_entries(hostvars, ["ct10"])
    failed = _verify.verify_node_records({"failed": True, "msg": "MODULE FAILURE"}, entries, "pve1")["ct10"]
    assert failed["checks"][0]["summary"] == "reading through node pve1 failed: MODULE FAILURE"
    # A node that could not be reached: its containers not read (no check: an outage is not a held GPU).
    gone = _verify.verify_node_records({"unreachable": True, "msg": "ssh: connect refused"}, entries, "pve1")["ct10"]
    assert gone["checks"] == [] and gone["ready"] is False
    assert gone["error"] == "reading through node pve1 could not be reached: ssh: connect refused"
    assert _verify.verify_verdict(gone, True)["problems"] == "not read: reading through node pve1 could not be reached: ssh: connect refused"


def test_a_node_as_the_host_enters_each_container_as_the_pct_connection_is_configured(monkeypatch):
    action = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.action.node_readiness").ActionModule
    monkeypatch.setenv("GPUFLEET_PCT_METHOD", "lxc-attach")
    settings = action._pct_settings()
    assert settings == {"method": "lxc-attach", "pct_path": "pct", "lxc_path": None}
    given = {"host": "ct10", "vmid": 100, "args": {}, "lxc_path": "/var/lib/lxc"}
    assert action._with_settings(given, settings.get, False) == dict(given, method="lxc-attach", pct_path="pct")
    # Its own variables first (verify_node_entries put them in the entry); a host without a vmid is read on the node.
    assert action._with_settings(dict(given, method="pct"), settings.get, False)["method"] == "pct"
    assert action._with_settings({"host": "pve1", "args": {}}, settings.get, False) == {"host": "pve1", "args": {}}


def test_the_plan_takes_host_names_not_a_pattern():
    """The play resolves the pattern and the limit (inventory_hostnames): a pattern given here is refused, named."""
    hostvars, _groups = fleet()
    with pytest.raises(AnsibleFilterError, match="expects host names .* not the pattern 'pve_containers'"):
        _fleet.fleet_read_plan("pve_containers", hostvars)
    with pytest.raises(AnsibleFilterError, match="not the pattern 'ct1\\*'"):
        _fleet.fleet_read_plan(["ct10"], hostvars, limit="ct1*")


def test_the_records_of_the_plans_containers_by_name():
    hostvars, _groups = fleet(n_nodes=1, per_node=2)
    hostvars["ct10"]["verify_record"] = _verify.verify_record(BRIEF, "ct10", "pve1", 100)
    records = _fleet.fleet_records(["ct10", "ct11"], hostvars)
    assert [r["host"] for r in records] == ["ct10"]  # ct11 was not read in this run
    assert records == _fleet.fleet_records([hostvars["ct10"], hostvars["ct11"]], hostvars)
