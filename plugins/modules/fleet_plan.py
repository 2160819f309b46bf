#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_plan
short_description: Check a run's options and selection, and plan how it reads its containers
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - What C(playbooks/plan.yml) runs once, on localhost, before any host is read. First the run's checks - every
    C(gpufleet_*) option of the run and of each selected container against the range and type of the code that
    takes it (P(gpufleet.hygiene.fleet_option_errors#filter)), then that the host pattern and the C(--limit) select
    a container at all (P(gpufleet.hygiene.fleet_empty_selection#filter)). Either failure fails this task with a
    configuration error that names what to change; nothing was read or changed.
  - Then the fleet plan (P(gpufleet.hygiene.fleet_read_plan#filter)) - which containers the run reads, and whether
    the read's play has the containers or their Proxmox VE nodes as its hosts - as the result itself (RV(by),
    RV(containers), RV(by_node), RV(container_hosts), RV(node_hosts)), which the playbooks register as
    C(gpufleet_plan) on localhost.
  - A run over LXC guests of community.proxmox's C(proxmox) inventory (C(proxmox_vmid), C(proxmox_node)) that no
    inventory source gave what the plays read (C(pve_node), C(ansible_pct_vmid), C(ansible_pct_node_host)) fails
    here too, naming them and the source to add after that inventory -
    P(gpufleet.hygiene.proxmox_lxc#inventory) with O(gpufleet.hygiene.proxmox_lxc#inventory:source=inventory)
    (docs/fleet.md). Only the run's containers (the pattern within C(--limit)) count; a run that selects nothing
    names such guests beside the empty selection.
  - The host pattern and the run's C(--limit) are resolved as P(ansible.builtin.inventory_hostnames#lookup) resolves
    them; a C(--limit) from a file (C(@retry)) is not resolved (read by container, every host named).
  - An action that runs on the controller; it opens no connection and runs nothing on any host.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.INFO_MODULE
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.hygiene.attributes.CONTROLLER_ACTION
options:
  hosts:
    description: The containers' host pattern (C(gpufleet_hosts)).
    type: str
    default: pve_containers
  read_by:
    description:
      - V(auto), V(node) or V(container) (C(gpufleet_read_by)); checked with the run's options, so that a wrong value
        is named as the variable the user set.
    type: str
    default: auto
  allow_empty:
    description:
      - Pass a run whose pattern and C(--limit) select no container (C(gpufleet_allow_empty_selection)), as a slice of
        a sliced run may; the plan then holds no container.
    type: bool
    default: false
seealso:
  - module: gpufleet.hygiene.node_readiness
  - plugin: gpufleet.hygiene.fleet_read_plan
    plugin_type: filter
  - plugin: gpufleet.hygiene.fleet_option_errors
    plugin_type: filter
  - plugin: gpufleet.hygiene.proxmox_lxc
    plugin_type: inventory
"""

EXAMPLES = r"""
- name: Check the run and plan the read
  gpufleet.hygiene.fleet_plan:
    hosts: "{{ gpufleet_hosts | default('pve_containers') }}"
    read_by: "{{ gpufleet_read_by | default('auto') }}"
  register: gpufleet_plan

- name: The hosts of the read's play by node
  ansible.builtin.debug:
    var: gpufleet_plan.node_hosts
"""

RETURN = r"""
by:
  description: V(node) (the read's play has the nodes as its hosts) or V(container).
  returned: success
  type: str
  sample: node
containers:
  description: The containers this run reads (the host pattern within C(--limit)).
  returned: success
  type: list
  elements: str
  sample: [train-100, train-101]
by_node:
  description: Read by node, each node's containers; else empty.
  returned: success
  type: dict
  sample: {pve1: [train-100, train-101]}
container_hosts:
  description: The hosts of the read's play by container (the containers), or none.
  returned: success
  type: list
  elements: str
  sample: []
node_hosts:
  description: The hosts of the read's play by node (the nodes), or none.
  returned: success
  type: list
  elements: str
  sample: [pve1]
msg:
  description: How many containers the run reads, and how; or, on failure, what is wrong and what to change.
  returned: always
  type: str
  sample: "2 container(s), read by node"
"""
