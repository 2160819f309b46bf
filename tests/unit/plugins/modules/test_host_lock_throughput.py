# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""host_lock and throughput: real files, real concurrent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import Gate, read_tail
from ansible_collections.gpufleet.hygiene.plugins.modules import host_lock, throughput


def test_lock_taken_held_released(run_module, tmp_path):
    path = str(tmp_path / "lock")
    first = run_module(host_lock.main, {"path": path, "owner": "run-a"})
    assert first["changed"] and first["owner"] == "run-a"
    with open(path) as f:
        assert json.load(f)["owner"] == "run-a"
    again = run_module(host_lock.main, {"path": path, "owner": "run-a"})
    assert again["changed"] is False
    other = run_module(host_lock.main, {"path": path, "owner": "run-b", "timeout": 1})
    assert other["failed"] and "held by run-a" in other["msg"]
    not_mine = run_module(host_lock.main, {"path": path, "owner": "run-b", "state": "absent"})
    assert not_mine["changed"] is False and os.path.exists(path)
    gone = run_module(host_lock.main, {"path": path, "owner": "run-a", "state": "absent"})
    assert gone["changed"] and not os.path.exists(path)
    assert run_module(host_lock.main, {"path": path, "owner": "run-a", "state": "absent"})["changed"] is False


def test_expired_lock_is_taken_over(run_module, tmp_path):
    path = tmp_path / "lock"
    path.write_text(json.dumps({"owner": "dead-run", "taken": 1, "expires": 2}))
    result = run_module(host_lock.main, {"path": str(path), "owner": "run-c"})
    assert result["changed"] and result["owner"] == "run-c"
    assert any("expired lock of dead-run" in w["event"]["msg"] for w in result["warnings"])


def test_check_mode_writes_nothing(run_module, tmp_path):
    path = str(tmp_path / "lock")
    result = run_module(host_lock.main, {"path": path, "owner": "run-a"}, check_mode=True)
    assert result["changed"] and not os.path.exists(path)


def test_two_processes_race_one_wins(tmp_path):
    """Real concurrent processes: exactly one takes the lock."""
    path = str(tmp_path / "lock")
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._hostlock import acquire, LockError\n"
            "try:\n    acquire(%r, sys.argv[1], 60, 0); print('won')\nexcept LockError:\n    print('lost')\n"
            % (os.path.join(os.getcwd(), ".ansible", "collections"), path))
    # A lock that existed before its content was written looked garbled to a racing run, which
    # took it over: two winners (seen once under a loaded parallel test run). Ten rounds of eight.
    for round_ in range(10):
        if os.path.exists(path):
            os.unlink(path)
        procs = [subprocess.Popen([sys.executable, "-c", code, "run-%d-%d" % (round_, i)], stdout=subprocess.PIPE, text=True)
                 for i in range(8)]
        outcomes = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert outcomes.count("won") == 1, (round_, outcomes)
        assert sorted(os.listdir(tmp_path)) == ["lock"], "no temporary file is left behind"


def test_lock_waits_for_release(run_module, tmp_path):
    path = str(tmp_path / "lock")
    run_module(host_lock.main, {"path": path, "owner": "run-a"})
    threading.Timer(1.0, os.unlink, [path]).start()
    start = time.monotonic()
    result = run_module(host_lock.main, {"path": path, "owner": "run-b", "timeout": 10})
    assert result["owner"] == "run-b" and 0.9 < time.monotonic() - start < 10


def test_lock_refuses_a_negative_wait(run_module, tmp_path):
    """A negative timeout waited not at all, without a word; it is refused, nothing taken."""
    path = tmp_path / "lock"
    result = run_module(host_lock.main, {"path": str(path), "owner": "x", "timeout": -5})
    assert result["failed"] and result["msg"] == "timeout must be at least 0 (got -5)"
    assert not path.exists()


def test_lock_bad_directory(run_module, tmp_path):
    result = run_module(host_lock.main, {"path": str(tmp_path / "nope" / "lock"), "owner": "x"})
    assert result["failed"] and "does not exist" in result["msg"]


LOG = "".join("step %d loss 1.0 %s tok/s\n" % (i, v) for i, v in enumerate(
    ["3.1K", "19.8K", "20.1K", "19.9K", "20.4K", "20000"]))


def test_throughput_passes_and_parses_units(run_module, tmp_path):
    log = tmp_path / "train.log"
    log.write_text(LOG)
    result = run_module(throughput.main, {"log": str(log), "skip": 1, "samples": 5, "baseline": 20000})
    assert result["passed"] is True
    assert result["readings"] == [19800.0, 20100.0, 19900.0, 20400.0, 20000.0]
    assert result["median"] == 20000.0 and result["floor"] == 18000.0


def test_throughput_catches_the_seed_slowdown(run_module, tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join("step %d 12.8K tok/s\n" % i for i in range(8)))
    result = run_module(throughput.main, {"log": str(log), "skip": 2, "samples": 5, "baseline": 20000})
    assert result["failed"] and result["passed"] is False
    assert "12800 tok/s (median of 5) is below the floor of 18000 tok/s (90% of the 20000 baseline)" in result["msg"]


def test_throughput_waits_for_a_live_writer(run_module, tmp_path):
    log = tmp_path / "train.log"
    code = ("import time, sys\nf = open(sys.argv[1], 'a')\n"
            "for i in range(6):\n    f.write('step %d 21000 tok/s\\n' % i); f.flush(); time.sleep(0.3)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(log)])
    try:
        result = run_module(throughput.main, {"log": str(log), "samples": 5, "wait": 20, "min_value": 15000})
    finally:
        writer.wait(timeout=20)
    assert result["passed"] and len(result["readings"]) == 5 and result["waited"] > 0


@pytest.mark.parametrize("args, message", [
    ({"pattern": "("}, "is not a valid regular expression"),
    ({"samples": 0}, "samples must be at least 1 (got 0)"),
    ({"baseline": 100, "min_fraction": 1.5}, "min_fraction must be at most 1 (got 1.5)"),
    ({"baseline": 100, "min_fraction": 0}, "min_fraction must be more than 0 (got 0.0)"),
    ({"baseline": 0}, "baseline must be more than 0 (got 0.0)"),
])
def test_throughput_bad_input(run_module, tmp_path, args, message):
    log = tmp_path / "train.log"
    log.write_text(LOG)
    result = run_module(throughput.main, dict({"log": str(log)}, **args))
    assert result["failed"] and message in result["msg"]


def test_throughput_missing_log_names_the_problem(run_module, tmp_path):
    result = run_module(throughput.main, {"log": str(tmp_path / "none.log"), "wait": 1})
    assert result["failed"] and "holds 0 throughput readings" in result["msg"]


def test_throughput_unreadable_log_fails_with_the_floor(run_module, tmp_path):
    result = run_module(throughput.main, {"log": str(tmp_path), "min_value": 100})
    assert result["failed"] and result["msg"].startswith("cannot read log %s: " % tmp_path)
    assert result["floor"] == 100.0 and result["passed"] is False


def test_gate_on_a_cut_log_skips_the_warm_up_from_what_is_in_view(tmp_path):
    """Only the end of the log is read: the warm-up is skipped from the readings in view, so a view
    of skip + samples readings is judged on its last ones, and a shorter one fails with the count."""
    log = tmp_path / "train.log"
    log.write_text(LOG)
    tail = "".join(LOG.splitlines(keepends=True)[-5:])
    assert read_tail(str(log), len(tail)) == (tail, True, None)
    assert read_tail(str(log), 1 << 20) == (LOG, False, None)
    result = Gate(str(log), samples=3, skip=2, max_bytes=len(tail)).run()
    assert result["readings"] == [19900.0, 20400.0, 20000.0]
    shorter = len("".join(LOG.splitlines(keepends=True)[-4:]))
    with pytest.raises(GpufleetError) as exc:
        Gate(str(log), samples=3, skip=2, max_bytes=shorter).run()
    assert "holds 2 throughput readings after skipping 2, 3 needed" in exc.value.msg
    assert "Only its last %d bytes were read (max_bytes)" % shorter in exc.value.msg


def test_throughput_fails_with_the_count_when_the_warm_up_is_all_that_came(run_module, tmp_path):
    """The relaunched run's part is longer than max_bytes (its compile output) and holds only its
    warm-up readings when the wait ends: the gate fails with the count, it judges no warm-up reading
    (it used to count the warm-up as out of view and judge those readings)."""
    log = tmp_path / "train.log"
    log.write_text("".join("step %d 20000 tok/s\n" % i for i in range(20)))  # the earlier run's
    since = {"inode": os.stat(log).st_ino, "offset": os.path.getsize(log)}
    warm_up = "".join("step %d 5000 tok/s\n" % i for i in range(3))
    with open(log, "a") as f:
        f.write("".join("compiling kernel %d\n" % i for i in range(200)) + warm_up)
    result = run_module(throughput.main, {"log": str(log), "skip": 3, "samples": 2, "wait": 0, "baseline": 20000,
                                          "max_bytes": 4096, "since": since})
    assert result["failed"] and result["passed"] is False
    assert "holds 0 throughput readings after skipping 3, 2 needed" in result["msg"], result["msg"]
    assert result["readings"] == [] and "median" not in result


def test_throughput_since_reads_only_what_was_written_after_it(run_module, tmp_path):
    """The module's since option: the old run's slow lines before the offset are not judged."""
    log = tmp_path / "train.log"
    log.write_text("".join("step %d 12.8K tok/s\n" % i for i in range(8)))
    since = {"inode": os.stat(log).st_ino, "offset": os.path.getsize(log)}
    with open(log, "a") as f:
        f.write(LOG)
    result = run_module(throughput.main, {"log": str(log), "skip": 1, "samples": 5, "baseline": 20000, "since": since})
    assert result["passed"] is True and result["readings"] == [19800.0, 20100.0, 19900.0, 20400.0, 20000.0]
    assert result["read_from"] == dict(since, **{"from": "launch"})
    tail = len("".join(LOG.splitlines(keepends=True)[-5:]))
    cut = Gate(str(log), samples=3, skip=2, max_bytes=tail, since=since).run()
    assert cut["readings"] == [19900.0, 20400.0, 20000.0]  # a cut view of the new run's part, skipped within
    assert "read_from" not in run_module(throughput.main, {"log": str(log), "samples": 5})


def test_gate_waits_on_its_clock_and_fails_with_the_partial_result(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 0 5K tok/s\n")
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    with pytest.raises(GpufleetError) as exc:
        Gate(str(log), samples=2, wait=3, baseline=1000).run(sleep=sleep, clock=lambda: now[0])
    assert slept == [1.0, 1.0, 1.0]
    assert "holds 1 throughput readings after skipping 0, 2 needed, after waiting 3.0s" in exc.value.msg
    assert exc.value.partial == {"readings": [5000.0], "floor": 900.0, "passed": False, "waited": 3.0}


def test_full_filesystem_leaves_no_empty_lock(run_module, tmp_path, monkeypatch):
    """The file is created, its content refused (ENOSPC): no empty lock stays behind."""
    import errno

    from ansible_collections.gpufleet.hygiene.plugins.module_utils.common import _hostlock

    def full(_info, _f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_hostlock.json, "dump", full)
    path = tmp_path / "lock"
    result = run_module(host_lock.main, {"path": str(path), "owner": "run-a"})
    assert result["failed"] and not path.exists()
    assert list(tmp_path.iterdir()) == [], "nothing is left behind"
    assert "cannot create lock %s: No space left on device; nothing was changed on this host" % path in result["msg"]


def test_waited_for_names_the_run_that_held_the_lock(run_module, tmp_path):
    path = tmp_path / "lock"
    free = run_module(host_lock.main, {"path": str(path), "owner": "run-a"})
    assert free["waited_for"] is None
    release = threading.Timer(1.0, path.unlink)
    release.start()
    try:
        result = run_module(host_lock.main, {"path": str(path), "owner": "run-b", "timeout": 20})
    finally:
        release.join()
    assert result["changed"] and result["owner"] == "run-b" and result["waited_for"] == "run-a"
    held = run_module(host_lock.main, {"path": str(path), "owner": "run-c", "timeout": 1})
    assert held["failed"] and "-e gpufleet_run_id=run-b" in held["msg"] and "nothing was changed here" in held["msg"]
