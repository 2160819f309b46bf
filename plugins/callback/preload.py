# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: preload
type: aggregate
short_description: Loads the pct connection once, before ansible-core forks its workers
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - ansible-core runs every task of every host in a worker process forked from the controller's
    main process. It loads its own connection plugins before the first fork, but not a
    collection's, so every worker imports P(gpufleet.hygiene.pct#connection) again and parses its
    documentation for its options, once per host and task (the cost is measured in the
    collection's docs/benchmarks.md).
  - This callback loads the C(gpufleet.hygiene.pct) connection plugin in the main process when the
    playbook starts, so that every worker inherits it. It prints nothing and changes no result.
  - The P(gpufleet.hygiene.proxmox_lxc#inventory) inventory plugin does the same after discovery;
    this callback is for fleets described in a static inventory.
requirements:
  - enabled in C(ansible.cfg) - C(callbacks_enabled = gpufleet.hygiene.preload) - or with
    C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.hygiene.preload)
notes:
  - The ad-hoc C(ansible) command loads enabled callbacks only with C(ANSIBLE_LOAD_CALLBACK_PLUGINS=1).
  - A plugin that cannot be loaded here is left to the first task that uses it, which reports the
    error (at C(-vvv) this callback says why it did not load it).
"""

from ansible.plugins.callback import CallbackBase

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._preload import preload_connection


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.hygiene.preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_start(self, playbook):
        preload_connection()
