# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Proxmox VE for the playbooks: hosts of community.proxmox's `proxmox` inventory as the
playbooks read hosts (proxmox_hosts), and which tag shows each container's verdict in the
Proxmox VE web UI (pve_tag_plan); docs: proxmox_hosts.yml, pve_tag_plan.yml."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

PCT = "gpufleet.hygiene.pct"


def _vmid(host, value):
    text = str(value)
    if isinstance(value, bool) or not text.isdigit():
        raise AnsibleFilterError("proxmox_hosts: %s has proxmox_vmid %r, not a Proxmox VE ID" % (host, value))
    return int(text)


def proxmox_hosts(hostvars, hosts):
    """For each host of ``hosts`` that community.proxmox's inventory made of an LXC guest
    (``proxmox_vmid``, ``proxmox_node``) and that does not say both its vmid and its node's address
    (``ansible_pct_vmid``, ``ansible_pct_node_host``, as this collection's inventory does): the
    variables the playbooks and roles read (``containers``), those its inventory composed kept, and
    for their nodes without an ``ansible_host`` the address ``gpufleet_pve_node_addresses`` gives
    them (``nodes``)."""
    containers, nodes = [], {}
    for host in hosts:
        hv = hostvars[host]
        if hv.get("proxmox_vmid") is None or (hv.get("ansible_pct_vmid") is not None and hv.get("ansible_pct_node_host")):
            continue
        if (hv.get("proxmox_vmtype") or "lxc") != "lxc":
            continue
        node = hv.get("proxmox_node")
        if not node:
            raise AnsibleFilterError("proxmox_hosts: %s has proxmox_vmid but no proxmox_node (community.proxmox's inventory "
                                     "gives both)" % host)
        addresses = hv.get("gpufleet_pve_node_addresses") or {}
        if not isinstance(addresses, Mapping):
            raise AnsibleFilterError("proxmox_hosts: gpufleet_pve_node_addresses of %s must map node names to addresses, got %r"
                                     % (host, addresses))
        node_vars = hostvars[node] if node in hostvars else {}  # noqa: SIM401 - HostVars has no KeyError
        address = addresses.get(node) or node_vars.get("ansible_host") or node
        vmid = _vmid(host, hv["proxmox_vmid"])
        composed = hv.get("ansible_pct_vmid")
        if composed is not None and _vmid(host, composed) != vmid:
            raise AnsibleFilterError("proxmox_hosts: %s has ansible_pct_vmid %r but proxmox_vmid %r: the inventory's compose "
                                     "must give ansible_pct_vmid from proxmox_vmid" % (host, composed, hv["proxmox_vmid"]))
        containers.append({
            "host": host, "pve_node": str(node), "ansible_pct_vmid": vmid,
            "ansible_pct_node_host": str(address), "ansible_connection": hv.get("ansible_connection") or PCT,
        })
        if node in hostvars and not node_vars.get("ansible_host") and addresses.get(node):
            nodes[node] = {"host": node, "ansible_host": str(addresses[node])}
    return {"containers": containers, "nodes": [nodes[n] for n in sorted(nodes)]}


# A container's verdict as the tag the Proxmox VE web UI shows (gpufleet_pve_tags).
TAG_OK = "gpufleet-ok"
TAG_DIRTY = "gpufleet-dirty"
TAG_UNHEALTHY = "gpufleet-unhealthy"
TAGS = (TAG_OK, TAG_DIRTY, TAG_UNHEALTHY)


def verdict_tag(record):
    """gpufleet-ok (ready), gpufleet-unhealthy (a GPU health check failed), gpufleet-dirty (not
    ready otherwise), or None when nothing was read of it (unreachable, stopped, failed read)."""
    checks = [c for c in record.get("checks") or () if isinstance(c, Mapping)]
    if record.get("error") or not checks or all(c.get("error") for c in checks):
        return None
    if record.get("ready"):
        return TAG_OK
    if any(c.get("name") == "gpu_healthy" and not c.get("ok") for c in checks):
        return TAG_UNHEALTHY
    return TAG_DIRTY


def pve_tag_plan(records, hostvars):
    """Which node tags which of its containers how: ``nodes`` (the node hosts) and ``by_node``
    (each a list of ``host``, ``vmid``, ``add``, ``remove``), for the containers whose
    ``gpufleet_pve_tags`` is true, that have a node and a vmid and of which a verdict was read."""
    by_node = {}
    for record in records:
        host = record.get("host")
        if host not in hostvars or not _true(hostvars[host].get("gpufleet_pve_tags")):
            continue
        tag = verdict_tag(record)
        node, vmid = record.get("node"), record.get("vmid")
        if tag is None or not node or vmid is None:
            continue
        by_node.setdefault(str(node), []).append({"host": host, "vmid": _vmid(host, vmid), "add": [tag],
                                                  "remove": [t for t in TAGS if t != tag]})
    return {"nodes": sorted(by_node), "by_node": by_node}


def _true(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


class FilterModule(object):
    def filters(self):
        return {"proxmox_hosts": proxmox_hosts, "pve_tag_plan": pve_tag_plan}
