# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_reached's action: a host whose node the read could not reach ends the run unreachable.

The verify role's read goes on past a node it cannot reach (its node_readiness task ignores
unreachable), so that each of that node's containers gets its record and summary line by name.
This task, right after the read, gives each of them the state the read found: unreachable, with
the read's message, counted in the recap and left out of the later tasks and plays. It opens no
connection: plugins/modules/node_reached.py holds the documentation only.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.plugins.action import ActionBase

ARGUMENT_SPEC = dict(read=dict(type="dict"))

# What the verify role registers its node read as, on the host that ran it.
READ_FACT = "verify__node_read"
JOB_FACT = "verify__node_job"


def _ran(read):
    return isinstance(read, Mapping) and bool(read) and not read.get("skipped")


def node_read(task_vars):
    """(the node read that read this host in this run, who ran it), ({}, None) when none did: the
    host's own (a node read by node, or the container that read for its node), else that of the
    first host of the batch reading for the same node (the group verify__node_job names), else its
    pve_node's when that node read it (read by node: the node keeps its record in verify_results)."""
    host = task_vars.get("inventory_hostname")
    own = task_vars.get(READ_FACT)
    if _ran(own):
        return own, host
    hostvars = task_vars.get("hostvars") or {}
    job = task_vars.get(JOB_FACT)
    group = job.get("group") if isinstance(job, Mapping) else None
    members = set((task_vars.get("groups") or {}).get(group) or ()) if group else set()
    for peer in task_vars.get("ansible_play_batch") or ():
        if peer != host and peer in members and peer in hostvars:
            read = hostvars[peer].get(READ_FACT)
            if _ran(read):
                return read, peer
    node = task_vars.get("pve_node")
    if node and node in hostvars:
        kept = hostvars[node].get("verify_results")
        if isinstance(kept, Mapping) and host in kept:
            read = hostvars[node].get(READ_FACT)
            if _ran(read):
                return read, node
    return {}, None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # The read's result is all it needs: the host (and its node) is never contacted again.
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, p = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        read, by = (p["read"], None) if p["read"] is not None else node_read(task_vars)
        result["changed"] = False
        if not read.get("unreachable"):
            result["msg"] = "read through its node" if read else "no node read of this host in this run"
            return result
        host = task_vars.get("inventory_hostname")
        said = read.get("msg") or "no message"
        kept = task_vars.get("verify_results")
        if by == host and isinstance(kept, Mapping):
            # A node that read its containers itself (the play's hosts are the nodes).
            msg = "%s could not be reached to read its containers (%s): %s" % (host, ", ".join(sorted(kept)), said)
        else:
            msg = "%s was not read: its node could not be reached%s: %s" % (
                host, "" if by in (None, host) else " (read by %s)" % by, said)
        result.update(unreachable=True, msg=msg)
        return result
