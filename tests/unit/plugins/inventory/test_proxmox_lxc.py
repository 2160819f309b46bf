# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The proxmox_lxc inventory plugin without a fleet: host names, and why a node is skipped (the
parsers of `pct list` / `pct config` it calls are tested with the layer, module_utils/test_proxmox_layer.py)."""

from __future__ import annotations

import importlib
import os

from ansible.plugins.loader import init_plugin_loader

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".ansible", "collections"))
# Through the collection loader, as ansible loads it (and as the connection tests need it).
init_plugin_loader([COLLECTIONS])
_plugin = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.inventory.proxmox_lxc")


def test_host_name_never_takes_a_node_or_an_odd_name():
    host_name = _plugin.container_host_name
    rows = [{"vmid": 100, "name": "pve2"}, {"vmid": 101, "name": "a;touch$(x)"}, {"vmid": 102, "name": "-oProxyCommand=x"},
            {"vmid": 103, "name": "train-103"}, {"vmid": 104, "name": "9" * 300}]
    names = {r["name"]: [r["vmid"]] for r in rows}
    got = [host_name("name", "pve1", r, names, {"pve1", "pve2"}) for r in rows]
    # pve2 is a node: a container so named would take over that node's host and its variables.
    assert got == ["pve1-100", "pve1-101", "pve1-102", "train-103", "pve1-104"]


def test_a_skipped_node_says_why_in_the_layer_s_words():
    paramiko = _plugin.paramiko
    why = _plugin.InventoryModule._why
    key = paramiko.RSAKey.generate(1024)
    assert why(paramiko.BadHostKeyException("pve1", key, key)) == "host key does not match"
    assert why(paramiko.AuthenticationException("no")) == "SSH authentication failed"
    assert why(paramiko.SSHException("Server 'pve1' not found in known_hosts")) == "host key unknown (host key checking is on)"
    assert why(ConnectionRefusedError(111, "Connection refused")) == "unreachable"
    assert why(_plugin.AnsibleError("`pct list` failed (rc=2): usage")) == "pct failed"
    assert why(ValueError("odd")) == "failed"
