# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_report: the job_libraries check in every format, real files written and parsed back."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

from fleet_sample import RUN_STARTED, realistic_fleet
from test_fleet_report import FILES, assert_unreadable_everywhere, parse_prometheus, run_fleet_report

NCCL = "/root/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2"
WRONG = {"pid": 1731, "comm": "python3", "path": NCCL, "package": "nvidia-nccl-cu13", "package_version": "2.28.9",
         "cuda_major": 13, "deleted": False, "reasons": ["CUDA 13, torch is CUDA 12.8"]}


def fleet():
    """The sample fleet, its first host's job running on the cu13 NCCL, its second's clean."""
    hosts = realistic_fleet()
    hosts[0]["checks"].append({"name": "job_libraries", "severity": "fail", "ok": False, "error": False, "libraries": [WRONG],
                               "summary": "1 wrong library mapped by the running job: ...; stop the job"})
    hosts[0]["ready"] = False
    hosts[1]["checks"].append({"name": "job_libraries", "severity": "fail", "ok": True, "error": False, "libraries": [],
                               "summary": "1 process(es) map 9 CUDA-side libraries, all for CUDA 12.8 from the venv"})
    return hosts


def test_every_format_carries_the_wrong_libraries(tmp_path):
    hosts = fleet()
    run_fleet_report(dict(records=hosts, dest=str(tmp_path), title="t", run_started=RUN_STARTED))
    with open(os.path.join(tmp_path, FILES["json"])) as f:
        data = json.load(f)
    assert data["checks"][:3] == ["gpu_idle", "job_live", "job_libraries"]
    by_host = {h["host"]: h for h in data["hosts"]}
    check = next(c for c in by_host[hosts[0]["host"]]["checks"] if c["name"] == "job_libraries")
    assert check["ok"] is False and check["libraries"] == [WRONG]
    assert next(c for c in by_host[hosts[1]["host"]]["checks"] if c["name"] == "job_libraries")["libraries"] == []

    suite = ET.parse(os.path.join(tmp_path, FILES["junit"])).getroot().find("testsuite")
    failure = next(tc for tc in suite.findall("testcase")
                   if tc.get("name") == "job_libraries" and tc.get("classname").endswith(hosts[0]["host"])).find("failure")
    assert failure.text.endswith("\npid 1731 python3: %s (nvidia-nccl-cu13 2.28.9): CUDA 13, torch is CUDA 12.8" % NCCL)

    with open(os.path.join(tmp_path, FILES["prometheus"])) as f:
        fams = parse_prometheus(f.read())
    wrong = {s[0]["host"]: s[1] for s in fams["gpufleet_hygiene_job_libraries_wrong"]["samples"]}
    assert wrong == {hosts[0]["host"]: 1.0, hosts[1]["host"]: 0.0}
    ok = {s[0]["host"]: s[1] for s in fams["gpufleet_hygiene_check_ok"]["samples"] if s[0]["check"] == "job_libraries"}
    assert ok == {hosts[0]["host"]: 0.0, hosts[1]["host"]: 1.0}

    with open(os.path.join(tmp_path, FILES["html"])) as f:
        page = f.read()
    assert "<th>job libraries</th>" in page


def test_a_wrong_library_entry_is_its_host_s_unreadable_row(tmp_path):
    """A library entry of the wrong shape (a pid that is no number) makes that host's record
    unreadable, named by the field, in every format; the other hosts are reported as usual."""
    hosts = fleet()
    hosts[0]["checks"][-1]["libraries"] = [dict(WRONG, pid="x")]
    result = run_fleet_report(dict(records=hosts, dest=str(tmp_path), title="t", run_started=RUN_STARTED))
    assert not result.get("failed"), result.get("msg")
    message = 'checks[%d].libraries[0].pid must be an integer' % (len(hosts[0]["checks"]) - 1)
    assert [w for w in result["warnings"] if message in w], result["warnings"]
    assert_unreadable_everywhere(str(tmp_path), hosts[0]["host"], message, hosts)
