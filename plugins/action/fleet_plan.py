# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_plan's action: the run's checks and the fleet plan, in one task on the controller.

What plan.yml used to do in three tasks (the options, the empty selection, the plan), each a
worker process of its own: the host pattern and the --limit resolved as
ansible.builtin.inventory_hostnames resolves them, then the same filters' code
(fleet_option_errors, fleet_empty_selection, fleet_read_plan). It opens no connection:
plugins/modules/fleet_plan.py holds the documentation only.
"""

from __future__ import annotations

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import lookup_loader

from ansible_collections.gpufleet.hygiene.plugins.filter.fleet import fleet_read_plan
from ansible_collections.gpufleet.hygiene.plugins.filter.run_checks import fleet_empty_selection, fleet_option_errors
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._community_proxmox import AdoptError, adopt

ARGUMENT_SPEC = dict(
    hosts=dict(type="str", default="pve_containers"),
    # Checked by fleet_option_errors first, as gpufleet_read_by: named as the user set it.
    read_by=dict(type="str", default="auto"),
    allow_empty=dict(type="bool", default=False),
)


# Where a run names guests of community.proxmox's inventory that no source adopted, the fix.
ADOPT = ("add the gpufleet.hygiene.proxmox_lxc inventory with source: inventory after that inventory (a later -i, or "
         "a later file of its directory): inventory/example-community-proxmox.gpufleet.proxmox_lxc.yml, docs/fleet.md; "
         "where it is there already, it failed to parse: its warning above says why")


def unadopted(hostvars, hosts):
    """What is wrong when some of ``hosts`` are LXC guests of community.proxmox's inventory without
    what the plays read (the proxmox_lxc inventory's source: inventory gives it), or None."""
    try:
        missing = [c["host"] for c in adopt(hostvars, hosts)["containers"]]
    except AdoptError as exc:
        return "%s; %s" % (exc, ADOPT)
    if not missing:
        return None
    named = ", ".join(missing[:5]) + (" and %d more" % (len(missing) - 5) if len(missing) > 5 else "")
    return ("%s: LXC guest(s) of community.proxmox's inventory (proxmox_vmid, proxmox_node) without the variables the "
            "plays read (pve_node, ansible_pct_vmid, ansible_pct_node_host); %s" % (named, ADOPT))


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def _hostnames(self, pattern, task_vars):
        lookup = lookup_loader.get("ansible.builtin.inventory_hostnames", loader=self._loader, templar=self._templar)
        return list(lookup.run([pattern], variables=task_vars))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        _validation, p = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        hostvars = task_vars.get("hostvars") or {}
        limit_text = task_vars.get("ansible_limit") or ""
        limit_file = limit_text.startswith("@")
        try:
            selected = self._hostnames(p["hosts"], task_vars)
            # A --limit from a file (@retry) is not resolved: read by container, every host named.
            limit = self._hostnames(limit_text, task_vars) if limit_text and not limit_file else None
        except AnsibleError as exc:
            raise AnsibleError("the host pattern gpufleet_hosts=%s or --limit %s cannot be resolved: %s"
                               % (p["hosts"], limit_text or "(none)", exc.message)) from exc
        result["changed"] = False
        # Guests of community.proxmox's inventory are read once an inventory source has given them
        # what the plays read; a run over any that none did stops here, saying which source to add.
        chosen = [h for h in selected if limit is None or h in limit]
        adopting = unadopted(hostvars, chosen)
        if adopting:
            result.update(failed=True, msg="configuration error, nothing was read or changed: " + adopting)
            return result
        errors = fleet_option_errors(hostvars, selected, limit=limit)
        if errors:
            result.update(failed=True, msg="configuration error, nothing was read or changed: " + "; ".join(errors))
            return result
        # A run that checked nothing must not pass: a CI gate would go green on an empty inventory.
        nothing = fleet_empty_selection(selected, limit=limit, pattern=p["hosts"], limit_text=limit_text,
                                        sources=task_vars.get("ansible_inventory_sources") or (),
                                        groups=task_vars.get("groups"))
        if nothing and not p["allow_empty"]:
            # No pve_containers without the source that adopts community.proxmox's guests: say so too.
            adopting = unadopted(hostvars, (task_vars.get("groups") or {}).get("all") or [])
            result.update(failed=True, msg=nothing + ("; and " + adopting if adopting else ""))
            return result
        # The plan is the result itself: registered as gpufleet_plan, no task of its own keeps it.
        result.update(fleet_read_plan(selected, hostvars, limit=limit, limit_file=limit_file, read_by=p["read_by"]))
        result["msg"] = "%d container(s), read by %s" % (len(result["containers"]), result["by"])
        return result
