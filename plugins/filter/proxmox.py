# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Proxmox VE for the playbooks: which tag shows each container's verdict in the Proxmox VE web
UI (pve_tag_plan; docs: pve_tag_plan.yml)."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError


def _vmid(host, value):
    text = str(value)
    if isinstance(value, bool) or not text.isdigit():
        raise AnsibleFilterError("pve_tag_plan: %s has vmid %r, not a Proxmox VE ID" % (host, value))
    return int(text)


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
        return {"pve_tag_plan": pve_tag_plan}
