# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""readiness/_record: the record's one builder - one shape whichever way a host was read or not read,
the checks a failed read fails, and what the reports take of what a read registered."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _record

CHECK_OK = {"name": "venv_clean", "severity": "fail", "ok": True, "error": False, "summary": "12 packages consistent with CUDA 12.8"}
GPU_HELD = {"name": "gpu_idle", "severity": "fail", "ok": False, "error": False, "summary": "GPU 0: 900 MiB used"}
BRIEF = {"ready": False, "running_job": False, "checks": [GPU_HELD, CHECK_OK], "gpus": [], "contaminants": [], "caches": []}


def registered(host, node="pve1", vmid=100, **extra):
    """verify_record as the readiness action registers it: the record plus Ansible's keys."""
    return dict(_record.record(dict(BRIEF, **extra), host, node, vmid), changed=False, failed=False, invocation={})


def test_one_record_shape_everywhere():
    assert set(_record.HOST_KEYS) == set(_record.RECORD_KEYS) | {"host", "node", "vmid", "remediated", "error", "repair_error"}
    for rec in (_record.record(BRIEF, "a"), _record.unread("b", "pve1", 7, "gone"), _record.of_host("c", registered("c")),
                _record.of_reading({"failed": True, "msg": "no python"}, "d", args={"venv": "/v"})):
        assert tuple(rec) == _record.HOST_KEYS or set(rec) == set(_record.HOST_KEYS), rec


def test_a_failed_reading_fails_the_checks_its_options_would_have_made_with_the_defaults_of_the_rest():
    short = _record.brief_of_failure({"msg": "container 100 is not running"}, {"venv": "/v", "verify_files": True})
    assert [c["name"] for c in short["checks"]] == ["gpu_idle", "venv_clean", "packages", "caches_fresh"]
    assert short["failed"] and short["msg"] == "container 100 is not running"
    assert [c["name"] for c in _record.brief_of_failure({"msg": "x"}, None)["checks"]] == ["gpu_idle"]


@pytest.mark.parametrize("node, vmid", [("", ""), (None, None)])
def test_an_empty_node_or_vmid_is_recorded_as_null(node, vmid):
    rec = _record.record(BRIEF, "box", node, vmid)
    assert (rec["node"], rec["vmid"], rec["remediated"], rec["error"], rec["repair_error"]) == (None, None, False, None, None)


def test_what_a_read_registered_is_the_record_without_ansible_s_keys():
    rec = _record.of_host("train-100", registered("train-100"))
    assert rec == _record.record(BRIEF, "train-100", "pve1", 100)
    # What the repair added to it (hygiene's repair_error, the verify step's remediated) is kept.
    repaired = _record.of_host("train-100", dict(registered("train-100"), remediated=True, repair_error="the purge failed"))
    assert (repaired["remediated"], repaired["repair_error"]) == (True, "the purge failed")
    # A record registered before repair_error existed reads as none.
    old = registered("train-100")
    del old["repair_error"]
    assert _record.of_host("train-100", old)["repair_error"] is None


@pytest.mark.parametrize("registered_result, error", [
    ({"failed": True, "msg": "argument 'require_gpu' is of type str"}, "argument 'require_gpu' is of type str"),
    ({}, _record.NO_RESULT),
    (None, _record.NO_RESULT),
])
def test_a_read_that_registered_no_record_is_recorded_as_not_read(registered_result, error):
    rec = _record.of_host("train-102", registered_result, "pve1", 102)
    assert (rec["ready"], rec["checks"], rec["error"], rec["node"], rec["vmid"]) == (False, [], error, "pve1", 102)


def test_an_unreachable_or_stopped_container_is_not_read_and_a_failed_read_fails_its_checks():
    for reading in ({"unreachable": True, "msg": "node pve1 could not be reached"}, {"not_read": True, "msg": "stopped"}):
        rec = _record.of_reading(reading, "train-100", "pve1", 100)
        assert (rec["checks"], rec["error"]) == ([], reading["msg"])
    rec = _record.of_reading({"msg": "no python3 in the container"}, "train-100", args={"venv": "/opt/venv"})
    assert rec["error"] is None and [c["summary"] for c in rec["checks"]] == ["no python3 in the container"] * 3
