# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Remediate as a desired state, on a simulated fleet of its own.

One node, three containers of the `incident` scenario (privileged: the jobs run as the
containers' root, and the inventory names no job users, as in the seed): train-600 contaminated,
train-601 the stale run holding its GPU at 64% of the baseline, train-602 a stale cache. In order:

1. remediate repairs the three and relaunches their jobs; a second remediate right after, and its
   --check, report no change on any container, and every relaunched job keeps its PID;
2. preflight then names the inventory's own job holding the GPUs (pid, start, throughput) and
   what to do, instead of an anonymous holder;
3. root's worker left behind beside a running job (reparented, running the venv's interpreter,
   no job users in the inventory) is named a leftover by preflight and stopped by remediate, the
   job left running; a process of another user that runs the venv's interpreter is never one;
0. remediate --check --diff ends with its plan, one line per container;
4. a typo'd venv (-e gpufleet_venv=/opt/venv-typo) stops nothing: the run fails for that
   container naming the variable, and its job runs on with the same PID;
5. --tags and --skip-tags choose the repair's steps; a purge without the kill under a running job
   is refused; a clean container whose job is down has it started by the next remediate;
6. a relaunch that dies at once leaves the job down, the end of the run says so and how to start
   it again, and that command does.

The fleet: state $GPUFLEET_DESIRED_STATE (default /var/tmp/gpufleet-sim-desired), port
$GPUFLEET_DESIRED_PORT (default 2968), vmids 600-602.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import time

import pytest
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
STATE = os.path.abspath(os.environ.get("GPUFLEET_DESIRED_STATE", "/var/tmp/gpufleet-sim-desired"))
PORT = os.environ.get("GPUFLEET_DESIRED_PORT", "2968")
NODE = "pve1"
JOB = "/opt/gpufleet/train_dflash.py"
TOKEN = "gpufleetds" + secrets.token_hex(4)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("desired")
    with simfleet.running(STATE, nodes=1, containers=3, scenario="incident", inventory=work / "inventory", port=PORT,
                          extra=["--vmid-base", "600"]) as (info, env):
        info["env"] = dict(env, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
        info["inv"] = str(work / "inventory" / "fleet.yml")
        info["lxc"] = simfleet.lxcpath(STATE, NODE)
        info["cts"] = info["nodes"][0]["containers"]
        yield info


def playbook(fleet, name, *args):
    return subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", fleet["inv"], os.path.join("playbooks", name), *args],
                          cwd=REPO, env=fleet["env"], text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=900, check=False)


def recap(text):
    out = {}
    for m in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", text.split("PLAY RECAP")[-1],
                         re.MULTILINE):
        out[m.group(1)] = {"changed": int(m.group(3)), "unreachable": int(m.group(4)), "failed": int(m.group(5))}
    return out


def job_pids(fleet):
    """{container: sorted PIDs of the inventory's job} (its command line, as the patterns name it)."""
    out = {}
    for ct in fleet["cts"]:
        procs = simfleet.processes(fleet["lxc"], ct["vmid"])
        out[ct["name"]] = sorted(pid for pid, cmd in procs.items() if re.match(r"^\S*python3? %s" % re.escape(JOB), cmd))
    return out


def sh(fleet, ct, script):
    return simfleet.sh(fleet["lxc"], ct["vmid"], script)


def test_remediate_check_ends_with_its_plan_on_one_screen(fleet):
    """remediate --check --diff ends with one line per container that would change: the CUDA-13
    packages on the contaminated one, the stale run's PID on its, the stale cache on its, each
    with the job it would relaunch, within the run's last 40 lines."""
    holder = fleet["cts"][1]
    [stale] = job_pids(fleet)[holder["name"]]
    res = playbook(fleet, "remediate.yml", "--check", "--diff")
    assert res.returncode == 0, res.stdout[-4000:]
    tail = res.stdout.rstrip().splitlines()[-40:]
    assert "PLAN (check mode: nothing was changed): 3 of 3 container(s) would change" in tail, "\n".join(tail)
    lines = dict((line.split(":")[0].strip(), line) for line in tail if line.startswith("  train-"))
    print("\n".join(tail))  # shown by pytest -rP: the plan as users see it
    assert re.search(r"would remove [^;]*nvidia-nccl-cu13 2\.28\.9", lines["train-600"]) and "would relaunch `" in lines["train-600"], lines
    assert ("would stop pid %d " % stale) in lines["train-601"], lines
    assert "would clear inductor /tmp/torchinductor_root (" in lines["train-602"], lines
    assert job_pids(fleet)[holder["name"]] == [stale]  # --check: nothing stopped


def test_a_second_remediate_changes_nothing(fleet):
    first = playbook(fleet, "remediate.yml")
    assert first.returncode == 0, first.stdout[-6000:]
    assert all(r["changed"] > 0 for h, r in recap(first.stdout).items() if h.startswith("train-")), first.stdout[-3000:]
    pids = job_pids(fleet)
    assert all(len(p) == 1 for p in pids.values()), pids  # each container runs its relaunched job
    # The run ends with what it did on each container, the gate's verdict with it.
    tail = first.stdout.rstrip().splitlines()[-40:]
    print("\n".join(tail))
    assert "OUTCOME: 3 of 3 container(s) changed" in tail, "\n".join(tail)
    assert all(re.search(r"^  %s: .*relaunched `.*throughput [\d.]+ tok/s against a floor of [\d.]+ \(\d+ readings" % name, "\n".join(tail),
                         re.MULTILINE) for name in pids), "\n".join(tail)
    for args in (["--check"], []):
        again = playbook(fleet, "remediate.yml", *args)
        assert again.returncode == 0, again.stdout[-6000:]
        counts = recap(again.stdout)
        assert sorted(h for h in counts if h.startswith("train-")) == ["train-600", "train-601", "train-602"]
        assert all(r["changed"] == 0 and r["failed"] == 0 for r in counts.values()), (args, again.stdout[-4000:])
        assert job_pids(fleet) == pids, args


def test_preflight_names_the_inventory_s_own_job(fleet):
    res = playbook(fleet, "preflight.yml")
    assert res.returncode != 0
    for ct in fleet["cts"]:
        [pid] = job_pids(fleet)[ct["name"]]
        assert re.search(r"%s is not ready: .*\[gpu_idle\] held by the inventory's own job \(pid %d, started \d{4}-\d\d-\d\d "
                         r"\d\d:\d\d:\d\d UTC, last \d+ tok/s \(\d+%% of the \d+ baseline\)\): stop it first if a new run needs these GPUs, or let it run "
                         r"with -e gpufleet_allow_running_job=true" % (ct["name"], pid), res.stdout), res.stdout[-4000:]
    assert playbook(fleet, "preflight.yml", "-e", "gpufleet_allow_running_job=true").returncode == 0


def start(fleet, ct, argv, user=None):
    """A process of the container reparented to its init (setsid, the shell gone), as a worker a
    crashed job left behind; its PID there."""
    line = " ".join(argv)
    if user:
        line = "setpriv --reuid=%s --regid=%s --clear-groups %s" % (user, user, line)  # numeric ids: a group may lack the name
    pid = int(sh(fleet, ct, "setsid %s </dev/null >/dev/null 2>&1 & echo $!" % line).strip())
    time.sleep(2)  # its GPU claim written
    return pid


def test_root_s_worker_left_behind_is_a_leftover_by_default(fleet):
    """No job users in the inventory: root's worker (parent init, the venv's interpreter, holding the
    GPU) is the job's leftover, stopped beside the job, which keeps running; nobody's process
    running the same interpreter is not."""
    ct = fleet["cts"][2]
    [job] = job_pids(fleet)[ct["name"]]
    holder = ["/opt/venv/bin/python", "-u", JOB, "--state", "/opt/gpufleet/gpu", "--gpu", "0", "--device",
              "/dev/nvidia%d" % ct["gpus"][0], "--mib", "1024", "--tag"]
    worker = start(fleet, ct, holder + [TOKEN + "-worker"])
    try:
        res = playbook(fleet, "preflight.yml", "--limit", "%s,localhost" % ct["name"], "-e", "gpufleet_allow_running_job=true")
        assert res.returncode != 0
        assert re.search(r"\[job_live\] job running \(pid %d\).*1 GPU holder\(s\) left by a job that is gone \(parent is init\): "
                         r"pid %d " % (job, worker), res.stdout), res.stdout[-4000:]
        res = playbook(fleet, "remediate.yml", "--limit", "%s,localhost" % ct["name"])
        assert res.returncode == 0, res.stdout[-6000:]
        procs = simfleet.processes(fleet["lxc"], ct["vmid"])
        assert worker not in procs and job in procs, procs
        assert job_pids(fleet)[ct["name"]] == [job]
        assert recap(playbook(fleet, "remediate.yml", "--limit", "%s,localhost" % ct["name"]).stdout)[ct["name"]]["changed"] == 0
    finally:
        sh(fleet, ct, "kill -9 %d 2>/dev/null; true" % worker)
    # Another user's process running the venv's interpreter holding the GPU is never the job's leftover.
    # (The stand-in's claims are root's in a privileged container: nobody may write one too.)
    sh(fleet, ct, "chmod 1777 /opt/gpufleet/gpu/claims")
    theirs = start(fleet, ct, holder + [TOKEN + "-theirs"], user="65534")
    smi = sh(fleet, ct, "/opt/gpufleet/bin/nvidia-smi --query-compute-apps=pid --format=csv,noheader")
    assert theirs in simfleet.processes(fleet["lxc"], ct["vmid"]) and smi.strip(), smi
    try:
        res = playbook(fleet, "preflight.yml", "--limit", "%s,localhost" % ct["name"], "-e", "gpufleet_allow_running_job=true")
        line = next(x for x in res.stdout.splitlines() if "%s is not ready" % ct["name"] in x)
        assert re.search(r"held by pid \d+ python3, pid %d python$" % theirs, line) and "left by a job that is gone" not in line, line
    finally:
        sh(fleet, ct, "kill -9 %d 2>/dev/null; true" % theirs)


def test_a_typo_d_venv_stops_nothing(fleet):
    """The venv named wrong on a container whose job runs: the run fails there before anything is
    stopped, naming the variable; the job runs on, the same process."""
    ct = fleet["cts"][1]
    before = job_pids(fleet)[ct["name"]]
    assert before
    res = playbook(fleet, "remediate.yml", "--limit", "%s,localhost" % ct["name"], "-e", "gpufleet_venv=/opt/venv-typo")
    assert res.returncode != 0
    assert re.search(r"%s: nothing was stopped or changed: the job's configuration is wrong.*gpufleet_venv=/opt/venv-typo does "
                     r"not exist" % ct["name"], res.stdout), res.stdout[-4000:]
    assert recap(res.stdout)[ct["name"]]["changed"] == 0
    assert job_pids(fleet)[ct["name"]] == before


STALE_CACHE = ("mkdir -p /tmp/torchinductor_root/fxgraph/zz && echo stale > /tmp/torchinductor_root/fxgraph/zz/entry && "
               "rm -f /tmp/torchinductor_root/.gpufleet-hygiene-fingerprint.json")


def test_each_step_can_be_chosen_with_tags_and_a_job_down_is_started(fleet):
    """--tags and --skip-tags choose the repair's steps (kill, purge, verify, relaunch); a purge
    chosen without the kill under a running job is refused before anything changes. A clean host
    whose job is down differs from the desired state: the next remediate starts the job."""
    ct = fleet["cts"][1]
    [job] = job_pids(fleet)[ct["name"]]
    sh(fleet, ct, STALE_CACHE)
    limit = ("--limit", "%s,localhost" % ct["name"])
    res = playbook(fleet, "remediate.yml", *limit, "--tags", "purge")
    assert res.returncode != 0
    assert ("%s: its job is running and the kill step was not selected (--tags, --skip-tags)" % ct["name"]) in res.stdout, \
        res.stdout[-4000:]
    assert job_pids(fleet)[ct["name"]] == [job] and sh(fleet, ct, "cat /tmp/torchinductor_root/fxgraph/zz/entry").strip() == "stale"

    res = playbook(fleet, "remediate.yml", *limit, "--skip-tags", "relaunch")
    assert res.returncode == 0, res.stdout[-6000:]
    assert job_pids(fleet)[ct["name"]] == []  # stopped, not relaunched
    assert "fxgraph" not in sh(fleet, ct, "ls /tmp/torchinductor_root")
    line = next(x for x in res.stdout.splitlines() if x.startswith("  %s: " % ct["name"]))
    assert "stopped pid %d " % job in line and "cleared inductor /tmp/torchinductor_root" in line and "relaunched" not in line, line

    res = playbook(fleet, "remediate.yml", *limit)
    assert res.returncode == 0, res.stdout[-6000:]
    [started] = job_pids(fleet)[ct["name"]]
    line = next(x for x in res.stdout.splitlines() if x.startswith("  %s: " % ct["name"]))
    assert "relaunched `" in line and "stopped" not in line and "cleared" not in line, line
    again = playbook(fleet, "remediate.yml", *limit)
    assert recap(again.stdout)[ct["name"]]["changed"] == 0 and job_pids(fleet)[ct["name"]] == [started]


def test_a_job_the_repair_left_down_is_named_at_the_end(fleet):
    """A repair that fails after it stopped the job (here its relaunch: the command the inventory
    now gives dies at once) ends the run saying which job is down, why, and how to start it again.
    Last: it leaves that container's job down."""
    import json

    ct = fleet["cts"][0]
    assert job_pids(fleet)[ct["name"]]
    # Not ready again: an Inductor cache with no record of what built it.
    sh(fleet, ct, STALE_CACHE)
    job = {"command": ["/bin/false"], "workdir": "/root", "env": {}, "method": "setsid", "log": "/var/log/gpufleet-train.log",
           "patterns": [r"^\S*python3? /opt/gpufleet/train_dflash\.py"], "users": [], "ready_regex": r"^step \d+ loss",
           "baseline_tokens_per_s": 20000}
    res = playbook(fleet, "remediate.yml", "--limit", "%s,localhost" % ct["name"], "-e", json.dumps({"gpufleet_job": job}))
    assert res.returncode != 0
    assert job_pids(fleet)[ct["name"]] == []
    tail = res.stdout.split("PLAY RECAP")[-1]
    assert "JOBS DOWN: the repair of 1 container(s) failed after it stopped their job, which is not running now:" in tail, tail
    assert re.search(r"  %s: .+ - once fixed, start it again with: ansible-playbook remediate.yml --limit %s,localhost"
                     % (ct["name"], ct["name"]), tail), tail
    # The command it gives does: with the inventory's own job again, remediate starts the job that is down.
    again = playbook(fleet, "remediate.yml", "--limit", "%s,localhost" % ct["name"])
    assert again.returncode == 0, again.stdout[-6000:]
    assert len(job_pids(fleet)[ct["name"]]) == 1
