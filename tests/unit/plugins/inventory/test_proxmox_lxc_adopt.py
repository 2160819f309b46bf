# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""proxmox_lxc with source: inventory, after an inventory source that lists LXC guests as
community.proxmox's does: what each guest and node is given, from the variables of the sources and
of the group_vars beside them, through ansible-core's own InventoryManager."""

from __future__ import annotations

import json
import re

import pytest
from ansible.errors import AnsibleError
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

# As community.proxmox's inventory lists them (want_proxmox_nodes_ansible_host): its groups, a QEMU
# guest, a guest with an address of its own, a node without one.
COMMUNITY = {"all": {"children": {
    "proxmox_nodes": {"hosts": {"pve1": {"ansible_host": "192.0.2.1"}, "pve2": {}}},
    "proxmox_all_lxc": {"hosts": {
        "train-100": {"proxmox_vmid": 100, "proxmox_node": "pve1", "proxmox_vmtype": "lxc"},
        "train-200": {"proxmox_vmid": 200, "proxmox_node": "pve2", "proxmox_vmtype": "lxc", "ansible_host": "10.9.9.9"},
    }},
    "proxmox_all_qemu": {"hosts": {"vm-300": {"proxmox_vmid": 300, "proxmox_node": "pve1", "proxmox_vmtype": "qemu"}}},
}}}
ADOPT = "plugin: gpufleet.hygiene.proxmox_lxc\nsource: inventory\n"


def inventory(tmp_path, community=None, adopt=ADOPT, group_vars=None):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "1-cluster.yml").write_text(json.dumps(community or COMMUNITY))
    if adopt is not None:
        (tmp_path / "2-gpufleet.proxmox_lxc.yml").write_text(adopt)
    if group_vars is not None:
        (tmp_path / "group_vars").mkdir()
        (tmp_path / "group_vars" / "all.yml").write_text(json.dumps(group_vars))
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(tmp_path)])
    return inv, VariableManager(loader=loader, inventory=inv)


def host_vars(inv, variables, name):
    return variables.get_vars(host=inv.get_host(name))


def test_the_guests_get_what_the_playbooks_read_and_the_default_group(tmp_path):
    inv, variables = inventory(tmp_path, group_vars={"gpufleet_pve_node_addresses": {"pve2": "192.0.2.2"}})
    assert sorted(h.name for h in inv.get_hosts("pve_containers")) == ["train-100", "train-200"]
    assert [h.name for h in inv.get_hosts("pve_node_pve2")] == ["train-200"]
    assert sorted(h.name for h in inv.get_hosts("pve_nodes")) == ["pve1", "pve2"]
    ct = host_vars(inv, variables, "train-200")
    # The node's address from group_vars beside the inventory (seen while the inventory is built),
    # never the guest's own ansible_host.
    assert (ct["pve_node"], ct["ansible_pct_vmid"], ct["ansible_pct_node_host"], ct["ansible_connection"]) == (
        "pve2", 200, "192.0.2.2", "gpufleet.hygiene.pct")
    assert ct["ansible_host"] == "10.9.9.9"
    # The node's address as the inventory reports it.
    assert host_vars(inv, variables, "train-100")["ansible_pct_node_host"] == "192.0.2.1"
    # A node without an address gets the mapped one; the QEMU guest is left alone.
    assert host_vars(inv, variables, "pve2")["ansible_host"] == "192.0.2.2"
    vm = host_vars(inv, variables, "vm-300")
    assert "ansible_pct_vmid" not in vm and "ansible_connection" not in vm


def test_container_vars_and_compose_apply_to_the_adopted_guests(tmp_path):
    inv, variables = inventory(tmp_path, adopt=ADOPT + (
        "container_vars:\n  ansible_pct_method: lxc-attach\n"
        "compose:\n  gpufleet_venv: \"'/opt/venv-' ~ proxmox_vmid\"\n"
        "keyed_groups:\n  - key: pve_node\n    prefix: onnode\n"))
    ct = host_vars(inv, variables, "train-100")
    assert ct["ansible_pct_method"] == "lxc-attach" and ct["gpufleet_venv"] == "/opt/venv-100"
    assert [h.name for h in inv.get_hosts("onnode_pve1")] == ["train-100"]


def test_without_it_nothing_is_given(tmp_path):
    inv, variables = inventory(tmp_path, adopt=None)
    assert not inv.get_groups_dict().get("pve_containers")
    assert "ansible_pct_vmid" not in host_vars(inv, variables, "train-100")


@pytest.mark.parametrize("guest, said", [
    ({"proxmox_vmid": "1a", "proxmox_node": "pve1", "proxmox_vmtype": "lxc"}, "proxmox_vmid '1a', not a Proxmox VE ID"),
    ({"proxmox_vmid": 100, "proxmox_node": "pve1", "ansible_pct_vmid": 101}, "has ansible_pct_vmid 101 but proxmox_vmid 100"),
])
def test_a_guest_whose_variables_contradict_fails_the_source_saying_what(tmp_path, monkeypatch, capsys, guest, said):
    monkeypatch.setattr("ansible.constants.INVENTORY_ANY_UNPARSED_IS_FAILED", True)
    bad = {"all": {"hosts": {"pve1": {}, "ct": guest}}}
    with pytest.raises(AnsibleError, match="failed to parse inventory source .*2-gpufleet.proxmox_lxc.yml"):
        inventory(tmp_path, community=bad)
    # What ansible-core prints of the source's failure: what is wrong, by this plugin.
    assert re.search(r"proxmox_lxc \(source: inventory\): ct (has )?%s" % re.escape(said.replace("has ", "")),
                     " ".join(capsys.readouterr().err.split())), said


def test_a_guests_own_connection_is_kept_and_a_node_the_inventory_lacks_is_reached_by_name(tmp_path):
    community = {"all": {"hosts": {
        "train-100": {"proxmox_vmid": 100, "proxmox_node": "pve9", "proxmox_vmtype": "lxc"},
        "train-101": {"proxmox_vmid": 101, "proxmox_node": "pve9", "proxmox_vmtype": "lxc",
                      "ansible_connection": "community.proxmox.proxmox_pct_remote"},
    }}}
    inv, variables = inventory(tmp_path, community=community)
    ct = host_vars(inv, variables, "train-100")
    assert (ct["ansible_pct_node_host"], ct["ansible_connection"]) == ("pve9", "gpufleet.hygiene.pct")
    assert host_vars(inv, variables, "train-101")["ansible_connection"] == "community.proxmox.proxmox_pct_remote"
    assert not inv.get_groups_dict().get("pve_nodes")  # pve9 is no host of the inventory


def test_the_node_addresses_given_with_e_count_with_use_extra_vars(tmp_path, monkeypatch):
    from ansible import context
    from ansible.module_utils.common.collections import ImmutableDict

    monkeypatch.setattr(context, "CLIARGS", ImmutableDict(extra_vars=('{"gpufleet_pve_node_addresses": {"pve2": "192.0.2.9"}}',)))
    inv, variables = inventory(tmp_path / "with", adopt=ADOPT + "use_extra_vars: true\n")
    assert host_vars(inv, variables, "train-200")["ansible_pct_node_host"] == "192.0.2.9"
    inv, variables = inventory(tmp_path / "without")
    assert host_vars(inv, variables, "train-200")["ansible_pct_node_host"] == "pve2"
