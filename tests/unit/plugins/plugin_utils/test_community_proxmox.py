# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""adopt(): community.proxmox's LXC guests as this collection reads hosts (what the proxmox_lxc
inventory's source: inventory gives them, and what the fleet plan finds missing)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._community_proxmox import AdoptError, adopt

# As community.proxmox's inventory gives them: a node, two LXC guests, a VM, and one of ours.
HOSTVARS = {
    "pve1": {},
    "pve2": {"ansible_host": "192.0.2.2"},
    "train-100": {"proxmox_vmid": 100, "proxmox_node": "pve1", "proxmox_vmtype": "lxc"},
    "train-200": {"proxmox_vmid": "200", "proxmox_node": "pve2", "proxmox_vmtype": "lxc", "ansible_host": "10.9.9.9"},
    "vm-300": {"proxmox_vmid": 300, "proxmox_node": "pve1", "proxmox_vmtype": "qemu"},
    "ours-400": {"ansible_pct_vmid": 400, "pve_node": "pve1", "proxmox_vmid": 400, "proxmox_node": "pve1",
                 "ansible_pct_node_host": "192.0.2.1"},
    # A guest an inventory's compose gave its connection, vmid and node, but not its node's address.
    "train-500": {"proxmox_vmid": 500, "proxmox_node": "pve2", "proxmox_vmtype": "lxc", "ansible_pct_vmid": 500,
                  "pve_node": "pve2", "ansible_connection": "gpufleet.hygiene.pct"},
}


def test_community_hosts_get_what_the_playbooks_read():
    got = adopt(HOSTVARS, list(HOSTVARS))
    assert got == {"containers": [
        {"host": "train-100", "pve_node": "pve1", "ansible_pct_vmid": 100, "ansible_pct_node_host": "pve1",
         "ansible_connection": "gpufleet.hygiene.pct"},
        # The node's address as the inventory reports it (the node host's ansible_host), not the guest's.
        {"host": "train-200", "pve_node": "pve2", "ansible_pct_vmid": 200, "ansible_pct_node_host": "192.0.2.2",
         "ansible_connection": "gpufleet.hygiene.pct"},
        # Composed: only its node's address was missing.
        {"host": "train-500", "pve_node": "pve2", "ansible_pct_vmid": 500, "ansible_pct_node_host": "192.0.2.2",
         "ansible_connection": "gpufleet.hygiene.pct"},
    ], "nodes": []}


def test_the_node_address_mapping_wins_and_reaches_the_nodes_without_an_address():
    mapping = {"pve1": "10.0.0.1", "pve2": "10.0.0.2"}
    hostvars = {k: dict(v, gpufleet_pve_node_addresses=mapping) for k, v in HOSTVARS.items()}
    got = adopt(hostvars, list(hostvars))
    assert [c["ansible_pct_node_host"] for c in got["containers"]] == ["10.0.0.1", "10.0.0.2", "10.0.0.2"]
    assert got["nodes"] == [{"host": "pve1", "ansible_host": "10.0.0.1"}]    # pve2 has its own ansible_host


@pytest.mark.parametrize("hv, msg", [
    ({"proxmox_vmid": 100}, "has proxmox_vmid but no proxmox_node"),
    ({"proxmox_vmid": "1a", "proxmox_node": "pve1"}, "proxmox_vmid '1a', not a Proxmox VE ID"),
    ({"proxmox_vmid": 100, "proxmox_node": "pve1", "gpufleet_pve_node_addresses": ["pve1"]}, "must map node names"),
    ({"proxmox_vmid": 100, "proxmox_node": "pve1", "ansible_pct_vmid": 101}, "has ansible_pct_vmid 101 but proxmox_vmid 100"),
])
def test_bad_community_hosts_are_said(hv, msg):
    with pytest.raises(AdoptError, match=msg):
        adopt({"ct": hv}, ["ct"])
