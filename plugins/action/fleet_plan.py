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

from collections import ChainMap
from collections.abc import Mapping

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.plugins.loader import lookup_loader

from ansible_collections.gpufleet.hygiene.plugins.filter.fleet import fleet_read_plan
from ansible_collections.gpufleet.hygiene.plugins.filter.proxmox import proxmox_hosts
from ansible_collections.gpufleet.hygiene.plugins.filter.run_checks import fleet_empty_selection, fleet_option_errors

ARGUMENT_SPEC = dict(
    hosts=dict(type="str", default="pve_containers"),
    # Checked by fleet_option_errors first, as gpufleet_read_by: named as the user set it.
    read_by=dict(type="str", default="auto"),
    allow_empty=dict(type="bool", default=False),
)


class _Accepted(Mapping):
    """hostvars as the plan sees them once community.proxmox's hosts are accepted: each accepted
    host's variables (``accept``: host -> the variables it is given) over its own, looked up lazily
    (nothing of a host is templated that the plan does not read)."""

    def __init__(self, hostvars, accept):
        self._hostvars = hostvars
        self._accept = accept

    def __getitem__(self, host):
        own = self._hostvars[host]
        return ChainMap(self._accept[host], own) if host in self._accept else own

    def __iter__(self):
        return iter(self._hostvars)

    def __len__(self):
        return len(self._hostvars)

    def __contains__(self, host):
        return host in self._hostvars


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
        # Hosts of community.proxmox's inventory that did not compose what the plays read: what
        # they are given (the next play sets it, a play only when there are any), and the plan
        # made as they will be.
        accept = proxmox_hosts(hostvars, (task_vars.get("groups") or {}).get("all") or [])
        given = dict((c["host"], dict((k, v) for k, v in c.items() if k != "host")) for c in accept["containers"] + accept["nodes"])
        errors = fleet_option_errors(hostvars, selected, limit=limit)
        if errors:
            result.update(failed=True, msg="configuration error, nothing was read or changed: " + "; ".join(errors))
            return result
        # A run that checked nothing must not pass: a CI gate would go green on an empty inventory.
        nothing = fleet_empty_selection(selected, limit=limit, pattern=p["hosts"], limit_text=limit_text,
                                        sources=task_vars.get("ansible_inventory_sources") or (),
                                        groups=task_vars.get("groups"))
        if nothing and not p["allow_empty"]:
            result.update(failed=True, msg=nothing)
            return result
        # The plan is the result itself: registered as gpufleet_plan, no task of its own keeps it.
        result.update(fleet_read_plan(selected, _Accepted(hostvars, given) if given else hostvars, limit=limit,
                                      limit_file=limit_file, read_by=p["read_by"]))
        result["accept"] = [dict(c) for c in accept["containers"] + accept["nodes"]]
        result["msg"] = "%d container(s), read by %s" % (len(result["containers"]), result["by"])
        return result
