#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: host_lock
short_description: Take or give back a per-host lock so two runs never act on one container at once
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Creates a lock file atomically (C(O_EXCL)) holding the owner (the id of the run), the time it
    was taken and when it expires. A run that died leaves a lock that expires after O(ttl) instead
    of one that blocks the host forever.
  - The roles of this collection take it before they change anything on a host and give it back
    at the end, in an C(always) section.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the lock would be taken or given back; writes nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
    details:
      - Taking a lock the same owner holds, or giving back a lock that is gone, changes nothing.
options:
  path:
    description: The lock file. Its directory must exist.
    type: path
    default: /run/gpufleet-hygiene.lock
  owner:
    description: Who takes the lock, normally the id of the run (the playbooks set one per run).
    type: str
    required: true
  state:
    description: V(present) takes the lock (waiting up to O(timeout)); V(absent) gives it back.
    type: str
    choices: [present, absent]
    default: present
  ttl:
    description: Seconds after which the lock counts as abandoned and another run may take it.
    type: int
    default: 3600
  timeout:
    description: Seconds to wait for another owner to give the lock back before failing (0 or more).
    type: int
    default: 0
  force:
    description: With O(state=absent), remove the lock even when another owner holds it.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Take this container's lock for the run
  gpufleet.hygiene.host_lock:
    owner: "{{ gpufleet_run_id }}"
    timeout: 60

- name: Give it back
  gpufleet.hygiene.host_lock:
    owner: "{{ gpufleet_run_id }}"
    state: absent
"""

RETURN = r"""
owner:
  description: Who holds the lock after the call (V(null) once given back).
  returned: always
  type: str
  sample: controller-1/4242/1764489600
taken:
  description: When the lock was taken, in seconds since the epoch.
  returned: when held
  type: float
expires:
  description: When the lock expires, in seconds since the epoch.
  returned: when held
  type: float
waited_for:
  description:
    - The owner of another run's lock that this call waited for before taking it, V(null) when the
      lock was free. That run may have changed the host meanwhile, so read its state again.
  returned: with O(state=present)
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._hostlock import acquire, bad_wait, read_lock, release


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", default="/run/gpufleet-hygiene.lock"),
            owner=dict(type="str", required=True),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            ttl=dict(type="int", default=3600),
            timeout=dict(type="int", default=0),
            force=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = bad_wait(p["timeout"])
    if problem:
        module.fail_json(msg=problem)
    try:
        if p["state"] == "present":
            before = read_lock(p["path"])
            changed, info, note = acquire(p["path"], p["owner"], p["ttl"], p["timeout"], module.check_mode)
            if note:
                module.warn(note)
            waited_for = None
            if changed and before is not None and not note and before.get("owner") != p["owner"]:
                waited_for = before.get("owner")
            module.exit_json(changed=changed, owner=info.get("owner"), taken=info.get("taken"), expires=info.get("expires"),
                             waited_for=waited_for)
        changed, note = release(p["path"], p["owner"], p["force"], module.check_mode)
        if note:
            module.warn(note)
        module.exit_json(changed=changed, owner=None)
    except GpufleetError as exc:
        fail(module, exc)


if __name__ == "__main__":
    main()
