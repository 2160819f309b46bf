# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The relaunch role's throughput gate judges only what the relaunched run wrote, on the
simulated fleet, with real processes in real containers.

On two containers the job's log (the inventory's, /var/log/gpufleet-train.log) first gets an
earlier run's readings: the training stand-in run until it has logged more readings than the
gate's window (skip 4 + 5 samples), then killed. The role then relaunches the job with settle
time 0; the new run (the same stand-in) compiles for 5 s and logs 4 warm-up steps at a quarter
of its rate before its rate. The gate runs about 2 s after the new run's first line (the role
waits for its ready line, then reads):

- **healthy**: the old run logged 12800 tokens/s, the new one logs 20000 (a line a second). The
  gate must pass, reading from the launch; judging the log's end (no ``since``) it would see the
  old run's slow readings and the new run's warm-up steps and fail.
- **slow**: the old run logged 20000 tokens/s, the new one logs 12800 (a line every 2 s),
  appended after those good lines. The gate must fail it (below 90 % of the 20000 baseline);
  without ``since`` the old good readings, the most of the log's last five, would pass it.

Both report ``read_from: {from: launch}``: the offset where the log stood when the role launched.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
import simfleet  # tests/lib, on pytest's pythonpath (pytest.ini)
from conftest import INVENTORY, REPO, STATE, VENV_BIN

PLAYBOOK = os.path.join(REPO, "tests", "integration", "targets", "relaunch_since", "relaunch.yml")
LOG = "/var/log/gpufleet-train.log"
JOB = re.compile(r"^\S*python3? /opt/gpufleet/train_dflash\.py")
WINDOW = 4 + 5  # the play's relaunch_throughput_skip + relaunch_throughput_samples
OLD_READINGS = 4 * WINDOW


class Container(object):
    def __init__(self, node, ct):
        self.name, self.vmid = ct["name"], ct["vmid"]
        self.device = "/dev/nvidia%d" % ct["gpus"][0]
        self.lxcpath = simfleet.lxcpath(STATE, node["name"])

    def sh(self, script, check=True):
        return simfleet.sh(self.lxcpath, self.vmid, script, check=check)

    def job(self, rate, *extra):
        return ["/usr/bin/python3", "/opt/gpufleet/train_dflash.py", "--state", "/opt/gpufleet/gpu", "--gpu", "0",
                "--device", self.device, "--mib", "40960", "--log-throughput", str(rate), *extra]

    def jobs(self):
        return sorted(pid for pid, cmd in simfleet.processes(self.lxcpath, self.vmid).items() if JOB.search(cmd))

    def readings(self):
        return re.findall(r"^step \d+ loss \S+ (\S+) tokens/s$", self.sh("cat %s 2>/dev/null || true" % LOG), re.MULTILINE)

    def old_run(self, rate):
        """An earlier run of the job: logs OLD_READINGS readings at rate into the job's log, then is killed."""
        argv = " ".join(self.job(rate, "--log-every", "0.05"))
        pid = int(self.sh("cd /root && setsid %s </dev/null >>%s 2>&1 & echo $!" % (argv, LOG)).strip())
        deadline = time.monotonic() + 60
        while len(self.readings()) < OLD_READINGS:
            assert time.monotonic() < deadline, "the old run's readings"
            time.sleep(0.2)
        self.sh("kill -9 %d" % pid)
        while pid in self.jobs():
            time.sleep(0.1)

    def used(self):
        out = self.sh("/opt/gpufleet/bin/nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
        return sum(int(v) for v in out.split())

    def clean(self, used_before):
        for pid in self.jobs():
            self.sh("kill -9 %d 2>/dev/null || true" % pid)
        self.sh("rm -f %s" % LOG)
        deadline = time.monotonic() + 60
        while self.used() > used_before and time.monotonic() < deadline:
            time.sleep(0.2)


class Streamed(object):
    """A run of an ansible CLI as an operator watches it: each line of its output with the time it came."""

    def __init__(self, argv, timeout=600):
        env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(["timeout", str(timeout), os.path.join(VENV_BIN, argv[0])] + argv[1:], cwd=REPO, env=env,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = []  # (seconds since the start, line)
        start = time.monotonic()
        for line in proc.stdout:
            self.lines.append((time.monotonic() - start, line.rstrip("\n")))
        self.returncode = proc.wait()
        self.stdout = "\n".join(line for _t, line in self.lines)


@pytest.fixture(scope="module")
def relaunched(fleet, tmp_path_factory):
    running = [(n, ct) for n in fleet["nodes"] for ct in n["containers"] if ct["running"] and ct["gpus"]]
    healthy, slow = Container(*running[0]), Container(*running[1])
    used_before = {c.name: c.used() for c in (healthy, slow)}
    work = tmp_path_factory.mktemp("relaunch-since")
    out = work / "out"
    out.mkdir()
    new_run = ("--compile-seconds", "5", "--warmup-steps", "4")
    hosts = {healthy.name: {"relaunch_since_command": healthy.job(20000, "--log-every", "1", *new_run)},
             slow.name: {"relaunch_since_command": slow.job(12800, "--log-every", "2", *new_run)}}
    extra = work / "relaunch.yml"
    extra.write_text(json.dumps({"all": {"hosts": hosts}}))
    try:
        for c in (healthy, slow):
            c.clean(used_before[c.name])
        healthy.old_run(12800)
        slow.old_run(20000)
        old = {c.name: len(c.readings()) for c in (healthy, slow)}
        res = Streamed(["ansible-playbook", "-i", INVENTORY, "-i", str(extra), PLAYBOOK,
                        "-e", "relaunch_since_hosts=%s,%s" % (healthy.name, slow.name), "-e", "relaunch_since_out=%s" % out])
        outcome = {}
        for c in (healthy, slow):
            path = out / ("%s.json" % c.name)
            outcome[c.name] = json.loads(path.read_text()) if path.exists() else None
        yield {"res": res, "lines": res.lines, "healthy": healthy.name, "slow": slow.name, "old": old, "outcome": outcome,
               "logs": {c.name: c.readings() for c in (healthy, slow)}}
    finally:
        for c in (healthy, slow):
            c.clean(used_before[c.name])


def test_the_log_holds_more_old_readings_than_the_gates_window(relaunched):
    assert relaunched["res"].returncode == 0, relaunched["res"].stdout[-6000:]
    for host in (relaunched["healthy"], relaunched["slow"]):
        assert relaunched["old"][host] >= OLD_READINGS > WINDOW


def test_a_healthy_relaunch_over_slow_old_readings_passes_reading_from_the_launch(relaunched):
    outcome = relaunched["outcome"][relaunched["healthy"]]
    assert outcome is not None, relaunched["res"].stdout[-6000:]
    assert outcome["failed"] is False, outcome
    gate = outcome["gate"]
    assert gate["passed"] is True and gate["read_from"]["from"] == "launch" and gate["read_from"]["offset"] > 0
    # the new run's own readings past its 4 warm-up steps, none of the old run's 12800
    assert gate["readings"] == [20000.0] * 5 and gate["median"] == 20000.0


def test_a_slow_relaunch_appended_after_good_readings_fails_at_the_gate(relaunched):
    outcome = relaunched["outcome"][relaunched["slow"]]
    assert outcome is not None, relaunched["res"].stdout[-6000:]
    assert outcome["failed"] is True and outcome["task"] == "Throughput gate", outcome
    assert re.search(r"throughput 12800 tok/s \(median of 5\) is below the floor of 18000 tok/s", outcome["msg"]), outcome["msg"]
    gate = outcome["gate"]
    assert gate["read_from"]["from"] == "launch" and gate["readings"] == [12800.0] * 5
    # the old run's good readings are still there, before the new run's
    log = relaunched["logs"][relaunched["slow"]]
    assert log[:relaunched["old"][relaunched["slow"]]] == ["20000"] * relaunched["old"][relaunched["slow"]]


def test_the_waits_say_what_they_have_read_at_least_every_15_s(relaunched):
    """At default verbosity, from the wait for the ready line to the end of the gate, the operator
    sees a line at least every 15 s: the slow run's gate (9 readings 2 s apart) prints what it has
    read so far while it waits, and the healthy run's pass prints its median, readings and floor."""
    lines = relaunched["lines"]
    first = next(i for i, (_t, line) in enumerate(lines) if line.startswith("TASK [gpufleet.hygiene.relaunch : The log says it runs]"))
    last = next(i for i, (_t, line) in enumerate(lines) if line.startswith("TASK [Write the outcome for the test]"))
    gaps = [(lines[i + 1][0] - lines[i][0], lines[i + 1][1]) for i in range(first, last)]
    assert max(g for g, _line in gaps) <= 15, "silent for %.1f s before: %s" % max(gaps)
    assert lines[last][0] - lines[first][0] > 15  # the waits were long enough to need it
    slow, healthy = relaunched["slow"], relaunched["healthy"]
    waiting = [line for _t, line in lines[first:last]
               if line.startswith("%s: waiting for 5 throughput readings of /var/log/gpufleet-train.log after skipping 4: " % slow)]
    assert waiting and re.search(r": [1-8] read so far \(last \d+ tok/s\), \d+s of 60s$", waiting[0]), "\n".join(waiting)
    assert any(re.match(r"%s: throughput 20000 tok/s \(median of 5 readings, 4 skipped\) against a floor of 18000 tok/s after "
                        % healthy, line) for _t, line in lines), relaunched["res"].stdout[-4000:]
