# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plan.yml's checks of a run before anything is read: its options (fleet_option_errors), named
as the user set them and judged by the code that takes each one, and a selection of no container
(fleet_empty_selection)."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping

import pytest
from ansible.errors import AnsibleFilterError, AnsibleUndefinedVariable

_checks = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.filter.run_checks")
_options = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options")
_hostlock = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.common._hostlock")
_errors = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors")
_node = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox._node")

HOSTS = ["train-100", "train-101", "train-102"]


def hostvars(extra=None, **per_host):
    """hostvars as a run sees them: extra vars (-e, strings as key=value gives them) on every host,
    localhost's included; per_host: {host: its own inventory variables}."""
    extra = extra or {}
    out = {"localhost": dict(extra)}
    for host in HOSTS:
        out[host] = dict(per_host.get(host.replace("-", "_"), {}), **extra)
    return out


def errors(hv, selected=None, limit=None):
    return _checks.fleet_option_errors(hv, HOSTS if selected is None else selected, limit=limit)


def test_an_option_out_of_range_given_with_e_is_named_once_as_the_user_set_it():
    assert errors(hostvars({"gpufleet_stall_after": "-5"})) == [
        "gpufleet_stall_after=-5 must be at least 1 (seconds without the log growing after which a job counts as stalled)"]


def test_an_inventory_value_names_the_hosts_that_have_it():
    hv = hostvars(train_101={"gpufleet_stall_after": 0}, train_102={"gpufleet_stall_after": 0},
                  train_100={"gpufleet_job": {"baseline_tokens_per_s": -3, "log": "/root/train.log"}})
    assert errors(hv) == [
        ("gpufleet_job.baseline_tokens_per_s=-3 must be at least 0 (the job's recorded good throughput, reported beside "
         "the last reading with their ratio) (set for train-100)"),
        ("gpufleet_stall_after=0 must be at least 1 (seconds without the log growing after which a job counts as stalled) "
         "(set for train-101, train-102)")]
    # A host the --limit leaves out is not the run's.
    assert errors(hv, limit=["train-101"]) == [
        ("gpufleet_stall_after=0 must be at least 1 (seconds without the log growing after which a job counts as stalled) "
         "(set for train-101)")]


@pytest.mark.parametrize("extra, message", [
    ({"gpufleet_nvidia_smi_timeout": "0"}, ("gpufleet_nvidia_smi_timeout=0 must be more than 0 (seconds one nvidia-smi call "
                                            "may take before it is killed and the module fails)")),
    ({"gpufleet_nvidia_smi_timeout": "abc"}, "gpufleet_nvidia_smi_timeout=abc must be a number (seconds one nvidia-smi call"),
    ({"gpufleet_stall_after": "15m"}, "gpufleet_stall_after=15m must be a whole number (seconds without the log growing"),
    ({"gpufleet_lock_timeout": "-1"}, "gpufleet_lock_timeout=-1 must be at least 0 (seconds to wait for another run's lock"),
    ({"gpufleet_lock_timeout": "1m"}, "gpufleet_lock_timeout=1m must be a whole number (seconds to wait for another run's lock"),
    ({"gpufleet_progress_every": "-5"}, "gpufleet_progress_every=-5 must be at least 0 (seconds between the progress lines of a wait"),
    ({"gpufleet_progress_every": "15s"}, "gpufleet_progress_every=15s must be a whole number (seconds between the progress lines"),
    ({"gpufleet_read_by": "nodes"}, "gpufleet_read_by=nodes must be one of auto, node, container"),
    ({"gpufleet_batch": "0"}, "gpufleet_batch=0 must be a number of containers of at least 1, a percentage from 1% to 100%"),
    ({"gpufleet_batch": "-5"}, "gpufleet_batch=-5 must be a number of containers of at least 1"),
    ({"gpufleet_batch": "0%"}, "gpufleet_batch=0% must be a number of containers of at least 1"),
    ({"gpufleet_batch": "10.5%"}, "gpufleet_batch=10.5% must be"),
    ({"gpufleet_batch": '[1,"10%"]'}, "a list is given to -e as JSON: -e '{\"gpufleet_batch\": [1, \"10%\"]}'"),
    ({"gpufleet_batch": [1, "10%", "abc"]}, "gpufleet_batch=[1, 10%, abc] must be"),
    ({"gpufleet_max_fail_percentage": "150"}, "gpufleet_max_fail_percentage=150 must be a percentage from 0 to 100"),
    ({"gpufleet_max_fail_percentage": "-1"}, "gpufleet_max_fail_percentage=-1 must be a percentage from 0 to 100"),
    ({"gpufleet_allow_running_job": "ture"}, "gpufleet_allow_running_job=ture must be true or false"),
    ({"gpufleet_allow_empty_selection": "sure"}, "gpufleet_allow_empty_selection=sure must be true or false"),
    ({"gpufleet_require_gpu": "maybe"}, "gpufleet_require_gpu=maybe must be true or false"),
    ({"gpufleet_job": "train.py"}, "gpufleet_job=train.py must be a mapping"),
    ({"gpufleet_job": {"baseline_tokens_per_s": "fast"}}, "gpufleet_job.baseline_tokens_per_s=fast must be a number"),
])
def test_each_kind_of_wrong_option(extra, message):
    got = errors(hostvars(extra))
    assert len(got) == 1 and message in got[0], got


@pytest.mark.parametrize("extra", [
    {},
    {"gpufleet_stall_after": "1", "gpufleet_nvidia_smi_timeout": "0.5", "gpufleet_lock_timeout": "0", "gpufleet_progress_every": "0"},
    {"gpufleet_batch": "100%", "gpufleet_max_fail_percentage": "100", "gpufleet_read_by": "node"},
    {"gpufleet_batch": [1, "10%", "25%"], "gpufleet_max_fail_percentage": "10%", "gpufleet_allow_running_job": "yes"},
    {"gpufleet_batch": 3, "gpufleet_max_fail_percentage": 0, "gpufleet_repair_stalled": False, "gpufleet_pve_tags": "true"},
    {"gpufleet_job": {"baseline_tokens_per_s": 0, "patterns": ["^python train"], "users": "root"}, "gpufleet_venv": "/opt/venv"},
    {"gpufleet_stall_after": None},  # unset as null: the default applies
])
def test_good_options_pass(extra):
    assert errors(hostvars(extra)) == []


def test_a_role_variable_set_instead_is_named():
    assert errors(hostvars({"verify_stall_after": "0", "gpufleet_stall_after": "900"})) == [
        "verify_stall_after=0 must be at least 1 (seconds without the log growing after which a job counts as stalled)"]


def test_a_variable_whose_template_fails_is_named():
    class Broken(dict):
        def __getitem__(self, key):
            if key == "gpufleet_stall_after":
                raise AnsibleUndefinedVariable("'stall' is undefined")
            return dict.__getitem__(self, key)

    hv = hostvars()
    hv["train-100"] = Broken(gpufleet_stall_after="{{ stall }}")
    got = errors(hv)
    assert len(got) == 1 and got[0].startswith("gpufleet_stall_after=... cannot be resolved: 'stall' is undefined"), got
    assert got[0].endswith("(set for train-100)")


def test_every_readiness_option_of_the_inventory_is_checked():
    checked = set(v.name for v in _checks.variables())
    assert set(o.inventory for o in _options.role_options() if o.inventory) <= checked
    assert {"gpufleet_batch", "gpufleet_max_fail_percentage", "gpufleet_read_by", "gpufleet_lock_timeout"} <= checked


# ------------------------------------------------------------------ no range restated here


def test_the_ranges_are_the_reads_own_not_a_copy(monkeypatch):
    """The check follows the table's bad_option(), which the read uses too: changed there, the check
    changes with it. A copy of stall_after's or nvidia_smi_timeout's range in the filter fails this test."""
    real = _options.bad_option

    def stricter(p):
        return (_errors.out_of_range("stall_after", p["stall_after"], least=60)
                or _errors.out_of_range("command_timeout", p["command_timeout"], least=2) or real(p))

    monkeypatch.setattr(_options, "bad_option", stricter)
    assert errors(hostvars({"gpufleet_stall_after": "30", "gpufleet_nvidia_smi_timeout": "1"})) == [
        ("gpufleet_nvidia_smi_timeout=1 must be at least 2 (seconds one nvidia-smi call may take before it is killed and "
         "the module fails)"),
        "gpufleet_stall_after=30 must be at least 60 (seconds without the log growing after which a job counts as stalled)"]


def test_the_lock_wait_is_host_lock_s_own_range(monkeypatch):
    monkeypatch.setattr(_hostlock, "bad_wait", lambda timeout: _errors.out_of_range("timeout", timeout, least=5))
    assert errors(hostvars({"gpufleet_lock_timeout": "3"})) == [
        "gpufleet_lock_timeout=3 must be at least 5 (seconds to wait for another run's lock on a container)"]


@pytest.mark.parametrize("value", ["-5", "-1", "0", "0.5", "1", "2", "900", "1e9", "abc", "nan"])
@pytest.mark.parametrize("option", [o for o in _options.role_options() if o.inventory and o.type in ("int", "float")],
                         ids=lambda o: o.name)
def test_the_check_accepts_exactly_what_the_node_read_accepts(option, value):
    """Whatever the filter says of a number option, the read of a container says the same."""
    top, _dot, key = option.inventory.partition(".")
    extra = {top: {key: value}} if key else {top: value}
    args = {option.name: float(value) if option.type == "float" and value != "abc" else value}
    _options_ok, problem = _node.container_args({"host": "ct", "args": args})
    filtered = errors(hostvars(extra))
    if option.given == "positive" and value != "abc" and float(value) == 0:
        problem = None  # given only above 0: 0 is "none"
    assert (problem is None) == (filtered == []), (problem, filtered)


def test_the_filter_restates_no_range_of_its_own():
    """Only the plays' own keywords are judged in the filter; every other range is called, not written."""
    source = inspect.getsource(_checks)
    assert "out_of_range(" not in source and "check_range(" not in source
    assert "least=" not in source and "more_than=" not in source and "at_most=" not in source


def test_bad_input_is_refused():
    with pytest.raises(AnsibleFilterError, match="expects hostvars"):
        _checks.fleet_option_errors("hostvars")
    with pytest.raises(AnsibleFilterError, match="expects host names"):
        _checks.fleet_option_errors({}, "pve_containers")


# ------------------------------------------------------------------ nothing selected


GROUPS = {"all": ["pve1", "pve2", "train-100", "train-101"], "ungrouped": [], "pve_nodes": ["pve1", "pve2"],
          "pve_containers": ["train-100", "train-101"], "pve_running": ["train-100"]}


def test_something_selected_is_no_error():
    assert _checks.fleet_empty_selection(["train-100"], None, groups=GROUPS) == ""
    assert _checks.fleet_empty_selection(["train-100", "train-101"], ["train-101", "localhost"], groups=GROUPS) == ""


def test_no_inventory_says_to_give_one(tmp_path):
    msg = _checks.fleet_empty_selection([], None, sources=["/etc/ansible/hosts-none"], groups={"all": [], "ungrouped": []})
    assert msg == ("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_containers (inventory: "
                   "/etc/ansible/hosts-none (no such file)): the inventory has no hosts. Give the fleet's inventory with -i "
                   "(inventory/example-proxmox.yml, inventory/example.proxmox_lxc.yml or inventory/example-community-proxmox.yml "
                   "show how), then run again")


def test_a_mistyped_pattern_is_named_with_the_groups_the_inventory_has(tmp_path):
    inv = tmp_path / "fleet.yml"
    inv.write_text("all: {}\n")
    msg = _checks.fleet_empty_selection([], None, pattern="pve_contianers", sources=[str(inv)], groups=GROUPS)
    assert msg == ("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_contianers (inventory: %s): "
                   "the pattern matches no host of the inventory. Did you mean pve_containers? Its groups (hosts): "
                   "pve_containers (2), pve_nodes (2), pve_running (1). Give -e gpufleet_hosts=<a group or a host pattern "
                   "of them>, or the inventory of the fleet with -i" % inv)


def test_a_limit_that_leaves_every_container_out_names_both():
    msg = _checks.fleet_empty_selection(["train-100", "train-101"], ["pve1"], limit_text="pve1", sources=["a,b"],
                                        groups=GROUPS)
    assert msg.startswith("nothing to do: no container selected by the host pattern gpufleet_hosts=pve_containers within "
                          "--limit pve1 (inventory: a,b): the pattern selects 2 host(s) (train-100, train-101), none of them "
                          "in the limit.")


def test_the_selection_filter_refuses_a_pattern_given_as_it_is():
    with pytest.raises(AnsibleFilterError, match="expects host names"):
        _checks.fleet_empty_selection("pve_containers")
    assert isinstance(GROUPS, Mapping)
