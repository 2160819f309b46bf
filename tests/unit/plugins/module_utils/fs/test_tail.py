# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The job's log, read as root where its user (``nobody`` here, through runuser) made it a link
to a root-only file, a link to /dev/zero, a FIFO, or put it under a directory linked elsewhere:
the throughput gate, the liveness read and the relaunch wait (log_wait) refuse each with a
problem that says so, within a bound, and nothing of the link's target is read or stat'ed.

fs/_tail opens and reads the log for all three (by its handle, a window at a time): it is what
these tests pin, through its users, job/_throughput's Gate, job/_liveness and the log_wait module."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness, throughput
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import Gate
from ansible_collections.gpufleet.hygiene.plugins.modules import log_wait

NOBODY = 65534
SECRET = "".join("step %d | 61000 tok/s\n" % i for i in range(8))
COLLECTIONS = os.path.join(os.getcwd(), ".ansible", "collections")


def as_nobody(*argv):
    """Run argv as the unprivileged user, as a container's user would."""
    subprocess.run(["runuser", "-u", "nobody", "--"] + list(argv), check=True, capture_output=True)


@pytest.fixture
def home():
    """A directory the unprivileged user owns, reachable by root without a link on the way."""
    d = tempfile.mkdtemp(prefix="gpufleet-home-", dir="/var/tmp")
    os.chown(d, NOBODY, NOBODY)
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def secret(tmp_path):
    """A root-only file (in a root-only directory) that holds throughput readings and a known mtime."""
    d = tmp_path / "root-only"
    d.mkdir(mode=0o700)
    path = d / "readings.log"
    path.write_text(SECRET)
    os.chmod(path, 0o600)
    os.utime(path, (1234567890, 1234567890))
    return str(path)


def in_subprocess(code, seconds=20):
    """Run code in a fresh interpreter limited to 1 GiB of memory and ``seconds``: what today's
    unbounded reads of /dev/zero or a FIFO would do to the module (grow, or block) ends there."""
    prelude = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
               "sys.path.insert(0, %r)\n" % COLLECTIONS)
    try:
        proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=seconds, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("the read blocked for more than %ss" % seconds)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


GATE = ("import json\n"
        "from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError\n"
        "from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import Gate\n"
        "try:\n    print(json.dumps({'result': Gate(%r, samples=1, min_value=1).run()}))\n"
        "except GpufleetError as exc:\n    print(json.dumps({'msg': exc.msg}))\n")


def test_the_gate_does_not_pass_on_a_root_only_file_the_log_links_to(home, secret):
    log = os.path.join(home, "train.log")
    as_nobody("ln", "-s", secret, log)
    with pytest.raises(GpufleetError) as exc:
        Gate(log, samples=5, min_value=50000).run()
    assert "symbolic link" in exc.value.msg and "61000" not in exc.value.msg
    assert exc.value.partial["passed"] is False and "readings" not in exc.value.partial


def test_the_gate_does_not_follow_a_log_directory_linked_elsewhere(home, secret):
    """The user's log directory is a link to a root-only directory: its files are not the log."""
    as_nobody("ln", "-s", os.path.dirname(secret), os.path.join(home, "logs"))
    with pytest.raises(GpufleetError) as exc:
        Gate(os.path.join(home, "logs", "readings.log"), samples=5, min_value=50000).run()
    assert "symbolic link" in exc.value.msg and os.path.join(home, "logs") in exc.value.msg


def test_the_gate_on_a_log_linked_to_dev_zero_is_refused_not_read(home):
    log = os.path.join(home, "train.log")
    as_nobody("ln", "-s", "/dev/zero", log)
    out = in_subprocess(GATE % log)
    assert "symbolic link" in out["msg"]


def test_the_gate_on_a_fifo_log_is_refused_at_once(home):
    log = os.path.join(home, "train.log")
    as_nobody("mkfifo", log)
    out = in_subprocess(GATE % log, seconds=10)
    assert "a FIFO, not a regular file" in out["msg"]


def test_liveness_does_not_stat_a_root_only_file_through_the_log_link(home, secret):
    """Neither the target's size nor its mtime reaches the record (nor the stall verdict)."""
    log = os.path.join(home, "train.log")
    as_nobody("ln", "-s", secret, log)
    live = liveness({"processes": [{"pid": os.getpid()}]}, [], log=log, now=1234567890 + 10)
    assert live["log"]["exists"] is False and "symbolic link" in live["log"]["error"]
    assert "size" not in live["log"] and "mtime" not in live["log"]
    rate = throughput(log)
    assert rate["tokens_per_s"] is None and "symbolic link" in rate["problem"]


def test_liveness_does_not_follow_a_log_directory_linked_elsewhere(home, secret):
    as_nobody("ln", "-s", os.path.dirname(secret), os.path.join(home, "logs"))
    log = os.path.join(home, "logs", "readings.log")
    live = liveness({"processes": [{"pid": os.getpid()}]}, [], log=log, now=1234567890 + 10)
    assert live["log"]["exists"] is False and "symbolic link" in live["log"]["error"]
    rate = throughput(log)
    assert rate["tokens_per_s"] is None and "symbolic link" in rate["problem"]


def test_liveness_reads_the_users_own_log_by_its_handle(home):
    """The ordinary case still works: the user's own regular file, its size and mtime."""
    log = os.path.join(home, "train.log")
    as_nobody("sh", "-c", "printf 'step 1 | 20000 tok/s\\n' > %s" % log)
    os.utime(log, (1000, 1000))
    live = liveness({"processes": [{"pid": os.getpid()}]}, [], log=log, now=1100)
    assert live["log"]["exists"] and live["log"]["size"] == 21 and live["log"]["age_s"] == 100.0
    assert throughput(log)["tokens_per_s"] == 20000.0


# ---------------------------------------------------------------- the relaunch role's wait


def test_log_wait_matches_only_what_the_launched_run_wrote(run_module, home):
    log = os.path.join(home, "train.log")
    as_nobody("sh", "-c", "printf 'old run: training started\\nstep 1\\n' > %s" % log)
    since = {"inode": os.stat(log).st_ino, "offset": os.path.getsize(log)}
    early = run_module(log_wait.main, {"log": log, "regex": "training started", "since": since, "timeout": 1})
    assert early["failed"] and "training started" in early["msg"] and early["read_from"]["from"] == "launch"
    as_nobody("sh", "-c", "printf 'new run: training started at step 0\\n' >> %s" % log)
    got = run_module(log_wait.main, {"log": log, "regex": "training started", "since": since, "timeout": 5})
    assert not got.get("failed") and got["matched"] == "new run: training started at step 0"
    assert got["read_from"] == dict(since, **{"from": "launch"})


def test_log_wait_in_slices_says_what_the_run_wrote_so_far(run_module, home):
    """progress_every: a call that ends with no ready line and the wait not over returns pending,
    what was written since the launch (its control characters shown as ?) and where the wait
    stands; the call in which the whole wait (from started) runs out fails as one call would."""
    log = os.path.join(home, "train.log")
    as_nobody("sh", "-c", "printf 'old run: training started\\n' > %s" % log)
    since = {"inode": os.stat(log).st_ino, "offset": os.path.getsize(log)}
    args = {"log": log, "regex": "training started", "since": since, "timeout": 3, "progress_every": 1, "started": time.time()}
    first = run_module(log_wait.main, args)
    assert first["pending"] is True and not first.get("failed") and first["lines"] == 0 and first["last_line"] is None
    assert re.fullmatch(r"waiting for a line of %s matching 'training started': nothing written since the launch, [12]s of 3s"
                        % re.escape(log), first["msg"]), first["msg"]
    as_nobody("sh", "-c", "printf 'loading shards 3/8\\033[2K\\n' >> %s" % log)
    second = run_module(log_wait.main, args)
    assert second["pending"] and second["lines"] == 1 and second["last_line"] == "loading shards 3/8?[2K"
    assert re.search(r"1 line\(s\) written since the launch, the last: loading shards 3/8\?\[2K, [12]s of 3s$", second["msg"])
    last = run_module(log_wait.main, args)
    assert last["failed"] and "pending" not in last and "in 3s" in last["msg"] and last["waited"] >= 3
    # The ready line within a slice: matched, no pending.
    as_nobody("sh", "-c", "printf 'new run: training started\\n' >> %s" % log)
    got = run_module(log_wait.main, dict(args, started=time.time()))
    assert got["matched"] == "new run: training started" and "pending" not in got


def test_log_wait_refuses_a_link_to_a_root_only_file(run_module, home, secret):
    log = os.path.join(home, "train.log")
    as_nobody("ln", "-s", secret, log)
    got = run_module(log_wait.main, {"log": log, "regex": "tok/s", "timeout": 5})
    assert got["failed"] and "symbolic link" in got["msg"] and "matched" not in got


WAIT = ("import json\n"
        "from ansible_collections.gpufleet.hygiene.plugins.modules.log_wait import wait\n"
        "from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError\n"
        "try:\n    print(json.dumps(wait(%r, 'ready', timeout=3)))\n"
        "except GpufleetError as exc:\n    print(json.dumps({'msg': exc.msg}))\n")


@pytest.mark.parametrize("make", [("ln", "-s", "/dev/zero"), ("mkfifo",)], ids=["dev-zero-link", "fifo"])
def test_log_wait_refuses_dev_zero_and_a_fifo_within_its_bound(home, make):
    log = os.path.join(home, "train.log")
    as_nobody(*(make + (log,)))
    out = in_subprocess(WAIT % log, seconds=10)
    assert "symbolic link" in out["msg"] or "a FIFO" in out["msg"]


def numbers(value):
    """Every int in a result, however deep."""
    if isinstance(value, dict):
        return [n for v in value.values() for n in numbers(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in numbers(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def test_where_the_log_stands_before_a_launch_is_read_by_its_handle(run_module, home, secret):
    """The relaunch role's record of the log before a launch: the log's own inode and size; a log
    linked to a root-only file is refused before anything starts, the target's size never told."""
    log = os.path.join(home, "train.log")
    assert run_module(log_wait.main, {"log": log})["log"] == {"exists": False, "inode": None, "size": None}
    as_nobody("sh", "-c", "printf 'step 1\\n' > %s" % log)
    assert run_module(log_wait.main, {"log": log})["log"] == {"exists": True, "inode": os.stat(log).st_ino, "size": 7}
    os.unlink(log)
    as_nobody("ln", "-s", secret, log)
    got = run_module(log_wait.main, {"log": log})
    # The target's size is in no value of the result, nor said in its message (as a number of its own: a
    # temporary name or an inode may hold its digits).
    assert got["failed"] and "symbolic link" in got["msg"] and len(SECRET) not in numbers(got)
    assert not re.search(r"(?<![\w.])%d(?![\w.])" % len(SECRET), got["msg"]), got["msg"]


def test_log_wait_reads_a_large_new_part_in_bounded_steps_without_pausing(home):
    """12 MiB written since the launch before the ready line: read 4 MiB at a time, never all at
    once, and without a pause between reads while there is more."""
    log = os.path.join(home, "train.log")
    as_nobody("sh", "-c", "head -c 12582912 /dev/zero | tr '\\0' 'x' | fold -w 1000 > %s; printf '\\nready at step 0\\n' >> %s" % (log, log))
    slept = []
    got = log_wait.wait(log, "^ready", since={"offset": 0}, timeout=60, sleep=slept.append)
    assert got["matched"] == "ready at step 0" and slept == []
