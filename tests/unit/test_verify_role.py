# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role asks readiness (read.yml) and node_readiness (node.yml, through
verify__readiness_args) for the same options, from the same variables, and records the same
host, node and VMID."""

from __future__ import annotations

import os
import re

import yaml

ROLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "roles", "verify"))


def load(*parts):
    with open(os.path.join(ROLE, *parts)) as f:
        return yaml.safe_load(f)


def test_readiness_and_node_readiness_get_the_same_options_from_the_same_variables():
    read = next(t for t in load("tasks", "read.yml") if "gpufleet.hygiene.readiness" in t)["gpufleet.hygiene.readiness"]
    node_args = load("vars", "main.yml")["verify__readiness_args"]
    # {'option': verify_var | filter ...} and combine({'option': verify_var ...} if ...)
    in_node = {m.group(1): m.group(2) for m in re.finditer(r"'(\w+)': (verify_\w+)", node_args)}
    in_read = {k: re.search(r"\{\{ (verify_\w+)", v).group(1) for k, v in read.items() if k != "record"}
    assert in_read == in_node
    assert len(in_read) == 24


def test_the_read_records_the_host_node_and_vmid_that_the_node_entry_point_records():
    read_task = next(t for t in load("tasks", "read.yml") if "gpufleet.hygiene.readiness" in t)
    assert read_task["register"] == "verify_result"
    whose = read_task["gpufleet.hygiene.readiness"]["record"]
    # The inventory's names: the node is pve_node, the container's id ansible_pct_vmid.
    assert whose == {"host": "{{ inventory_hostname }}", "node": "{{ pve_node | default(none) }}",
                     "vmid": "{{ ansible_pct_vmid | default(none) }}"}
    job = next(t for t in load("tasks", "node.yml") if "verify__node_job" in t.get("ansible.builtin.set_fact", {}))
    job = " ".join(job["ansible.builtin.set_fact"]["verify__node_job"].split())
    # The node entry point's filter takes the same three, in that order, as its label.
    label = ", ".join(whose[k].strip("{} ") for k in ("host", "node", "vmid"))
    assert "gpufleet.hygiene.verify_node_job( %s," % label in job, job


def playbook_reads_without_validation():
    """(playbook, entry point, the import_role's vars) of every verify role import with rolespec_validate: false."""
    found = []
    for name in ("preflight.yml", "remediate.yml", "hygiene.yml"):
        with open(os.path.join(ROLE, "..", "..", "playbooks", name)) as f:
            for play in yaml.safe_load(f):
                for task in play.get("tasks", []):
                    spec = task.get("ansible.builtin.import_role") or {}
                    if spec.get("name") == "gpufleet.hygiene.verify" and spec.get("rolespec_validate") is False:
                        found.append((name, spec.get("tasks_from", "main"), task.get("vars", {})))
    return found


def test_without_ansible_cores_validation_the_read_still_validates_every_variable():
    # The playbooks leave out ansible-core's validation task of the verify role (one task per host):
    # every variable of its main entry point must then reach the read, which validates it as a
    # readiness option, or be one of the two the role only uses itself, verify_fail and verify_show.
    read = next(t for t in load("tasks", "read.yml") if "gpufleet.hygiene.readiness" in t)["gpufleet.hygiene.readiness"]
    in_read = {re.search(r"\{\{ (verify_\w+)", v).group(1) for k, v in read.items() if k != "record"}
    specs = load("meta", "argument_specs.yml")["argument_specs"]
    spec = set(specs["main"]["options"])
    assert spec == in_read | {"verify_fail", "verify_show"}
    # The entry points the playbooks use: the read alone, the verdict alone.
    assert set(specs["read"]["options"]) == in_read and set(specs["fail"]["options"]) == {"verify_fail", "verify_show"}
    found = playbook_reads_without_validation()
    assert sorted((name, entry) for name, entry, _vars in found) == [
        ("hygiene.yml", "nodes"), ("hygiene.yml", "read"), ("preflight.yml", "fail"), ("preflight.yml", "nodes"),
        ("preflight.yml", "read"),
        ("remediate.yml", "read")]
    for name, entry, play_vars in found:
        assert set(play_vars) <= set(specs[entry]["options"]), (name, entry)
    # The other two are taken strictly by the verdict's filter (true or false, or an error naming them).
    [verdict] = load("tasks", "fail.yml")
    assert verdict["vars"]["verify__verdict"] == "{{ verify_result | gpufleet.hygiene.verify_verdict(verify_fail, verify_show) }}"
    assert "when" not in verdict  # a `when: verify_fail | bool` would take a wrong value for false
