# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The playbooks' fleet view: how this run reads its containers (fleet_read_plan), every host's
record (fleet_records) and the one-line-per-host summary (fleet_summary); docs:
fleet_read_plan.yml, fleet_records.yml, fleet_summary.yml.

The playbooks find their hosts one way: the host pattern of their first play, resolved with
ansible.builtin.inventory_hostnames, then the hosts this run read (the ones with a
verify_record). The records come from module_utils.readiness._record, the builder the readiness
action and the verify role use.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.hygiene.plugins.filter.verify import verify_verdict
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _record
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils import _node_read

PCT = "gpufleet.hygiene.pct"
READ_BY = ("auto", "node", "container")


def fleet_read_plan(selected, hostvars, limit=None, limit_file=False, read_by="auto"):
    """How a run reads the containers it selected: by container (one host per container) or by
    node (the nodes are the play's hosts, one node_readiness run each). ``selected``: the host
    pattern's hosts and ``limit``: the --limit's (both as ansible.builtin.inventory_hostnames
    resolves them; none without a --limit); ``limit_file``: the --limit is a file (@retry), not
    resolved. Returns ``by``, the ``containers`` read, ``by_node`` (node: [containers]), and the
    hosts of each path's play: ``container_hosts`` (the containers, or none) and ``node_hosts``
    (their nodes, or none)."""
    if read_by not in READ_BY:
        raise AnsibleFilterError("fleet_read_plan: gpufleet_read_by must be one of %s, got %r" % (", ".join(READ_BY), read_by))
    if isinstance(selected, str) or (limit is not None and isinstance(limit, str)):
        raise AnsibleFilterError("fleet_read_plan: expects host names (query('ansible.builtin.inventory_hostnames', pattern)), "
                                 "not the pattern %r" % (selected if isinstance(selected, str) else limit))
    allowed = None if limit is None else set(limit)
    containers = [c for c in selected if allowed is None or c in allowed]
    by_node, without = {}, []
    for name in containers:
        hv = hostvars[name]
        node = hv.get("pve_node")
        # The node must be a host of the inventory and of this run (--limit) to be the play's host.
        if hv.get("ansible_connection") != PCT or not node or node not in hostvars or (allowed is not None and node not in allowed):
            without.append(name)
        else:
            by_node.setdefault(node, []).append(name)
    if read_by == "node" and without:
        raise AnsibleFilterError("fleet_read_plan: gpufleet_read_by=node, but these containers have no node among this "
                                 "run's hosts (pve_node, reached through %s): %s" % (PCT, ", ".join(without)))
    # Either way each container is read from its node (the verify role's read); by node, the
    # nodes are the play's hosts and no task runs per container. A limit from a file may leave the
    # nodes out: auto then reads by container.
    node = read_by == "node" or (read_by == "auto" and bool(by_node) and not without and not limit_file)
    return {"by": "node" if node else "container", "containers": containers, "by_node": by_node if node else {},
            "container_hosts": [] if node else containers, "node_hosts": list(by_node) if node else []}


def fleet_records(hosts, hostvars=None, unread=False):
    """The record of every host this run read, from the hosts (their names, with hostvars, or each
    one's variables):
    the verify role's verify_record (or verify_result, its name before 0.3.0, until 0.4.0), or, when its read failed before reading (a value refused, a
    template that failed), the record of a host not read, with the read's message. With hostvars,
    a container read by its node (verify_records of its pve_node) has the record kept there. With
    unread, a host without any record is recorded as not read (no result) instead of left out."""
    out = []
    for host in hosts:
        # a host's name (the plan's containers): its variables
        hv = hostvars[host] if isinstance(host, str) and hostvars is not None and host in hostvars else host
        if not isinstance(hv, Mapping) or "inventory_hostname" not in hv:
            raise AnsibleFilterError("fleet_records: expects host names with hostvars, or each host's variables "
                                     "(hosts | map('extract', hostvars))")
        name = hv["inventory_hostname"]
        if "verify_record" in hv:
            registered = hv["verify_record"]
        elif "verify_result" in hv:
            # Registered by a playbook of yours under the record's name before 0.3.0 (until 0.4.0).
            registered = hv["verify_result"]
        elif hostvars is not None and name in _node_records(hostvars, hv.get("pve_node")):
            registered = _node_records(hostvars, hv.get("pve_node"))[name]
        elif unread:
            out.append(_record.unread(name, hv.get("pve_node"), hv.get("ansible_pct_vmid")))
            continue
        else:
            continue  # not read in this run (--limit, or a later batch never ran)
        if not isinstance(registered, Mapping):
            registered = {}
        out.append(_record.of_host(name, registered, hv.get("pve_node"), hv.get("ansible_pct_vmid")))
    return out


def _node_records(hostvars, node):
    """The records a node kept of the containers it read (roles/verify/tasks/read_nodes.yml), or {}."""
    if not node or node not in hostvars:
        return {}
    kept = hostvars[node].get("verify_records")
    return kept if isinstance(kept, Mapping) else {}


def fleet_summary(records):
    """One line per record (verify_verdict's line) and the count of those ready."""
    if not isinstance(records, (list, tuple)):
        raise AnsibleFilterError("fleet_summary: expects a list of records (fleet_records), got %s" % type(records).__name__)
    lines = [verify_verdict(r)["line"] for r in records]
    not_ready = [r["host"] for r in records if not r.get("ready")]
    lines.append("%d of %d ready; not ready: %s" % (len(records) - len(not_ready), len(records), ", ".join(not_ready) or "none"))
    return lines


def fleet_unreached(plan, hostvars):
    """The hosts of a run (its fleet plan, read) whose node the read could not reach, for
    node_reached to count unreachable: read by node, each such node and its containers; read by
    container, each container whose node's read (its own, or its node's reader's) was unreachable.
    [] in a run where every node answered: no task for anyone."""
    if not isinstance(plan, Mapping) or "containers" not in plan:
        raise AnsibleFilterError("fleet_unreached: expects the fleet plan (gpufleet_plan)")
    out = []
    if plan.get("by") == "node":
        for node, containers in (plan.get("by_node") or {}).items():
            if node in hostvars and _node_read.unreachable(hostvars[node].get(_node_read.READ_FACT)):
                out += [node] + list(containers)
        return out
    seen = {}  # container: (its read, its group)
    down = set()
    for name in plan["containers"]:
        if name not in hostvars:
            continue
        hv = hostvars[name]
        read, group = hv.get(_node_read.READ_FACT), _node_read.group_of(hv)
        seen[name] = group
        if _node_read.unreachable(read):
            down.add(group)
    return [name for name, group in seen.items() if group is not None and group in down]


class FilterModule(object):
    def filters(self):
        return {"fleet_read_plan": fleet_read_plan, "fleet_records": fleet_records, "fleet_summary": fleet_summary,
                "fleet_unreached": fleet_unreached}
