# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_readiness's action: run the module on the container's Proxmox VE node.

Over the gpufleet.hygiene.pct connection the task's host is a container; this action switches
that connection to its node (run_on=node) for this one module run and back, and fills each
listed container's method, pct_path and lxc_path, when not given, from the connection's own
settings (ansible.cfg, environment, variables), so that the containers are entered as the
connection would enter them. Over any other connection the module runs on the host itself (a
node that is the play's host, the verify role's read, given verify_node_containers), and those of a container
with a vmid left out are the pct connection's settings from ansible.cfg and the environment
(the filter that lists the containers gives their own variables).
"""

from __future__ import annotations

from ansible import constants as C
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import connection_loader

PCT = "gpufleet.hygiene.pct"
FROM_CONNECTION = ("method", "pct_path", "lxc_path")


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        on_pct = getattr(self._connection, "transport", None) == PCT
        if isinstance(args.get("containers"), list):
            setting = self._connection.get_option if on_pct else self._pct_settings().get
            args["containers"] = [self._with_settings(c, setting, on_pct) for c in args["containers"]]
        if on_pct:
            self._connection.set_option("run_on", "node")
        try:
            result.update(self._execute_module(module_name="gpufleet.hygiene.node_readiness", module_args=args, task_vars=task_vars))
        finally:
            if on_pct:
                self._connection.set_option("run_on", "container")
        return result

    @staticmethod
    def _pct_settings():
        plugin = connection_loader.get(PCT, class_only=True)
        return {name: C.config.get_config_value(name, plugin_type="connection", plugin_name=plugin._load_name, variables={})
                for name in FROM_CONNECTION}

    @staticmethod
    def _with_settings(entry, setting, on_pct):
        if not isinstance(entry, dict) or not (on_pct or entry.get("vmid") is not None):
            return entry  # the module says what is wrong with it; a host read where the module runs
        entry = dict(entry)
        for name in FROM_CONNECTION:
            if entry.get(name) is None:
                value = setting(name)
                if value is not None:
                    entry[name] = value
        return entry
