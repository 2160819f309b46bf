#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_reached
short_description: End the run of a host whose Proxmox VE node the read could not reach, as unreachable
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - The C(gpufleet.hygiene.verify) role's read goes on past a node it cannot reach, so that each of the node's
    containers gets its record, its summary line and its report row by name (its node read ignores unreachable).
    Run right after that read, this action gives each host the state the read found - V(unreachable), with the
    read's message - so that the recap counts it C(unreachable), the exit status says so and no later task or play
    tries it. A host read through a node that answered (or not read by a node in this run) is skipped, unchanged.
  - Which read is this host's - its own node read (a node that read its containers, or the container that read for
    its node), else that of the host of the play's batch that read for the same node (the group the read made), else
    its C(pve_node)'s when that node read it (the playbooks reading by node).
  - An action that runs on the controller; it opens no connection and runs nothing on the host or its node.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.INFO_MODULE
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.hygiene.attributes.CONTROLLER_ACTION
options:
  read:
    description:
      - The node read's registered result (M(gpufleet.hygiene.node_readiness)) to judge, instead of the one the
        verify role registered for this host.
    type: dict
notes:
  - Ansible does not count an unreachable host against C(max_fail_percentage); a batch whose every host is failed or
    unreachable still ends the run (docs/reliability.md).
seealso:
  - module: gpufleet.hygiene.node_readiness
"""

EXAMPLES = r"""
- name: Read the state
  ansible.builtin.import_role:
    name: gpufleet.hygiene.verify
    tasks_from: read

- name: A container whose node could not be reached is unreachable, not failed
  gpufleet.hygiene.node_reached:
"""

RETURN = r"""
unreachable:
  description: The read could not reach this host's node.
  returned: when it could not
  type: bool
  sample: true
msg:
  description: The read's message when its node could not be reached, naming who read it; else how it was read.
  returned: always
  type: str
  sample: "train-201 was not read: its node could not be reached (read by train-200): gpufleet.hygiene.pct: node root@pve2:22 is unreachable: ..."
"""
