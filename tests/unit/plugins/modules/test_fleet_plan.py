# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_plan (an action, on the controller): the run's checks and the fleet plan in one task, over a
real inventory and the variables ansible-core gives a task on localhost."""

from __future__ import annotations

import pytest
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.loader import action_loader, connection_loader
from ansible.template import Templar
from ansible.vars.hostvars import HostVars
from ansible.vars.manager import VariableManager

ACTION = "gpufleet.hygiene.fleet_plan"

INVENTORY = """\
[pve_nodes]
pve1 ansible_host=127.0.1.1
pve2 ansible_host=127.0.1.2

[pve_containers]
train-100 pve_node=pve1 ansible_pct_vmid=100 ansible_connection=gpufleet.hygiene.pct
train-101 pve_node=pve1 ansible_pct_vmid=101 ansible_connection=gpufleet.hygiene.pct
train-200 pve_node=pve2 ansible_pct_vmid=200 ansible_connection=gpufleet.hygiene.pct
"""


def fleet_of(path, text=INVENTORY, after=()):
    """(loader, inventory, variable manager, source) of an inventory file holding ``text`` (and the
    sources ``after`` it), with the hostvars the task queue manager gives a play's tasks."""
    path.write_text(text)
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(path)] + [str(p) for p in after])
    variables = VariableManager(loader=loader, inventory=inventory)
    variables._hostvars = HostVars(inventory=inventory, variable_manager=variables, loader=loader)
    return loader, inventory, variables, str(path)


@pytest.fixture
def fleet(tmp_path):
    return fleet_of(tmp_path / "hosts")


def run(fleet, args=None, limit=None, extra=None):
    loader, inventory, variables, source = fleet
    variables._extra_vars = dict(extra or {})
    task_vars = variables.get_vars(host=inventory.localhost or inventory.get_host("localhost"))
    task_vars.setdefault("ansible_inventory_sources", [source])  # a magic variable of a play's tasks
    if limit is not None:
        task_vars["ansible_limit"] = limit
    task = Task()
    task.action = ACTION
    task.args = dict(args or {})
    play_context = PlayContext()
    connection = connection_loader.get("ansible.builtin.local", play_context)
    action = action_loader.get(ACTION, task=task, connection=connection, play_context=play_context, loader=loader,
                               templar=Templar(loader=loader), shared_loader_obj=None)
    return action.run(task_vars=task_vars)


def test_the_plan_reads_every_container_by_its_node(fleet):
    result = run(fleet)
    assert not result.get("failed") and result["changed"] is False, result
    assert result["by"] == "node" and result["containers"] == ["train-100", "train-101", "train-200"]
    assert result["by_node"] == {"pve1": ["train-100", "train-101"], "pve2": ["train-200"]}
    assert result["node_hosts"] == ["pve1", "pve2"] and result["container_hosts"] == []
    assert result["msg"] == "3 container(s), read by node"


def test_the_pattern_and_the_limit_are_resolved_as_inventory_hostnames_does(fleet):
    result = run(fleet, {"hosts": "pve_containers:!train-101"}, limit="train-1*,pve1")
    assert result["containers"] == ["train-100"] and result["by_node"] == {"pve1": ["train-100"]}, result
    # A limit without the containers' nodes: read by container (each still read from its node).
    alone = run(fleet, limit="train-200")
    assert alone["by"] == "container" and alone["container_hosts"] == ["train-200"] and alone["node_hosts"] == []


def test_an_option_out_of_range_fails_naming_the_variable_before_the_plan(fleet):
    result = run(fleet, extra={"gpufleet_stall_after": -5})
    assert result["failed"] is True and "containers" not in result, result
    assert result["msg"].startswith("configuration error, nothing was read or changed: gpufleet_stall_after=-5 must be at "
                                    "least 1"), result


def test_a_wrong_read_by_is_named_as_the_variable_the_user_set(fleet):
    result = run(fleet, {"read_by": "nodes"}, extra={"gpufleet_read_by": "nodes"})
    assert result["failed"] is True
    assert "gpufleet_read_by=nodes must be one of auto, node, container" in result["msg"], result


def test_an_empty_selection_fails_unless_allowed(fleet):
    result = run(fleet, {"hosts": "pve_contianers"})
    assert result["failed"] is True and "containers" not in result
    assert result["msg"].startswith("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_contianers "
                                    "(inventory: %s): the pattern matches no host of the inventory. Did you mean "
                                    "pve_containers?" % fleet[3]), result
    allowed = run(fleet, {"hosts": "pve_contianers", "allow_empty": True})
    assert not allowed.get("failed") and allowed["containers"] == [] and allowed["by"] == "container", allowed


def test_a_limit_from_a_file_is_not_resolved(fleet):
    result = run(fleet, limit="@retry")
    assert result["by"] == "container" and result["containers"] == ["train-100", "train-101", "train-200"], result


COMMUNITY = ("[pve]\npve1 ansible_host=127.0.1.1\n\n[lxc]\n"
             "ct-101 proxmox_vmid=101 proxmox_node=pve1 proxmox_vmtype=lxc\n"
             "ct-102 proxmox_vmid=102 proxmox_node=pve1 proxmox_vmtype=lxc ansible_pct_vmid=102 "
             "ansible_pct_node_host=127.0.1.1 ansible_connection=gpufleet.hygiene.pct pve_node=pve1\n")


def test_community_proxmox_s_guests_no_source_adopted_stop_the_run_naming_the_source(tmp_path):
    result = run(fleet_of(tmp_path / "community", COMMUNITY), {"hosts": "lxc"})
    assert result.get("failed") and result["msg"] == (
        "configuration error, nothing was read or changed: ct-101: LXC guest(s) of community.proxmox's inventory "
        "(proxmox_vmid, proxmox_node) without the variables the plays read (pve_node, ansible_pct_vmid, "
        "ansible_pct_node_host); add the gpufleet.hygiene.proxmox_lxc inventory with source: inventory after that "
        "inventory (a later -i, or a later file of its directory): "
        "inventory/example-community-proxmox.gpufleet.proxmox_lxc.yml, docs/fleet.md; where it is there already, it "
        "failed to parse: its warning above says why"), result
    # Nothing selected (no pve_containers group without that source): said beside the empty selection.
    nothing = run(fleet_of(tmp_path / "c2", COMMUNITY))
    assert nothing["msg"].startswith("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_containers")
    assert "; and ct-101: LXC guest(s) of community.proxmox's inventory" in nothing["msg"], nothing
    # Only the run's containers count: one left out by --limit stops nothing, nor does a slice that
    # may select nothing.
    community = fleet_of(tmp_path / "c3", COMMUNITY)
    limited = run(community, {"hosts": "lxc"}, limit="ct-102")
    assert not limited.get("failed") and limited["containers"] == ["ct-102"], limited
    assert not run(community, {"allow_empty": True}).get("failed")


def test_community_proxmox_s_guests_adopted_by_the_inventory_are_planned(tmp_path, fleet):
    adopter = tmp_path / "gpufleet.proxmox_lxc.yml"
    adopter.write_text("plugin: gpufleet.hygiene.proxmox_lxc\nsource: inventory\n")
    community = fleet_of(tmp_path / "community", COMMUNITY, after=[adopter])
    result = run(community, {"hosts": "lxc"})
    assert not result.get("failed"), result
    assert result["by"] == "node" and result["by_node"] == {"pve1": ["ct-101", "ct-102"]}, result
    # The guest it adopted is in pve_containers, the default pattern (ct-102 had what the plays read).
    assert run(community)["by_node"] == {"pve1": ["ct-101"]}
    # This collection's inventory is planned as before.
    assert not run(fleet).get("failed")
