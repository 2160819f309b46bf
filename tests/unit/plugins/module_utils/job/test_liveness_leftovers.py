# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_liveness, whose GPU holders are leftovers: REAL processes of two unprivileged users (nobody runs the
job, daemon is another user), reparented to init as a worker whose job died is, and a PID
namespace init that nobody made with unshare. Only the job's users' holders are leftovers (or
those of leftover_users); a namespace init is reported with what to do, never left to fail
silently nor named for the repair to signal. What the readiness read (readiness/_readiness's
check_job) and the repair filter make of it is checked here too."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.filter.repair import repair_plan
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness, uids_of
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._checks import check_job


@pytest.fixture
def spawn():
    """spawn(user, *argv): a process of ``user`` whose parent is init (its launcher exited)."""
    pids = []

    def _spawn(user, *argv):
        out = subprocess.run(["runuser", "-u", user, "--", "sh", "-c", '"$@" >/dev/null 2>&1 </dev/null & echo $!', "sh"] + list(argv),
                             capture_output=True, text=True, check=True).stdout
        pid = int(out.split()[0])
        pids.append(pid)
        deadline = time.monotonic() + 5
        while _ppid(pid) != 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        return pid

    yield _spawn
    for pid in pids:
        for child in _children(pid):
            _kill(child)
        _kill(pid)


def _ppid(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(next(line for line in f if line.startswith("PPid:")).split()[1])


def _children(pid):
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _child(launcher, deadline):
    """The one child of a process launched by spawn (unshare's or nsenter's), once it exists."""
    while not _children(launcher) and time.monotonic() < deadline:
        time.sleep(0.02)
    [child] = _children(launcher)
    return child


def _orphan(launcher, child, deadline):
    """Kill the launcher and wait until the kernel has given its child to the outer init."""
    _kill(launcher)
    while _ppid(child) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)


def _kill(pid):
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def gpus(*pids):
    return [{"index": 0, "utilization_pct": 50, "processes": [{"pid": p, "name": "python3", "used_memory_mib": 100} for p in pids]}]


def job_of(user, pid):
    return {"processes": [{"pid": pid, "user": user}]}


def test_another_user_s_holder_is_never_the_job_s_leftover(spawn):
    """nobody's job runs; daemon's process holds a GPU with init as parent: not a leftover (the
    repair would stop it, and, the host then repaired, the job too). nobody's own orphan is."""
    job = spawn("nobody", "sleep", "300")
    theirs = spawn("daemon", "sleep", "300")
    mine = spawn("nobody", "sleep", "301")
    live = liveness(job_of("nobody", job), gpus(job, theirs, mine), now=0)
    assert [h["pid"] for h in live["leftovers"]] == [mine] and live["leftovers"][0]["user"] == "nobody"
    check = check_job(live, {})
    plan = repair_plan({"ready": False, "running_job": True, "checks": [check]}, allow_running_job=True, leftovers="always")
    assert [h["pid"] for h in plan["leftover_pids"]] == [mine]


def test_with_no_job_user_known_no_holder_is_a_leftover(spawn):
    """No job running and no job users given: whose a holder is cannot be told, so none is named."""
    theirs = spawn("daemon", "sleep", "300")
    live = liveness({"processes": []}, gpus(theirs), now=0)
    assert live["leftovers"] == [] and check_job(live, {})["ok"] is True


def test_the_job_s_users_and_leftover_users_say_whose_holders_are_leftovers(spawn):
    theirs = spawn("daemon", "sleep", "300")
    mine = spawn("nobody", "sleep", "300")
    assert [h["pid"] for h in liveness({"processes": []}, gpus(theirs, mine), now=0, users=["nobody"])["leftovers"]] == [mine]
    # leftover_users, when given, is the whole rule (by name or uid).
    live = liveness({"processes": []}, gpus(theirs, mine), now=0, users=["nobody"], leftover_users=["1"])
    assert [h["pid"] for h in live["leftovers"]] == [theirs]


def test_a_namespace_init_holding_a_gpu_is_reported_with_the_action(spawn):
    """nobody's own PID namespace (unshare -Urpf), its launcher gone: its init is never signalled,
    so it is not a leftover the repair would try to stop; the check fails and says what to do."""
    unshare = spawn("nobody", "unshare", "-Urpf", "sleep", "300")
    deadline = time.monotonic() + 5
    init = _child(unshare, deadline)
    _orphan(unshare, init, deadline)
    try:
        live = liveness({"processes": []}, gpus(init), now=0, users=["nobody"])
        assert live["leftovers"] == [] and [h["pid"] for h in live["namespace_inits"]] == [init]
        check = check_job(live, {})
        assert check["ok"] is False and check["leftovers"] == []
        assert check["namespace_inits"][0]["pid"] == init and check["namespace_inits"][0]["user"] == "nobody"
        assert "init of their own PID namespace" in check["summary"] and "kill -TERM" in check["summary"]
        assert "pid %d" % init in check["summary"]
    finally:
        _kill(init)


def test_every_user_given_counts_by_uid_or_name_and_an_unknown_name_is_left_out():
    """A numeric uid does not end the list (the names after it count), and a name that is no user
    here is passed over (the users after it count too)."""
    assert uids_of(["65534", "root"]) == {65534, 0}
    assert uids_of(["no-such-user-gpufleet", "daemon", " 0 "]) == {pwd.getpwnam("daemon").pw_uid, 0}
    assert uids_of(None) == set()


def _fake_proc(root, pid, status):
    """A /proc of one process ``pid`` whose parent is init (its stat after the parent field is this
    process's own), with ``status`` as its status file."""
    with open("/proc/self/stat") as f:
        after_ppid = f.read().rsplit(")", 1)[1].split(None, 2)[2]
    (root / str(pid)).mkdir()
    (root / str(pid) / "stat").write_text("%d (python3) S 1 %s" % (pid, after_ppid))
    (root / str(pid) / "status").write_text(status)


def test_a_holder_without_nspid_is_a_leftover_not_a_namespace_init(tmp_path):
    """A kernel before 4.1 writes no NSpid line: nobody's orphan holding a GPU is a leftover."""
    _fake_proc(tmp_path, 4242, "Name:\tpython3\nPPid:\t1\nUid:\t65534\t65534\t65534\t65534\n")
    live = liveness({"processes": []}, gpus(4242), now=0, users=["nobody"], proc=str(tmp_path))
    assert [h["pid"] for h in live["leftovers"]] == [4242] and live["namespace_inits"] == []


def test_a_holder_gone_before_its_owner_is_read_is_no_leftover(tmp_path):
    """Its stat read, its status gone (it exited in between): whose it was cannot be told."""
    _fake_proc(tmp_path, 4243, "")
    (tmp_path / "4243" / "status").unlink()
    live = liveness({"processes": []}, gpus(4243), now=0, users=["nobody"], proc=str(tmp_path))
    assert live["leftovers"] == [] and live["namespace_inits"] == []


def test_a_process_entered_into_a_namespace_and_orphaned_is_a_leftover_not_its_init(spawn):
    """nobody's process started inside their PID namespace from outside it (nsenter, as pct exec
    and lxc-attach do), the entering process gone: the kernel gives it to the outer init (its
    parent is PID 1), yet it is not its namespace's init (its NSpid ends in 2, not 1). It is a
    leftover like any other, not a namespace init."""
    unshare = spawn("nobody", "unshare", "-Urpf", "sleep", "300")
    deadline = time.monotonic() + 5
    init = _child(unshare, deadline)
    entered = spawn("nobody", "nsenter", "-t", str(init), "-U", "-p", "--preserve-credentials", "sleep", "301")
    inside = _child(entered, deadline)
    _orphan(entered, inside, deadline)
    try:
        with open("/proc/%d/status" % inside) as f:
            nspid = next(line for line in f if line.startswith("NSpid:")).split()[1:]
        assert _ppid(inside) == 1 and len(nspid) == 2 and nspid[-1] != "1"
        live = liveness({"processes": []}, gpus(inside), now=0, users=["nobody"])
        assert [h["pid"] for h in live["leftovers"]] == [inside] and live["namespace_inits"] == []
    finally:
        _kill(inside)
        _kill(init)


@pytest.fixture
def venv():
    """A venv's layout that every user may reach: its bin/python, a link to this interpreter (as
    venv makes it)."""
    top = tempfile.mkdtemp(prefix="gpufleet-leftover-")
    os.chmod(top, 0o755)
    os.makedirs(os.path.join(top, "venv", "bin"))
    os.symlink("/usr/bin/python3", os.path.join(top, "venv", "bin", "python"))  # reachable by every user
    with open(os.path.join(top, "venv", "pyvenv.cfg"), "w") as f:
        f.write("home = /usr/bin\n")
    yield os.path.join(top, "venv")
    shutil.rmtree(top)


SLEEP = ["-c", "import time; time.sleep(300)"]


def test_with_no_job_user_given_the_launch_user_s_reparented_venv_interpreter_is_a_leftover(spawn, venv):
    """The seed's case: the training runs as the container's root and the inventory names no job
    users. A worker the job left behind (parent init) running the venv's interpreter as the user
    the job is launched as (here the read's own, root) is the job's leftover; root's process
    running another interpreter (a daemon of the host's), and another user's process running the
    venv's, are not."""
    worker = spawn("root", os.path.join(venv, "bin", "python"), *SLEEP)
    daemon = spawn("root", "/usr/bin/python3", *SLEEP)
    theirs = spawn("daemon", os.path.join(venv, "bin", "python"), *SLEEP)
    live = liveness({"processes": []}, gpus(worker, daemon, theirs), now=0, venv=venv)
    assert [(h["pid"], h["user"]) for h in live["leftovers"]] == [(worker, "root")]
    # Without the venv, nothing tells the job's interpreter: no leftover but by the job's users.
    assert liveness({"processes": []}, gpus(worker, daemon, theirs), now=0)["leftovers"] == []
    check = check_job(live, {})
    assert check["ok"] is False and [h["pid"] for h in check["leftovers"]] == [worker]


def test_the_job_s_user_given_is_the_launch_user(spawn, venv):
    """gpufleet_job.user (launch_user) names the user the job is launched as: nobody's reparented
    venv interpreter is a leftover, root's is not; leftover_users, when given, is the whole rule."""
    mine = spawn("nobody", os.path.join(venv, "bin", "python"), *SLEEP)
    roots = spawn("root", os.path.join(venv, "bin", "python"), *SLEEP)
    live = liveness({"processes": []}, gpus(mine, roots), now=0, venv=venv, launch_user="nobody")
    assert [h["pid"] for h in live["leftovers"]] == [mine]
    live = liveness({"processes": []}, gpus(mine, roots), now=0, venv=venv, launch_user="nobody", leftover_users=["daemon"])
    assert live["leftovers"] == []
    # A launch user this host does not have names no one.
    assert liveness({"processes": []}, gpus(mine, roots), now=0, venv=venv, launch_user="no-such-user-gpufleet")["leftovers"] == []


def test_a_process_that_maps_the_venv_runs_its_interpreter_whatever_its_argv0(spawn, venv):
    """A worker started by the interpreter's real path (multiprocessing's spawn, an exec with
    another argv[0]) that imports from the venv maps a file below it."""
    os.makedirs(os.path.join(venv, "lib", "python3", "site-packages"))
    lib = os.path.join(venv, "lib", "python3", "site-packages", "mapped.bin")
    with open(lib, "wb") as f:
        f.write(b"\0" * 4096)
    code = "import mmap, time; f = open(%r, 'rb'); m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ); time.sleep(300)" % lib
    worker = spawn("root", "/usr/bin/python3", "-c", code)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open("/proc/%d/maps" % worker) as f:
            if lib in f.read():
                break
        time.sleep(0.02)
    live = liveness({"processes": []}, gpus(worker), now=0, venv=venv)
    assert [h["pid"] for h in live["leftovers"]] == [worker]


def test_the_job_s_workers_holding_gpus_are_the_job_s():
    """torch.compile's compile workers (and a data loader's children) hold GPU contexts under
    command lines the job's patterns do not match: as descendants of the job they are its workers,
    neither leftovers nor foreign holders, so gpu_idle passes a running job with them where running
    jobs are allowed, and remediate keeps that job."""
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._checks import check_gpu

    code = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '300']); print(p.pid, flush=True); time.sleep(300)"
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = int(job.stdout.readline())
    try:
        state = gpus(job.pid, worker)
        live = liveness(job_of("root", job.pid), state, now=0)
        assert live["workers"] == [worker] and live["leftovers"] == []
        gpu = {"gpus": [{"index": 0, "idle": False, "memory_used_mib": 900, "processes": state[0]["processes"]}]}
        check = check_gpu(gpu, job_of("root", job.pid), True, live)
        assert check["ok"] is True and check["summary"] == "held by the running job (pid %d, %d)" % (job.pid, worker)
        # Without the liveness read (its workers unknown), the worker is a holder that is not the job.
        assert check_gpu(gpu, job_of("root", job.pid), True)["others"] == [worker]
    finally:
        _kill(worker)
        job.kill()
        job.wait()
