# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The filters built on the record (module_utils.readiness._record, tests/unit/plugins/module_utils/
readiness/test_record.py): the playbooks' fleet_records and fleet_summary, the node entry point's verify_node_job and
verify_node_readings, and the repair role's repair_plan."""

from __future__ import annotations

import importlib
import os

import pytest
from ansible.errors import AnsibleFilterError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
_verify = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.verify")
_fleet = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.fleet")
_repair = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.repair")
_record = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record")
_readiness = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._readiness")
_report = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema")

CHECK_OK = {"name": "venv_clean", "severity": "fail", "ok": True, "error": False, "summary": "12 packages consistent with CUDA 12.8"}
GPU_HELD = {"name": "gpu_idle", "severity": "fail", "ok": False, "error": False, "summary": "GPU 0: 900 MiB used"}
BRIEF = {"ready": False, "running_job": False, "checks": [GPU_HELD, CHECK_OK], "gpus": [], "contaminants": [], "caches": []}


def registered(host, node="pve1", vmid=100, **extra):
    """verify_record as the readiness action registers it: the record plus Ansible's keys."""
    return dict(_record.record(dict(BRIEF, **extra), host, node, vmid), changed=False, failed=False, invocation={})


class HostVars(dict):
    """A host's hostvars as a filter sees them (a read-only mapping)."""


def test_fleet_records_takes_a_record_registered_under_its_name_before_0_3_where_there_is_no_other():
    """A 0.2 playbook registered readiness's record as verify_result: taken until 0.4.0; where a
    host has both (the verify role sets the old name as an alias), verify_record is the record."""
    old = registered("train-100")
    both = dict(registered("train-101", vmid=101), ready=True)
    hosts = [HostVars(inventory_hostname="train-100", pve_node="pve1", ansible_pct_vmid=100, verify_result=old),
             HostVars(inventory_hostname="train-101", pve_node="pve1", ansible_pct_vmid=101, verify_record=both,
                      verify_result={"failed": True, "msg": "stale"})]
    records = _fleet.fleet_records(hosts)
    assert records == [_record.record(BRIEF, "train-100", "pve1", 100), _record.record(dict(BRIEF, ready=True), "train-101", "pve1", 101)]


def test_fleet_records_keeps_the_hosts_read_and_records_a_refused_read_as_not_read():
    hosts = [
        HostVars(inventory_hostname="train-100", pve_node="pve1", ansible_pct_vmid=100, verify_record=registered("train-100")),
        HostVars(inventory_hostname="train-101", pve_node="pve1", ansible_pct_vmid=101),  # --limit left it out
        HostVars(inventory_hostname="train-102", pve_node="pve1", ansible_pct_vmid=102,
                 verify_record={"failed": True, "msg": "gpufleet.hygiene.readiness: argument 'require_gpu' is of type str"}),
        HostVars(inventory_hostname="train-103", verify_record=dict(_record.unread("train-103", "pve2", 103, "unreachable: no route"),
                                                                    unreachable=True)),
    ]
    records = _fleet.fleet_records(hosts)
    assert [r["host"] for r in records] == ["train-100", "train-102", "train-103"]
    assert all(set(r) == set(_record.HOST_KEYS) for r in records)  # Ansible's keys left out
    assert records[0] == _record.record(BRIEF, "train-100", "pve1", 100)
    assert records[1] == _record.unread("train-102", "pve1", 102, "gpufleet.hygiene.readiness: argument 'require_gpu' is of type str")
    assert records[2]["error"] == "unreachable: no route" and records[2]["checks"] == []
    # What fleet_report takes without a warning.
    assert _report.normalize_hosts(records)[1] == []
    lines = _fleet.fleet_summary(records)
    assert lines == ["train-100 - NOT READY: [gpu_idle] GPU 0: 900 MiB used",
                     "train-102 - NOT READY, not read: gpufleet.hygiene.readiness: argument 'require_gpu' is of type str",
                     "train-103 - NOT READY, not read: unreachable: no route",
                     "0 of 3 ready; not ready: train-100, train-102, train-103"]
    ready = _record.record(dict(BRIEF, ready=True, checks=[CHECK_OK]), "train-104")
    assert _fleet.fleet_summary([ready])[-1] == "1 of 1 ready; not ready: none"
    with pytest.raises(AnsibleFilterError, match="each host's variables"):
        _fleet.fleet_records(["train-100"])
    with pytest.raises(AnsibleFilterError, match="a list of records"):
        _fleet.fleet_summary("train-100")


ARGS = {"venv": "/opt/venv", "require_gpu": True}


def test_node_job_through_pct_names_the_node_and_the_containers_python():
    job = _verify.verify_node_job(ARGS, "train-100", "pve1", 100, connection="gpufleet.hygiene.pct", node_user="root",
                                  node_host="10.0.0.1", node_port=22, interpreter="/opt/py/bin/python3", method="lxc-attach")
    assert job["node"] == "root|10.0.0.1|22" and job["group"].startswith("gpufleet_node_") and len(job["group"]) == 30
    assert job["python"] == "/usr/bin/python3"  # the node's, not the container's
    assert job["label"] == {"host": "train-100", "node": "pve1", "vmid": 100}
    assert job["entry"] == {"host": "train-100", "args": ARGS, "vmid": 100, "python": "/opt/py/bin/python3", "method": "lxc-attach"}
    # Same node, same group; an interpreter that is not a path gives the containers' default.
    other = _verify.verify_node_job(ARGS, "train-101", "pve1", 101, connection="gpufleet.hygiene.pct", node_user="root",
                                    node_host="10.0.0.1", node_port="22", interpreter="auto_silent", container_python="/usr/bin/python3.11")
    assert other["group"] == job["group"] and other["entry"]["python"] == "/usr/bin/python3.11"
    with pytest.raises(AnsibleFilterError, match="no ansible_pct_vmid"):
        _verify.verify_node_job(ARGS, "train-102", connection="gpufleet.hygiene.pct")


def test_node_job_of_a_plain_host_is_its_own_node():
    job = _verify.verify_node_job(ARGS, "gpu-box", connection="ssh", discovered="/usr/bin/python3.12")
    assert job["node"] == "self|gpu-box" and job["python"] == "/usr/bin/python3.12"
    assert job["entry"] == {"host": "gpu-box", "args": ARGS} and job["label"] == {"host": "gpu-box", "node": None, "vmid": None}
    assert _verify.verify_node_job(ARGS, "gpu-box")["python"] == "auto_silent"


def test_a_host_gets_its_reading_from_its_reader_or_the_readers_failure():
    def job(host, vmid, addr):
        return _verify.verify_node_job(ARGS, host, "n", vmid, connection="gpufleet.hygiene.pct", node_host=addr)
    reading = dict(BRIEF, warnings=[])
    a1 = HostVars(inventory_hostname="a1", verify__node_job=job("a1", 101, "10.0.0.1"), verify__node_read={"containers": {"a1": reading, "a2": reading}})
    assert _verify.verify_node_reading(a1, "a1") == reading and _verify.verify_node_reading(a1, "a2") == reading
    b1 = HostVars(inventory_hostname="b1", verify__node_job=job("b1", 103, "10.0.0.2"), verify__node_read={"unreachable": True, "msg": "ssh: no route"})
    want = {"failed": True, "unreachable": True, "msg": "reading through node 10.0.0.2 failed (by b1): ssh: no route"}
    assert _verify.verify_node_reading(b1, "b2") == want
    assert _verify.verify_node_reading(b1, "b1")["msg"] == "reading through node 10.0.0.2 failed: ssh: no route"
    # A container the reader brought no reading of (it read before this host joined) fails by name.
    assert _verify.verify_node_reading(a1, "a3")["msg"] == "reading through node 10.0.0.1 failed (by a1): no result"
    # A node that could not be reached: recorded as not read, with that message.
    out = _verify.verify_node_reading(b1, "b2")
    rec = _verify.verify_record(out, "b2", "n", 104, ARGS)
    assert rec["checks"] == [] and rec["error"] == out["msg"] and rec["ready"] is False
    # A read that failed otherwise: every check these options would have made fails with its message.
    failed = HostVars(inventory_hostname="b1", verify__node_job=job("b1", 103, "10.0.0.2"), verify__node_read={"failed": True, "msg": "MODULE FAILURE"})
    rec = _verify.verify_record(_verify.verify_node_reading(failed, "b2"), "b2", "n", 104, ARGS)
    assert [c["summary"] for c in rec["checks"]] == ["reading through node 10.0.0.2 failed (by b1): MODULE FAILURE"] * 3
    lonely = HostVars(inventory_hostname="c1", verify__node_job=job("c1", 105, "10.0.0.3"))
    assert _verify.verify_node_reading(lonely, "c1")["msg"] == "reading through node 10.0.0.3 failed: no result"
    with pytest.raises(AnsibleFilterError, match="expects the reader's variables"):
        _verify.verify_node_reading("c1", "c1")
    # A container's vmid that is no vmid is refused before any read, naming the variable.
    with pytest.raises(AnsibleFilterError, match=r"vmid must be an integer from 100 to 999999999 \(ansible_pct_vmid of c1\), got '1; id'"):
        job("c1", "1; id", "10.0.0.3")


@pytest.mark.parametrize("record, allow, repair, left", [
    (dict(BRIEF), False, True, None),
    (dict(BRIEF, running_job=True), False, True, None),          # remediate stops a job that holds the GPUs
    (dict(BRIEF, running_job=True), True, False, "running a job"),  # hygiene never touches one
    (dict(BRIEF, ready=True, checks=[CHECK_OK]), True, False, "ready"),
    (dict(BRIEF, checks=[dict(GPU_HELD, error=True, summary="nvidia-smi did not answer")]), False, False,
     "with GPUs that cannot be read"),
])
def test_repair_plan_follows_the_policy(record, allow, repair, left):
    plan = _repair.repair_plan(record, allow)
    assert (plan["repair"], plan["left"]) == (repair, left)


def test_repair_plan_purges_only_for_a_check_purging_fixes():
    assert _repair.repair_plan(BRIEF)["purge"] is False and _repair.repair_plan(BRIEF)["failed"] == ["gpu_idle"]
    dirty = dict(BRIEF, checks=[GPU_HELD, dict(CHECK_OK, ok=False)])
    assert _repair.repair_plan(dirty)["purge"] is True
    broken = dict(BRIEF, checks=[dict(GPU_HELD, error=True, summary="GPU is lost")])
    assert _repair.repair_plan(broken)["gpu_errors"] == ["GPU is lost"]
    with pytest.raises(AnsibleFilterError, match="allow_running_job must be true or false"):
        _repair.repair_plan(BRIEF, "perhaps")
    with pytest.raises(AnsibleFilterError, match="verify_record"):
        _repair.repair_plan({"ready": False})


STALLED = {"name": "job_live", "severity": "fail", "ok": False, "error": False, "state": "stalled", "leftovers": [],
           "summary": "job (pid 7) stalled: its log /var/log/train.log has not grown for 1200s (stall_after 900s)"}
LEFTOVER = {"pid": 9, "start_time": 123, "cmdline": "python3 -c from multiprocessing.spawn import spawn_main"}


@pytest.mark.parametrize("allow, stalled, repair, left", [
    (True, False, False, "running a stalled job"),  # hygiene reports a stalled job, leaves it unless asked
    (True, True, True, None),                        # gpufleet_repair_stalled: true
    (False, False, True, None),                      # remediate's default stops any job holding the GPUs
])
def test_repair_plan_repairs_a_stalled_job_only_when_asked(allow, stalled, repair, left):
    record = dict(BRIEF, running_job=True, checks=[GPU_HELD, STALLED])
    plan = _repair.repair_plan(record, allow, stalled)
    assert (plan["repair"], plan["left"], plan["stalled"]) == (repair, left, True)
    with pytest.raises(AnsibleFilterError, match="repair_stalled must be true or false"):
        _repair.repair_plan(record, allow, "sometimes")


def test_repair_plan_stops_leftovers_and_never_a_healthy_running_job():
    left_by_job = dict(STALLED, state="none", leftovers=[LEFTOVER], summary="1 GPU holder(s) left by a job that is gone")
    plan = _repair.repair_plan(dict(BRIEF, checks=[GPU_HELD, left_by_job]), True, False)
    assert plan["repair"] is True and plan["leftovers"] == [LEFTOVER] and plan["stalled"] is False
    # A healthy running job beside them is never touched where running jobs are allowed: nothing is stopped.
    beside = dict(left_by_job, state="running")
    plan = _repair.repair_plan(dict(BRIEF, running_job=True, checks=[GPU_HELD, beside]), True, True)
    assert (plan["repair"], plan["left"], plan["leftovers"]) == (False, "running a job", [])


@pytest.mark.parametrize("state, left", [("running", "running a job"), ("stalled", "running a stalled job")])
def test_repair_plan_stops_leftovers_beside_a_job_only_when_always(state, left):
    """leftovers=always (remediate): beside a job left running, the leftovers are stopped by PID
    and start time, and the host is still not repaired (the job is not touched)."""
    beside = dict(STALLED, state=state, leftovers=[LEFTOVER])
    record = dict(BRIEF, running_job=True, checks=[GPU_HELD, beside])
    plan = _repair.repair_plan(record, True, False, "always")
    assert (plan["repair"], plan["left"], plan["leftovers"]) == (False, left, [LEFTOVER])
    assert plan["leftover_pids"] == [{"pid": 9, "start_time": 123}]
    assert _repair.repair_plan(record, True, False, "repaired")["leftovers"] == []
    # Nothing is stopped on a host whose GPUs cannot be read, whatever the policy.
    broken = dict(record, checks=[dict(GPU_HELD, error=True, summary="GPU is lost"), beside])
    assert _repair.repair_plan(broken, True, False, "always")["leftovers"] == []
    with pytest.raises(AnsibleFilterError, match="leftovers must be one of repaired, always"):
        _repair.repair_plan(record, True, False, "sometimes")


RUNNING = dict(STALLED, ok=True, state="running", slow=False, summary="job running (pid 7), its log grew 2s ago")
GPU_OWN = dict(GPU_HELD, ok=True, summary="held by the running job (pid 7)")
VENV_DIRTY = dict(CHECK_OK, name="venv_clean", ok=False, summary="1 package(s) built for another CUDA than 12.8")


@pytest.mark.parametrize("checks, repair, left, leftovers", [
    # The inventory's job running as described: nothing to do, and a second remediate changes nothing.
    ([GPU_OWN, RUNNING], False, "running its job, healthy", []),
    # Beside it, a worker whose job is gone: stopped by PID and start time, the job left running.
    ([GPU_OWN, dict(RUNNING, ok=False, leftovers=[LEFTOVER])], False, "running its job, healthy", [LEFTOVER]),
    # ... which also holds GPU memory beside the job's: the same (gpu_idle's other holder is it).
    ([dict(GPU_HELD, others=[9]), dict(RUNNING, ok=False, leftovers=[LEFTOVER])], False, "running its job, healthy", [LEFTOVER]),
    # A holder beside it that is no leftover (another user's): repaired.
    ([dict(GPU_HELD, others=[9, 99]), dict(RUNNING, ok=False, leftovers=[LEFTOVER])], True, None, [LEFTOVER]),
    # Running below its floor (the seed's 64%), stalled, or on an environment that fails a check: repaired.
    ([GPU_OWN, dict(RUNNING, ok=False, slow=True)], True, None, []),
    ([GPU_OWN, dict(STALLED, leftovers=[LEFTOVER])], True, None, [LEFTOVER]),
    ([GPU_OWN, RUNNING, VENV_DIRTY], True, None, []),
    # Its GPU shared with a holder that is not the job: repaired.
    ([dict(GPU_HELD, summary="GPU 0: 40960 MiB used, held by pid 7 python3, pid 99 python3"), RUNNING], True, None, []),
])
def test_remediate_keeps_the_inventory_s_job_when_it_runs_as_described(checks, repair, left, leftovers):
    """keep_healthy_job (remediate's desired state): a job that runs at its pace with nothing else
    failing is left running, whatever allow_running_job says; anything else is repaired."""
    record = dict(BRIEF, running_job=True, checks=checks)
    plan = _repair.repair_plan(record, False, False, "always", True)
    assert (plan["repair"], plan["left"], plan["leftovers"]) == (repair, left, leftovers)
    # Without it (the policy before the desired state), a job holding the GPUs is always stopped.
    assert _repair.repair_plan(record, False, False, "always")["repair"] is True
    with pytest.raises(AnsibleFilterError, match="keep_healthy_job must be true or false"):
        _repair.repair_plan(record, False, False, "always", "maybe")


def test_a_configuration_error_stops_nothing():
    """Validate before destroy: what job_config found wrong (a typo'd venv) leaves the host as it
    is, its job running, whatever else fails; the errors name the inventory variable."""
    config = {"name": "job_config", "severity": "fail", "ok": False, "error": False, "summary": "configuration error: ...",
              "problems": [{"option": "venv", "variable": "gpufleet_venv", "value": "/opt/venv-typo", "problem": "does not exist"}]}
    record = dict(BRIEF, running_job=True, checks=[GPU_OWN, RUNNING, dict(VENV_DIRTY, error=True), config])
    for keep in (True, False):
        plan = _repair.repair_plan(record, False, False, "always", keep)
        assert (plan["repair"], plan["left"], plan["leftovers"]) == (False, "with a configuration error", [])
        assert plan["config_errors"] == ["gpufleet_venv=/opt/venv-typo does not exist"]
    assert _repair.repair_plan(dict(record, checks=[GPU_OWN, RUNNING, dict(config, ok=True, problems=[])]), False)["config_errors"] == []


@pytest.mark.parametrize("record, start", [
    (dict(BRIEF, ready=True, checks=[CHECK_OK]), True),                     # clean, its job down: started
    (dict(BRIEF, ready=True, running_job=True, checks=[CHECK_OK]), False),  # its job runs: nothing to do
    (dict(BRIEF), False),                                                   # not ready: repaired (and relaunched)
])
def test_remediate_starts_the_job_of_a_ready_host_where_it_does_not_run(record, start):
    """start_job (remediate with a job described): the desired state is the job running, so a ready
    host whose job is down is to have it started, with no repair; without start_job it is left."""
    plan = _repair.repair_plan(record, False, False, "always", True, start_job=True)
    assert plan["start"] is start and not (plan["start"] and plan["repair"])
    assert plan["left"] == ("ready, its job not running" if start else plan["left"])
    assert _repair.repair_plan(record, False, False, "always", True)["start"] is False
