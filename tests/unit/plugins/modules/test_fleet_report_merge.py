# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_report's merge_from: the reports of a sliced run's slices make the report of the whole run.

The slices are cut as AWX cuts them (contrib/awx/run_sliced.py's slice_hosts); every file the
merge writes must equal the one a single unsliced run writes, byte for byte.
"""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
from ansible.errors import AnsibleActionFail
from fleet_sample import RUN_STARTED, realistic_fleet
from test_fleet_report import FILES, REPO, args, run_fleet_report

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._merge import earliest_start, merge_slices
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import ReportError

_spec = importlib.util.spec_from_file_location("run_sliced", os.path.join(REPO, "contrib", "awx", "run_sliced.py"))
run_sliced = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_sliced)


@pytest.fixture
def act():
    """fleet_report's action run as a task would."""
    return run_fleet_report


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write_slices(act, base, count, run_started=RUN_STARTED):
    """Each slice's report.json (as contrib/awx/slice.yml writes it); return their directories."""
    fleet = realistic_fleet()
    names = [h["host"] for h in fleet]
    dirs = []
    for number in range(1, count + 1):
        mine = set(run_sliced.slice_hosts(names, number, count))
        d = base / ("slice-%d" % number)
        res = act(args(d, records=[h for h in fleet if h["host"] in mine], formats=["json"], run_started=run_started))
        assert not res.get("failed"), res
        dirs.append(str(d))
    return dirs


def test_slices_are_awx_s(tmp_path):
    hosts = ["ct-%02d" % i for i in range(10, 0, -1)]
    cut = [run_sliced.slice_hosts(hosts, n, 3) for n in (1, 2, 3)]
    assert cut == [["ct-01", "ct-04", "ct-07", "ct-10"], ["ct-02", "ct-05", "ct-08"], ["ct-03", "ct-06", "ct-09"]]
    assert run_sliced.slice_hosts(["a"], 2, 3) == []
    with pytest.raises(ValueError):
        run_sliced.slice_hosts(hosts, 0, 3)


@pytest.mark.parametrize("count", [1, 3, 5])
def test_the_merged_report_is_the_unsliced_report(act, tmp_path, count):
    whole = act(args(tmp_path / "whole"))
    assert not whole.get("failed"), whole
    dirs = write_slices(act, tmp_path, count)
    # A slice named by its directory or by its report.json alike.
    merge_from = dirs[:1] + [os.path.join(d, "report.json") for d in dirs[1:]]
    merged = act(dict(args(tmp_path / "merged", merge_from=merge_from), records=None, run_started=None))
    assert not merged.get("failed"), merged
    for name in FILES.values():
        assert read(str(tmp_path / "merged" / name)) == read(str(tmp_path / "whole" / name)), name
    assert merged["summary"] == whole["summary"]
    assert merged["run_started"] == RUN_STARTED
    held = [len(json.loads(read(os.path.join(d, "report.json")))["hosts"]) for d in dirs]
    assert [s["hosts"] for s in merged["slices"]] == held
    assert sum(held) == whole["summary"]["hosts"]
    assert all(s["found"] for s in merged["slices"])


def test_a_host_in_two_slices_fails_and_names_both(act, tmp_path):
    dirs = write_slices(act, tmp_path, 2)
    again = tmp_path / "again"
    one = json.loads(read(os.path.join(dirs[0], "report.json")))["hosts"][0]
    assert not act(args(again, records=[one], formats=["json"])).get("failed")
    res = act(dict(args(tmp_path / "merged", merge_from=dirs + [str(again)]), records=None))
    assert res["failed"]
    assert json.dumps(one["host"]) in res["msg"], res["msg"]
    assert os.path.join(dirs[0], "report.json") in res["msg"] and os.path.join(str(again), "report.json") in res["msg"], res["msg"]
    assert not os.path.exists(str(tmp_path / "merged"))


def test_hosts_and_slices_together_and_a_host_in_both(act, tmp_path):
    fleet = realistic_fleet()
    dirs = write_slices(act, tmp_path, 3)
    only = json.loads(read(os.path.join(dirs[0], "report.json")))["hosts"]
    rest = [h for h in fleet if h["host"] not in set(h["host"] for h in only)]
    res = act(args(tmp_path / "merged", records=rest, merge_from=dirs[:1]))
    assert not res.get("failed"), res
    assert res["summary"]["hosts"] == len(fleet)
    res = act(args(tmp_path / "twice", records=fleet[:1] + rest, merge_from=dirs[:1]))
    assert res["failed"] and json.dumps(fleet[0]["host"]) in res["msg"] and "hosts[0]" in res["msg"], res


def test_a_missing_slice_fails_or_warns(act, tmp_path):
    dirs = write_slices(act, tmp_path, 3)
    gone = str(tmp_path / "slice-4")
    res = act(dict(args(tmp_path / "merged", merge_from=dirs + [gone]), records=None))
    assert res["failed"] and "1 of 4 slice reports missing" in res["msg"] and gone in res["msg"], res
    assert not os.path.exists(str(tmp_path / "merged"))
    res = act(dict(args(tmp_path / "merged", merge_from=dirs + [gone], merge_missing="warn"), records=None))
    assert not res.get("failed"), res
    assert any(gone in w and "not in the report" in w for w in res["warnings"]), res
    assert [s["found"] for s in res["slices"]] == [True, True, True, False]
    assert res["summary"]["hosts"] == len(realistic_fleet())


def test_one_of_records_and_merge_from_is_required(act, tmp_path):
    a = args(tmp_path)
    del a["records"]
    with pytest.raises(AnsibleActionFail, match="one of the following is required: records, merge_from"):
        act(a)


@pytest.mark.parametrize("text, message", [
    ("not json", "is not JSON"),
    ('{"schema_version": 1}', "not a fleet report"),
    ('{"schema_version": 99, "hosts": []}', "has schema_version 99"),
])
def test_what_is_not_a_slice_report(tmp_path, text, message):
    path = tmp_path / "report.json"
    path.write_text(text)
    with pytest.raises(ReportError, match=message):
        merge_slices([str(tmp_path)])


def test_earliest_start_and_merge_missing_choices(act, tmp_path):
    early = write_slices(act, tmp_path / "a", 2, run_started="2025-06-01T03:00:07Z")[:1]
    late = write_slices(act, tmp_path / "b", 2, run_started="2025-06-01T04:00:00+01:00")[1:]
    _records, slices, _warnings = merge_slices(early + late)
    # An offset is the same instant: 04:00+01:00 is 03:00Z, earlier than 03:00:07Z.
    assert earliest_start(slices) == "2025-06-01T03:00:00Z"
    assert earliest_start([{"found": False, "run_started": None}]) is None
    with pytest.raises(ReportError, match="merge_missing"):
        merge_slices(early, missing="skip")


# ------------------------------------------------------------------ hostile slices

def edit_slice(directory, edit):
    """Change a slice's report.json as whoever can write it could."""
    path = os.path.join(directory, "report.json")
    run = json.loads(read(path))
    edit(run["hosts"])
    with open(path, "w") as f:
        json.dump(run, f)
    return path


@pytest.mark.parametrize("host", [["train-a1"], {"name": "train-a1"}, 101, None])
def test_a_record_of_a_slice_naming_no_host_is_an_unreadable_row_naming_the_file(act, tmp_path, host):
    """A record whose host is a list or a dict (unhashable), a number or nothing: no TypeError, the
    merged report holds it as an unreadable record that names the slice's file."""
    dirs = write_slices(act, tmp_path, 2)
    path = edit_slice(dirs[1], lambda hosts: hosts[0].update(host=host))
    res = act(dict(args(tmp_path / "merged", merge_from=dirs), records=None))
    assert not res.get("failed"), res
    with open(tmp_path / "merged" / FILES["json"]) as f:
        rows = [h for h in json.load(f)["hosts"] if h["error"] and h["error"].startswith("unreadable record")]
    assert len(rows) == 1 and rows[0]["host"].startswith("hosts[")
    assert "(slice report %s, its hosts[0])" % path in rows[0]["error"] and "host is required" in rows[0]["error"]
    assert res["summary"]["hosts"] == len(realistic_fleet())


def test_a_forged_record_in_a_slice_is_an_unreadable_row_naming_the_file(act, tmp_path):
    dirs = write_slices(act, tmp_path, 2)

    def forge(hosts):
        check = next(c for c in hosts[0]["checks"] if c["name"] == "gpu_healthy")
        check["gpus"][0]["ecc"]["volatile_uncorrected"] = '0\ngpufleet_hygiene_host_ready{host="train-101"} 1'

    path = edit_slice(dirs[0], forge)
    res = act(dict(args(tmp_path / "merged", merge_from=dirs), records=None))
    assert not res.get("failed"), res
    assert "train-101" not in read(str(tmp_path / "merged" / FILES["prometheus"])).decode()
    assert any(path in w and "ecc.volatile_uncorrected must be an integer" in w for w in res["warnings"]), res["warnings"]


@pytest.mark.parametrize("depth", [33, 100000])
def test_deeply_nested_json_is_a_report_error_naming_the_file(act, tmp_path, depth):
    dirs = write_slices(act, tmp_path, 2)
    path = edit_slice(dirs[1], lambda hosts: None)
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(ReportError, match=r"slice report %s nests arrays and objects %d deep" % (path, depth + 1)):
        merge_slices(dirs)
    res = act(dict(args(tmp_path / "merged", merge_from=dirs), records=None))
    assert res["failed"] and path in res["msg"], res
    assert not os.path.exists(str(tmp_path / "merged"))


def test_brackets_inside_strings_are_no_nesting():
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._merge import json_depth

    assert json_depth('{"a": "[[[[{{{{\\"]]]", "b": [[1]]}') == 3
    assert json_depth(json.dumps({"hosts": [{"checks": [{"gpus": [{"mig": {"instances": [{"holders": [{"pid": 1}]}]}}]}]}]})) == 12
