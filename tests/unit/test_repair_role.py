# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The repair role holds the one repair sequence; remediate.yml and hygiene.yml call it and differ
only in policy (the role's variables they set)."""

from __future__ import annotations

import os
import re

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLE = os.path.join(REPO, "roles", "repair")


def load(*parts):
    with open(os.path.join(*parts)) as f:
        return yaml.safe_load(f)


def first_play(name):
    """The first play on the containers (hygiene's first play, on localhost, only chooses how to read)."""
    return next(play for play in load(REPO, "playbooks", name) if play.get("hosts", "localhost") != "localhost")


def test_every_variable_is_typed_described_and_defaulted():
    options = load(ROLE, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    defaults = load(ROLE, "defaults", "main.yml")
    assert set(options) == set(defaults) and all(name.startswith("repair_") for name in options)
    for name, spec in options.items():
        assert spec.get("type") and spec.get("description"), name
        value = defaults[name]
        fallback = re.fullmatch(r"\{\{ (gpufleet_\w+) \| default\((.*)\) \}\}", value) if isinstance(value, str) else None
        if fallback and spec["type"] != "str":
            # A typed option's documented default is the literal its inventory variable falls back
            # to (the docs' schema takes no Jinja there), and its description names that variable.
            assert spec.get("default") == yaml.safe_load(fallback.group(2)), name
            assert "C(%s)" % fallback.group(1) in " ".join(spec["description"]), name
        else:
            assert spec.get("default") == value, name


def test_the_sequence_is_written_once():
    assert not os.path.exists(os.path.join(REPO, "playbooks", "tasks", "remediate_repair.yml"))
    for name in ("remediate.yml", "hygiene.yml"):
        with open(os.path.join(REPO, "playbooks", name)) as f:
            text = f.read()
        # The steps are the role's: no playbook takes a lock or calls kill, purge or relaunch itself.
        for step in ("host_lock", "gpufleet.hygiene.kill", "gpufleet.hygiene.purge", "gpufleet.hygiene.relaunch"):
            assert step not in text, (name, step)
        [repair] = [t for t in first_play(name)["tasks"] if "ansible.builtin.include_role" in t]
        assert repair["ansible.builtin.include_role"] == {"name": "gpufleet.hygiene.repair"}
        assert "not verify_record.ready" in repair["when"]
    main = load(ROLE, "tasks", "main.yml")
    assert all(set(t) <= {"name", "ansible.builtin.include_tasks", "when", "tags"} for t in main)  # a dispatcher
    # Its two includes run whatever --tags chooses: the steps inside carry their own tags.
    assert all(t["tags"] == ["always"] for t in main)


def test_remediate_and_hygiene_differ_only_in_policy():
    options = set(load(ROLE, "meta", "argument_specs.yml")["argument_specs"]["main"]["options"])
    remediate, hygiene = first_play("remediate.yml"), first_play("hygiene.yml")
    policy = {"repair_allow_running_job", "repair_stalled", "repair_leftovers", "repair_relaunch", "repair_unreadable_gpus",
              "repair_fail_unrepaired", "repair_fail_on_error", "repair_run_name", "repair_keep_healthy_job"}
    assert set(remediate["vars"]) == set(hygiene["vars"]) == policy and policy <= options
    # Hygiene never touches a running job, fails no host for a fault it only reports, relaunches nothing.
    assert hygiene["vars"]["repair_allow_running_job"] is True and hygiene["vars"]["repair_relaunch"] is False
    assert hygiene["vars"]["repair_unreadable_gpus"] == "report" and hygiene["vars"]["repair_fail_unrepaired"] is False
    # Remediate stops a job holding the GPUs unless asked not to, and relaunches the inventory's job.
    assert remediate["vars"]["repair_unreadable_gpus"] == "fail" and remediate["vars"]["repair_fail_unrepaired"] is True
    # A failed repair: remediate fails the host at once (its batches' canary counts it), hygiene records it and
    # fails it after the report.
    assert remediate["vars"]["repair_fail_on_error"] is True and hygiene["vars"]["repair_fail_on_error"] is False
    assert "gpufleet_allow_running_job" in remediate["vars"]["repair_allow_running_job"]
    assert "gpufleet_job.command" in remediate["vars"]["repair_relaunch"]
    # A stalled job is stopped only when the inventory asks, the same way in both.
    assert remediate["vars"]["repair_stalled"] == hygiene["vars"]["repair_stalled"]
    assert "gpufleet_repair_stalled" in remediate["vars"]["repair_stalled"]
    # Leftovers beside a running job: remediate stops them, hygiene reports them.
    assert (remediate["vars"]["repair_leftovers"], hygiene["vars"]["repair_leftovers"]) == ("always", "repaired")
    # Remediate's desired state is the inventory's job running on a clean environment: a healthy job
    # is kept, as hygiene keeps every running job.
    assert remediate["vars"]["repair_keep_healthy_job"] is True and hygiene["vars"]["repair_keep_healthy_job"] is True
    # The read is made with the policy's own value: the job's own GPU use is no fault where it is kept.
    for play in (remediate, hygiene):
        read = play["tasks"][0]
        assert read["vars"] == {"verify_allow_running_job": "{{ repair_allow_running_job or repair_keep_healthy_job }}"}


def test_the_lock_is_given_back_whatever_happens():
    [block] = load(ROLE, "tasks", "repair.yml")
    assert block["block"][0]["gpufleet.hygiene.host_lock"]["owner"] == "{{ repair_lock_owner }}"
    [release] = block["always"]
    assert release["gpufleet.hygiene.host_lock"]["state"] == "absent" and release["when"] == "repair__lock.owner is defined"


def _tasks(items):
    """Every task of a task list, those of its blocks, rescues and always sections included, in order."""
    for task in items or ():
        yield task
        for section in ("block", "rescue", "always"):
            yield from _tasks(task.get(section))


def _expr(value):
    return " ".join(str(value).split())


def alias_problems(files):
    """Where a task list sets a record (verify_record, verify_records) without its old name (verify_result,
    verify_results) following it through gpufleet.hygiene.verify_alias: in the same set_fact, from the same
    expression, or in a later set_fact of the file from the record itself."""
    problems = []
    for path in files:
        facts = [t["ansible.builtin.set_fact"] for t in _tasks(load(path)) if isinstance(t.get("ansible.builtin.set_fact"), dict)]
        for i, fact in enumerate(facts):
            for new, old in (("verify_record", "verify_result"), ("verify_records", "verify_results")):
                if new not in fact:
                    continue
                if old in fact:
                    want = _expr(fact[new])[:-2].rstrip() + " | gpufleet.hygiene.verify_alias('%s') }}" % old
                    if _expr(fact[old]) != want:
                        problems.append("%s: %s is not %s" % (os.path.relpath(path, REPO), _expr(fact[old]), want))
                elif not any(_expr(later.get(old)) == "{{ %s | gpufleet.hygiene.verify_alias('%s') }}" % (new, old) for later in facts[i + 1:]):
                    problems.append("%s: %s set without %s" % (os.path.relpath(path, REPO), new, old))
    return problems


def test_the_old_names_of_the_record_follow_every_update_of_it():
    """verify_result and verify_results (deprecated aliases until 0.4.0) hold what verify_record and
    verify_records hold after every task that sets them: the read, and the verify role's note entry
    point, through which the repair's three updates go - the repair role sets neither itself."""
    files = [os.path.join(REPO, "roles", role, "tasks", name) for role in ("verify", "repair")
             for name in sorted(os.listdir(os.path.join(REPO, "roles", role, "tasks")))]
    setting = []
    for path in files:
        with open(path) as f:
            if "verify_record" in f.read():
                setting.append(path)
    assert len(setting) >= 5 and alias_problems(setting) == []
    for path in files:
        if os.sep + "repair" + os.sep in path:
            for task in _tasks(load(path)):
                assert not set(task.get("ansible.builtin.set_fact") or {}) & {"verify_record", "verify_result"}, path
    notes = [t for f in files if os.sep + "repair" + os.sep in f for t in _tasks(load(f))
             if (t.get("ansible.builtin.import_role") or {}).get("tasks_from") == "note"]
    assert sorted(str(t["vars"]["verify_note"]) for t in notes) == [
        "{'remediated': True}", "{'repair_error': '{{ repair__config_error }}'}", "{'repair_error': '{{ repair__error }}'}"]


def test_a_record_update_without_its_alias_is_found(tmp_path):
    path = tmp_path / "tasks.yml"
    path.write_text(yaml.safe_dump([{"block": [{"ansible.builtin.set_fact": {
        "verify_record": "{{ verify_record | combine({'repair_error': 'x'}) }}",
        "verify_result": "{{ verify_record | gpufleet.hygiene.verify_alias('verify_result') }}"}}]}]))
    assert len(alias_problems([str(path)])) == 1  # the alias misses the update
    path.write_text(yaml.safe_dump([{"ansible.builtin.set_fact": {"verify_records": "{{ x }}"}}]))
    assert alias_problems([str(path)]) == ["%s: verify_records set without verify_results" % os.path.relpath(str(path), REPO)]
