# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""processes: real processes, real signals, a decoy that must survive."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from ansible_collections.gpufleet.hygiene.plugins.modules import processes


def spawn(tag, ignore_term=False):
    code = "import signal, time\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    code += "time.sleep(120)\n"
    return subprocess.Popen([sys.executable, "-c", code, tag])


@pytest.fixture
def tag():
    return "gpufleet-test-%s" % uuid.uuid4().hex[:10]


@pytest.fixture
def procs():
    started = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_query_then_absent_then_idempotent(run_module, tag, procs):
    job = spawn(tag + "-train_dflash.py")
    decoy = spawn(tag + "-train_dflash_notes.txt")  # resembles the job's name, not its pattern
    procs += [job, decoy]
    time.sleep(0.2)
    scope = {"cmdline": [tag + r"-train_dflash\.py$"]}
    q = run_module(processes.main, {"scope": scope})
    assert q["changed"] is False and [p["pid"] for p in q["processes"]] == [job.pid]
    check = run_module(processes.main, {"scope": scope, "state": "absent"}, check_mode=True)
    assert check["changed"] and check["terminated"][0]["outcome"] == "would_terminate"
    assert job.poll() is None
    done = run_module(processes.main, {"scope": scope, "state": "absent", "grace_period": 5})
    assert done["changed"] and done["terminated"][0]["outcome"] == "terminated"
    assert job.wait(timeout=5) == -15
    assert decoy.poll() is None, "the decoy must survive"
    again = run_module(processes.main, {"scope": scope, "state": "absent"})
    assert again["changed"] is False and again["count"] == 0


def test_sigterm_ignored_gets_sigkill(run_module, tag, procs):
    stubborn = spawn(tag, ignore_term=True)
    procs.append(stubborn)
    time.sleep(0.3)
    done = run_module(processes.main, {"scope": {"cmdline": [tag]}, "state": "absent", "grace_period": 0.5})
    assert done["terminated"][0]["signals"] == ["SIGTERM", "SIGKILL"]
    assert done["terminated"][0]["outcome"] == "killed"
    assert stubborn.wait(timeout=5) == -9


def test_never_signals_itself_or_pid1(run_module):
    # A scope matching every python process would include this test process: it is excluded.
    q = run_module(processes.main, {"scope": {"users": [str(os.getuid())]}})
    pids = {p["pid"] for p in q["processes"]}
    assert os.getpid() not in pids and 1 not in pids


def test_empty_scope_and_bad_regex(run_module):
    assert "scope names no criterion" in run_module(processes.main, {"scope": {}})["msg"]
    assert "invalid regular expression" in run_module(processes.main, {"scope": {"cmdline": ["("]}})["msg"]


def spawn_with_worker(tag):
    """A job whose worker (like a compile or data-loader worker) has a command line of its own."""
    code = ("import subprocess, sys, time\n"
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', sys.argv[1] + ':compile-worker'])\n"
            "print(w.pid, flush=True)\n"
            "time.sleep(120)\n")
    job = subprocess.Popen([sys.executable, "-c", code, tag + "-train_dflash.py"], stdout=subprocess.PIPE, text=True)
    return job, int(job.stdout.readline())


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_descendants_are_in_scope_and_stopped_with_the_job(run_module, tag, procs):
    job, worker = spawn_with_worker(tag)
    procs.append(job)
    scope = {"cmdline": [tag + r"-train_dflash\.py$"]}
    q = run_module(processes.main, {"scope": scope, "descendants": True})
    assert [(p["pid"], p["descendant_of"]) for p in q["processes"]] == [(job.pid, None), (worker, job.pid)]
    assert [p["pid"] for p in run_module(processes.main, {"scope": scope})["processes"]] == [job.pid]
    done = run_module(processes.main, {"scope": scope, "state": "absent", "grace_period": 5, "descendants": True})
    assert {t["pid"]: t["outcome"] for t in done["terminated"]} == {job.pid: "terminated", worker: "terminated"}
    job.wait(timeout=5)
    deadline = time.time() + 5
    while _alive(worker) and time.time() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def test_without_descendants_the_worker_is_left(run_module, tag, procs):
    job, worker = spawn_with_worker(tag)
    procs.append(job)
    try:
        done = run_module(processes.main, {"scope": {"cmdline": [tag + r"-train_dflash\.py$"]}, "state": "absent",
                                           "grace_period": 5})
        assert [t["pid"] for t in done["terminated"]] == [job.pid]
        job.wait(timeout=5)
        assert _alive(worker), "only the job itself was asked for"
    finally:
        if _alive(worker):
            os.kill(worker, 9)


@pytest.mark.parametrize("pattern", ["", ".*", "a|", "(?:x)?", r"\s*"])
def test_pattern_matching_every_process_is_refused(run_module, tag, procs, pattern):
    decoy = spawn(tag + "-decoy")
    procs.append(decoy)
    for key in ("cmdline", "name"):
        result = run_module(processes.main, {"scope": {key: [pattern], "users": [str(os.getuid())]}, "state": "absent"})
        assert result["failed"]
        assert "scope.%s pattern %r matches the empty string, so it matches every process" % (key, pattern) in result["msg"]
    assert decoy.poll() is None


@pytest.mark.parametrize("session", ["usersess:", "usersess:0", "usersess.0", "usersess:0.0", "train\nusersess", "", "a\tb"])
def test_tmux_session_that_tmux_would_read_as_another_target_is_refused(run_module, tmp_path, tag, session):
    """tmux reads =usersess:0 as the session usersess: such a name would reach a user's own
    session. Refused, and that session's process survives."""
    sock = str(tmp_path / "tmux.sock")
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", "usersess", sys.executable, "-c",
                    "import time; time.sleep(120)", tag], check=True)
    try:
        before = run_module(processes.main, {"scope": {"tmux_session": "usersess", "tmux_socket": sock}})
        assert before["count"] == 1
        result = run_module(processes.main, {"scope": {"tmux_session": session, "tmux_socket": sock}, "state": "absent"})
        assert result["failed"]
        assert "scope.tmux_session %r" % session in result["msg"]
        assert "is empty" in result["msg"] if not session else "no session is named that way" in result["msg"]
        after = run_module(processes.main, {"scope": {"tmux_session": "usersess", "tmux_socket": sock}})
        assert after["processes"] == before["processes"]
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], check=False)


def test_process_naming_itself_with_bytes_that_are_not_utf8_is_still_seen(run_module, tag, procs):
    """A process may set its name (comm, in /proc/<pid>/stat) to any bytes: it must still be
    listed and stopped, not look gone."""
    code = ("import ctypes, time\n"
            "ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(b'\\xff\\xfe) x (job'), 0, 0, 0)\n"
            "open('/proc/self/comm', 'rb').read()\n"
            "time.sleep(120)\n")
    job = subprocess.Popen([sys.executable, "-c", code, tag])
    procs.append(job)
    for _i in range(100):
        with open("/proc/%d/comm" % job.pid, "rb") as f:
            if f.read().startswith(b"\xff"):
                break
        time.sleep(0.02)
    q = run_module(processes.main, {"scope": {"cmdline": [tag + "$"]}})
    assert [p["pid"] for p in q["processes"]] == [job.pid]
    assert q["processes"][0]["comm"] == "\ufffd\ufffd) x (job"
    done = run_module(processes.main, {"scope": {"cmdline": [tag + "$"]}, "state": "absent", "grace_period": 5})
    assert done["terminated"][0]["outcome"] == "terminated"
    assert job.wait(timeout=5) == -15


def _start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def test_pids_scope_stops_the_listed_process_and_nothing_else(run_module, tag, procs):
    """A process named by PID and start time, as a read returned it, is stopped; a process of
    the same command line beside it is not listed and survives."""
    job, twin = spawn(tag), spawn(tag)
    procs += [job, twin]
    time.sleep(0.2)
    scope = {"pids": [{"pid": job.pid, "start_time": _start_time(job.pid)}]}
    q = run_module(processes.main, {"scope": scope})
    assert [(p["pid"], p["start_time"]) for p in q["processes"]] == [(job.pid, _start_time(job.pid))]
    done = run_module(processes.main, {"scope": scope, "state": "absent", "grace_period": 5})
    assert [(t["pid"], t["outcome"]) for t in done["terminated"]] == [(job.pid, "terminated")]
    assert job.wait(timeout=5) == -15
    assert twin.poll() is None, "a process not listed must survive"
    again = run_module(processes.main, {"scope": scope, "state": "absent"})
    assert again["changed"] is False and again["count"] == 0


def test_a_listed_pid_whose_start_time_differs_is_not_signalled(run_module, tag, procs):
    """The entry was read from an earlier process of that PID: the PID now names another one
    (its start time differs), which is out of scope and never signalled."""
    other = spawn(tag)
    procs.append(other)
    time.sleep(0.2)
    stale = {"pid": other.pid, "start_time": _start_time(other.pid) - 1}
    done = run_module(processes.main, {"scope": {"pids": [stale]}, "state": "absent", "grace_period": 1})
    assert done["changed"] is False and done["count"] == 0 and done["terminated"] == []
    time.sleep(0.2)
    assert other.poll() is None


def test_scope_vmids_is_gpu_state_s_alone_processes_refuses_it(run_module):
    """Inside a container a process has no vmid: processes' scope has no vmids option (gpu_state's,
    which reads from the node, has)."""
    bad = run_module(processes.main, {"scope": {"cmdline": ["train_dflash\\.py"], "vmids": [100]}})
    assert bad["failed"] and "vmids" in bad["msg"] and "Unsupported parameters" in bad["msg"], bad["msg"]


def test_pids_combine_with_the_other_criteria_and_are_checked(run_module, tag, procs):
    job = spawn(tag)
    procs.append(job)
    time.sleep(0.2)
    entry = {"pid": job.pid, "start_time": _start_time(job.pid)}
    # Every criterion must match: the listed PID is not in scope when its command line is not.
    q = run_module(processes.main, {"scope": {"pids": [entry], "cmdline": [tag + "-not-this$"]}})
    assert q["count"] == 0
    q = run_module(processes.main, {"scope": {"pids": [entry], "cmdline": [tag + "$"]}})
    assert [p["pid"] for p in q["processes"]] == [job.pid]
    bad = run_module(processes.main, {"scope": {"pids": [{"pid": 0, "start_time": 5}]}})
    assert bad["failed"] and "pid must be at least 1" in bad["msg"]
    missing = run_module(processes.main, {"scope": {"pids": [{"pid": job.pid}]}, "state": "absent"})
    # The argument spec's own message: the entry is refused before any process is looked at.
    assert missing["failed"] and missing["msg"] == "missing required arguments: start_time found in scope -> pids", missing
    assert job.poll() is None
    missing = run_module(processes.main, {"scope": {"pids": [{"start_time": 5}]}, "state": "absent"})
    assert missing["failed"] and missing["msg"] == "missing required arguments: pid found in scope -> pids", missing


def test_diff_names_what_it_stops_and_only_under_diff(run_module, tag, procs):
    """--diff shows each process in scope (PID, user, command line) before and what is left after;
    in check mode that is the plan; without --diff the result carries no diff."""
    job = spawn(tag + "-train_dflash.py")
    decoy = spawn(tag + "-other.py")
    procs += [job, decoy]
    time.sleep(0.2)
    scope = {"cmdline": [tag + r"-train_dflash\.py$"]}
    plan = run_module(processes.main, {"scope": scope, "state": "absent"}, check_mode=True, diff=True)
    user = plan["processes"][0]["user"]
    assert plan["diff"]["before"].startswith("pid %d (%s) %s -c " % (job.pid, user, sys.executable))
    assert plan["diff"]["before"].rstrip().endswith(tag + "-train_dflash.py") and plan["diff"]["after"] == ""
    assert str(decoy.pid) not in plan["diff"]["before"] and job.poll() is None
    assert "diff" not in run_module(processes.main, {"scope": scope, "state": "absent"}, check_mode=True)
    done = run_module(processes.main, {"scope": scope, "state": "absent", "grace_period": 5}, diff=True)
    assert done["diff"]["before"] == plan["diff"]["before"] and done["diff"]["after"] == ""
    assert job.wait(timeout=5) == -15 and decoy.poll() is None
    assert "diff" not in run_module(processes.main, {"scope": scope, "state": "absent"}, diff=True)  # nothing left to stop
