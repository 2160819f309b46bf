# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_reached (an action, on the controller) and the unattempted callback: a host whose node the
read could not reach ends the run unreachable; a run that stopped early names what it never attempted."""

from __future__ import annotations

import importlib

import pytest
from ansible.errors import AnsibleFilterError
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.loader import action_loader, connection_loader
from ansible.template import Templar

ACTION = "gpufleet.hygiene.node_reached"
_action = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.action.node_reached")
_callback = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.callback.unattempted")

DOWN = {"changed": False, "unreachable": True, "msg": "gpufleet.hygiene.pct: node root@pve2:22 is unreachable: Connection refused"}
UP = {"changed": False, "containers": {"train-200": {}, "train-201": {}}, "read": {"containers": 2}}
SKIPPED = {"changed": False, "skipped": True, "skip_reason": "Conditional result was False"}


def run_action(task_vars, args=None):
    task = Task()
    task.action = ACTION
    task.args = dict(args or {})
    loader, play_context = DataLoader(), PlayContext()
    connection = connection_loader.get("ansible.builtin.local", play_context)
    action = action_loader.get(ACTION, task=task, connection=connection, play_context=play_context, loader=loader,
                               templar=Templar(loader=loader), shared_loader_obj=None)
    return action.run(task_vars=task_vars)


def container_vars(host, read=None, batch=("train-200", "train-201"), reader="train-200"):
    """A container read by container (the verify role's read_host): its facts, the batch, the group."""
    hostvars = {"train-200": {"verify__node_read": read}, "train-201": {"verify__node_read": SKIPPED}}
    out = {"inventory_hostname": host, "verify__node_job": {"group": "gpufleet_node_abc"}, "hostvars": hostvars,
           "groups": {"gpufleet_node_abc": ["train-200", "train-201"]}, "ansible_play_batch": list(batch),
           "pve_node": "pve2"}
    out.update(hostvars[host])
    return out


def test_the_container_that_read_for_its_unreachable_node_is_unreachable():
    result = run_action(container_vars("train-200", DOWN))
    assert result["unreachable"] is True and result["changed"] is False
    assert result["msg"] == ("train-200 was not read: its node could not be reached: gpufleet.hygiene.pct: node root@pve2:22 "
                             "is unreachable: Connection refused")


def test_its_peers_are_unreachable_too_naming_who_read_them():
    result = run_action(container_vars("train-201", DOWN))
    assert result["unreachable"] is True
    assert result["msg"].startswith("train-201 was not read: its node could not be reached (read by train-200): ")


def test_a_node_read_by_node_is_unreachable_naming_its_containers():
    hv = {"inventory_hostname": "pve2", "verify__node_read": DOWN, "verify_records": {"train-201": {}, "train-200": {}}}
    result = run_action(hv)
    assert result["unreachable"] is True
    assert result["msg"].startswith("pve2 could not be reached to read its containers (train-200, train-201): gpufleet")


def test_a_container_read_by_its_node_follows_the_node():
    hostvars = {"pve2": {"verify__node_read": DOWN, "verify_records": {"train-200": {}}}}
    result = run_action({"inventory_hostname": "train-200", "pve_node": "pve2", "hostvars": hostvars})
    assert result["unreachable"] is True and "(read by pve2)" in result["msg"]
    # A node that did not read it says nothing of it.
    result = run_action({"inventory_hostname": "train-201", "pve_node": "pve2", "hostvars": hostvars})
    assert "unreachable" not in result and result["msg"] == "no node read of this host in this run" and result["skipped"]


@pytest.mark.parametrize("read", [UP, {"failed": True, "msg": "nvidia-smi hung"}])
def test_a_node_that_answered_leaves_the_host_as_it_is(read):
    for host in ("train-200", "train-201"):
        result = run_action(container_vars(host, read))
        assert "unreachable" not in result and not result.get("failed") and result["changed"] is False, result
        assert result["msg"] == "read through its node" and result["skipped"] is True


def test_a_read_given_is_judged_instead():
    assert run_action({"inventory_hostname": "x"}, {"read": DOWN})["unreachable"] is True
    assert "unreachable" not in run_action({"inventory_hostname": "x", "verify__node_read": DOWN}, {"read": UP})


def test_another_batch_s_reader_is_not_this_host_s():
    """A peer of the same node outside this batch (an earlier batch's reader) is not asked."""
    assert "unreachable" not in run_action(container_vars("train-201", DOWN, batch=("train-201",)))


# ------------------------------------------------------------------ the unattempted callback


class Stats:
    def __init__(self, failures=(), dark=()):
        self.failures = dict((h, 1) for h in failures)
        self.dark = dict((h, 1) for h in dark)


PLAN = {"by": "container", "containers": ["train-100", "train-101", "train-200", "train-201"], "by_node": {}}


def test_the_containers_no_task_ran_for_are_never_attempted():
    assert _callback.unattempted(PLAN, {"localhost", "train-100"}) == ["train-101", "train-200", "train-201"]
    assert _callback.unattempted(PLAN, {"localhost", "train-100", "train-101", "train-200", "train-201"}) == []
    assert _callback.unattempted(None, set()) == [] and _callback.unattempted({"containers": "x"}, set()) == []


def test_read_by_node_a_container_whose_node_ran_was_attempted():
    plan = dict(PLAN, by="node", by_node={"pve1": ["train-100", "train-101"], "pve2": ["train-200", "train-201"]})
    assert _callback.unattempted(plan, {"localhost", "pve1"}) == ["train-200", "train-201"]


def test_the_message_names_what_stopped_the_run():
    msg = _callback.message(["train-101", "train-200"], Stats(failures=["train-201"], dark=["train-100"]))
    assert msg == ("NEVER ATTEMPTED: 2 container(s) of this run's plan, nothing read or changed on them: train-101, "
                   "train-200. The run stopped early, after train-100 (unreachable), train-201 (failed): fix that and run "
                   "again (the containers done are ready and skipped), or let failures go on with "
                   "-e gpufleet_max_fail_percentage=100.")
    many = _callback.message(["ct-%03d" % i for i in range(60)], Stats())
    assert "ct-049 and 10 more. The run stopped early: fix" in many


class _Host:
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


class _Result:
    def __init__(self, host, run_once=False, delegate_to=None):
        self._host = _Host(host)
        self._task = Task()
        self._task.run_once = run_once
        self._task.delegate_to = delegate_to


class _Variables:
    """The variable manager as the callback uses it: localhost's facts."""

    def __init__(self, plan):
        self.plan = plan
        self._inventory = self

    def get_host(self, name):
        return _Host(name)

    def get_vars(self, host=None, include_hostvars=True):
        return {"gpufleet_plan": self.plan} if host.name == "localhost" else {}


class _Play:
    def __init__(self, variables):
        self.variables = variables

    def get_variable_manager(self):
        return self.variables


def test_the_callback_speaks_after_the_recap_only_of_what_was_left(capsys):
    cb = _callback.CallbackModule()
    cb.v2_playbook_on_play_start(_Play(_Variables(PLAN)))
    cb.v2_runner_on_ok(_Result("localhost"))
    cb.v2_runner_on_ok(_Result("train-101", run_once=True, delegate_to="localhost"))  # plan.yml's check: no attempt
    cb.v2_runner_on_unreachable(_Result("train-100"))
    cb.v2_playbook_on_stats(Stats(dark=["train-100"]))
    out = capsys.readouterr().out
    assert ("NEVER ATTEMPTED: 3 container(s) of this run's plan, nothing read or changed on them: train-101, train-200, "
            "train-201. The run stopped early, after train-100 (unreachable)") in out
    for host in ("train-101", "train-200", "train-201"):
        cb.v2_runner_on_skipped(_Result(host))
    cb.v2_playbook_on_stats(Stats())
    assert capsys.readouterr().out == ""


def test_the_callback_is_silent_without_a_plan(capsys):
    cb = _callback.CallbackModule()
    cb.v2_playbook_on_stats(Stats())  # no play started
    cb.v2_playbook_on_play_start(_Play(_Variables(None)))  # a run that stopped in the plan itself
    cb.v2_playbook_on_stats(Stats(failures=["localhost"]))
    assert capsys.readouterr().out == ""


# ------------------------------------------------------------------ which hosts a playbook marks

_fleet = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.fleet")


def test_read_by_node_an_unreachable_node_and_its_containers():
    plan = {"by": "node", "containers": ["train-100", "train-200", "train-201"],
            "by_node": {"pve1": ["train-100"], "pve2": ["train-200", "train-201"]}}
    hostvars = {"pve1": {"verify__node_read": UP}, "pve2": {"verify__node_read": DOWN}}
    assert _fleet.fleet_unreached(plan, hostvars) == ["pve2", "train-200", "train-201"]
    hostvars["pve2"]["verify__node_read"] = UP
    assert _fleet.fleet_unreached(plan, hostvars) == []


def test_read_by_container_every_container_of_the_unreachable_reader_s_node():
    plan = {"by": "container", "containers": ["train-100", "train-200", "train-201"], "by_node": {}}
    hostvars = {"train-100": {"verify__node_read": UP, "verify__node_job": {"group": "g1"}},
                "train-200": {"verify__node_read": DOWN, "verify__node_job": {"group": "g2"}},
                "train-201": {"verify__node_read": SKIPPED, "verify__node_job": {"group": "g2"}}}
    assert _fleet.fleet_unreached(plan, hostvars) == ["train-200", "train-201"]
    hostvars["train-200"]["verify__node_read"] = UP
    assert _fleet.fleet_unreached(plan, hostvars) == []
    # A container that was not read at all (a refused read) belongs to no group.
    hostvars["train-201"] = {}
    assert _fleet.fleet_unreached(plan, hostvars) == []


def test_fleet_unreached_wants_the_plan():
    with pytest.raises(AnsibleFilterError, match="expects the fleet plan"):
        _fleet.fleet_unreached(["train-100"], {})


def test_the_jobs_a_repair_left_down_are_listed_at_the_end():
    """The repair role's set_stats (gpufleet_jobs_down, run-wide): each host, why, and the command
    that starts its job again; nothing at all without them."""
    stats = Stats()
    assert _callback.jobs_down(stats) == {}
    stats.custom = {"_run": {"gpufleet_jobs_down": {
        "train-202": {"why": "venv /opt/venv: the uninstall failed", "relaunch": "ansible-playbook remediate.yml --limit train-202,localhost"},
        "train-101": {"why": "the throughput gate failed"}}}}
    down = _callback.jobs_down(stats)
    assert sorted(down) == ["train-101", "train-202"]
    assert _callback.down_message(down).splitlines() == [
        "JOBS DOWN: the repair of 2 container(s) failed after it stopped their job, which is not running now:",
        "  train-101: the throughput gate failed - once fixed, start it again with: remediate.yml",
        ("  train-202: venv /opt/venv: the uninstall failed - once fixed, start it again with: ansible-playbook remediate.yml "
         "--limit train-202,localhost")]
