# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pct connection takes the variables of community.proxmox's `proxmox` inventory: proxmox_vmid
for the vmid, proxmox_node for the node, its address from gpufleet_pve_node_addresses."""

from __future__ import annotations

import os

import pytest
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, init_plugin_loader

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".ansible", "collections"))
init_plugin_loader([COLLECTIONS])


def conn_with(**variables):
    conn = connection_loader.get("gpufleet.hygiene.pct", PlayContext(), None)
    conn.set_options(var_options=variables)
    conn._connect()
    return conn


# What community.proxmox gives a guest, and the ansible_host ansible-core gives every host
# (its inventory name when nothing sets it), or the guest address its users compose.
COMMUNITY = {"proxmox_vmid": 101, "proxmox_node": "pve1", "proxmox_vmtype": "lxc", "ansible_host": "train-101"}


@pytest.mark.parametrize("extra, want_host", [
    ({"gpufleet_pve_node_addresses": {"pve1": "10.0.0.11", "pve2": "10.0.0.12"}}, "10.0.0.11"),
    ({}, "pve1"),                                                      # no mapping: the node's name
    ({"gpufleet_pve_node_addresses": {"pve2": "10.0.0.12"}}, "pve1"),  # not in the mapping: its name
    ({"ansible_host": "192.168.5.101", "gpufleet_pve_node_addresses": {"pve1": "10.0.0.11"}}, "10.0.0.11"),
    ({"ansible_pct_node_host": "pve1.example.com", "gpufleet_pve_node_addresses": {"pve1": "10.0.0.11"}}, "pve1.example.com"),
])
def test_community_proxmox_hosts_reach_their_node(extra, want_host):
    conn = conn_with(**dict(COMMUNITY, **extra))
    assert conn._vmid == 101
    assert conn.get_option("node_host") == want_host
    assert conn._ssh_argv("true")[-2] == want_host


@pytest.mark.parametrize("mapping, want_host", [({"pve1": "10.0.0.11"}, "10.0.0.11"), ({}, "pve1")])
def test_a_host_without_any_ansible_host(mapping, want_host):
    """As ansible-core runs a task on a host of community.proxmox's inventory that sets no
    ansible_host: no ansible_host among the connection's variables at all."""
    variables = {k: v for k, v in COMMUNITY.items() if k != "ansible_host"}
    conn = conn_with(**dict(variables, gpufleet_pve_node_addresses=mapping))
    assert conn.get_option("node_host") == want_host


def test_ansible_pct_vmid_wins_over_proxmox_vmid():
    assert conn_with(**{**COMMUNITY, "ansible_pct_vmid": 102})._vmid == 102
    assert conn_with(**{**COMMUNITY, "proxmox_vmid": "103"})._vmid == 103       # the API's vmid as text


def test_without_proxmox_node_nothing_changes():
    conn = conn_with(ansible_host="pve9.example.com", ansible_pct_vmid=100)
    assert conn.get_option("node_host") == "pve9.example.com"
