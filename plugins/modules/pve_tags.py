#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_tags
short_description: Add and remove tags of a Proxmox VE container, keeping its other tags
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Runs on the Proxmox VE node the container lives on. Reads the container's tags (the C(tags) key of
    C(pct config <vmid>), a C(;)-separated list), adds O(add), removes O(remove) and writes the list back
    with C(pct set <vmid> --tags) only when the set of tags changes. Every other tag of the container is kept.
  - Tags are compared and written as Proxmox VE keeps them by default - lower-cased, sorted, once each - so
    that the web UI shows the same list the next run reads.
  - The playbooks use it to show a hygiene or preflight verdict in the Proxmox VE web UI
    (C(gpufleet-ok), C(gpufleet-dirty), C(gpufleet-unhealthy)) when C(gpufleet_pve_tags) is true.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports the tags the container would get; runs no C(pct set).
  diff_mode:
    support: full
    details:
      - The container's C(tags) line before and after.
  idempotent:
    support: full
    details:
      - A container that already has the tags (and none of O(remove)) is not written to.
options:
  vmid:
    description: The container's Proxmox VE ID.
    type: int
    required: true
  add:
    description: Tags the container must have (Proxmox VE's tag format, letters, digits, C(_), C(-), C(+), C(.)).
    type: list
    elements: str
    default: []
  remove:
    description: Tags the container must not have. A tag in both O(add) and O(remove) is refused.
    type: list
    elements: str
    default: []
  pct_path:
    description: Name or path of C(pct) on the node.
    type: str
    default: pct
notes:
  - Needs C(VM.Config.Options) on the container (root on the node has it); Proxmox VE may limit which tags a
    user may set (datacenter C(user-tag-access)), and C(pct set)'s error says so.
seealso:
  - plugin: gpufleet.hygiene.pct
    plugin_type: connection
"""

EXAMPLES = r"""
- name: Show the verdict in the Proxmox VE web UI
  gpufleet.hygiene.pve_tags:
    vmid: 101
    add: [gpufleet-ok]
    remove: [gpufleet-dirty, gpufleet-unhealthy]
  delegate_to: pve1
"""

RETURN = r"""
tags:
  description: The container's tags after the run (in check mode, what they would be).
  returned: always
  type: list
  elements: str
  sample: [gpufleet-ok, team-a]
previous:
  description: The container's tags before the run, as its config lists them.
  returned: always
  type: list
  elements: str
  sample: [gpufleet-dirty, team-a]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct, _tags


def main():
    module = AnsibleModule(
        argument_spec={
            "vmid": {"type": "int", "required": True},
            "add": {"type": "list", "elements": "str", "default": []},
            "remove": {"type": "list", "elements": "str", "default": []},
            "pct_path": {"type": "str", "default": "pct"},
        },
        supports_check_mode=True,
    )
    p = module.params
    vmid = _pct.parse_vmid(p["vmid"])
    if vmid is None:
        module.fail_json(msg=_pct.bad_vmid("vmid", p["vmid"]))
    wrong = _tags.bad(p["add"] + p["remove"])
    if wrong is not None:
        module.fail_json(msg="not a Proxmox VE tag: %r (letters, digits, _, -, + and . only, not starting with - + or .)" % wrong)
    both = {t.lower() for t in p["add"]} & {t.lower() for t in p["remove"]}
    if both:
        module.fail_json(msg="tags both to add and to remove: %s" % ", ".join(sorted(both)))

    rc, out, err = module.run_command(_pct.config_argv(vmid, p["pct_path"]))
    if rc != 0:
        module.fail_json(msg="pct config %d failed (rc=%d): %s" % (vmid, rc, err.strip() or out.strip()))
    previous = _tags.split(_pct.parse_config(out).get("tags", ""))
    after = _tags.merged(previous, p["add"], p["remove"])
    changed = after != _tags.normalize(previous)
    result = {"changed": changed, "tags": after, "previous": previous}
    if module._diff:
        result["diff"] = {"before": "tags: %s\n" % ";".join(previous), "after": "tags: %s\n" % ";".join(after),
                          "before_header": "pct config %d" % vmid, "after_header": "pct config %d" % vmid}
    if changed and not module.check_mode:
        rc, out, err = module.run_command(_tags.set_argv(vmid, after, p["pct_path"]))
        if rc != 0:
            module.fail_json(msg="pct set %d --tags failed (rc=%d): %s" % (vmid, rc, err.strip() or out.strip()), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
