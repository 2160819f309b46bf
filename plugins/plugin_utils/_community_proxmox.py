# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The LXC guests of community.proxmox's ``proxmox`` inventory as this collection reads hosts.

That inventory gives each guest ``proxmox_vmid``, ``proxmox_node`` and ``proxmox_vmtype``; the
playbooks and roles read ``ansible_pct_vmid``, ``pve_node`` and reach a container through
``ansible_pct_node_host`` with the pct connection. ``adopt()`` says what each such guest (and
node) is to be given: the proxmox_lxc inventory's ``source: inventory`` sets it while the inventory
is built, and the fleet plan refuses a run whose guests lack it, naming that source.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError

PCT = "gpufleet.hygiene.pct"


class AdoptError(GpufleetError):
    """A guest whose variables say something impossible (its message says what to fix)."""


def _vmid(host, value):
    text = str(value)
    if isinstance(value, bool) or not text.isdigit():
        raise AdoptError("%s has proxmox_vmid %r, not a Proxmox VE ID" % (host, value))
    return int(text)


def adopt(hostvars, hosts):
    """For each host of ``hosts`` that community.proxmox's inventory made of an LXC guest
    (``proxmox_vmid``, ``proxmox_node``, ``proxmox_vmtype`` lxc or unset) and that does not say both
    its vmid and its node's address (``ansible_pct_vmid``, ``ansible_pct_node_host``, as this
    collection's inventory does): the variables the playbooks and roles read (``containers``: host,
    pve_node, ansible_pct_vmid, ansible_pct_node_host, ansible_connection), those its inventory
    composed kept; and for their nodes without an ``ansible_host`` the address
    ``gpufleet_pve_node_addresses`` gives them (``nodes``: host, ansible_host). ``hostvars``: each
    host's variables by name."""
    containers, nodes = [], {}
    for host in hosts:
        hv = hostvars[host]
        if hv.get("proxmox_vmid") is None or (hv.get("ansible_pct_vmid") is not None and hv.get("ansible_pct_node_host")):
            continue
        if (hv.get("proxmox_vmtype") or "lxc") != "lxc":
            continue
        node = hv.get("proxmox_node")
        if not node:
            raise AdoptError("%s has proxmox_vmid but no proxmox_node (community.proxmox's inventory gives both)" % host)
        addresses = hv.get("gpufleet_pve_node_addresses") or {}
        if not isinstance(addresses, Mapping):
            raise AdoptError("gpufleet_pve_node_addresses of %s must map node names to addresses, got %r" % (host, addresses))
        # Not hostvars.get(node, {}): ansible-core's HostVars answers a host it lacks with an
        # Undefined, not a KeyError, so get() would not fall back.
        node_vars = {}
        if node in hostvars:
            node_vars = hostvars[node]
        address = addresses.get(node) or node_vars.get("ansible_host") or node
        vmid = _vmid(host, hv["proxmox_vmid"])
        composed = hv.get("ansible_pct_vmid")
        if composed is not None and _vmid(host, composed) != vmid:
            raise AdoptError("%s has ansible_pct_vmid %r but proxmox_vmid %r: the inventory's compose must give "
                             "ansible_pct_vmid from proxmox_vmid" % (host, composed, hv["proxmox_vmid"]))
        containers.append({
            "host": host, "pve_node": str(node), "ansible_pct_vmid": vmid,
            "ansible_pct_node_host": str(address), "ansible_connection": hv.get("ansible_connection") or PCT,
        })
        if node in hostvars and not node_vars.get("ansible_host") and addresses.get(node):
            nodes[node] = {"host": node, "ansible_host": str(addresses[node])}
    return {"containers": containers, "nodes": [nodes[n] for n in sorted(nodes)]}
