# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role's filters: verify_record (a readiness reading -> the record), verify_verdict, verify_alias."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest
from ansible.errors import AnsibleFilterError

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
_filters = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.verify")
_fleet_report = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema")
_record = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record")
verify_record, verify_verdict = _filters.verify_record, _filters.verify_verdict

GPU = {"index": 0, "name": "NVIDIA H200", "uuid": "GPU-1", "memory_used_mib": 21098, "memory_total_mib": 143771,
       "utilization_pct": 0, "processes": [{"pid": 4242, "name": "python3", "used_memory_mib": 21098}]}
READING = {  # readiness with brief=true, as registered (Ansible adds changed/failed)
    "changed": False, "failed": False, "ready": False, "running_job": False,
    "checks": [{"name": "gpu_idle", "severity": "fail", "ok": False, "error": False, "summary": "GPU 0: 21098 MiB held by pid 4242 (python3)"},
               {"name": "venv_clean", "severity": "fail", "ok": True, "error": False, "summary": "no CUDA 13 wheel"}],
    "gpus": [GPU], "contaminants": [], "caches": [{"name": "inductor", "path": "/root/.cache/x", "size_bytes": 1, "entries": 1, "fresh": True}],
}


def test_a_reading_becomes_the_record_of_the_reports():
    rec = verify_record(READING, "train-100", "pve1", 100)
    assert rec == {"host": "train-100", "node": "pve1", "vmid": 100, "remediated": False, "error": None, "repair_error": None,
                   "ready": False, "running_job": False, "checks": READING["checks"], "gpus": [GPU], "contaminants": [],
                   "caches": READING["caches"]}
    # What fleet_report accepts, without a warning about an unknown key.
    hosts, warnings = _fleet_report.normalize_hosts([rec])
    assert hosts[0]["host"] == "train-100" and warnings == []
    # A plain host: no node, no VMID.
    plain = verify_record(READING, "gpu-box", "", None)
    assert plain["node"] is None and plain["vmid"] is None


@pytest.mark.parametrize("args, names", [
    (None, ["gpu_idle"]),
    ({"venv": "/root/venv"}, ["gpu_idle", "venv_clean", "caches_fresh"]),
    ({"venv": "/root/venv", "caches": False, "verify_files": True}, ["gpu_idle", "venv_clean", "packages"]),
])
def test_a_call_that_failed_before_reading_fails_every_check_it_would_have_made(args, names):
    rec = verify_record({"failed": True, "msg": "no Python at /usr/bin/python3 in train-100"}, "train-100", "pve1", 100, args)
    assert [c["name"] for c in rec["checks"]] == names
    assert all(not c["ok"] and c["error"] and c["summary"] == "no Python at /usr/bin/python3 in train-100" for c in rec["checks"])
    assert rec["ready"] is False and rec["gpus"] == [] and rec["host"] == "train-100"


@pytest.mark.parametrize("call, msg", [
    (lambda: verify_record("not a dict", "h"), "must be a readiness result"),
    (lambda: verify_record(READING, ""), "host"),
    (lambda: verify_record({"failed": True}, "h", args=["venv"]), "args must be the readiness options"),
    (lambda: verify_verdict({"ready": True}), "verify_record"),
    (lambda: verify_verdict(verify_record(READING, "h"), "maybe"), "verify_fail must be true or false, got 'maybe'"),
    (lambda: verify_verdict(verify_record(READING, "h"), True, None), "verify_show must be true or false, got None"),
])
def test_bad_input_says_what_is_wrong(call, msg):
    with pytest.raises(AnsibleFilterError, match=msg):
        call()


def test_the_verdict_one_line_per_check_and_one_summary():
    verdict = verify_verdict(verify_record(READING, "train-100", "pve1", 100))
    assert verdict == {"ready": False, "fail": False, "show": False,
                       "lines": ["NOT READY", "gpu_idle | FAIL | GPU 0: 21098 MiB held by pid 4242 (python3)", "venv_clean | ok | no CUDA 13 wheel"],
                       "problems": "[gpu_idle] GPU 0: 21098 MiB held by pid 4242 (python3)",
                       "line": "train-100 - NOT READY: [gpu_idle] GPU 0: 21098 MiB held by pid 4242 (python3)"}
    ready = dict(READING, ready=True, checks=[READING["checks"][1], dict(READING["checks"][1], name="caches_fresh", summary="1 cache(s) fresh")])
    verdict = verify_verdict(verify_record(ready, "h"))
    assert verdict["lines"] == ["READY", "venv_clean | ok | no CUDA 13 wheel", "caches_fresh | ok | 1 cache(s) fresh"]
    assert verdict["line"] == "h - ready: no CUDA 13 wheel; 1 cache(s) fresh"
    assert verify_verdict(verify_record(dict(READING, ready=True, checks=[]), "h"))["line"] == "h - ready"


def test_a_container_that_could_not_be_reached_is_one_line_saying_why():
    # As the readiness action records it: nothing read, error set to the connection's message.
    unreachable = _record.record(_record.nothing_read(), "train-104", "pve1", 104,
                                 error="container 104 on node root@10.0.0.1:22 is not running (stopped)")
    verdict = verify_verdict(unreachable)
    assert verdict["ready"] is False
    # What the verdict task says when it fails the host: why it was not read.
    assert verdict["problems"] == "not read: container 104 on node root@10.0.0.1:22 is not running (stopped)"
    assert verdict["line"] == "train-104 - NOT READY, not read: container 104 on node root@10.0.0.1:22 is not running (stopped)"


def test_fail_and_show_come_back_as_booleans_as_ansible_reads_them():
    for fail, show, want in ((True, False, (True, False)), ("yes", "no", (True, False)), ("false", 1, (False, True))):
        verdict = verify_verdict(verify_record(READING, "h"), fail, show)
        assert (verdict["fail"], verdict["show"]) == want


def test_checks_failed_for_one_reason_share_one_entry_of_the_summary():
    # A call that failed before reading fails every check with its message: said once.
    failed = verify_record({"failed": True, "msg": "container 100 is not running"}, "train-100", args={"venv": "/opt/venv"})
    assert verify_verdict(failed)["problems"] == "[gpu_idle, venv_clean, caches_fresh] container 100 is not running"
    mixed = dict(READING, checks=READING["checks"] + [dict(READING["checks"][0], name="caches_fresh"),
                                                      dict(READING["checks"][0], name="packages", summary="torch drifted")])
    assert verify_verdict(verify_record(mixed, "h"))["problems"] == (
        "[gpu_idle, caches_fresh] GPU 0: 21098 MiB held by pid 4242 (python3) | [packages] torch drifted")


def test_the_filters_by_their_names_in_a_template(tmp_path):
    """Loaded by ansible-core under their fully qualified names, as the role uses them."""
    play = tmp_path / "play.yml"
    play.write_text("""
- hosts: localhost
  gather_facts: false
  tasks:
    - ansible.builtin.copy:
        content: "{{ reading | gpufleet.hygiene.verify_record('train-100', 'pve1', 100) | gpufleet.hygiene.verify_verdict | to_json }}"
        dest: "%s"
        mode: "0600"
""" % (tmp_path / "out.json"))
    (tmp_path / "extra.json").write_text(json.dumps({"reading": READING, "ansible_python_interpreter": sys.executable}))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(play), "-i", "localhost,", "-c", "local",
                           "-e", "@" + str(tmp_path / "extra.json")], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False, timeout=120, env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())["problems"] == "[gpu_idle] GPU 0: 21098 MiB held by pid 4242 (python3)"


def test_the_old_names_are_the_same_value_tagged_deprecated_naming_the_new_one():
    # ansible-core keeps its tags private: the one way to see what a template reading the value is told.
    from ansible.module_utils._internal._datatag._tags import Deprecated

    rec = verify_record(READING, "train-100", "pve1", 100)
    for old, new, value in (("verify_result", "verify_record", rec), ("verify_results", "verify_records", {"train-100": rec})):
        alias = _filters.verify_alias(value, old)
        assert alias == value
        tag = Deprecated.get_tag(alias)
        assert tag is not None, old
        assert tag.msg == "The verify role's %s is renamed %s." % (old, new)
        assert tag.help_text == "Read %s instead." % new
        assert tag.version == "0.4.0" and tag.deprecator.resolved_name == "gpufleet.hygiene"
        assert Deprecated.get_tag(value) is None  # the new name's value is left untagged


@pytest.mark.parametrize("value, old, message", [
    ({"host": "a"}, "verify_reslt", "'verify_reslt' is no old name of the verify role's outputs; one of: verify_result, verify_results"),
    ("a", "verify_result", "verify_alias: expects the verify_record (a dict), got str"),
])
def test_an_alias_of_an_unknown_name_or_of_no_record_is_refused(value, old, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        _filters.verify_alias(value, old)


def test_the_role_variables_give_the_read_its_options_by_the_tables_rules():
    args = _filters.verify_readiness_args({
        "job_patterns": ["train"], "require_gpu": "no", "threshold_mib": "64", "command_timeout": "20",  # always: converted
        "venv": "", "nvidia_smi": "", "device_patterns": [], "expected_cuda": 12.8,  # set: left out when empty
        "job_baseline_tokens_per_s": "0",  # positive: only above 0
        "cache_environment": {"HF_TOKEN": "secret", "TRITON_CACHE_DIR": "/c"},
    }, ["TRITON_CACHE_DIR"])
    assert args == {"job_patterns": ["train"], "require_gpu": False, "threshold_mib": 64, "command_timeout": 20.0,
                    "expected_cuda": "12.8", "cache_environment": {"TRITON_CACHE_DIR": "/c"}}
    assert _filters.verify_readiness_args({"job_baseline_tokens_per_s": "2000.5"}) == {"job_baseline_tokens_per_s": 2000.5}
    assert _filters.verify_readiness_args({"job_baseline_tokens_per_s": -1}) == {}
    # Not a value it can convert: given as it is, for the read to refuse naming the option.
    assert _filters.verify_readiness_args({"require_gpu": "maybe", "job_baseline_tokens_per_s": "fast"}) == {
        "require_gpu": "maybe", "job_baseline_tokens_per_s": "fast"}


@pytest.mark.parametrize("values, cache_vars, message", [
    ({"jb_patterns": []}, None, "'jb_patterns' is no option a role gives the read; one of: "),
    ({"cache_environment": {"HOME": "/root"}}, None, "cache_environment needs cache_vars"),
    (["job_patterns"], None, "expects {option: value}, got list"),
])
def test_values_the_rules_cannot_apply_to_are_refused(values, cache_vars, message):
    with pytest.raises(AnsibleFilterError, match=re.escape(message)):
        _filters.verify_readiness_args(values, cache_vars)


def test_a_value_the_read_would_refuse_is_not_made_acceptable_on_the_way():
    """1.5 is no int (int() would cut it to 1) and a cache_environment that is no dict is no
    environment: both are given as they are, for the read to refuse naming the option."""
    assert _filters.verify_readiness_args({"threshold_mib": 1.5, "stall_after": 2.0}) == {"threshold_mib": 1.5, "stall_after": 2}
    assert _filters.verify_readiness_args({"cache_environment": "HOME=/root"}, ["HOME"]) == {"cache_environment": "HOME=/root"}
