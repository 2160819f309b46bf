# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Faults injected for real into a remediate run on the simulated fleet.

One fleet for the module (2 nodes x 2 containers, scenario `incident`): train-100 holds the
CUDA-13 contamination, train-101 a stale Inductor cache, train-200 a stale training process
holding its GPU, train-201 is healthy with a decoy process and file. Three runs of
`playbooks/remediate.yml` over the whole fleet inject the faults, several at once on
different hosts (module fixtures `outage`, `gpu_faults`, `contention`); each fault has its
own test of that run and of the re-run, which checks:

- the run finishes for the rest of the fleet (their recap),
- the affected host's message says what happened and what to do,
- nothing outside the asked scope is touched (the other containers' processes, packages
  and decoys, and on the affected host what the failed step must not have changed),
- a re-run after the fault is removed completes the work.

The faults: a node's sshd killed mid-run, a container stopped mid-run, nvidia-smi hanging
and exiting 15 (the nvidia-smi STAND-IN's fault modes), a holder ignoring SIGTERM, a holder
stuck in the kernel (a real process in state D: frozen in a cgroup-v1 freezer, which
SIGKILL cannot end until it is thawed, as a process stuck in a GPU driver), an uninstall
failing half-way (an immutable file), two remediate runs on one container at once, a PID
reused between listing and signalling (a real reused PID in a PID namespace), and the
container's /run and /tmp full (tmpfs filled to ENOSPC).

Needs root, and the cgroup-v1 freezer at /sys/fs/cgroup/freezer (the state-D holder). Own
fleet: $GPUFLEET_FAULTS_STATE (default /var/tmp/gpufleet-sim-faults) and $GPUFLEET_FAULTS_PORT
(default 2850), so it runs beside the suite's other fleets.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import subprocess
import sys
import threading
import time

import cuda_fixtures  # tests/lib, on pytest's pythonpath (pytest.ini)
import pytest
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

STATE = os.path.abspath(os.environ.get("GPUFLEET_FAULTS_STATE", "/var/tmp/gpufleet-sim-faults"))
PORT = os.environ.get("GPUFLEET_FAULTS_PORT", "2850")
FLEET = os.path.join(REPO, "tests", "sim", "fleet")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
HOSTS = ("train-100", "train-101", "train-200", "train-201")
LOCK = "/run/gpufleet-hygiene.lock"
SMI = "/opt/gpufleet/bin/nvidia-smi"
JOB_RE = re.compile(r"^\S*python3? /opt/gpufleet/(train_dflash\.py|train-standin)")
# Quick settings for every run: short grace and drain (the holders here exit at once or never),
# no settling pause after the launch (the relaunch role waits for the GPU and the log anyway).
# One batch and no failure budget: the faults hit several hosts of one run at once, and the run must
# finish for the rest (remediate.yml's rolling defaults are tested in test_rolling.py).
QUICK = ["-e", "kill_grace_period=2", "-e", "kill_drain_timeout=15", "-e", "relaunch_settle_seconds=0",
         "-e", "gpufleet_batch=100%", "-e", "gpufleet_max_fail_percentage=100"]
FAULTS = []  # (test, fault) pairs, counted for docs/reliability.md


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("faults")
    with simfleet.running(STATE, nodes=2, containers=2, scenario="incident", inventory=work / "inventory", port=PORT,
                          timeout=300) as (info, env):
        try:
            cts = {}
            for node in info["nodes"]:
                for ct in node["containers"]:
                    cts[ct["name"]] = dict(ct, node=node["name"])
            yield {"env": env, "inventory": str(work / "inventory" / "fleet.yml"), "cts": cts, "work": work}
        finally:  # a frozen holder is thawed first, or the fleet cannot stop its container
            for frozen in glob.glob("/sys/fs/cgroup/freezer/**/gpufleet-faults-stuck", recursive=True):
                _write(os.path.join(frozen, "freezer.state"), "THAWED")


# ------------------------------------------------------------------------------ helpers


def _read(path):
    with open(path) as f:
        return f.read()


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def lxcpath(fleet, host):
    return os.path.join(STATE, "nodes", fleet["cts"][host]["node"], "lxc")


def rootfs(fleet, host):
    return os.path.join(lxcpath(fleet, host), str(fleet["cts"][host]["vmid"]), "rootfs")


def sh(fleet, host, script, check=True, timeout=60):
    return simfleet.sh(lxcpath(fleet, host), fleet["cts"][host]["vmid"], script, check=check, timeout=timeout)


def processes(fleet, host):
    return simfleet.processes(lxcpath(fleet, host), fleet["cts"][host]["vmid"])


def jobs(fleet, host):
    return {pid: cmd for pid, cmd in processes(fleet, host).items() if JOB_RE.search(cmd)}


def packages(fleet, host):
    site = glob.glob(os.path.join(rootfs(fleet, host), "opt", "venv", "lib", "python3*", "site-packages"))[0]
    return sorted(n for n in os.listdir(site) if n.endswith(".dist-info"))


def _dist(name, version):
    return "%s-%s.dist-info" % (re.sub(r"[-_.]+", "_", name).lower(), version)


def contaminants(fleet, host):
    """The seed's CUDA-13 packages and leftovers still installed in the container's venv."""
    have = set(packages(fleet, host))
    return sorted(_dist(n, v) for n, v in cuda_fixtures.SEED_ADDED if _dist(n, v) in have)


def snapshot(fleet, hosts):
    """What must not change on hosts outside a fault's scope: processes, packages, decoy file."""
    snap = {}
    for host in hosts:
        decoy = os.path.join(rootfs(fleet, host), "root", "decoy-notes.txt")
        snap[host] = {
            "processes": processes(fleet, host),
            "packages": packages(fleet, host),
            "decoy": _read(decoy) if os.path.exists(decoy) else None,
        }
    return snap


def lock_of(fleet, host):
    """The host lock in the container's /run (a tmpfs, as in a real container), or None."""
    text = sh(fleet, host, "cat %s 2>/dev/null || true" % LOCK)
    return json.loads(text) if text.strip() else None


def standin_config(path, **changes):
    """Change an nvidia-smi STAND-IN's configuration file (its fault modes); None removes a key."""
    with open(path) as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    _write(path + ".tmp", json.dumps(config))
    os.replace(path + ".tmp", path)


def gpu_config(fleet, host, **changes):
    """Change the container's nvidia-smi STAND-IN configuration (its fault modes)."""
    standin_config(os.path.join(rootfs(fleet, host), "opt", "gpufleet", "gpu", "config.json"), **changes)


def node_gpu_config(fleet, host, **changes):
    """Change the nvidia-smi STAND-IN configuration of the host's node (its fault modes): the
    node read runs the node's nvidia-smi once for all its containers, never theirs."""
    standin_config(os.path.join(STATE, "nodes", fleet["cts"][host]["node"], "gpu", "config.json"), **changes)


def node_standins():
    """The node nvidia-smi stand-ins of this fleet still running (a hung one must have been killed)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                cmdline = _read("/proc/%s/cmdline" % entry).replace("\0", " ")
                if os.path.join(STATE, "standins", "nvidia_smi.py") in cmdline:
                    found.append(cmdline)
    return found


def start_stale(fleet, host, *extra):
    """A stale training stand-in holding the container's GPU (40960 MiB), outside any tmux session,
    appending the seed's slow readings (12800 tokens/s, 64% of the baseline) to the job's log: a run
    that is not the job the inventory describes, which remediate stops (one at its pace it keeps)."""
    ct = fleet["cts"][host]
    before = set(jobs(fleet, host))
    argv = ["/usr/bin/python3", "/opt/gpufleet/train_dflash.py", "--state", "/opt/gpufleet/gpu", "--gpu", "0",
            "--device", "/dev/nvidia%d" % ct["gpus"][0], "--mib", "40960", "--log-throughput", "12800", "--log-every", "0.5",
            "--compile-seconds", "0", "--tag", "stale"] + list(extra)
    subprocess.run(["lxc-attach", "-n", str(ct["vmid"]), "-P", lxcpath(fleet, host), "--", "/bin/sh", "-c",
                    'setsid "$@" </dev/null >>/var/log/gpufleet-train.log 2>&1 &', "sh"] + argv, check=True, timeout=30)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        new = set(jobs(fleet, host)) - before
        claims = os.path.join(rootfs(fleet, host), "opt", "gpufleet", "gpu", "claims")
        log = os.path.join(rootfs(fleet, host), "var", "log", "gpufleet-train.log")
        # Its claim written and its slow reading the log's last (the read judges the last one).
        if new and any(n.startswith("%d." % p) for p in new for n in os.listdir(claims)) and _last_rate(log) == 12800:
            return new.pop()
        time.sleep(0.1)
    raise AssertionError("the stale stand-in did not start in %s" % host)


def _last_rate(log):
    try:
        rates = re.findall(r"([\d.]+) tokens/s", _read(log))
    except OSError:
        return None
    return float(rates[-1]) if rates else None


def stale_cache(fleet, host):
    """An Inductor cache with content and no fingerprint record (nobody knows what built it)."""
    root = os.path.join(rootfs(fleet, host), "tmp", "torchinductor_root")
    cache = os.path.join(root, "fxgraph", "ab")
    os.makedirs(cache, exist_ok=True)
    _write(os.path.join(cache, "fx-entry"), "compiled while the venv mixed cu128 and cu130\n")
    record = os.path.join(root, ".gpufleet-hygiene-fingerprint.json")
    if os.path.exists(record):
        os.remove(record)
    return cache


def cache_files(fleet, host):
    """The files of the container's Inductor cache, its fingerprint record left out."""
    root = os.path.join(rootfs(fleet, host), "tmp", "torchinductor_root")
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _dirs, files in os.walk(root) for f in files
                  if f != ".gpufleet-hygiene-fingerprint.json")


def playbook(fleet, *args, timeout=300):
    """Run ansible-playbook from the repository root (ansible.cfg applies); (rc, output)."""
    env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    res = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", fleet["inventory"], *args], cwd=REPO,
                         env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    keep_log(fleet, args, res.stdout)
    return res.returncode, res.stdout


def keep_log(fleet, args, output):
    """Every run's output in the module's work directory, for whoever reads a failure."""
    logs = os.path.join(str(fleet["work"]), "logs")
    os.makedirs(logs, exist_ok=True)
    name = "%02d-%s.log" % (len(os.listdir(logs)), os.environ.get("PYTEST_CURRENT_TEST", "run").split("::")[-1].split(" ")[0])
    _write(os.path.join(logs, name), "ansible-playbook %s\n%s" % (" ".join(args), output))


class Background(object):
    """ansible-playbook in the background, its output read line by line as it comes."""

    def __init__(self, fleet, *args):
        env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", PYTHONUNBUFFERED="1")
        self.fleet, self.args = fleet, args
        self.proc = subprocess.Popen([os.path.join(VENV_BIN, "ansible-playbook"), "-i", fleet["inventory"], *args],
                                     cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()
        with self.cond:
            self.lines.append(None)
            self.cond.notify_all()

    def wait_for(self, pattern, timeout=180):
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                while seen < len(self.lines):
                    line = self.lines[seen]
                    seen += 1
                    if line is None:
                        raise AssertionError("the run ended before %r:\n%s" % (pattern, self.output()))
                    if rx.search(line):
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no %r within %ss:\n%s" % (pattern, timeout, self.output()))
                self.cond.wait(left)

    def output(self):
        return "".join(line for line in self.lines if line is not None)

    def finish(self, timeout=300):
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.thread.join(10)
        keep_log(self.fleet, self.args, self.output())
        return rc, self.output()


def recap(output):
    """{host: {ok, changed, unreachable, failed, ...}} from the PLAY RECAP."""
    out = {}
    for line in output[output.rindex("PLAY RECAP"):].splitlines()[1:]:
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if m:
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


def failure(output, host):
    """The text ansible printed for the host's failed or unreachable task (the task's name first)."""
    task = None
    for block in re.split(r"\n(?=TASK \[|PLAY RECAP|RUNNING HANDLER)", output):
        if block.startswith("TASK ["):
            task = block.splitlines()[0]
        # "FAILED! <message>" as the collection's concise callback prints a failure, "=> {...}" as the default does
        m = re.search(r"^(fatal|failed): \[%s\]: (FAILED|UNREACHABLE)! (?:=> )?.*?(?=^\S|\Z)" % re.escape(host), block,
                      re.MULTILINE | re.DOTALL)
        if m:
            return "%s\n%s" % (task, " ".join(m.group(0).split()))
    raise AssertionError("no failure of %s in:\n%s" % (host, output))


def assert_recap(output, ok=(), failed=(), unreachable=()):
    """Hosts in ok finished without failure; the others failed or were unreachable, as said."""
    rc = recap(output)
    for host in tuple(ok) + tuple(failed) + tuple(unreachable):
        r = rc[host]
        if host in failed:
            assert r["failed"] >= 1 and r["unreachable"] == 0, (host, r, output[-3000:])
        elif host in unreachable:
            assert r["unreachable"] >= 1, (host, r, output[-3000:])
        elif host in ok:
            assert r["failed"] == 0 and r["unreachable"] == 0, (host, r, output[-3000:])
    return rc


def assert_untouched(before, after):
    for host, was in before.items():
        assert after[host] == was, host


def reset(fleet):
    """Between tests: no job, no stale lock, no fault, a ready fleet (each test breaks its host itself)."""
    for host in HOSTS:
        vmid, path = str(fleet["cts"][host]["vmid"]), lxcpath(fleet, host)
        status = subprocess.run(["lxc-info", "-n", vmid, "-P", path, "-s", "-H"], text=True, stdout=subprocess.PIPE,
                                check=True, timeout=30).stdout.strip()
        if status != "RUNNING":
            subprocess.run(["lxc-start", "-n", vmid, "-P", path], check=True, timeout=60)
            subprocess.run(["lxc-wait", "-n", vmid, "-P", path, "-s", "RUNNING", "-t", "20"], check=True, timeout=60)
        gpu_config(fleet, host, fault=None, never_drain=None, fault_message=None)
        pids = sorted(jobs(fleet, host))
        tmux = [pid for pid, cmd in processes(fleet, host).items() if cmd.startswith("tmux")]
        if pids or tmux:
            # One may end on its own between the listing and the kill (a job whose tmux session the
            # last test's kill ended), and kill then exits 1: none left is what is asserted below.
            sh(fleet, host, "kill -9 %s" % " ".join(str(p) for p in pids + tmux), check=False)
        sh(fleet, host, "rm -f %s" % LOCK)
        deadline = time.monotonic() + 10
        while jobs(fleet, host):
            assert time.monotonic() < deadline, "jobs of %s outlived SIGKILL: %s" % (host, jobs(fleet, host))
            time.sleep(0.1)
        # The stand-in frees a dead holder's memory 0.5 s after it first notices: let it notice.
        deadline = time.monotonic() + 10
        while sh(fleet, host, SMI + " --query-gpu=memory.used --format=csv,noheader,nounits").split() != ["0"]:
            assert time.monotonic() < deadline, "GPU memory of %s not freed" % host
            time.sleep(0.2)


def ready_fleet(fleet):
    """reset(), and the incident repaired first when the first tests did not run (-k)."""
    reset(fleet)
    if not fleet.get("repaired"):
        rc, out = playbook(fleet, "playbooks/remediate.yml", *QUICK)
        assert rc == 0, out[-3000:]
        fleet["repaired"] = True
        reset(fleet)


# ------------------------------------------------------------------------------ faults
#
# Faults are injected in three runs of remediate over the whole fleet, several at once on
# different hosts (each host is then "the rest of the fleet" for the others), so that the
# module stays a few minutes long; each fault has its own test of that run's results.


@pytest.fixture(scope="module")
def outage(fleet):
    """The incident fleet as brought up, plus a stale holder in train-101. While the kill role
    runs, pve2's sshd is killed (train-200 and train-201 live there) and train-101 is stopped.
    Then sshd and train-101 come back; a first re-run (lock wait 1 s) completes train-101 and
    meets the lock the broken run left on train-200; a second re-run, as that run's owner,
    completes train-200."""
    start_stale(fleet, "train-101")
    res = {"before": snapshot(fleet, ["train-201"])}
    run = Background(fleet, "playbooks/remediate.yml", *QUICK)
    run.wait_for(r"^TASK \[gpufleet\.hygiene\.kill : Terminate the processes of tmux session")
    subprocess.run([FLEET, "sshd", "pve2", "stop"], cwd=REPO, env=fleet["env"], check=True, timeout=30)
    subprocess.run(["lxc-stop", "-n", "101", "-P", lxcpath(fleet, "train-101"), "-k"], check=True, timeout=60)
    res["rc"], res["out"] = run.finish()
    res["after"] = snapshot(fleet, ["train-201"])
    res["100"] = {"contaminants": contaminants(fleet, "train-100"), "jobs": jobs(fleet, "train-100")}
    res["101_cache"] = cache_files(fleet, "train-101")
    subprocess.run([FLEET, "sshd", "pve2", "start"], cwd=REPO, env=fleet["env"], check=True, timeout=60)
    subprocess.run(["lxc-start", "-n", "101", "-P", lxcpath(fleet, "train-101")], check=True, timeout=60)
    subprocess.run(["lxc-wait", "-n", "101", "-P", lxcpath(fleet, "train-101"), "-s", "RUNNING", "-t", "20"], check=True, timeout=60)
    res["lock"] = lock_of(fleet, "train-200")
    res["200_jobs"] = jobs(fleet, "train-200")
    res["rc1"], res["out1"] = playbook(fleet, "playbooks/remediate.yml", "--limit", "train-101,train-200",
                                       "-e", "gpufleet_lock_timeout=1", *QUICK)
    res["200_jobs1"] = jobs(fleet, "train-200")
    res["101"] = {"cache": cache_files(fleet, "train-101"), "jobs": jobs(fleet, "train-101")}
    owner = (res["lock"] or {}).get("owner", "none")
    res["rc2"], res["out2"] = playbook(fleet, "playbooks/remediate.yml", "--limit", "train-200", "-e", "gpufleet_run_id=%s" % owner, *QUICK)
    res["200"] = {"jobs": jobs(fleet, "train-200"), "lock": lock_of(fleet, "train-200")}
    fleet["repaired"] = True
    return res


def test_sshd_dies_mid_run(outage):
    """pve2's sshd (and every session through it) is killed mid-run: train-200 is unreachable
    with what happened and what to do; pve1's train-100 is repaired in the same run; the lock
    left on train-200 names its owner and how to resume; resuming as that owner completes."""
    FAULTS.append(("sshd", "a node's sshd dies mid-run"))
    res = outage
    assert res["rc"] != 0
    assert_recap(res["out"], ok=("train-100", "train-201"), unreachable=("train-200",))
    msg = failure(res["out"], "train-200")
    assert "UNREACHABLE!" in msg and "node root@127.0.1.2:%s" % PORT in msg, msg
    assert ("was lost during a command in container 200" in msg and "run again" in msg) or "is unreachable" in msg, msg
    assert res["100"]["contaminants"] == [] and res["100"]["jobs"]  # repaired during the outage
    assert_untouched(res["before"], res["after"])  # train-201, healthy, on the node that went away
    assert res["lock"] and res["lock"]["owner"].startswith("remediate-train-200-"), res["lock"]
    assert [c for c in res["200_jobs"].values() if "--tag stale" in c]  # the stale holder outlived the outage
    assert_recap(res["out1"], failed=("train-200",))
    msg = failure(res["out1"], "train-200")
    assert "is held by %s" % res["lock"]["owner"] in msg and "-e gpufleet_run_id=%s" % res["lock"]["owner"] in msg, msg
    assert "nothing was changed here" in msg, msg
    assert res["200_jobs1"] == res["200_jobs"]  # indeed nothing
    assert res["rc2"] == 0, res["out2"][-3000:]
    assert res["200"]["jobs"] and not [c for c in res["200"]["jobs"].values() if "--tag stale" in c]
    assert res["200"]["lock"] is None


def test_container_stops_mid_run(outage):
    """train-101 is stopped mid-run: unreachable, with how to start it; nothing of its repair
    was done; once started again, a re-run completes it (its lock was in /run, a tmpfs)."""
    FAULTS.append(("container", "a container stops mid-run"))
    res = outage
    msg = failure(res["out"], "train-101")
    assert "UNREACHABLE!" in msg, msg
    node = "container 101 on node root@127.0.1.1:%s" % PORT
    # Stopped under a running command (lxc-attach killed), or found stopped by the next one.
    assert ("%s stopped during a command" % node in msg or "%s is not running (stopped)" % node in msg), msg
    assert "start it (pct start 101) and run again" in msg, msg
    assert res["101_cache"] == ["fxgraph/ab/fx-entry", "triton/0/KX3F/kernel.cubin"]  # never reached: nothing purged
    assert_recap(res["out1"], ok=("train-101",))
    assert recap(res["out1"])["train-101"]["changed"] > 0
    assert res["101"]["cache"] == [] and res["101"]["jobs"]


def _freeze(fleet, host, pid_in_ct):
    """Freeze a container's process in a cgroup-v1 freezer: it is then in state D, and SIGKILL
    stays pending until it is thawed, as for a process stuck in a GPU driver."""
    # The container's own freezer cgroup, as its init is in it: another fleet's container of the
    # same vmid (another worker's) has one of its own, and a process of the same pid in it.
    init = simfleet.init_pid(lxcpath(fleet, host), fleet["cts"][host]["vmid"])
    own = re.search(r"^\d+:freezer:(.*)$", _read("/proc/%d/cgroup" % init), re.MULTILINE).group(1).rstrip("/")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = _read("/proc/%s/status" % entry)
            cgroup = _read("/proc/%s/cgroup" % entry)
        except OSError:
            continue
        nspid = re.search(r"^NSpid:\s+(.*)$", status, re.MULTILINE).group(1).split()
        freezer = re.search(r"^\d+:freezer:(.*)$", cgroup, re.MULTILINE)
        if nspid[-1] == str(pid_in_ct) and len(nspid) > 1 and freezer and (freezer.group(1) + "/").startswith(own + "/"):
            path = "/sys/fs/cgroup/freezer%s/gpufleet-faults-stuck" % freezer.group(1).rstrip("/")
            os.makedirs(path, exist_ok=True)
            _write(os.path.join(path, "cgroup.procs"), entry)
            _write(os.path.join(path, "freezer.state"), "FROZEN")
            deadline = time.monotonic() + 10
            while _read(os.path.join(path, "freezer.state")).strip() != "FROZEN":
                assert time.monotonic() < deadline, "the freezer did not freeze"
                time.sleep(0.05)
            return path
    raise AssertionError("no host process for pid %s of %s" % (pid_in_ct, host))


@pytest.fixture(scope="module")
def gpu_faults(fleet):
    """Three runs with four faults. First, the nodes' nvidia-smi fails: it hangs on train-100's
    node and exits 15 (a GPU fallen off the bus) on train-201's (the nvidia-smi STAND-IN's fault
    modes); every container of those nodes is read from its node, so each fails before any
    change. Then, with the GPUs answering again, the repairs' faults: train-101's stale holder
    is stuck in the kernel (state D), train-200's ignores SIGTERM. Then the holder is thawed
    and a re-run completes the hosts that failed."""
    ready_fleet(fleet)
    res = {"sigterm_pid": start_stale(fleet, "train-200", "--ignore-sigterm"), "stuck_pid": start_stale(fleet, "train-101")}
    for host in ("train-100", "train-201"):
        stale_cache(fleet, host)
    caches_before = {h: cache_files(fleet, h) for h in ("train-100", "train-201")}
    node_gpu_config(fleet, "train-100", fault="hang", hang_seconds=3600)
    node_gpu_config(fleet, "train-201", fault="exit:15")
    frozen = _freeze(fleet, "train-101", res["stuck_pid"])
    try:
        res["stuck_state"] = re.search(r"^State:\s+(\S)", sh(fleet, "train-101", "cat /proc/%d/status" % res["stuck_pid"]),
                                       re.MULTILINE).group(1)
        res["before"] = snapshot(fleet, HOSTS)
        try:
            res["rc"], res["out"] = playbook(fleet, "-v", "playbooks/remediate.yml", "-e", "gpufleet_nvidia_smi_timeout=3", *QUICK)
        finally:
            node_gpu_config(fleet, "train-100", fault=None)
            node_gpu_config(fleet, "train-201", fault=None)
        res["after"] = snapshot(fleet, HOSTS)
        res["standins_left"] = node_standins()
        res["caches"] = {h: cache_files(fleet, h) for h in ("train-100", "train-201")}
        res["caches_before"] = caches_before
        res["rc_kill"], res["out_kill"] = playbook(fleet, "-v", "playbooks/remediate.yml", "-e", "gpufleet_nvidia_smi_timeout=3", *QUICK)
        res["after_kill"] = snapshot(fleet, HOSTS)
        res["lock_101"] = lock_of(fleet, "train-101")
    finally:
        _write(os.path.join(frozen, "freezer.state"), "THAWED")
    deadline = time.monotonic() + 10
    while res["stuck_pid"] in processes(fleet, "train-101") and time.monotonic() < deadline:
        time.sleep(0.1)
    os.rmdir(frozen)
    res["rc2"], res["out2"] = playbook(fleet, "playbooks/remediate.yml", "--limit", "train-100,train-101,train-201", *QUICK)
    res["fixed"] = {h: {"caches": cache_files(fleet, h), "jobs": jobs(fleet, h)} for h in ("train-100", "train-101", "train-201")}
    res["decoy_201"] = snapshot(fleet, ["train-201"])["train-201"]["decoy"]
    return res


def test_nvidia_smi_hangs_or_gpu_lost(gpu_faults):
    """A hung nvidia-smi and a GPU fallen off the bus, on the node that reads its containers:
    every container of those nodes fails before any change, each saying what happened and what
    to do (the timeout option; a GPU reset or reboot); the hung call is killed; a re-run after
    the GPUs answer again completes the repair."""
    FAULTS.append(("nvidia-smi hang", "nvidia-smi hangs"))
    FAULTS.append(("nvidia-smi 15", "nvidia-smi exits 15, GPU fallen off the bus"))
    res = gpu_faults
    assert res["rc"] != 0
    assert_recap(res["out"], failed=HOSTS)
    for host in ("train-100", "train-101"):  # the node whose nvidia-smi hung
        hang = failure(res["out"], host)
        assert "Stop when the GPUs cannot be read" in hang and "nothing was changed on this host" in hang, hang
        assert "reading the GPUs on the node: " in hang and "did not answer within 3.0s (command_timeout) and was killed" in hang, hang
        assert "gpufleet_nvidia_smi_timeout" in hang and "Xid" in hang, hang
    for host in ("train-200", "train-201"):  # the node with a GPU lost
        lost = failure(res["out"], host)
        assert "nothing was changed on this host" in lost and "fallen off the bus" in lost, lost
        assert "GPU is lost" in lost and "reset or a reboot" in lost, lost
    for host in HOSTS:
        assert res["after"][host] == res["before"][host], host  # no process, package or file changed
    for host in ("train-100", "train-201"):
        assert "fxgraph/ab/fx-entry" in res["caches"][host] and res["caches"][host] == res["caches_before"][host]
    assert res["standins_left"] == []  # the hung call was killed
    assert res["rc2"] == 0, res["out2"][-3000:]
    for host in ("train-100", "train-201"):
        assert res["fixed"][host]["caches"] == [], host
    # train-100's job relaunched; train-201 is a spare (its job described with relaunch: false): repaired, not started.
    assert res["fixed"]["train-100"]["jobs"] and not res["fixed"]["train-201"]["jobs"], res["fixed"]
    assert res["decoy_201"] == res["before"]["train-201"]["decoy"]


def test_holder_ignores_sigterm(gpu_faults):
    """train-200's stale holder ignores SIGTERM: the kill role escalates to SIGKILL after the
    grace period, says so, and the repair completes in the same run."""
    FAULTS.append(("sigterm", "a holder ignores SIGTERM"))
    res = gpu_faults
    out, pid = res["out_kill"], res["sigterm_pid"]
    block = out[out.index("TASK [gpufleet.hygiene.kill : Stop the processes matching the job's patterns]"):]
    block = block[:block.index("\nTASK [")]
    m = re.search(r"changed: \[train-200\] => .*?(?=^\S|\Z)", block, re.MULTILINE | re.DOTALL)
    assert m, block
    assert re.search(r"outcome: killed\s+pid: %d\s+signals:\s+- SIGTERM\s+- SIGKILL" % pid, m.group(0)), m.group(0)
    assert pid not in res["after_kill"]["train-200"]["processes"]
    relaunched = {p: c for p, c in res["after_kill"]["train-200"]["processes"].items() if JOB_RE.search(c)}
    assert relaunched and not [c for c in relaunched.values() if "--tag stale" in c]
    for key in ("packages", "decoy"):
        assert res["after_kill"]["train-200"][key] == res["before"]["train-200"][key]


def test_holder_that_cannot_be_killed(gpu_faults):
    """train-101's stale holder is stuck in the kernel (state D): SIGTERM and SIGKILL do not end
    it and its GPU memory never drains. The kill role fails naming the PID, its state and what
    to do, signals nothing else, gives the lock back; once it exits, a re-run completes."""
    FAULTS.append(("state D", "a holder that cannot be killed, memory never drains"))
    res = gpu_faults
    pid = res["stuck_pid"]
    assert res["stuck_state"] == "D"
    msg = failure(res["out_kill"], "train-101")
    assert "Stop the processes matching the job's patterns" in msg, msg
    assert "still running after SIGTERM, 2.0s of grace and SIGKILL: pid %d" % pid in msg, msg
    assert "state D (uninterruptible sleep, in " in msg, msg
    assert "cannot be killed" in msg and "reset the GPU or reboot the node, then run again" in msg, msg
    assert "nothing outside the scope was signalled" in msg, msg
    assert res["after_kill"]["train-101"] == res["before"]["train-101"]  # the stuck one still there, nothing else touched
    assert res["lock_101"] is None
    assert_recap(res["out2"], ok=("train-101",))
    assert res["fixed"]["train-101"]["jobs"]


@pytest.fixture(scope="module")
def contention(fleet):
    """One run (A) with three faults: train-100 contaminated again with one file immutable,
    train-101's /run and /tmp tiny tmpfs filled to ENOSPC (a stale cache in /tmp), and
    train-200 (a stale holder) whose lock A already holds while two other runs want it: B
    waits for it, C waits 1 s. Then the file is freed and /run unmounted (/tmp stays full),
    and a re-run completes train-100 and train-101."""
    ready_fleet(fleet)
    res = {}
    root = rootfs(fleet, "train-100")
    py = os.path.join(root, "opt", "venv", "bin", "python")
    wheels = os.path.join(root, "opt", "gpufleet", "wheels")
    env = dict(os.environ, UV_CACHE_DIR=os.path.join(str(fleet["work"]), "uv-cache"))
    subprocess.run([os.path.join(VENV_BIN, "uv"), "pip", "install", "--quiet", "--python", py, "--no-index", "--find-links", wheels]
                   + ["%s==%s" % nv for nv in cuda_fixtures.SEED_ADDED], env=env, check=True, timeout=120)
    res["contaminated"] = contaminants(fleet, "train-100")
    site = glob.glob(os.path.join(root, "opt", "venv", "lib", "python3*", "site-packages"))[0]
    stuck = os.path.join(site, _dist("sglang", "0.5.12"), "METADATA")
    subprocess.run(["chattr", "+i", stuck], check=True)
    for path in ("/run", "/tmp"):
        sh(fleet, "train-101", "mount -t tmpfs -o size=256k,mode=1777 gpufleet-faults-full %s" % path)
    try:
        sh(fleet, "train-101", "mkdir -p /tmp/torchinductor_root/fxgraph/ab && echo stale >/tmp/torchinductor_root/fxgraph/ab/fx-entry")
        res["fill"] = [sh(fleet, "train-101", "dd if=/dev/zero of=%s/gpufleet-faults-fill bs=4k 2>&1" % p, check=False) for p in ("/run", "/tmp")]
        res["stale"] = start_stale(fleet, "train-200")
        cli = subprocess.run([os.path.join(VENV_BIN, "ansible"), "-i", fleet["inventory"], "train-200", "-m",
                              "gpufleet.hygiene.host_lock", "-a", "owner=faults-run-a"], cwd=REPO, env=fleet["env"],
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False)
        assert cli.returncode == 0, cli.stdout
        res["before"] = snapshot(fleet, HOSTS)
        b = Background(fleet, "playbooks/remediate.yml", "--limit", "train-200", "-e", "gpufleet_lock_timeout=180", *QUICK)
        c = Background(fleet, "playbooks/remediate.yml", "--limit", "train-200", "-e", "gpufleet_lock_timeout=1", *QUICK)
        b.wait_for(r"^TASK \[gpufleet\.hygiene\.repair : Take the host's lock\]")
        res["rc_c"], res["out_c"] = c.finish()
        res["jobs_after_c"] = jobs(fleet, "train-200")
        res["rc"], res["out"] = playbook(fleet, "playbooks/remediate.yml", "-e", "gpufleet_run_id=faults-run-a", *QUICK)
        res["after"] = snapshot(fleet, HOSTS)
        res["left"] = contaminants(fleet, "train-100")
        res["lock_100"] = lock_of(fleet, "train-100")
        res["run_101"] = sh(fleet, "train-101", "ls -A /run").split()
        res["cache_101"] = sh(fleet, "train-101", "cat /tmp/torchinductor_root/fxgraph/ab/fx-entry")
        res["jobs_a"] = jobs(fleet, "train-200")
        res["rc_b"], res["out_b"] = b.finish()
        res["jobs_b"] = jobs(fleet, "train-200")
        res["lock_200"] = lock_of(fleet, "train-200")
        subprocess.run(["chattr", "-i", stuck], check=True)
        sh(fleet, "train-101", "umount /run")
        res["rc2"], res["out2"] = playbook(fleet, "playbooks/remediate.yml", "--limit", "train-100,train-101", *QUICK)
        res["left2"] = contaminants(fleet, "train-100")
        res["cache2_101"] = sh(fleet, "train-101", "find /tmp/torchinductor_root -type f ! -name .gpufleet-hygiene-fingerprint.json")
        res["jobs2_101"] = jobs(fleet, "train-101")
        cli = subprocess.run([os.path.join(VENV_BIN, "ansible"), "-i", fleet["inventory"], "train-100", "-m",
                              "gpufleet.hygiene.cuda_contamination", "-a", "venv=/opt/venv", "-o"], cwd=REPO, env=fleet["env"],
                             text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120, check=False)
        res["scan2_100"] = cli.stdout
    finally:
        subprocess.run(["chattr", "-i", stuck], check=False)
        reset(fleet)
        sh(fleet, "train-101", "umount /tmp; umount /run; true", check=False)
    res["mounts_101"] = sh(fleet, "train-101", "grep gpufleet-faults-full /proc/mounts || true")
    return res


def test_uninstall_fails_half_way(contention):
    """One contaminant's file is immutable: the uninstall removes what it can, fails naming
    what is left, why and what to do, and the lock is given back; after the file is freed, a
    re-run removes the rest and restores the clobbered files."""
    FAULTS.append(("uninstall", "an uninstall fails half-way"))
    res = contention
    assert len(res["contaminated"]) == len(cuda_fixtures.SEED_ADDED)
    msg = failure(res["out"], "train-100")
    assert "Remove packages built for another CUDA major" in msg, msg
    assert "the uninstall failed part-way (uv exited 2): removed nvidia-cudnn-cu13" in msg, msg
    assert "still installed sglang-kernel, sglang" in msg, msg
    assert "sglang-0.5.12.dist-info/METADATA`: Operation not permitted" in msg and "and run again" in msg, msg
    assert res["left"] == sorted([_dist("sglang", "0.5.12"), _dist("sglang-kernel", "0.4.2.post2+cu130")]), res["left"]
    assert res["lock_100"] is None
    assert_recap(res["out2"], ok=("train-100",))
    assert res["left2"] == []
    assert '"clean": true' in res["scan2_100"] and '"clobbered": []' in res["scan2_100"], res["scan2_100"]


def test_disk_full(contention):
    """train-101's /run (the lock) and /tmp (caches, tmux, module payloads) are full: the run
    fails there before changing anything, says so and what to free, and leaves no empty lock;
    with /run freed and /tmp still full, the re-run completes the repair."""
    FAULTS.append(("disk full", "the container's /run and /tmp full"))
    res = contention
    assert all("No space left on device" in f for f in res["fill"]), res["fill"]
    msg = failure(res["out"], "train-101")
    assert "Take the host's lock" in msg, msg
    assert "cannot create lock %s: No space left on device; nothing was changed on this host" % LOCK in msg, msg
    assert "Free space on its filesystem" in msg, msg
    assert "gpufleet-hygiene.lock" not in res["run_101"]  # no empty lock left
    assert res["cache_101"] == "stale\n"
    assert res["after"]["train-101"] == res["before"]["train-101"]
    assert_recap(res["out2"], ok=("train-101",))
    assert res["cache2_101"].split() == [] and res["jobs2_101"]
    assert not res["mounts_101"].strip()


def test_two_runs_at_once(contention):
    """Run A holds train-200's lock; run C (1 s wait) fails naming A and changes nothing; A
    repairs and relaunches the job, repairs nothing it should not (train-201 untouched); run B
    gets the lock after A, reads the host again, finds it ready and leaves A's job alone."""
    FAULTS.append(("two runs", "two remediate runs on one container at once"))
    res = contention
    assert res["rc_c"] != 0
    msg = failure(res["out_c"], "train-200")
    assert "is held by faults-run-a since" in msg and "another run is acting on this host" in msg, msg
    assert "nothing was changed here" in msg, msg
    assert res["stale"] in res["jobs_after_c"]
    assert_recap(res["out"], ok=("train-200", "train-201"), failed=("train-100", "train-101"))
    assert recap(res["out"])["train-200"]["changed"] > 0
    assert res["stale"] not in res["jobs_a"] and len(res["jobs_a"]) == 1
    assert res["after"]["train-201"] == res["before"]["train-201"]
    assert res["rc_b"] == 0, res["out_b"][-3000:]
    assert re.search(r"msg: 'faults-run-a held this host(''|')s lock and left it ready: nothing more to do here'", res["out_b"]), res["out_b"]
    assert res["jobs_b"] == res["jobs_a"]  # A's job untouched by B
    assert res["lock_200"] is None


PID_REUSE = r'''
import json, os, signal, subprocess, sys, time
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc, _terminate

def reuse(pid):
    """Start a decoy that gets exactly this (free) PID, through ns_last_pid."""
    for _ in range(50):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        q = subprocess.Popen(["sleep", "600"])
        if q.pid == pid:
            return q
        q.kill(); q.wait()
    raise SystemExit("could not reuse pid %d" % pid)

out = {}
# 1. The PID is reused before terminate() looks: the start-time guard refuses it.
p = subprocess.Popen(["sleep", "600"])
target = {"pid": p.pid, "start_time": _proc.start_time(p.pid)}
p.kill(); p.wait()
time.sleep(0.05)  # start times count clock ticks (10 ms): a PID cycles through far slower than that
q = reuse(target["pid"])
out["listed"] = _terminate.terminate([target], grace=0.2)[target["pid"]]
out["listed_decoy_alive"] = q.poll() is None and _proc.start_time(q.pid) != target["start_time"]
q.kill(); q.wait()
# 2. The PID is reused after it was pinned (pidfd) and its start time checked: the pidfd
#    still names the dead process, so the signal reaches no one.
p = subprocess.Popen(["sleep", "600"])
h = _terminate._Handle(p.pid, _proc.start_time(p.pid))
assert h.valid() and h.fd is not None
p.kill(); p.wait()
q = reuse(p.pid)
h.valid = lambda: True   # as if the start-time check had passed just before the reuse
out["pinned_sent"] = h.send(signal.SIGKILL)
time.sleep(0.2)
out["pinned_decoy_alive"] = q.poll() is None
h.close(); q.kill(); q.wait()
print(json.dumps(out))
'''


def test_pid_reused_between_listing_and_signalling(fleet):
    """A real reused PID (ns_last_pid in a fresh PID namespace): a process chosen for
    termination dies and a decoy gets its PID before the signal. The start-time guard
    refuses it (outcome pid_reused, nothing sent), and a signal through the pidfd taken
    before the reuse reaches no one; the decoy lives."""
    FAULTS.append(("pid reuse", "a PID reused between listing and signalling"))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".ansible", "collections"))
    res = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", PID_REUSE], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["listed"] == {"signals": [], "outcome": "pid_reused"}
    assert out["listed_decoy_alive"] is True
    assert out["pinned_sent"] is False and out["pinned_decoy_alive"] is True


def test_fault_count():
    """Every fault above was injected (the count docs/reliability.md reports)."""
    assert len(FAULTS) == 10, FAULTS
