# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Load this collection's connection plugin in the controller's main process.

ansible-core forks a worker for every host and task. Before the first fork it loads its own
connection plugins (and so defines their options), but not a collection's: each worker then
imports gpufleet.hygiene.pct again and parses its documentation for its options, a cost paid
per host and task (measured in docs/benchmarks.md). Loaded here once, before the forks, every
worker inherits it. Callers: the proxmox_lxc inventory plugin and the preload callback.
"""

from __future__ import annotations

from ansible.plugins.loader import action_loader, connection_loader
from ansible.utils.display import Display

CONNECTION = "gpufleet.hygiene.pct"
# The action every container's read runs: it imports the readers' module_utils (to validate their
# options and build their payload), which each forked worker would otherwise import again.
ACTIONS = ("gpufleet.hygiene.readiness",)

display = Display()


def _load(loader, name):
    try:
        return loader.get(name, class_only=True) is not None
    except Exception as exc:  # noqa: BLE001 - only a head start; the task's own load reports the error
        display.vvv("gpufleet.hygiene: %s not loaded ahead of the tasks: %s" % (name, exc))
        return False


def preload_connection(name=CONNECTION, actions=ACTIONS):
    """Load the connection plugin `name` (its class and its options) and the action plugins
    `actions`; True when the connection loaded. A plugin that does not load here is left to the
    first task that uses it, which says why."""
    loaded = _load(connection_loader, name)
    for action in actions:
        _load(action_loader, action)
    return loaded
