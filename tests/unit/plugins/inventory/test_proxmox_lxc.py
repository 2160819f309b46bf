# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The proxmox_lxc inventory plugin without a fleet: host names, and why a node is skipped (the
parsers of `pct list` / `pct config` it calls are tested with the layer, proxmox/test_pct.py)."""

from __future__ import annotations

import importlib
import os

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".ansible", "collections"))
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
    """What OpenSSH prints when it cannot reach a node (exit status 255), in the inventory's words."""
    why = _plugin.InventoryModule._why
    said = {
        "host key does not match": ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\r\nHost key for [pve1]:22 has "
                                    "changed and you have requested strict checking.\r\nHost key verification failed.\r\n"),
        "host key unknown (host key checking is on)": ("No ED25519 host key is known for pve1 and you have requested strict "
                                                       "checking.\r\nHost key verification failed.\r\n"),
        "SSH authentication failed": "root@pve1: Permission denied (publickey).\r\n",
        "unreachable": "ssh: connect to host pve1 port 22: Connection refused\r\n",
    }
    for reason, stderr in said.items():
        assert why(_plugin.NodeSshError(_plugin._ssh.failure(255, b"", stderr), stderr)) == reason
    assert why(ConnectionRefusedError(111, "Connection refused")) == "unreachable"
    assert why(_plugin.AnsibleError("`pct list` failed (rc=2): usage")) == "pct failed"
    assert why(ValueError("odd")) == "failed"


def test_a_container_pct_lists_as_ct_vmid_has_no_hostname():
    """Real pct lists a container without a hostname as CT<vmid>: it is named as one with a blank
    name (<node>-<vmid>), and its pve_name is empty."""
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    listing = "%-10s %-10s %-12s %-20s\n" * 3 % ("VMID", "Status", "Lock", "Name", 300, "running", "", "CT300",
                                                 301, "running", "", "train-301")
    rows = _plugin._pct.parse_list(listing)
    for row in rows:
        row["config"] = {"hostname": row["name"]} if row["name"] else {}
    plugin = inventory_loader.get("gpufleet.hygiene.proxmox_lxc")
    plugin.inventory = InventoryData()
    plugin.set_options(direct={"plugin": "gpufleet.hygiene.proxmox_lxc", "nodes": ["pve3"]})
    node = {"name": "pve3", "host": "10.0.0.3", "port": 22, "user": "root"}
    plugin._populate({"nodes": {"pve3": {"node": node, "containers": rows}}, "failed": []})
    hosts = {name: host.get_vars() for name, host in plugin.inventory.hosts.items()}
    assert sorted(hosts) == ["pve3", "pve3-300", "train-301"]
    assert hosts["pve3-300"]["pve_name"] == "" and hosts["pve3-300"]["ansible_pct_vmid"] == 300
    assert hosts["train-301"]["pve_name"] == "train-301"


def test_gpus_in_every_passthrough_style_and_a_container_that_may_open_all(monkeypatch):
    """Containers passed through with cgroup2 rules and mount entries (no devN:) are GPU containers
    with their indices; one allowed c 195:* with no /dev/nvidiaN is one too, its indices unknown, and
    the node's warning says so."""
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    mount = "".join("lxc.mount.entry: /dev/nvidia%d dev/nvidia%d none bind,optional,create=file\n" % (i, i) for i in (2, 3))
    configs = {
        400: "hostname: box\nlxc.cgroup2.devices.allow: c 195:* rwm\n" + mount,
        401: "hostname: anygpu\nlxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 508:* rwm\n",
        402: "dev0: /dev/nvidia1\nhostname: devstyle\n",
        403: "hostname: web\n",
    }
    rows = [{"vmid": v, "status": "running", "lock": "", "name": _plugin._pct.parse_config(t)["hostname"],
             "config": _plugin._pct.parse_config(t)} for v, t in configs.items()]
    warnings = []
    monkeypatch.setattr(_plugin.display, "warning", warnings.append)
    plugin = inventory_loader.get("gpufleet.hygiene.proxmox_lxc")
    plugin.inventory = InventoryData()
    plugin.set_options(direct={"plugin": "gpufleet.hygiene.proxmox_lxc", "nodes": ["pve4"]})
    node = {"name": "pve4", "host": "10.0.0.4", "port": 22, "user": "root"}
    plugin._populate({"nodes": {"pve4": {"node": node, "containers": rows}}, "failed": []})
    hosts = {name: host.get_vars() for name, host in plugin.inventory.hosts.items()}
    assert sorted(h.name for h in plugin.inventory.groups["pve_gpu"].get_hosts()) == ["anygpu", "box", "devstyle"]
    assert [h.name for h in plugin.inventory.groups["pve_no_gpu"].get_hosts()] == ["web"]
    assert (hosts["box"]["pve_gpu_indices"], hosts["box"]["pve_gpus"], hosts["box"]["pve_gpu_all"]) == (
        [2, 3], ["/dev/nvidia2", "/dev/nvidia3"], False)
    assert (hosts["anygpu"]["pve_gpu_indices"], hosts["anygpu"]["pve_gpu_all"]) == ([], True)
    assert (hosts["devstyle"]["pve_gpu_indices"], hosts["web"]["pve_gpu_all"]) == ([1], False)
    assert len(warnings) == 1 and "pve4" in warnings[0] and "401" in warnings[0] and "c 195:*" in warnings[0], warnings


def test_unprivileged_containers_get_their_variable_and_group():
    """`unprivileged: 1` in pct config (Proxmox VE's default for a new container) puts the container
    in pve_unprivileged with pve_unprivileged true; absent or 0 is privileged, in no such group."""
    from ansible.inventory.data import InventoryData
    from ansible.plugins.loader import inventory_loader

    configs = {
        500: "arch: amd64\nhostname: unpriv\nostype: debian\nswap: 0\nunprivileged: 1\n",
        501: "hostname: priv\nostype: debian\n",
        502: "hostname: zero\nunprivileged: 0\n",
    }
    rows = [{"vmid": v, "status": "running", "lock": "", "name": _plugin._pct.parse_config(t)["hostname"],
             "config": _plugin._pct.parse_config(t)} for v, t in configs.items()]
    plugin = inventory_loader.get("gpufleet.hygiene.proxmox_lxc")
    plugin.inventory = InventoryData()
    plugin.set_options(direct={"plugin": "gpufleet.hygiene.proxmox_lxc", "nodes": ["pve5"]})
    node = {"name": "pve5", "host": "10.0.0.5", "port": 22, "user": "root"}
    plugin._populate({"nodes": {"pve5": {"node": node, "containers": rows}}, "failed": []})
    hosts = {name: host.get_vars() for name, host in plugin.inventory.hosts.items()}
    assert [h.name for h in plugin.inventory.groups["pve_unprivileged"].get_hosts()] == ["unpriv"]
    assert (hosts["unpriv"]["pve_unprivileged"], hosts["priv"]["pve_unprivileged"], hosts["zero"]["pve_unprivileged"]) == (
        True, False, False)
