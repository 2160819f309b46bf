# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""proc/_scope: a scope's criteria (all must match), its listed PIDs, its tmux session and the
everyday processes its patterns may not match; and what a scope may never reach: broad patterns
(checked against this machine's real processes, not the implementation's table), a PID
namespace's init, kernel threads; and a namespace's PID 2, which is an ordinary process there.
Real processes, a real PID namespace (``unshare --pid --fork --mount-proc``), real signals.

The Scope with the table of everyday processes it refuses to match (proc/_ordinary; the table
itself is tested in test_ordinary.py), also through the processes and gpu_state modules and the
kill role; proc/_proc reads the processes, applies the scope and its protection."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from procfiles import fake_proc

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc, _scope
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import describe, scan_device_holders
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._scope import ProcError, Scope, tmux_name_problem, tmux_pane_pids
from ansible_collections.gpufleet.hygiene.plugins.modules import gpu_state, processes
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

MODULES = os.path.dirname(os.path.abspath(processes.__file__))
COLLECTIONS = MODULES.rsplit(os.sep + "ansible_collections" + os.sep, 1)[0]  # where ansible_collections/ lies
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                                reason="a PID namespace needs root, unshare and nsenter")


# --------------------------------------------------------------------------- criteria, pids, tmux, everyday rows


def test_everyday_rows_take_roots_daemons_past_a_process_gone_meanwhile(tmp_path, monkeypatch):
    """A process that ended between the listing and the read of its name is passed over, not
    the end of the list: root's sshd listed after it still gives its row."""
    gone = fake_proc(tmp_path, 40, comm="sshd")
    (gone / "comm").mkdir()  # reading it fails, as a vanished process's does
    fake_proc(tmp_path, 41, comm="sshd", uid=0, cmdline=b"sshd: /etc/ssh/sshd_config [listener]\0")
    (tmp_path / "41" / "comm").write_text("sshd\n")
    fake_proc(tmp_path, 42, comm="sshd", uid=1000, cmdline=b"sshd: fake [listener]\0")  # not root's
    (tmp_path / "42" / "comm").write_text("sshd\n")
    monkeypatch.setattr(_scope, "all_pids", lambda proc=None: [40, 41, 42])
    rows = _scope.ordinary_processes(str(tmp_path))
    assert rows[:len(_scope.ORDINARY)] == list(_scope.ORDINARY)
    assert rows[len(_scope.ORDINARY):] == [("sshd", "sshd: /etc/ssh/sshd_config [listener]")]


def test_pid_1_is_no_everyday_row_even_under_a_daemon_s_name(tmp_path, monkeypatch):
    """In a one-process container PID 1 may be the job itself; a pattern that names it is right."""
    fake_proc(tmp_path, 1, comm="sshd", ppid=0, uid=0, cmdline=b"sshd: /etc/ssh/sshd_config [listener]\0")
    (tmp_path / "1" / "comm").write_text("sshd\n")
    monkeypatch.setattr(_scope, "all_pids", lambda proc=None: [1])
    assert _scope.ordinary_processes(str(tmp_path)) == list(_scope.ORDINARY)


def test_everyday_rows_end_with_this_module_s_own_process():
    """This process's own (comm, command line) is a row, so that no scope pattern matches the
    module that reads it."""
    with open("/proc/self/comm") as f:
        comm = f.read().rstrip("\n")
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = " ".join(a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a)
    assert _scope.ordinary_processes()[-1] == (comm, cmdline)


@pytest.mark.parametrize("cmdline, pattern, hit", [
    ("/opt/venv/bin/dflash-train run.py --steps 9", "^dflash-train$", True),  # argv[0]'s basename
    ("/opt/venv/bin/dflash-train run.py --steps 9", "^9$", False),            # the last argument is no name
    ("/opt/venv/bin/dflash-train run.py --steps 9", "^run.py$", False),
])
def test_a_name_is_searched_in_comm_and_argv_0_s_basename_only(cmdline, pattern, hit):
    info = {"pid": 4200, "comm": "pt_main_thread", "cmdline": cmdline}
    assert Scope(name=[pattern]).matches(info)[0] is hit


def test_scope_criteria_are_anded(gpu):
    _state, trainers = gpu
    p = trainers.start(tag="run-a")
    info = describe(p.pid)
    me = str(os.getuid())
    assert Scope(cmdline=["train_dflash"]).matches(info) == (True, "in scope")
    assert Scope(cmdline=["train_dflash"], users=[me]).matches(info)[0]
    ok, why = Scope(cmdline=["train_dflash"], users=["no-such-user"]).matches(info)
    assert not ok and "scope.users" in why
    assert not Scope(cmdline=["--tag run-b"]).matches(info)[0]
    assert Scope(name=["^python"], allow_broad=True).matches(info)[0]
    with pytest.raises(ProcError, match="matches ordinary system processes"):
        Scope(name=["^python"])  # every Python process, this module's own among them
    assert not Scope(vmids=[200]).matches(info)[0]
    assert Scope().matches(info) == (False, "the scope is empty")
    with pytest.raises(ProcError, match="invalid regular expression"):
        Scope(cmdline=["("])


@pytest.mark.parametrize("entry", [{"pid": 5}, {"start_time": 9}, {"pid": "five", "start_time": 9}, None, [5, 9]],
                         ids=["no_start_time", "no_pid", "pid_not_a_number", "null", "a_list"])
def test_a_pids_entry_without_an_integer_pid_and_start_time_is_refused_naming_it(entry):
    with pytest.raises(ProcError) as err:
        Scope(pids=[{"pid": 4, "start_time": 8}, entry])
    assert str(err.value) == "scope.pids: each entry needs an integer pid and start_time, got %r" % (entry,)


@pytest.mark.parametrize("entry", [{"pid": 0, "start_time": 9}, {"pid": 5, "start_time": -1}])
def test_a_pids_entry_out_of_range_is_refused_naming_it(entry):
    with pytest.raises(ProcError) as err:
        Scope(pids=[entry])
    assert str(err.value) == "scope.pids: pid must be at least 1 and start_time at least 0, got %r" % (entry,)


def test_a_start_time_of_0_is_a_start_time():
    """Clock ticks since boot: a process started in the boot's first tick has 0."""
    assert Scope(pids=[{"pid": 5, "start_time": 0}]).pids == {5: 0}


def fake_tmux(tmp_path, monkeypatch, script):
    """A tmux first on PATH that runs ``script`` (sh)."""
    fake = tmp_path / "bin" / "tmux"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\n" + script)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (fake.parent, os.environ["PATH"]))


@pytest.mark.parametrize("name, bad", [
    ("train", None), ("train-2_b", None), ("tr\u00e4ning", None),  # letters beyond ASCII are a name's own
    ("train run", None),  # a space is no separator: the target is one argument
    ("train:0", "':'"), ("train.1", "'.'"), ("train\x7f", "'\\x7f'"), ("train\t", "'\\t'"), ("a\x1fb", "'\\x1f'"),
])
def test_a_tmux_name_is_refused_for_separators_and_control_characters_only(name, bad):
    why = tmux_name_problem(name)
    if bad is None:
        assert why is None
    else:
        assert why.startswith("contains %s, which tmux reads" % bad), why


def test_a_tmux_that_does_not_answer_is_named_with_its_timeout(tmp_path, monkeypatch):
    fake_tmux(tmp_path, monkeypatch, "exec sleep 30\n")
    started = time.monotonic()
    with pytest.raises(ProcError) as err:
        tmux_pane_pids("train", timeout=0.3)
    assert str(err.value) == "tmux did not answer within 0.3s"
    assert time.monotonic() - started < 10


def test_a_tmux_session_with_no_tmux_installed_is_an_error_that_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no tmux anywhere on it
    with pytest.raises(ProcError) as err:
        tmux_pane_pids("train")
    assert str(err.value) == "scope.tmux_session is set but tmux is not installed on the target"


def test_a_tmux_killed_by_a_signal_gives_no_panes(tmp_path, monkeypatch):
    """What a tmux that died printed is not trusted: its exit status is not 0 (a signal's is
    negative), so the session holds nothing."""
    fake_tmux(tmp_path, monkeypatch, "echo 4242\nkill -KILL $$\n")
    assert tmux_pane_pids("train") is None


def test_a_tmux_session_that_is_not_there_holds_nothing_and_says_so(tmp_path, monkeypatch):
    fake_tmux(tmp_path, monkeypatch, "echo 'no server running' >&2\nexit 1\n")
    scope = Scope(tmux_session="train")
    assert scope.matches(describe(os.getpid())) == (False, "not in tmux session train")
    assert scope.notes == ["tmux session 'train' was not found: nothing is in it"]


def test_a_user_not_listed_is_named_out_of_scope():
    assert Scope(users=["alice"]).matches({"pid": 5, "uid": 1001, "user": "bob"}) == (False, "user bob is not in scope.users")


def test_a_pid_not_listed_is_named_out_of_scope():
    scope = Scope(pids=[{"pid": 4, "start_time": 8}])
    assert scope.matches({"pid": 5, "start_time": 8}) == (False, "pid 5 is not in scope.pids")


def test_scope_tmux_session(gpu, tmp_path):
    state, trainers = gpu
    sock = str(tmp_path / "tmux.sock")
    outside = trainers.start(tag="outside")
    cmd = "%s %s --state %s --gpu 1 --mib 10 --tag inside" % (sys.executable, gpu_standin.TRAINER, state)
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", "train", cmd], check=True)
    try:
        inside = None
        for _i in range(100):
            holders, _u = scan_device_holders([gpu_standin.device(state, 1)])
            if holders:
                inside = list(holders)[0]
                break
            time.sleep(0.05)
        assert inside is not None
        scope = Scope(tmux_session="train", tmux_socket=sock)
        assert scope.matches(describe(inside))[0]
        assert not scope.matches(describe(outside.pid))[0]
        missing = Scope(tmux_session="nope", tmux_socket=sock)
        assert not missing.matches(describe(inside))[0]
        assert "was not found" in missing.notes[0]
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], check=False)


# --------------------------------------------------------------------------- real command lines


def _raw(pid, name):
    with open("/proc/%d/%s" % (pid, name), "rb") as f:
        return f.read()


def real_processes():
    """(comm, argv0 basename, cmdline) of this machine's init, its sshd processes and its other
    everyday daemons, read straight from /proc (not through the module's own reader)."""
    wanted = {"sshd", "cron", "crond", "agetty", "dbus-daemon", "systemd", "init", "rsyslogd", "systemd-journal"}
    rows = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            comm = _raw(pid, "comm").decode("utf-8", "replace").rstrip("\n")
            argv = [a.decode("utf-8", "replace") for a in _raw(pid, "cmdline").split(b"\0") if a]
        except OSError:
            continue
        # PID 1 counts only as an everyday init (systemd, init): the scope leaves PID 1 out of
        # its table (protected anyway; in a one-process container it may be the job itself).
        if argv and comm in wanted:
            # A process that sets its title (sshd) has spaces in argv[0]: its name is the first word.
            rows.append((comm, os.path.basename(argv[0].split(" ")[0]), " ".join(argv)))
    return rows


@pytest.fixture(scope="module")
def everyday(tmp_path_factory):
    """The machine's real everyday processes; an sshd of our own is started when none runs."""
    rows = real_processes()
    started = None
    if not any(comm == "sshd" for comm, _a, _c in rows) and shutil.which("sshd") and shutil.which("ssh-keygen"):
        d = tmp_path_factory.mktemp("sshd")
        key = str(d / "host_key")
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key], check=True)
        with socket.socket() as probe:  # a free loopback port: sshd refuses port 0
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        started = subprocess.Popen([shutil.which("sshd"), "-D", "-f", "/dev/null", "-h", key, "-p", str(port),
                                    "-o", "ListenAddress=127.0.0.1"], stderr=subprocess.PIPE)
        for _attempt in range(50):
            rows = real_processes()
            if any(comm == "sshd" for comm, _a, _c in rows) or started.poll() is not None:
                break
            time.sleep(0.1)
        assert started.poll() is None, "sshd did not start: %s" % started.stderr.read().decode(errors="replace")
    assert any(comm == "sshd" for comm, _a, _c in rows), "no sshd to test against"
    yield rows
    if started is not None:
        started.kill()
        started.wait()


# Pattern pieces that say nothing about a job: classes, wildcards, anchors, separators.
ATOM = st.sampled_from([".", r"\S", r"\s", r"\w", r"\W", r"[\s\S]", r"\D", r"\d", r"[a-z]", r"[^ ]", "/", "-",
                        " ", ":", "_", r"[^/]"])
QUANT = st.sampled_from(["", "", "+", "?", "*", "{2}", "{1,3}", "+?"])
PIECE = st.builds(lambda a, q: a + q, ATOM, QUANT)
BROAD = st.builds(lambda anchor, pieces, alt: alt + anchor + "".join(pieces),
                  st.sampled_from(["", "^"]), st.lists(PIECE, min_size=1, max_size=3),
                  st.sampled_from(["", r"train_zq9\.py|"]))
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _refused(key, pattern, **kw):
    try:
        _scope.Scope(**{key: [pattern]}, **kw)
    except _scope.ProcError as exc:
        assert str(exc).startswith("scope.%s pattern %r matches" % (key, pattern)), str(exc)
        return str(exc)
    return None


@SETTINGS
@given(pattern=BROAD)
def test_a_cmdline_pattern_that_matches_a_real_everyday_process_is_refused(everyday, pattern):
    hits = [cmdline for _comm, _argv0, cmdline in everyday if re.search(pattern, cmdline)]
    if hits:
        assert _refused("cmdline", pattern), "%r matches %r and was accepted" % (pattern, hits[0])
        assert _refused("cmdline", pattern, allow_broad=True) is None or re.search(pattern, "")


@pytest.mark.skipif(os.geteuid() != 0, reason="starts a process as another user")
def test_a_running_daemon_s_own_title_counts_as_everyday_but_only_root_s():
    """A root daemon named as a table row (sshd here) with a command line no row foresees is
    everyday too; the same name run by an ordinary user, or root's job under python3, changes nothing."""
    # Outside pytest's own 0700 base: nobody must reach the program.
    fake = os.path.join(tempfile.mkdtemp(prefix="gpufleet-daemon-", dir="/tmp"), "sshd")
    os.chmod(os.path.dirname(fake), 0o755)
    shutil.copy(shutil.which("bash"), fake)
    marker = "gpufleet-%s/sshd_config" % uuid.uuid4().hex[:8]
    pattern = re.escape(marker)
    try:
        with running([fake, "-c", "sleep 300; :", marker], user="nobody"):
            assert _refused("cmdline", pattern) is None
        with running([fake, "-c", "sleep 300; :", marker]):
            assert marker in (_refused("cmdline", pattern) or "")
            assert _refused("cmdline", pattern, allow_broad=True) is None
        # Root's job under an interpreter's name is a job, not a daemon: its pattern stays accepted.
        job = os.path.join(os.path.dirname(fake), "python3")
        shutil.copy(fake, job)
        with running([job, "-c", "sleep 300; :", marker]):
            assert _refused("cmdline", pattern) is None
    finally:
        shutil.rmtree(os.path.dirname(fake))


@contextlib.contextmanager
def running(argv, **popen):
    """A process of argv for the with block (given 0.2 s to exec, so that /proc shows its command
    line), killed and reaped after it."""
    proc = subprocess.Popen(argv, **popen)
    try:
        time.sleep(0.2)
        yield proc
    finally:
        proc.kill()
        proc.wait()


@SETTINGS
@given(pattern=BROAD)
def test_a_name_pattern_that_matches_a_real_everyday_process_is_refused(everyday, pattern):
    hits = [name for comm, argv0, _c in everyday for name in (comm, argv0) if re.search(pattern, name)]
    if hits:
        assert _refused("name", pattern), "%r matches %r and was accepted" % (pattern, hits[0])


@SETTINGS
@given(word=st.from_regex(r"\A[a-z][a-z0-9_]{3,12}\Z"), anchored=st.booleans())
def test_a_pattern_anchored_on_a_job_is_accepted(everyday, word, anchored):
    """The other way round: the patterns the docs recommend are not refused."""
    pattern = (r"^\S*python3? \S*" if anchored else "") + re.escape(word + "_train.py") + r"(\s|$)"
    assert not any(re.search(pattern, c) for _a, _b, c in everyday)
    assert _refused("cmdline", pattern) is None


@pytest.mark.parametrize("pattern", [".", r"\S", "^.", r"[\s\S]", r"\w", "python3?", "sshd", "bash"])
def test_the_broad_patterns_of_the_report_are_refused_and_nothing_is_signalled(run_module, pattern):
    tag = "gpufleet-test-%s" % uuid.uuid4().hex[:10]
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", tag])
    try:
        for key in ("cmdline", "name"):
            res = run_module(processes.main, {"scope": {key: [pattern]}, "state": "absent"}, check_mode=True)
            assert res["failed"] and "scope.%s pattern %r matches ordinary system processes" % (key, pattern) in res["msg"]
            assert "scope.allow_broad" in res["msg"] and "terminated" not in res
            res = run_module(gpu_state.main, {"state": "idle", "scope": {key: [pattern]}, "nvidia_smi": "/nonexistent"},
                             check_mode=True)
            assert res["failed"] and "scope.%s pattern %r matches ordinary system processes" % (key, pattern) in res["msg"]
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()


def test_allow_broad_is_passed_through_and_pid1_stays_protected(run_module):
    # Processes of its own that a broad scope must reach, whatever else runs on this machine.
    decoys = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _decoy in range(3)]
    try:
        res = run_module(processes.main, {"scope": {"cmdline": ["."], "allow_broad": True}, "state": "absent"},
                         check_mode=True)
    finally:
        for decoy in decoys:
            decoy.kill()
            decoy.wait()
    pids = {p["pid"] for p in res["processes"]}
    assert res["changed"] is True and {d.pid for d in decoys} <= pids
    assert 1 not in pids and os.getpid() not in pids
    reasons = {p["pid"]: p["reason"] for p in res["protected"]}
    assert "init of the node's PID namespace" in reasons[1]
    assert "own process" in reasons[os.getpid()]
    assert all(t["signals"] == [] and t["outcome"] == "would_terminate" for t in res["terminated"])
    # the empty string is refused even so
    res = run_module(processes.main, {"scope": {"cmdline": [".*"], "allow_broad": True}})
    assert res["failed"] and "matches the empty string" in res["msg"]


# --------------------------------------------------------------------------- kernel threads


def test_kernel_threads_are_told_by_their_flag_and_never_in_scope(run_module):
    comm = _raw(2, "comm").decode().strip()
    if comm != "kthreadd":
        pytest.skip("PID 2 here is %r: this /proc is not a host's" % comm)
    stat = _raw(2, "stat").decode()
    assert _proc.stat_flags(stat) & _proc.PF_KTHREAD
    assert _proc.describe(2)["kthread"] and not _proc.describe(os.getpid())["kthread"]
    for scope in ({"name": ["^kthreadd$"]}, {"name": ["^kworker/"]}, {"name": ["^ksoftirqd"]}):
        res = run_module(processes.main, {"scope": scope})
        assert (res["count"], res["processes"], res["protected"]) == (0, [], []), scope


# --------------------------------------------------------------------------- a real PID namespace


INIT = """
import os, subprocess, sys, time
tag, script = sys.argv[1][:-len("-init")], sys.argv[2]
fd = os.open(os.environ["GPF_DEVICE"], os.O_RDONLY) if os.environ.get("GPF_DEVICE") else None
job = subprocess.Popen([sys.executable, script, tag + "-job"])
while True:
    time.sleep(60)
"""

JOB = """
import subprocess, sys, time
if sys.argv[1].endswith("-job"):
    subprocess.Popen([sys.executable, __file__, sys.argv[1][:-4] + "-worker"])
time.sleep(120)
"""


def _nspid(pid):
    for line in _raw(pid, "status").decode().splitlines():
        if line.startswith("NSpid:"):
            return [int(x) for x in line.split()[1:]]
    return []


def _alive(pid):
    try:
        return _raw(pid, "stat").decode().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_inside(init, tag, module, args):
    """The module as Ansible runs it, entered into the PID namespace whose init has host PID
    ``init``, as lxc-attach enters a container."""
    path = os.path.join(MODULES, module + ".py")
    argsfile = "/tmp/%s-args.json" % tag
    with open(argsfile, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": args}, f)
    try:
        out = subprocess.run(["nsenter", "-t", str(init), "--pid", "--mount", "--",
                              sys.executable, path, argsfile], env=dict(os.environ, PYTHONPATH=COLLECTIONS),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False)
    finally:
        os.unlink(argsfile)
    assert out.stdout, out.stderr
    return json.loads(out.stdout)


class Namespace(object):
    """``unshare --pid --fork --mount-proc``: an init (PID 1 there), the job (PID 2) and its
    worker (PID 3, whose parent is PID 2), each with ``<tag>-<role>`` as its last argument."""

    def __init__(self, tmp_path, device=None):
        self.tag = "gpufleet-test-%s" % uuid.uuid4().hex[:10]
        init, job = tmp_path / "init.py", tmp_path / "job.py"
        init.write_text(INIT)
        job.write_text(JOB)
        env = dict(os.environ, GPF_DEVICE=device or "")
        self.unshare = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child",
                                         sys.executable, str(init), self.tag + "-init", str(job)], env=env)
        self.host = {}
        deadline = time.monotonic() + 10
        while len(self.host) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        argv = _raw(int(entry), "cmdline").split(b"\0")
                    except OSError:
                        continue
                    for role in ("init", "job", "worker"):
                        if (self.tag + "-" + role).encode() in argv[1:] and argv[0] == sys.executable.encode():
                            self.host[role] = int(entry)
        assert len(self.host) == 3, self.host
        self.inner = {role: _nspid(pid)[-1] for role, pid in self.host.items()}
        assert self.inner == {"init": 1, "job": 2, "worker": 3}, self.inner

    def pattern(self, roles="init|job|worker"):
        return "^%s \\S+ %s-(%s)" % (re.escape(sys.executable), re.escape(self.tag), roles)

    def run_inside(self, module, args):
        return run_inside(self.host["init"], self.tag, module, args)

    def close(self):
        self.unshare.kill()
        self.unshare.wait()
        for pid in self.host.values():
            deadline = time.monotonic() + 5
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)


@pytest.fixture
def ns(tmp_path):
    n = Namespace(tmp_path)
    yield n
    n.close()


def _wait_gone(pid, seconds=5):
    deadline = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


@NEEDS_ROOT
def test_inside_a_namespace_pid2_is_signalled_and_pid1_refused(ns):
    """As in a container: the job is PID 2 there and its worker's parent is PID 2; both are found
    and stopped. PID 1 matches the scope too: refused, and the result says which and why."""
    res = ns.run_inside("processes", {"scope": {"cmdline": [ns.pattern()]}, "state": "absent", "grace_period": 5})
    assert not res.get("failed"), res
    assert [p["pid"] for p in res["processes"]] == [2, 3]
    assert {t["pid"]: t["outcome"] for t in res["terminated"]} == {2: "terminated", 3: "terminated"}
    [init] = res["protected"]
    assert init["pid"] == 1 and "PID 1 (NSpid ends in 1)" in init["reason"]
    warned = json.dumps(res["warnings"])  # as the module wrote them, before the controller reads them
    assert "pid 1 (" in warned and "not signalled" in warned
    assert _wait_gone(ns.host["job"]) and _wait_gone(ns.host["worker"])
    assert _alive(ns.host["init"])


@NEEDS_ROOT
def test_from_the_node_a_containers_init_is_refused(ns, run_module):
    """From the host's /proc: the namespace's init (NSpid ends in 1) is refused, the job and its
    worker are stopped."""
    res = run_module(processes.main, {"scope": {"cmdline": [ns.pattern()]}, "state": "absent", "grace_period": 5})
    assert sorted(p["pid"] for p in res["processes"]) == sorted([ns.host["job"], ns.host["worker"]])
    [init] = res["protected"]
    assert init["pid"] == ns.host["init"] and "init of its container's PID namespace" in init["reason"]
    assert {t["outcome"] for t in res["terminated"]} == {"terminated"}
    assert _wait_gone(ns.host["job"]) and _wait_gone(ns.host["worker"])
    assert _alive(ns.host["init"])


@NEEDS_ROOT
def test_descendants_stop_at_a_namespaces_init(ns, run_module):
    """A scope matching what started a container (here unshare, as lxc-start on a node) with
    descendants: the init is refused and nothing below it is taken as a worker."""
    scope = {"cmdline": ["^unshare .*%s-init" % re.escape(ns.tag)]}
    res = run_module(processes.main, {"scope": scope, "descendants": True, "state": "absent"}, check_mode=True)
    assert [p["pid"] for p in res["processes"]] == [ns.unshare.pid]
    [init] = res["protected"]
    assert (init["pid"], init["descendant_of"]) == (ns.host["init"], ns.unshare.pid)
    assert all(_alive(pid) for pid in ns.host.values())


@NEEDS_ROOT
def test_gpu_state_refuses_a_containers_init_holding_a_gpu(tmp_path, run_module):
    """gpu_state applies the same rule: a namespace's init that holds a GPU and matches the scope
    is listed in protected with the reason, never signalled."""
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=1, release_delay=0.1)
    smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", state)
    n = Namespace(tmp_path, device=gpu_standin.device(state, 0))
    try:
        res = run_module(gpu_state.main, {
            "nvidia_smi": smi, "vantage": "container", "state": "idle", "timeout": 0.3, "poll_interval": 0.05,
            "device_patterns": [os.path.join(state, "dev", "nvidia*")], "scope": {"cmdline": [n.pattern("init")]}})
        assert res["failed"] and res["terminated"] == []
        [init] = res["protected"]
        assert init["pid"] == n.host["init"] and init["container_pid"] == 1
        assert "PID 1 (NSpid ends in 1)" in init["reason"]
        assert _alive(n.host["init"])
    finally:
        n.close()


# --------------------------------------------------------------------------- scope.pids


# PID 1 of a fresh namespace: starts a process (PID 2 there), and at each line read stops it and
# makes the kernel give the next process the same PID (ns_last_pid), as PID reuse does.
REUSE = """
import os, subprocess, sys, time
tag = sys.argv[1]
proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", tag + "-first"])
print(proc.pid, flush=True)
sys.stdin.readline()
proc.kill()
proc.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(proc.pid - 1))
proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", tag + "-second"])
print(proc.pid, flush=True)
sys.stdin.readline()
"""


@NEEDS_ROOT
def test_a_listed_pid_reused_by_another_process_is_not_signalled(tmp_path):
    """Real PID reuse: the entry read for the first process names, after it exited, a second
    process given the same PID. The second is out of scope and survives."""
    tag = "gpufleet-test-%s" % uuid.uuid4().hex[:10]
    script = tmp_path / "reuse.py"
    script.write_text(REUSE)
    ns = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, str(script), tag],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        first = int(ns.stdout.readline())
        [init] = _proc.children_map().get(ns.pid, [])
        [read] = run_inside(init, tag, "processes", {"scope": {"cmdline": [re.escape(tag) + "-first$"]}})["processes"]
        assert read["pid"] == first
        ns.stdin.write("\n")
        ns.stdin.flush()
        assert int(ns.stdout.readline()) == first, "the kernel gave the second process the first one's PID"
        res = run_inside(init, tag, "processes", {"scope": {"pids": [{"pid": first, "start_time": read["start_time"]}]},
                                                  "state": "absent", "grace_period": 1})
        assert not res.get("failed"), res
        assert res["count"] == 0 and res["terminated"] == [] and res["changed"] is False
        [now] = run_inside(init, tag, "processes", {"scope": {"cmdline": [re.escape(tag) + "-second$"]}})["processes"]
        assert now["pid"] == first and now["start_time"] != read["start_time"]
    finally:
        ns.kill()
        ns.wait()


@NEEDS_ROOT
def test_a_listed_namespace_init_or_kernel_thread_is_never_signalled(ns, run_module):
    """scope.pids goes through the one protection rule: a container's init listed by its PID and
    start time is refused, a kernel thread (the host's kthreadd) is never looked at."""
    init = ns.host["init"]
    entries = [{"pid": init, "start_time": _proc.start_time(init)}]
    kthread = _proc.describe(2)
    if kthread is not None and kthread["kthread"]:
        entries.append({"pid": 2, "start_time": kthread["start_time"]})
    res = run_module(processes.main, {"scope": {"pids": entries}, "state": "absent", "grace_period": 1})
    assert res["count"] == 0 and res["terminated"] == []
    assert [(p["pid"], "init of its container's PID namespace" in p["reason"]) for p in res["protected"]] == [(init, True)]
    inside = ns.run_inside("processes", {"scope": {"pids": [{"pid": 1, "start_time": _proc.start_time(init)}]},
                                         "state": "absent"})
    assert inside["count"] == 0 and [p["pid"] for p in inside["protected"]] == [1]
    assert _alive(init) and _alive(ns.host["job"])


def test_gpu_state_stops_a_listed_holder_and_leaves_one_whose_start_time_differs(tmp_path, run_module):
    """gpu_state's scope.pids: the holder listed with its start time is stopped; the one listed
    with another start time (its PID reused since the read) is out of scope, with the reason."""
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=1, release_delay=0.1)
    smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", state)
    code = "import os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); time.sleep(120)"
    holders = [subprocess.Popen([sys.executable, "-c", code, gpu_standin.device(state, 0)]) for _i in range(2)]
    try:
        time.sleep(0.5)
        listed, other = holders
        scope = {"pids": [{"pid": listed.pid, "start_time": _proc.start_time(listed.pid)},
                          {"pid": other.pid, "start_time": _proc.start_time(other.pid) + 1}]}
        res = run_module(gpu_state.main, {
            "nvidia_smi": smi, "vantage": "container", "state": "idle", "timeout": 0.5, "poll_interval": 0.05,
            "device_patterns": [os.path.join(state, "dev", "nvidia*")], "scope": scope, "grace_period": 5})
        assert [(t["pid"], t["outcome"]) for t in res["terminated"]] == [(listed.pid, "terminated")]
        [left] = res["out_of_scope"]
        assert left["pid"] == other.pid and "the PID was reused" in left["reason"]
        assert listed.wait(timeout=5) == -15 and other.poll() is None
    finally:
        for h in holders:
            if h.poll() is None:
                h.kill()
            h.wait()


# --------------------------------------------------------------------------- the kill role


KILL_PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.import_role:
        name: gpufleet.hygiene.kill
        tasks_from: processes.yml
"""


def _kill_role(tmp_path, *extra):
    play = tmp_path / "kill.yml"
    play.write_text(KILL_PLAY)
    bindir = os.path.dirname(sys.executable)
    argv = [os.path.join(bindir, "ansible-playbook"), "-i", "localhost,", str(play), "-e",
            "ansible_python_interpreter=%s" % sys.executable, "-e", '{"kill_grace_period": 1}'] + list(extra)
    return subprocess.run(argv, cwd=os.path.dirname(os.path.dirname(COLLECTIONS)), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)


def test_the_kill_role_refuses_a_broad_pattern_unless_its_variable_says_so(tmp_path):
    tag = "gpufleet-test-%s" % uuid.uuid4().hex[:10]
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", tag])
    try:
        refused = _kill_role(tmp_path, "-e", '{"kill_process_patterns": ["."]}')
        assert refused.returncode != 0
        assert "scope.cmdline pattern '.' matches ordinary system processes" in refused.stdout, refused.stdout
        # allowed, in check mode: the role passes allow_broad through; nothing is signalled
        allowed = _kill_role(tmp_path, "--check", "-e", '{"kill_process_patterns": ["."], "kill_allow_broad": true}')
        assert allowed.returncode == 0, allowed.stdout
        assert "changed=1" in allowed.stdout and "ok=1" in allowed.stdout
        assert decoy.poll() is None
    finally:
        decoy.kill()
        decoy.wait()
