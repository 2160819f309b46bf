# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_readiness's action: run the module on the container's Proxmox VE node.

Over the gpufleet.hygiene.pct connection the task's host is a container; this action switches
that connection to its node (run_on=node) for this one module run and back, and fills each
listed container's method, pct_path and lxc_path, when not given, from the connection's own
settings (ansible.cfg, environment, variables), so that the containers are entered as the
connection would enter them. Over any other connection the module runs on the host itself.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

PCT = "gpufleet.hygiene.pct"
FROM_CONNECTION = ("method", "pct_path", "lxc_path")


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        on_pct = getattr(self._connection, "transport", None) == PCT
        if on_pct and isinstance(args.get("containers"), list):
            args["containers"] = [self._with_connection_settings(c) for c in args["containers"]]
        if on_pct:
            self._connection.set_option("run_on", "node")
        try:
            result.update(self._execute_module(module_name="gpufleet.hygiene.node_readiness", module_args=args, task_vars=task_vars))
        finally:
            if on_pct:
                self._connection.set_option("run_on", "container")
        return result

    def _with_connection_settings(self, entry):
        if not isinstance(entry, dict):
            return entry  # the module says what is wrong with it
        entry = dict(entry)
        for name in FROM_CONNECTION:
            if entry.get(name) is None:
                value = self._connection.get_option(name)
                if value is not None:
                    entry[name] = value
        return entry
