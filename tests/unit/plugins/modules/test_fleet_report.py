# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_report: real files written, parsed back and checked format by format.

fleet_report is an action (it runs on the controller): the tests load it with Ansible's plugin
loader, as ansible-playbook does, and one runs it through ansible-playbook itself.
"""

from __future__ import annotations

import copy
import html.parser
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task
from ansible.plugins.loader import action_loader, connection_loader
from ansible.template import Templar
from fleet_sample import HOSTILE_NAME, RUN_STARTED, hostile_fleet, realistic_fleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
ACTION = "gpufleet.hygiene.fleet_report"

FILES = {"json": "report.json", "junit": "report.junit.xml", "prometheus": "gpufleet_hygiene.prom", "html": "report.html"}


# ------------------------------------------------------------------------------------------
# A small parser of the Prometheus text exposition format (version 0.0.4), strict on purpose.

METRIC = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def parse_labels(text):
    """Parse '{a="x",b="y"}' with the format's escapes (\\\\, \\", \\n); anything else is an error."""
    assert text[0] == "{" and text[-1] == "}", text
    body, i, labels = text[1:-1], 0, {}
    while i < len(body):
        m = LABEL_NAME.match(body, i)
        assert m, "bad label name at %r" % body[i:]
        name = m.group(0)
        i = m.end()
        assert body[i:i + 2] == '="', "expected =\" after %s in %r" % (name, body)
        i += 2
        value = []
        while True:
            assert i < len(body), "unterminated label value in %r" % body
            ch = body[i]
            if ch == "\\":
                nxt = body[i + 1]
                assert nxt in '\\"n', "bad escape \\%s in %r" % (nxt, body)
                value.append({"\\": "\\", '"': '"', "n": "\n"}[nxt])
                i += 2
            elif ch == '"':
                i += 1
                break
            else:
                assert ch != "\n"
                value.append(ch)
                i += 1
        assert name not in labels, "label %s twice" % name
        labels[name] = "".join(value)
        if i < len(body):
            assert body[i] == ",", "expected , in %r" % body
            i += 1
    return labels


def parse_prometheus(text):
    """Return {family: {"help": str, "type": str, "samples": [(labels, value)]}}; assert the syntax."""
    assert text.endswith("\n")
    families, current, seen_series = {}, None, set()
    for line in text[:-1].split("\n"):
        assert line, "empty line"
        if line.startswith("# HELP "):
            name, _sep, help_text = line[7:].partition(" ")
            assert name not in families, "HELP for %s twice or after its samples" % name
            assert "\n" not in help_text
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
        elif line.startswith("# TYPE "):
            name, _sep, kind = line[7:].partition(" ")
            assert name == current and families[name]["type"] is None, line
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            families[name]["type"] = kind
        else:
            assert not line.startswith("#"), line
            m = METRIC.match(line)
            assert m, "bad sample line %r" % line
            name, labels, value = m.group(1), m.group(2), m.group(3)
            assert name == current, "sample %s outside its family %s" % (name, current)
            assert families[name]["type"] is not None, "sample before TYPE"
            labels = parse_labels(labels) if labels else {}
            series = (name, tuple(sorted(labels.items())))
            assert series not in seen_series, "duplicate series %r" % (series,)
            seen_series.add(series)
            families[name]["samples"].append((labels, float(value)))
    for name, fam in families.items():
        assert fam["type"] and fam["samples"], name
    return families


# ------------------------------------------------------------------------------------------


def run_fleet_report(args, check_mode=False, diff=False):
    """Run the fleet_report action with args as a task would; return its result."""
    task = Task()
    task.action = ACTION
    task.args = dict(args)
    task.check_mode = check_mode
    task.diff = diff
    loader, play_context = DataLoader(), PlayContext()
    # The connection a task always has; the action uses none of it (it writes on the controller).
    connection = connection_loader.get("ansible.builtin.local", play_context)
    action = action_loader.get(ACTION, task=task, connection=connection, play_context=play_context, loader=loader,
                               templar=Templar(loader=loader), shared_loader_obj=None)
    result = action.run(task_vars={})
    assert "deprecations" not in result, result["deprecations"]
    return result


@pytest.fixture
def run_action():
    """run_fleet_report, for the tests that take it as a fixture."""
    return run_fleet_report


def args(dest, **kw):
    a = dict(records=realistic_fleet(), dest=str(dest), title="Nightly GPU hygiene", run_started=RUN_STARTED)
    a.update(kw)
    return a


def test_parser_rejects_bad_lines():
    with pytest.raises(AssertionError):
        parse_prometheus('# HELP x y\n# TYPE x gauge\nx{a="b\\q"} 1\n')
    with pytest.raises(AssertionError):
        parse_prometheus("x 1\n")
    with pytest.raises(AssertionError):
        parse_prometheus('# HELP x y\n# TYPE x gauge\nx{a="1"} 1\nx{a="1"} 2\n')


def test_writes_every_format(run_action, tmp_path):
    dest = tmp_path / "report"
    result = run_action(args(dest))
    assert result["changed"] is True
    assert sorted(os.listdir(dest)) == sorted(FILES.values())
    assert [f["format"] for f in result["files"]] == ["json", "junit", "prometheus", "html"]
    assert all(f["changed"] for f in result["files"])
    for f in result["files"]:
        assert os.path.getsize(f["path"]) == f["size"]
        assert stat.S_IMODE(os.stat(f["path"]).st_mode) == 0o644
    assert result["summary"] == {"hosts": 12, "ready": 8, "not_ready": 4, "running_job": 1, "remediated": 1, "error": 1,
                                 "repair_failed": 0, "checks_failed": 4, "checks_warned": 2, "nodes": 3, "gpus": 12, "contaminants": 3}
    assert result["not_ready"] == ["train-a1", "train-b1", "train-c1", "train-c4"]
    assert result["run_started"] == "2025-06-01T03:00:00Z"


def test_json_holds_the_whole_run(run_action, tmp_path):
    run_action(args(tmp_path))
    with open(tmp_path / FILES["json"]) as f:
        data = json.load(f)
    assert data["schema_version"] == 1
    assert data["title"] == "Nightly GPU hygiene"
    assert data["run_started"] == "2025-06-01T03:00:00Z"
    assert data["checks"] == ["gpu_idle", "job_live", "venv_clean", "packages", "caches_fresh", "gpu_healthy"]
    by_host = {h["host"]: h for h in data["hosts"]}
    src = {h["host"]: h for h in realistic_fleet()}
    assert set(by_host) == set(src)
    for name, h in src.items():
        assert by_host[name] == h, name
    assert [h["host"] for h in data["hosts"]][:4] == ["train-a1", "train-a2", "train-a3", "train-a4"]


def test_junit_is_valid_for_ci(run_action, tmp_path):
    run_action(args(tmp_path))
    root = ET.parse(tmp_path / FILES["junit"]).getroot()
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for attr in ("name", "tests", "failures", "errors", "skipped", "time", "timestamp"):
        assert attr in suite.attrib, attr
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$", suite.get("timestamp"))
    cases = suite.findall("testcase")
    # 11 reachable hosts x 6 checks, plus one error case for the stopped container
    assert len(cases) == int(suite.get("tests")) == int(root.get("tests")) == 67
    for tc in cases:
        assert tc.get("name") and tc.get("classname") and float(tc.get("time")) == 0
    failures = [(tc.get("classname"), tc.get("name"), tc.find("failure")) for tc in cases if tc.find("failure") is not None]
    assert len(failures) == int(suite.get("failures")) == 4
    expected = {("gpufleet.pve1.train-a1", "venv_clean"), ("gpufleet.pve2.train-b1", "gpu_idle"), ("gpufleet.pve3.train-c1", "caches_fresh"),
                ("gpufleet.pve2.train-b1", "gpu_healthy")}
    assert {(c, n) for c, n, _f in failures} == expected
    msg = {n: f.get("message") for _c, n, f in failures}
    assert msg["gpu_idle"] == "pid 40170 (python3) holds 61.2 GiB on GPU0; no training session owns it"
    errors = [tc for tc in cases if tc.find("error") is not None]
    assert len(errors) == int(suite.get("errors")) == 1
    assert errors[0].get("classname") == "gpufleet.pve3.train-c4"
    assert errors[0].find("error").get("message") == "container '304' not running!"
    warned = [tc for tc in cases if tc.get("classname") == "gpufleet.pve2.train-b3" and tc.get("name") == "packages"][0]
    assert warned.find("failure") is None
    assert warned.find("system-out").text.startswith("warning: 2 extra packages")


def test_prometheus_metrics(run_action, tmp_path):
    run_action(args(tmp_path))
    fams = parse_prometheus((tmp_path / FILES["prometheus"]).read_text())
    for name in ("gpufleet_hygiene_host_ready", "gpufleet_hygiene_check_ok", "gpufleet_hygiene_gpu_memory_used_bytes",
                 "gpufleet_hygiene_gpu_memory_total_bytes", "gpufleet_hygiene_contaminants",
                 "gpufleet_hygiene_last_run_timestamp_seconds"):
        assert fams[name]["type"] == "gauge" and fams[name]["help"], name
    assert fams["gpufleet_hygiene_last_run_timestamp_seconds"]["samples"] == [({}, 1748746800.0)]
    ready = {s[0]["host"]: (s[0], s[1]) for s in fams["gpufleet_hygiene_host_ready"]["samples"]}
    assert ready["train-a1"] == ({"host": "train-a1", "node": "pve1", "vmid": "101"}, 0.0)
    assert ready["train-a2"][1] == 1.0
    assert len(ready) == 12
    checks = {(s[0]["host"], s[0]["check"]): s[1] for s in fams["gpufleet_hygiene_check_ok"]["samples"]}
    assert len(checks) == 66
    assert checks[("train-b1", "gpu_idle")] == 0.0 and checks[("train-b3", "packages")] == 0.0
    assert checks[("train-b2", "gpu_idle")] == 1.0
    used = {(s[0]["host"], s[0]["gpu"]): s for s in fams["gpufleet_hygiene_gpu_memory_used_bytes"]["samples"]}
    labels, value = used[("train-b1", "0")]
    assert labels == {"host": "train-b1", "node": "pve2", "vmid": "201", "gpu": "0", "name": "NVIDIA H200"}
    assert value == 62710 * 1024 * 1024
    assert len(fams["gpufleet_hygiene_gpu_memory_total_bytes"]["samples"]) == 12
    cont = {s[0]["host"]: s[1] for s in fams["gpufleet_hygiene_contaminants"]["samples"]}
    assert cont["train-a1"] == 3.0 and cont["train-a2"] == 0.0
    fresh = {(s[0]["host"], s[0]["cache"]): s[1] for s in fams["gpufleet_hygiene_cache_fresh"]["samples"]}
    assert fresh[("train-c1", "inductor")] == 0.0
    states = {s[0]["state"]: s[1] for s in fams["gpufleet_hygiene_hosts"]["samples"]}
    assert states == {"ready": 8.0, "not_ready": 4.0, "running_job": 1.0, "remediated": 1.0, "error": 1.0}
    # The job's last tok/s and its baseline, only where job_live read them from the job's log.
    for name, value in (("gpufleet_hygiene_job_tokens_per_second", 12800.0), ("gpufleet_hygiene_job_baseline_tokens_per_second", 20000.0)):
        assert fams[name]["type"] == "gauge" and fams[name]["samples"] == [({"host": "train-a3", "node": "pve1"}, value)], name


def test_second_run_changes_nothing(run_action, tmp_path):
    first = run_action(args(tmp_path))
    assert first["changed"] is True
    before = {n: os.stat(tmp_path / n) for n in FILES.values()}
    second = run_action(args(tmp_path))
    assert second["changed"] is False
    assert not any(f["changed"] for f in second["files"])
    for n, st in before.items():
        after = os.stat(tmp_path / n)
        assert (after.st_ino, after.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), n
    # The same instant written another way is the same run.
    third = run_action(args(tmp_path, run_started="2025-06-01T05:00:00+02:00"))
    assert third["changed"] is False


def test_a_new_run_or_new_state_changes(run_action, tmp_path):
    run_action(args(tmp_path))
    later = run_action(args(tmp_path, run_started="2025-06-02T03:00:00Z"))
    assert later["changed"] is True
    fams = parse_prometheus((tmp_path / FILES["prometheus"]).read_text())
    assert fams["gpufleet_hygiene_last_run_timestamp_seconds"]["samples"][0][1] == 1748746800 + 86400
    hosts = realistic_fleet()
    hosts[0]["remediated"] = True
    changed = run_action(args(tmp_path, records=hosts, run_started="2025-06-02T03:00:00Z"))
    assert changed["changed"] is True
    assert {f["format"] for f in changed["files"] if f["changed"]} == {"json", "prometheus", "html"}


def test_without_run_started_every_call_is_a_new_run(run_action, tmp_path):
    a = args(tmp_path)
    del a["run_started"]
    result = run_action(a)
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", result["run_started"])
    with open(tmp_path / FILES["json"]) as f:
        assert json.load(f)["run_started"] == result["run_started"]


def test_check_mode_writes_nothing(run_action, tmp_path):
    dest = tmp_path / "new" / "report"
    result = run_action(args(dest), check_mode=True)
    assert result["changed"] is True
    assert all(f["changed"] for f in result["files"])
    assert not (tmp_path / "new").exists()
    run_action(args(dest))
    snapshot = {n: (dest / n).read_bytes() for n in FILES.values()}
    hosts = realistic_fleet()
    hosts[1]["ready"] = False
    result = run_action(args(dest, records=hosts), check_mode=True)
    assert result["changed"] is True
    assert {n: (dest / n).read_bytes() for n in FILES.values()} == snapshot
    assert sorted(os.listdir(dest)) == sorted(FILES.values())


def test_diff_mode(run_action, tmp_path):
    run_action(args(tmp_path))
    hosts = realistic_fleet()
    hosts[0]["checks"][1]["summary"] = "something else"
    result = run_action(args(tmp_path, records=hosts), diff=True)
    diffs = {d["after_header"]: d for d in result["diff"]}
    jd = diffs[str(tmp_path / FILES["json"])]
    assert "3 CUDA 13 wheels" in jd["before"] and "something else" in jd["after"]
    assert diffs[str(tmp_path / FILES["html"])]["after"].startswith("(HTML, ")
    assert str(tmp_path / FILES["prometheus"]) not in diffs  # summaries are not metrics


def test_formats_and_prometheus_file(run_action, tmp_path):
    dest, textfile = tmp_path / "out", tmp_path / "textfile"
    textfile.mkdir()
    result = run_action(args(dest, formats=["prometheus", "junit"], prometheus_file=str(textfile)))
    assert sorted(os.listdir(dest)) == ["gpufleet_hygiene.prom", "report.junit.xml"]
    assert os.listdir(textfile) == ["gpufleet_hygiene.prom"]  # no temporary file left behind
    assert (textfile / "gpufleet_hygiene.prom").read_text() == (dest / "gpufleet_hygiene.prom").read_text()
    assert stat.S_IMODE(os.stat(textfile / "gpufleet_hygiene.prom").st_mode) == 0o644
    assert [f["path"] for f in result["files"]][-1] == str(textfile / "gpufleet_hygiene.prom")
    named = tmp_path / "textfile" / "hygiene.prom"
    run_action(args(dest, formats=["prometheus"], prometheus_file=str(named)))
    parse_prometheus(named.read_text())


def test_prometheus_file_needs_the_format(run_action, tmp_path):
    result = run_action(args(tmp_path, formats=["json"], prometheus_file=str(tmp_path / "x.prom")))
    assert result["failed"] and "'prometheus' is not in formats" in result["msg"]


def _bad(mutate):
    hosts = realistic_fleet()
    mutate(hosts)
    return hosts


BAD = [
    (lambda h: h[1].pop("ready"), 'hosts[1] (host "train-a2"): ready is required'),
    (lambda h: h[1].update(ready="maybe"), 'hosts[1] (host "train-a2"): ready must be true or false, got "maybe"'),
    (lambda h: h[2].update(vmid="abc"), 'hosts[2] (host "train-a3"): vmid must be an integer, got "abc"'),
    (lambda h: h[0].pop("host"), "hosts[0]: host is required"),
    (lambda h: h[3].update(host=""), "hosts[3]: host is required"),
    (lambda h: h[4]["checks"][0].update(severity="error"), "hosts[4] (host \"train-b1\"): checks[0].severity must be 'fail' or 'warn', got \"error\""),
    (lambda h: h[4]["checks"][2].pop("ok"), 'hosts[4] (host "train-b1"): checks[2].ok is required'),
    (lambda h: h[5].update(checks="gpu_idle"), 'hosts[5] (host "train-b2"): checks must be a list, got str'),
    (lambda h: h[5].pop("checks"), 'hosts[5] (host "train-b2"): checks is required'),
    (lambda h: h[5]["checks"].append(dict(h[5]["checks"][0])), 'hosts[5] (host "train-b2"): checks[6].name "gpu_idle" appears twice'),
    (lambda h: h[2]["gpus"][1].update(index=0), 'hosts[2] (host "train-a3"): gpus[1].index 0 appears twice'),
    (lambda h: h[2]["gpus"][0]["processes"][0].update(pid=None), 'hosts[2] (host "train-a3"): gpus[0].processes[0].pid is required'),
    (lambda h: h[2]["gpus"][0].update(memory_used_mib=-1), 'hosts[2] (host "train-a3"): gpus[0].memory_used_mib must be >= 0, got -1'),
    (lambda h: h[0]["contaminants"][0].update(cuda_major="13x"), 'hosts[0] (host "train-a1"): contaminants[0].cuda_major must be an integer'),
    (lambda h: h[8]["caches"][0].update(fresh="stale"), 'hosts[8] (host "train-c1"): caches[0].fresh must be true or false'),
    (lambda h: h[2]["checks"][1]["throughput"].update(tokens_per_s="fast"),
     'hosts[2] (host "train-a3"): checks[1].throughput.tokens_per_s must be a number >= 0 or null, got "fast"'),
    (lambda h: h[2]["checks"][1].update(throughput=12800), 'hosts[2] (host "train-a3"): checks[1].throughput must be a dict, got int'),
    (lambda h: h[0].update(ready=True, running_job=[1]), 'hosts[0] (host "train-a1"): running_job must be true or false, got [1]'),
    (lambda h: h[1].update(host="x" * 257), "hosts[1]: host is longer than 256 characters (257)"),
    (lambda h: h[1]["checks"][0].update(summary="y" * 16385), 'hosts[1] (host "train-a2"): checks[0].summary is longer than 16384 characters'),
    (lambda h: h[6].update(gpus=["GPU0"]), 'hosts[6] (host "train-b3"): gpus[0] must be a dict, got str'),
]


def report_files(dest):
    """(JSON hosts by name, JUnit root, Prometheus families, HTML text) of a written report."""
    with open(os.path.join(dest, FILES["json"])) as f:
        rows = {h["host"]: h for h in json.load(f)["hosts"]}
    junit = ET.parse(os.path.join(dest, FILES["junit"])).getroot()
    with open(os.path.join(dest, FILES["prometheus"])) as f:
        fams = parse_prometheus(f.read())
    with open(os.path.join(dest, FILES["html"])) as f:
        page = f.read()
    return rows, junit, fams, page


def sample(fams, family, **labels):
    """The values of a family's samples whose labels include these."""
    return [v for lab, v in fams["gpufleet_hygiene_" + family]["samples"] if all(lab.get(k) == w for k, w in labels.items())]


def assert_unreadable_everywhere(dest, host, message, hosts):
    """The host is its "unreadable record" row in every format, the others are all reported."""
    rows, junit, fams, page = report_files(dest)
    assert len(rows) == len(hosts)
    row = rows[host]
    assert row["error"].startswith("unreadable record") and message in row["error"], row["error"]
    assert (row["ready"], row["checks"], row["gpus"]) == (False, [], [])
    [case] = [tc for tc in junit.iter("testcase") if tc.get("classname").endswith("." + host.replace(".", "_"))]
    assert message in case.find("error").get("message")
    assert sample(fams, "host_ready", host=host) == [0.0] and sample(fams, "host_error", host=host) == [1.0]
    parser = TagCollector()
    parser.feed(page)
    text = "".join(parser.text)
    assert message in text  # the page says it, as text
    assert "unreadable record" in text and "unreachable or unreadable" in text
    assert "unreachable: unreadable" not in text and "unreadable record: unreadable record" not in text
    return rows


@pytest.mark.parametrize("mutate,message", BAD)
def test_a_bad_record_is_its_host_s_unreadable_row(run_action, tmp_path, mutate, message):
    """A record that fails its check is reported as its host's "unreadable record" row, in every
    format, the other hosts as usual; never a crash, never a whole report refused."""
    hosts = _bad(mutate)
    result = run_action(args(tmp_path, records=hosts))
    assert not result.get("failed"), result.get("msg")
    assert "Traceback" not in json.dumps(result)
    assert [w for w in result["warnings"] if message in w], result["warnings"]
    named = re.match(r'^hosts\[(\d+)\](?: \(host "([^"]*)"\))?', message)
    host = named.group(2) or "hosts[%s]" % named.group(1)
    assert_unreadable_everywhere(tmp_path, host, message, hosts)
    assert host in result["not_ready"]


def test_two_records_of_one_host_are_an_error(run_action, tmp_path):
    result = run_action(args(tmp_path, records=_bad(lambda h: h.append(copy.deepcopy(h[0])))))
    assert result["failed"] is True
    assert 'hosts[12] (host "train-a1"): host appears twice (also hosts[0])' in result["msg"]
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------
# Hostile records: what a container's read (or a slice's file) can put in a record's GPU fields.

def promtool_check_metrics(text):
    """promtool check metrics (the set-up installs promtool: never skipped)."""
    path = shutil.which("promtool")
    assert path, "promtool missing: run scripts/setup-host.sh"
    return subprocess.run([path, "check", "metrics"], input=text, capture_output=True, text=True, timeout=120, check=False)


FORGED = 'gpufleet_hygiene_host_ready{host="train-101",node="pve9",vmid="101"} 1'


def _gpu_health_of(host):
    return next(c for c in host["checks"] if c["name"] == "gpu_healthy")["gpus"][0]


@pytest.mark.parametrize("field, forge, message", [
    ("xid_events", lambda g: g.update(xid_events={"79": "1\n" + FORGED}), "gpus[0].xid_events.79 must be an integer"),
    ("ecc", lambda g: g["ecc"].update(volatile_uncorrected="0\n" + FORGED), "gpus[0].ecc.volatile_uncorrected must be an integer"),
    ("xid code", lambda g: g.update(xid_events={'79"} 1\n' + FORGED + '\n#': 1}), "gpus[0].xid_events keys must be Xid codes"),
])
def test_a_record_cannot_forge_prometheus_samples(run_action, tmp_path, field, forge, message):
    """A container's record with text where the report writes a number: the Prometheus file holds
    no sample it did not make (promtool accepts the file, and no series of train-101 is in it), and
    the host is its unreadable record row."""
    hosts = realistic_fleet()
    forge(_gpu_health_of(hosts[1]))
    result = run_action(args(tmp_path, records=hosts))
    assert not result.get("failed"), result.get("msg")
    prom = tmp_path / FILES["prometheus"]
    check = promtool_check_metrics(prom.read_text())
    assert check.returncode == 0, check.stdout + check.stderr
    assert "train-101" not in prom.read_text()
    assert not [line for line in prom.read_text().splitlines() if line.startswith("gpufleet_hygiene_host_ready{") and line.endswith(" 1")
                and 'host="train-a2"' in line]
    assert_unreadable_everywhere(tmp_path, "train-a2", message, hosts)


@pytest.mark.parametrize("shape, message", [
    (lambda c: c["gpus"][0].update(findings=["xid_79 fell off the bus"]), "gpus[0].findings[0] must be a dict, got str"),
    (lambda c: c["gpus"][0].update(findings=[{"severity": "fail", "what": "fell off"}]), "gpus[0].findings[0].code is required"),
    (lambda c: c.update(findings=["driver mismatch"]), "checks[5].findings[0] must be a dict, got str"),
    (lambda c: c.update(findings=[{"code": "x", "severity": "grave"}]), "checks[5].findings[0].severity must be 'fail', 'warn' or 'info'"),
    (lambda c: c["gpus"][0].update(ecc=[0, 1]), "gpus[0].ecc must be a dict, got list"),
    (lambda c: c["gpus"][0].update(throttle="hw_slowdown"), "gpus[0].throttle must be a list of reasons, got str"),
    (lambda c: c["gpus"][0].update(healthy="very"), "gpus[0].healthy must be true or false"),
    (lambda c: c.update(driver="580"), "checks[5].driver must be a dict, got str"),
    (lambda c: c["gpus"][0]["mig"].update(instances=[{"gpu_instance_id": "1; 2"}]), "gpus[0].mig.instances[0].gpu_instance_id must be an integer"),
])
def test_gpu_health_of_the_wrong_shape_is_an_unreadable_row(run_action, tmp_path, shape, message):
    """Findings as strings or without a code, ecc as a list ...: a row, not a crash of the report."""
    hosts = realistic_fleet()
    shape(next(c for c in hosts[1]["checks"] if c["name"] == "gpu_healthy"))
    result = run_action(args(tmp_path, records=hosts))
    assert not result.get("failed"), result.get("msg")
    assert_unreadable_everywhere(tmp_path, "train-a2", message, hosts)


def test_only_the_gpu_health_fields_the_reports_know_are_kept(run_action, tmp_path):
    hosts = realistic_fleet()
    check = next(c for c in hosts[1]["checks"] if c["name"] == "gpu_healthy")
    check["gpus"][0].update(extra={"deep": [[[[1]]]]}, xid_events={"079": 2})
    check["gpus"][0]["ecc"]["volatile_uncorrected"] = "3"  # digits as text: taken as the number
    result = run_action(args(tmp_path, records=hosts))
    assert not result.get("failed"), result.get("msg")
    rows, _junit, fams, _page = report_files(tmp_path)
    gpu = _gpu_health_of(rows["train-a2"])
    assert "extra" not in gpu and gpu["xid_events"] == {"79": 2} and gpu["ecc"]["volatile_uncorrected"] == 3
    assert sample(fams, "gpu_xid_events", host="train-a2", xid="79") == [2.0]
    assert sample(fams, "gpu_ecc_uncorrected", host="train-a2", kind="volatile") == [3.0]


def test_bad_host_entry_type(run_action, tmp_path):
    host = {"host": "a", "ready": True, "running_job": False, "remediated": False, "checks": [], "gpus": ["GPU0"]}
    result = run_action(args(tmp_path, records=[host]))
    assert not result.get("failed"), result.get("msg")
    assert_unreadable_everywhere(tmp_path, "a", 'hosts[0] (host "a"): gpus[0] must be a dict, got str', [host])
    # A slice's file can hold anything in its hosts list (the task's own hosts are dicts).
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import normalize_hosts
    rows, warnings = normalize_hosts([host, "not a record", ["x"]])
    assert [r["error"] for r in rows if r["host"].startswith("hosts[")] == [
        "unreadable record: hosts[1]: must be a dict (one host's result), got str",
        "unreadable record: hosts[2]: must be a dict (one host's result), got list"]
    assert len(warnings) == 3


def test_bad_run_started_and_dest(run_action, tmp_path):
    result = run_action(args(tmp_path, run_started="last tuesday"))
    assert result["failed"] and "run_started must be an ISO 8601 timestamp" in result["msg"]
    afile = tmp_path / "file"
    afile.write_text("x")
    result = run_action(args(afile))
    assert result["failed"] and "exists and is not a directory" in result["msg"]


def test_lenient_types_and_unknown_keys(run_action, tmp_path):
    hosts = realistic_fleet()
    hosts[0].update(vmid="101", ready="false", node="", extra_key=1)
    result = run_action(args(tmp_path, records=hosts))
    assert not result.get("failed"), result.get("msg")
    assert any("unknown keys ignored: extra_key" in str(w) for w in result["warnings"]), result.get("warnings")

    with open(tmp_path / FILES["json"]) as f:
        h = [x for x in json.load(f)["hosts"] if x["host"] == "train-a1"][0]
    assert (h["vmid"], h["ready"], h["node"]) == (101, False, None)


def test_a_registered_record_carries_its_result_keys_without_warnings(run_action, tmp_path):
    # The verify role registers readiness's result as the record: Ansible's own result keys come along.
    hosts = copy.deepcopy(realistic_fleet())
    hosts[0].update(changed=False, failed=False, failed_when_result=False)
    hosts[1].update(changed=False, unreachable=True, msg="ssh: connect to host 192.0.2.1 port 22: No route to host")
    hosts[1]["extra_key"] = 1
    result = run_action(args(tmp_path, records=hosts))
    assert not result.get("failed"), result.get("msg")
    # "hosts[N] (host NAME): unknown keys ignored: K, ..."
    unknown = re.findall(r"(hosts\[\d+\] \(host [^)]*\)): unknown keys ignored: ([\w, ]+)", " ".join(str(w) for w in result.get("warnings", [])))
    assert ("hosts[1] (host %s)" % json.dumps(hosts[1]["host"]), "extra_key") in unknown, unknown
    assert not [keys for _where, keys in unknown if set(keys.split(", ")) & {"changed", "failed", "failed_when_result", "unreachable", "msg"}], unknown


class TagCollector(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text = [], [], []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if not self._in_script:
            self.text.append(data)


def test_hostile_input_is_escaped_everywhere(run_action, tmp_path):
    result = run_action(args(tmp_path, records=hostile_fleet()))
    assert not result.get("failed"), result.get("msg")
    page = (tmp_path / FILES["html"]).read_text()
    assert "<script>alert" not in page and "<img" not in page and "<b onmouseover" not in page and "<i>cupy" not in page
    parser = TagCollector()
    parser.feed(page)
    assert parser.tags.count("script") == 1  # ours only
    assert not [a[0] for a in parser.attrs if a[0].startswith("on")]
    text = "".join(parser.text)
    assert HOSTILE_NAME.split("\n", maxsplit=1)[0] in text
    assert "<img src=x onerror=alert(1)> held by \"evil\"" in text
    assert '<b onmouseover="alert(2)">python3</b>' in text
    # A strict XML parser takes the JUnit file; the control character became U+FFFD.
    root = ET.parse(tmp_path / FILES["junit"]).getroot()
    tc = root.find("testsuite/testcase")
    assert tc.get("classname") == "gpufleet.pve\"1\\." + HOSTILE_NAME.replace(".", "_").replace("\x01", "\ufffd")
    assert tc.find("failure").get("message") == '<img src=x onerror=alert(1)> held by "evil"'
    # Prometheus label values come back exactly.
    fams = parse_prometheus((tmp_path / FILES["prometheus"]).read_text())
    labels = fams["gpufleet_hygiene_host_ready"]["samples"][0][0]
    assert labels == {"host": HOSTILE_NAME, "node": 'pve"1\\', "vmid": "100"}
    with open(tmp_path / FILES["json"]) as f:
        assert json.load(f)["hosts"][0]["host"] == HOSTILE_NAME


def test_html_content(run_action, tmp_path):
    run_action(args(tmp_path))
    page = (tmp_path / FILES["html"]).read_text()
    parser = TagCollector()
    parser.feed(page)
    # self-contained: nothing fetched from anywhere
    for name, value in parser.attrs:
        if name in ("src", "href"):
            assert value in ("report.json", "report.junit.xml", "gpufleet_hygiene.prom"), value
    assert "http://" not in page and "https://" not in page and "<link" not in page
    assert "default-src 'none'" in page
    assert page.count('<tr class="h ') == 12
    assert page.count('<tr class="node ') == 3
    text = " ".join(parser.text)
    for label in ("ready", "not ready", "running jobs left alone", "remediated this run", "unreachable"):
        assert label in text
    assert "Run started 2025-06-01 03:00:00 UTC" in text
    assert "/opt/venv/bin/python3" in text and "61.2 / 140.4 GiB" in text
    # four failed checks, the unreachable host, the legend, the unhealthy GPU in the GPU health section
    assert page.count('class="cell fail"') == 4 + 1 + 1 + 1
    assert '<div class="tps low" title="train-a3: last reading 12800.0 tok/s in the job&#39;s log, 64% of the 20000 baseline' in page
    assert "<b>12,800</b><small>64% of 20,000</small>" in page and page.count('<td class="rate">') == 12
    assert 'class="stale"' in page and 'class="busy"' in page


PLAY = """
- name: The report as users write it
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Write the fleet report
      gpufleet.hygiene.fleet_report:
        records: "{{ fleet }}"
        dest: "{{ dest }}"
        title: Nightly GPU hygiene
        run_started: "{{ run_started }}"
      run_once: true
      register: report

    - name: The same run again, in check and diff mode
      gpufleet.hygiene.fleet_report:
        records: "{{ fleet }}"
        dest: "{{ dest }}"
        title: Nightly GPU hygiene
        run_started: "{{ run_started }}"
      check_mode: true
      diff: true
      register: again

    - name: Keep both results for the test
      ansible.builtin.copy:
        content: "{{ {'report': report, 'again': again} | to_json }}"
        dest: "{{ out }}"
        mode: "0644"
"""


def test_through_ansible_playbook(run_action, tmp_path):
    """The action as a playbook runs it: the same files, byte for byte, as the loaded action writes."""
    play, extra = tmp_path / "play.yml", tmp_path / "extra.json"
    play.write_text(PLAY)
    extra.write_text(json.dumps({"fleet": realistic_fleet(), "dest": str(tmp_path / "played"), "run_started": RUN_STARTED,
                                 "out": str(tmp_path / "out.json"), "ansible_python_interpreter": sys.executable}))
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(play), "-i", "localhost,",
                           "-c", "local", "-e", "@" + str(extra)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, check=False, timeout=120, env=dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = json.loads((tmp_path / "out.json").read_text())
    assert results["report"]["changed"] is True and results["report"]["not_ready"] == ["train-a1", "train-b1", "train-c1", "train-c4"]
    assert results["again"]["changed"] is False and "diff" not in results["again"]
    run_action(args(tmp_path / "loaded"))
    for name in FILES.values():
        assert (tmp_path / "played" / name).read_bytes() == (tmp_path / "loaded" / name).read_bytes(), name


def test_html_gpu_health_says_each_finding_and_what_to_do(run_action, tmp_path):
    """gpu_healthy's host findings (the driver against its pin) and a read that failed are listed;
    an info finding alone leaves the GPU healthy."""
    hosts = realistic_fleet()
    check = hosts[1]["checks"][5]
    check.update(ok=False, summary="driver 570.86.15, pinned 570.133.20", error="nvidia-smi -q -x: no <gpu> element",
                 driver={"version": "570.86.15", "pin": "570.133.20"},
                 findings=[{"code": "driver_pin", "severity": "fail", "what": "driver 570.86.15 is not the fleet's pin 570.133.20",
                            "action": "upgrade the node's driver, then reboot"}])
    check["gpus"][0]["findings"] = [{"code": "throttle_sw_power_cap", "severity": "info", "what": "power cap reached", "action": "none"}]
    run_action(args(tmp_path, records=hosts))
    page = (tmp_path / FILES["html"]).read_text()
    card = page[page.index("<h3>train-a2<span"):]
    card = card[:card.index("</div>\n<div class=\"hcard")]
    assert "driver 570.86.15 <span class=\"pinbad\">pinned 570.133.20</span>" in card
    assert '<div class="cell pass" title="train-a2 GPU0' in card  # info only: still healthy
    assert '<li class="fail"><span class="k">nvidia-smi -q -x: no &lt;gpu&gt; element</span></li>' in card
    assert ('<li class="fail"><span class="k">driver 570.86.15 is not the fleet&#39;s pin 570.133.20</span> '
            '<span class="act">→ upgrade the node&#39;s driver, then reboot</span></li>') in card
    assert '<li class="na"><span class="k">GPU0: power cap reached</span>' in card
    assert card.index('class="fail"><span class="k">driver') < card.index('class="na"')


def test_a_long_reason_is_reported_as_it_is():
    """A container whose read failed for a long reason (the node read's "2 containers with vmid 200
    run on this node (init PIDs ...)" runs past 256 characters) is shown with that reason, not with
    a complaint about its length."""
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import normalize_hosts

    why = ("container 200 is not running (2 containers with vmid 200 run on this node (init PIDs 4100, 5100): not read "
           "from the node, whose processes are whose cannot be told apart; a Proxmox VE node runs one container of each "
           "vmid) - start it (pct start 200), or take it out of the run")
    assert len(why) > 256
    [host], warnings = normalize_hosts([{"host": "train-200", "node": "pve1", "vmid": 200, "ready": False, "running_job": False,
                                         "remediated": False, "checks": [], "gpus": [], "contaminants": [], "caches": [],
                                         "error": why}])
    assert host["error"] == why and warnings == []


def test_a_failed_repair_is_said_in_every_format(run_action, tmp_path):
    """What hygiene records of a repair that failed (the repair role's repair_error): the host's row,
    JUnit's repair failure, the metric, the page's pill and what to do - escaped as any text."""
    records = realistic_fleet()
    why = "no reference CUDA: set expected_cuda <b>now</b>"
    [rec] = [r for r in records if r["host"] == "train-c1"]
    rec["repair_error"] = why
    result = run_action(args(tmp_path, records=records))
    assert result["summary"]["repair_failed"] == 1
    rows, junit, fams, page = report_files(tmp_path)
    assert rows["train-c1"]["repair_error"] == why and all(r["repair_error"] is None for h, r in rows.items() if h != "train-c1")
    [case] = [tc for tc in junit.iter("testcase") if tc.get("name") == "repair"]
    assert case.get("classname").endswith(".train-c1") and case.find("failure").get("message") == why
    assert sample(fams, "host_repair_failed", host="train-c1") == [1.0]
    assert sample(fams, "host_repair_failed", host="train-a2") == [0.0]
    assert "<b>now</b>" not in page and "&lt;b&gt;now&lt;/b&gt;" in page
    parser = TagCollector()
    parser.feed(page)
    text = "".join(parser.text)
    assert "repair failed" in text and "repair failed: " + why in text.replace("repair failed:\n", "repair failed: ")
    assert re.search(r"\b1\s*repairs failed", text), text  # the count on top
    assert "remediate.yml --limit train-c1,localhost --check --diff" in text


def test_a_long_repair_error_is_cut_not_refused(run_action, tmp_path):
    """An installer's output in the message must not make the record unreadable (which would hide
    the failure: no pill, host_repair_failed 0)."""
    records = realistic_fleet()
    long = "pip said: " + "x" * 40000
    [rec] = [r for r in records if r["host"] == "train-c1"]
    rec["repair_error"] = long
    run_action(args(tmp_path, records=records))
    rows, _junit, fams, _page = report_files(tmp_path)
    cut = rows["train-c1"]["repair_error"]
    assert rows["train-c1"]["error"] is None and len(cut) == 16384, rows["train-c1"]["error"]
    assert cut.startswith("pip said: xxx") and cut.endswith(" ... (%d more characters)" % (len(long) - 16384))
    assert sample(fams, "host_repair_failed", host="train-c1") == [1.0]


def test_hosts_is_records_under_its_old_name_for_one_release(tmp_path, run_action):
    """The option was named hosts before 0.3.0: a playbook still giving it writes the same report."""
    new = run_action(args(tmp_path / "new"))
    a = args(tmp_path / "old")
    a["hosts"] = a.pop("records")
    old = run_action(a)
    assert not old.get("failed") and old["summary"] == new["summary"], old
    with open(tmp_path / "old" / "report.json") as f, open(tmp_path / "new" / "report.json") as g:
        assert json.load(f)["hosts"] == json.load(g)["hosts"]
