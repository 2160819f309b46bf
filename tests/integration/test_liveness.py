# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job_live over the session's simulated fleet, with real processes in real containers.

Two containers, set up once, then preflight, hygiene and remediate run over both:

- **stalled**: the fleet's job, started and then stopped with SIGSTOP, so that its log no longer
  grows. Preflight and hygiene report it stalled (hygiene's JSON report too) and hygiene leaves
  it alone; remediate with running jobs allowed and ``gpufleet_repair_stalled`` stops it and
  relaunches the job, whose ready line and readings are its own, not the stopped run's.
- **beside**: the fleet's job, healthy, and a GPU worker of another job whose parent was killed
  (reparented to the container's init). Preflight and hygiene report the worker as a leftover and
  hygiene leaves it; remediate with running jobs allowed stops it by its PID and start time. The
  healthy job is never touched: its PID and start time are the same after every run.

The job's log is the inventory's (``/var/log/gpufleet-train.log``); ``gpufleet_stall_after`` is
3 seconds here, so that the stopped job is stalled within the test and the healthy one, which
logs every half second, is not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time

import pytest
import simfleet  # tests/lib, on pytest's pythonpath (pytest.ini)
from conftest import INVENTORY, REPO, STATE

PLAYBOOKS = os.path.join(REPO, "playbooks")
LOG = "/var/log/gpufleet-train.log"
STALL_AFTER = 3
WORKER_MIB = 4096
# Another job's launcher: starts its GPU worker and says which PID it has.
LAUNCHER = ("import subprocess, sys, time\n"
            "p = subprocess.Popen(sys.argv[1:])\n"
            "open('/root/liveness-pids', 'w').write(str(p.pid))\n"
            "time.sleep(10 ** 7)\n")


class Container(object):
    """One running container of the fleet, looked into through lxc-attach."""

    def __init__(self, node, ct):
        self.node, self.name, self.vmid = node["name"], ct["name"], ct["vmid"]
        self.device = "/dev/nvidia%d" % ct["gpus"][0]
        self.lxcpath = simfleet.lxcpath(STATE, self.node)

    def sh(self, script, check=True):
        return simfleet.sh(self.lxcpath, self.vmid, script, check=check)

    def stat(self, pid):
        """(state, ppid, start time) of a PID in the container, or None when it is gone."""
        out = self.sh("cat /proc/%d/stat 2>/dev/null || true" % pid)
        if not out.strip():
            return None
        fields = out.rsplit(")", 1)[1].split()
        return None if fields[0] == "Z" else (fields[0], int(fields[1]), int(fields[19]))

    def start(self, argv, out="/dev/null"):
        """Start argv detached (its parent the container's init, as a launcher leaves it); its PID."""
        quoted = " ".join(shlex.quote(a) for a in argv)
        return int(self.sh("cd /root && setsid %s </dev/null >>%s 2>&1 & echo $!" % (quoted, out)).strip())

    def start_job(self):
        """The fleet's job as the inventory describes it, appending to its log."""
        pid = self.start(["/usr/bin/python3", "/opt/gpufleet/train_dflash.py", "--state", "/opt/gpufleet/gpu", "--gpu", "0",
                          "--device", self.device, "--mib", "40960", "--log-throughput", "20000", "--log-every", "0.5",
                          "--compile-seconds", "1"], out=LOG)
        self.wait(lambda: "tokens/s" in self.sh("cat %s 2>/dev/null || true" % LOG), "the job's first reading")
        return pid

    def jobs(self):
        """PIDs of the processes the inventory's job patterns match."""
        rx = re.compile(r"^\S*python3? /opt/gpufleet/train_dflash\.py")
        return sorted(pid for pid, cmd in simfleet.processes(self.lxcpath, self.vmid).items() if rx.search(cmd))

    @staticmethod
    def wait(ok, what, seconds=30):
        deadline = time.monotonic() + seconds
        while not ok():
            assert time.monotonic() < deadline, "timed out waiting for %s" % what
            time.sleep(0.2)

    def gpu_used(self):
        """MiB used on the container's GPUs, as its nvidia-smi reports them."""
        out = self.sh("/opt/gpufleet/bin/nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
        return sum(int(v) for v in out.split())

    def clean(self, used_before):
        """Leave the container as the fleet made it: no job, no tmux server, no job log, and its
        GPU memory back to what it was (the driver frees it a moment after a holder dies, and the
        next test's reads must not see it still held)."""
        for pid in self.jobs() + [int(p) for p in self.sh("cat /root/liveness-pids 2>/dev/null || true").split()]:
            self.sh("kill -9 %d 2>/dev/null || true" % pid)
        self.sh("tmux kill-server 2>/dev/null || true; rm -f %s /root/liveness-pids" % LOG)
        self.wait(lambda: self.gpu_used() <= used_before, "the GPU memory of %s released" % self.name)


def _flat(text):
    """Output with the YAML callback's wrapping and quoting undone."""
    return " ".join(text.split()).replace("''", "'")


@pytest.fixture(scope="module")
def scene(fleet, ansible_cli, tmp_path_factory):
    running = [(n, ct) for n in fleet["nodes"] for ct in n["containers"] if ct["running"] and ct["gpus"]]
    stalled, beside = Container(*running[0]), Container(*running[1])
    work = tmp_path_factory.mktemp("liveness")
    extra = work / "expect-cuda.yml"  # this fleet's venvs hold no torch: the CUDA they are held to
    extra.write_text(json.dumps({"all": {"hosts": {c.name: {"gpufleet_expected_cuda": "12.8"} for c in (stalled, beside)}}}))
    seen = {"stalled": stalled, "beside": beside}
    used_before = {c.name: c.gpu_used() for c in (stalled, beside)}

    def playbook(name, *args):
        return ansible_cli("ansible-playbook", "-i", INVENTORY, "-i", str(extra), os.path.join(PLAYBOOKS, name),
                           "--limit", "%s,%s,localhost" % (stalled.name, beside.name),
                           "-e", "gpufleet_stall_after=%d" % STALL_AFTER, *args)

    try:
        # The stalled job: it logged, then stopped (SIGSTOP) and its log ages past stall_after.
        seen["stalled_pid"] = stalled.start_job()
        stalled.sh("kill -STOP %d" % seen["stalled_pid"])
        seen["stalled_at"] = stalled.stat(seen["stalled_pid"])
        seen["log_before"] = stalled.sh("cat %s" % LOG)
        # Beside a healthy job: a GPU worker (its command line matches no job pattern) whose job is killed.
        seen["job_pid"] = beside.start_job()
        seen["job_at"] = beside.stat(seen["job_pid"])
        parent = beside.start(["/usr/bin/python3", "-c", LAUNCHER, "/usr/bin/python3", "-u", "/opt/gpufleet/train_dflash.py",
                               "--state", "/opt/gpufleet/gpu", "--gpu", "0", "--device", beside.device, "--mib", str(WORKER_MIB),
                               "--tag", "dataloader-worker"])
        beside.wait(lambda: beside.sh("cat /root/liveness-pids 2>/dev/null || true").strip(), "the worker")
        seen["worker_pid"] = int(beside.sh("cat /root/liveness-pids"))
        beside.wait(lambda: beside.sh("test -e /opt/gpufleet/gpu/claims/%d.json && echo y || true" % seen["worker_pid"]).strip(),
                    "the worker's GPU claim")
        beside.sh("kill -9 %d" % parent)
        beside.wait(lambda: (beside.stat(seen["worker_pid"]) or ("", 0))[1] == 1, "the worker reparented to init")
        seen["worker_at"] = beside.stat(seen["worker_pid"])
        time.sleep(STALL_AFTER + 1)

        seen["preflight"] = playbook("preflight.yml")

        report = work / "report"
        seen["hygiene"] = playbook("hygiene.yml", "-e", "gpufleet_report_dir=%s" % report)
        with open(report / "report.json") as f:
            seen["report"] = {h["host"]: h for h in json.load(f)["hosts"]}
        seen["after_hygiene"] = {"stalled": stalled.stat(seen["stalled_pid"]), "job": beside.stat(seen["job_pid"]),
                                 "worker": beside.stat(seen["worker_pid"])}

        seen["log_at_remediate"] = len(stalled.sh("cat %s" % LOG).encode())
        seen["remediate"] = playbook("remediate.yml", "-e", "gpufleet_allow_running_job=true",
                                     "-e", "gpufleet_repair_stalled=true")
        seen["after_remediate"] = {"stalled": stalled.stat(seen["stalled_pid"]), "job": beside.stat(seen["job_pid"]),
                                   "worker": beside.stat(seen["worker_pid"]), "relaunched": stalled.jobs(),
                                   "jobs_beside": beside.jobs(), "log": stalled.sh("cat %s" % LOG)}
        yield seen
    finally:
        for c in (stalled, beside):
            c.clean(used_before[c.name])


def test_preflight_reports_the_stalled_job_and_the_leftover(scene):
    res = scene["preflight"]
    assert res.returncode == 2, res.stdout[-4000:]
    flat = _flat(res.stdout)
    assert re.search(r"%s - NOT READY: .*\[job_live\] job \(pid %d\) stalled: its log %s has not grown for \d+s \(stall_after %ds\)"
                     % (scene["stalled"].name, scene["stalled_pid"], LOG, STALL_AFTER), flat), flat[-4000:]
    assert re.search(r"%s - NOT READY: .*\[job_live\] job running \(pid %d\).*1 GPU holder\(s\) left by a job that is gone "
                     r"\(parent is init\): pid %d " % (scene["beside"].name, scene["job_pid"], scene["worker_pid"]), flat), flat[-4000:]


def test_hygiene_reports_both_in_its_json_report_and_touches_neither_job(scene):
    res = scene["hygiene"]
    assert res.returncode == 0, res.stdout[-4000:]
    stalled = {c["name"]: c for c in scene["report"][scene["stalled"].name]["checks"]}["job_live"]
    assert stalled["ok"] is False and not stalled.get("error"), stalled
    assert re.match(r"job \(pid %d\) stalled: its log %s has not grown for \d+s" % (scene["stalled_pid"], LOG),
                    stalled["summary"]), stalled
    beside = {c["name"]: c for c in scene["report"][scene["beside"].name]["checks"]}["job_live"]
    assert beside["ok"] is False and not beside.get("error"), beside
    assert beside["summary"].startswith("job running (pid %d)" % scene["job_pid"]), beside
    assert "left by a job that is gone (parent is init): pid %d " % scene["worker_pid"] in beside["summary"], beside
    # The running job's last tok/s reading in its log, against the inventory's baseline.
    assert beside["throughput"] == {"tokens_per_s": 20000.0, "baseline": 20000.0, "ratio": 1.0}, beside
    assert not scene["report"][scene["stalled"].name]["remediated"] and not scene["report"][scene["beside"].name]["remediated"]
    # Nothing was signalled: the stalled job is still the same process, still stopped; the healthy
    # job and the leftover beside it run on (a leftover beside a running job is reported only).
    after = scene["after_hygiene"]
    assert after["stalled"] == scene["stalled_at"] and after["stalled"][0] == "T"
    assert after["job"][2] == scene["job_at"][2] and after["job"][0] != "T"
    assert after["worker"] == scene["worker_at"]


def test_remediate_stops_the_stalled_job_and_relaunches_it(scene):
    res = scene["remediate"]
    assert res.returncode == 0, res.stdout[-6000:]
    after = scene["after_remediate"]
    assert after["stalled"] is None, "the stalled job is gone"
    [new] = after["relaunched"]
    assert new != scene["stalled_pid"]
    # The relaunched run logged past where the stopped run had left the log: its own ready line and readings.
    fresh = after["log"].encode()[scene["log_at_remediate"]:].decode()
    assert re.search(r"^step \d+ loss .* 20000 tokens/s$", fresh, re.MULTILINE), fresh[-2000:]
    assert "Throughput gate" in res.stdout


def test_remediate_stops_the_leftover_and_never_the_healthy_job(scene):
    after = scene["after_remediate"]
    assert after["worker"] is None, "the leftover is gone"
    assert after["job"] is not None and after["job"][2] == scene["job_at"][2], "the healthy job is the same process"
    assert after["jobs_beside"] == [scene["job_pid"]]
    assert "TASK [gpufleet.hygiene.repair : Stop the GPU holders whose job is gone]" in scene["remediate"].stdout
