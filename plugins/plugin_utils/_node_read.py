# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which node read read a host in this run, and whether it reached the node.

The verify role's read registers its node_readiness run as verify__node_read on the host that ran
it: a node that read its containers (the playbooks reading by node), or the first container of
its node in the batch, which read for all of them (verify__node_job names their group). The read
goes on past a node it cannot reach (ignore_unreachable) so that every container is recorded by
name; the node_reached action and the fleet_unreached filter find that state here afterwards.
Callers: plugins/action/node_reached.py, plugins/filter/fleet.py.
"""

from __future__ import annotations

from collections.abc import Mapping

READ_FACT = "verify__node_read"
JOB_FACT = "verify__node_job"


def ran(read):
    """A node read that ran (not the skipped task of a host that did not read)."""
    return isinstance(read, Mapping) and bool(read) and not read.get("skipped")


def unreachable(read):
    return ran(read) and bool(read.get("unreachable"))


def group_of(hv):
    job = hv.get(JOB_FACT)
    return job.get("group") if isinstance(job, Mapping) else None


def node_read(host, hv, hostvars, batch=(), groups=None):
    """(the node read that read ``host`` in this run, who ran it), ({}, None) when none did: the
    host's own (``hv``: its variables), else that of the first host of ``batch`` reading for the
    same node (the group of verify__node_job), else its pve_node's when that node read it (the node
    keeps its record in verify_records)."""
    own = hv.get(READ_FACT)
    if ran(own):
        return own, host
    group = group_of(hv)
    members = set((groups or {}).get(group) or ()) if group else set()
    for peer in batch or ():
        if peer != host and peer in members and peer in hostvars:
            read = hostvars[peer].get(READ_FACT)
            if ran(read):
                return read, peer
    node = hv.get("pve_node")
    if node and node in hostvars:
        kept = hostvars[node].get("verify_records")
        if isinstance(kept, Mapping) and host in kept:
            read = hostvars[node].get(READ_FACT)
            if ran(read):
                return read, node
    return {}, None
