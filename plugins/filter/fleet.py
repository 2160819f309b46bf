# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The playbooks' fleet view: every host's record (fleet_records) and the one-line-per-host
summary (fleet_summary); docs: fleet_records.yml, fleet_summary.yml.

The playbooks find their hosts one way: the host pattern of their first play, resolved with
ansible.builtin.inventory_hostnames, then the hosts this run read (the ones with a
verify_result). The records come from module_utils.readiness._record, the builder the readiness
action and the verify role use.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.hygiene.plugins.filter.verify import verify_verdict
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _record


def fleet_records(hosts):
    """The record of every host this run read, from the hosts' variables (hostvars of each host):
    the verify role's verify_result, or, when its read failed before reading (a value refused, a
    template that failed), the record of a host not read, with the read's message."""
    out = []
    for hv in hosts:
        if not isinstance(hv, Mapping) or "inventory_hostname" not in hv:
            raise AnsibleFilterError("fleet_records: expects each host's variables (hosts | map('extract', hostvars))")
        if "verify_result" not in hv:
            continue  # not read in this run (--limit, or a later batch never ran)
        registered = hv["verify_result"]
        if not isinstance(registered, Mapping):
            registered = {}
        out.append(_record.of_host(hv["inventory_hostname"], registered, hv.get("pve_node"), hv.get("ansible_pct_vmid")))
    return out


def fleet_summary(records):
    """One line per record (verify_verdict's line) and the count of those ready."""
    if not isinstance(records, (list, tuple)):
        raise AnsibleFilterError("fleet_summary: expects a list of records (fleet_records), got %s" % type(records).__name__)
    lines = [verify_verdict(r)["line"] for r in records]
    not_ready = [r["host"] for r in records if not r.get("ready")]
    lines.append("%d of %d ready; not ready: %s" % (len(records) - len(not_ready), len(records), ", ".join(not_ready) or "none"))
    return lines


class FilterModule(object):
    def filters(self):
        return {"fleet_records": fleet_records, "fleet_summary": fleet_summary}
