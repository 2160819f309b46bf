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

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._node_read import node_read

ARGUMENT_SPEC = dict(read=dict(type="dict"))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # The read's result is all it needs: the host (and its node) is never contacted again.
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, p = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = task_vars.get("inventory_hostname")
        read, by = (p["read"], None) if p["read"] is not None else node_read(
            host, task_vars, task_vars.get("hostvars") or {}, task_vars.get("ansible_play_batch"), task_vars.get("groups"))
        result["changed"] = False
        if not read.get("unreachable"):
            # Nothing to count: skipped, so that a play of the unreachable and the failed together
            # (preflight's and hygiene's last) shows no extra ok for the others.
            result.update(skipped=True, msg="read through its node" if read else "no node read of this host in this run")
            return result
        said = read.get("msg") or "no message"
        kept = task_vars.get("verify_records")
        if by == host and isinstance(kept, Mapping):
            # A node that read its containers itself (the play's hosts are the nodes).
            msg = "%s could not be reached to read its containers (%s): %s" % (host, ", ".join(sorted(kept)), said)
        else:
            msg = "%s was not read: its node could not be reached%s: %s" % (
                host, "" if by in (None, host) else " (read by %s)" % by, said)
        result.update(unreachable=True, msg=msg)
        return result
