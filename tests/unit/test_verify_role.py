# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role's read gives node_readiness (read.yml, through verify__readiness_args) every
readiness option its variables set, records the host, node and VMID, and every variable of its
entry points reaches something that validates it."""

from __future__ import annotations

import os
import re

import yaml

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import ARGUMENT_SPEC

ROLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "roles", "verify"))


def load(*parts):
    with open(os.path.join(ROLE, *parts)) as f:
        return yaml.safe_load(f)


NODE_VARS = {"verify_node_python", "verify_container_python", "verify_node_parallel", "verify_node_timeout"}
# Only a play whose hosts are the nodes gives these (read_nodes.yml).
NODE_PLAY_VARS = {"verify_node_containers", "verify_node_overrides"}


def readiness_vars():
    """{readiness option: the role variable} of verify__readiness_args."""
    node_args = load("vars", "main.yml")["verify__readiness_args"]
    # {'option': verify_var | filter ...} and combine({'option': verify_var ...} if ...)
    return {m.group(1): m.group(2) for m in re.finditer(r"'(\w+)': (verify_\w+)", node_args)}


def test_the_read_gives_every_readiness_option_of_the_roles_variables():
    # Every readiness option but two the read sets itself: the evidence cache (the node read writes
    # nothing in a container) and the read's own time bound (container_timeout, verify_node_timeout).
    assert set(readiness_vars()) == set(ARGUMENT_SPEC) - {"evidence_cache", "read_timeout"}
    read = next(t for t in load("tasks", "read_host.yml") if "gpufleet.hygiene.node_readiness" in t)
    assert read["register"] == "verify__node_read"
    assert read["gpufleet.hygiene.node_readiness"]["containers"] == (
        "{{ verify__peers | map('extract', hostvars, ['verify__node_job', 'entry']) | list }}")
    # Read from the node by default: nothing of a container runs.
    assert read["gpufleet.hygiene.node_readiness"]["read_from"] == "{{ gpufleet_node_read | default('node') }}"


def test_the_read_records_the_host_node_and_vmid():
    job = next(t for t in load("tasks", "read_host.yml") if "verify__node_job" in t.get("ansible.builtin.set_fact", {}))
    job = " ".join(job["ansible.builtin.set_fact"]["verify__node_job"].split())
    # The inventory's names: the node is pve_node, the container's id ansible_pct_vmid.
    assert "gpufleet.hygiene.verify_node_job( inventory_hostname, pve_node | default(none), ansible_pct_vmid | default(none)," in job, job
    record = next(t for t in load("tasks", "read_host.yml") if "verify_record" in t.get("ansible.builtin.set_fact", {}))
    assert "verify_record(inventory_hostname, verify__node_job.label.node, verify__node_job.label.vmid" in " ".join(
        record["ansible.builtin.set_fact"]["verify_record"].split())


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
    in_read = set(readiness_vars().values()) | NODE_VARS
    specs = load("meta", "argument_specs.yml")["argument_specs"]
    spec = set(specs["main"]["options"])
    assert spec == in_read | NODE_PLAY_VARS | {"verify_fail", "verify_show"}
    # The entry points the playbooks use: the read alone, the verdict alone; no other.
    # read_host and read_nodes: the read's two files, which the playbooks import directly (they know
    # their plays' hosts), with the read's options. note: the repair role's one way to change a
    # record (tests/unit/test_repair_role.py), its one option a dict that role writes.
    assert set(specs) == {"main", "read", "read_host", "read_nodes", "fail", "note"}
    assert set(specs["note"]["options"]) == {"verify_note"}
    assert set(specs["read"]["options"]) == in_read | NODE_PLAY_VARS and set(specs["fail"]["options"]) == {"verify_fail", "verify_show"}
    assert specs["read_host"]["options"] == specs["read_nodes"]["options"] == specs["read"]["options"]
    found = playbook_reads_without_validation()
    assert sorted((name, entry) for name, entry, _vars in found) == [
        ("hygiene.yml", "read_host"), ("hygiene.yml", "read_nodes"), ("preflight.yml", "fail"), ("preflight.yml", "read_host"),
        ("preflight.yml", "read_nodes"),
        ("remediate.yml", "read_host")]
    for name, entry, play_vars in found:
        assert set(play_vars) <= set(specs[entry]["options"]), (name, entry)
    # The other two are taken strictly by the verdict's filter (true or false, or an error naming them).
    [verdict] = load("tasks", "fail.yml")
    assert verdict["vars"]["verify__verdict"] == "{{ verify_record | gpufleet.hygiene.verify_verdict(verify_fail, verify_show) }}"
    assert "when" not in verdict  # a `when: verify_fail | bool` would take a wrong value for false


def test_the_read_is_one_include_whose_file_each_host_chooses():
    """A node given containers reads them (read_nodes.yml), any other host itself (read_host.yml):
    one task either way, so neither kind of host runs (or skips) the other's tasks."""
    [include] = load("tasks", "read.yml")
    assert include["ansible.builtin.include_tasks"] == (
        "{{ 'read_nodes.yml' if verify_node_containers | default(none) is not none else 'read_host.yml' }}")
    assert "when" not in include
    main = load("tasks", "main.yml")
    assert [t.get("ansible.builtin.import_tasks") for t in main] == ["read.yml", "fail.yml"]
