# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_throughput: the throughput gate judges only what the launched run wrote.

Real processes (the training stand-in) append real lines to a real log, slowly: a compile
phase before the first reading, warm-up readings, then their rate. An earlier run's readings
are in the log first, as in the seed incident, where the contaminated run's 12.8K tok/s were
still there when the healthy run was relaunched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import Gate

STANDIN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "standins", "train_dflash.py")
GOOD, SLOW = 20000, 12800  # the seed's baseline and its contaminated run


class Runs:
    """Runs of the stand-in trainer appending to one log, as the relaunch role starts them."""

    def __init__(self, tmp_path):
        self.state = tmp_path / "gpu"
        (self.state / "dev").mkdir(parents=True)
        (self.state / "dev" / "nvidia0").write_bytes(b"")
        self.log = tmp_path / "train.log"
        self.procs = []

    def start(self, rate, compile_seconds=0.0, warmup_steps=0, every=0.05):
        with open(self.log, "ab") as out:  # >> "$GPUFLEET_LOG"
            proc = subprocess.Popen(
                [sys.executable, STANDIN, "--state", str(self.state), "--log-throughput", str(rate), "--log-every",
                 str(every), "--compile-seconds", str(compile_seconds), "--warmup-steps", str(warmup_steps)],
                stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def earlier_run(self, rate, readings):
        """A run that wrote `readings` readings and was stopped (killed by remediation)."""
        proc = self.start(rate, every=0.01)
        deadline = time.monotonic() + 30
        while self.log.read_text().count("tokens/s") < readings and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        assert self.log.read_text().count("%g tokens/s" % rate) >= readings

    def at_launch(self):
        """Where the log stands now: what the relaunch role records (stat's inode and size)."""
        st = os.stat(self.log)
        return {"inode": st.st_ino, "offset": st.st_size}

    def stop(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.fixture
def runs(tmp_path):
    r = Runs(tmp_path)
    yield r
    r.stop()


def test_stale_slow_readings_do_not_fail_a_healthy_relaunch(runs):
    runs.earlier_run(SLOW, 20)
    since = runs.at_launch()
    runs.start(GOOD, compile_seconds=1.0, warmup_steps=2)
    # What the gate did before: the stale run's readings are all it sees while the new run compiles.
    with pytest.raises(GpufleetError) as old_way:
        Gate(str(runs.log), samples=5, baseline=GOOD).run()
    assert "12800 tok/s (median of 5) is below the floor of 18000" in old_way.value.msg

    result = Gate(str(runs.log), samples=5, skip=2, wait=30, baseline=GOOD, since=since).run()
    assert result["passed"] and result["readings"] == [float(GOOD)] * 5  # the 5000 warm-up readings skipped
    assert result["read_from"] == {"offset": since["offset"], "inode": since["inode"], "from": "launch"}
    assert result["waited"] >= 1.0  # it waited out the compile phase for the new run's readings


def test_a_slow_relaunch_after_good_readings_fails(runs):
    runs.earlier_run(GOOD, 20)
    since = runs.at_launch()
    runs.start(SLOW, compile_seconds=0.5, warmup_steps=1)
    assert Gate(str(runs.log), samples=5, baseline=GOOD).run()["passed"]  # the old way: passed on the old run's lines

    with pytest.raises(GpufleetError) as exc:
        Gate(str(runs.log), samples=5, skip=1, wait=30, baseline=GOOD, since=since).run()
    assert "12800 tok/s (median of 5) is below the floor of 18000 tok/s" in exc.value.msg
    assert exc.value.partial["readings"] == [float(SLOW)] * 5 and exc.value.partial["passed"] is False
    assert exc.value.partial["read_from"]["from"] == "launch"


def test_skip_counts_the_new_runs_warm_up(runs):
    """With 3 warm-up readings of the new run and skip 3, not one warm-up reading is judged,
    though the old run left far more than skip + samples readings before it."""
    runs.earlier_run(GOOD, 20)
    since = runs.at_launch()
    runs.start(GOOD, compile_seconds=0.3, warmup_steps=3)
    result = Gate(str(runs.log), samples=2, skip=3, wait=30, min_value=GOOD, since=since).run()
    assert result["readings"] == [float(GOOD)] * 2
    text = runs.log.read_bytes()[since["offset"]:].decode()
    assert text.startswith("ready ") and "compiled in 0.3 s" in text and text.count("5000 tokens/s") >= 3


def test_a_log_rotated_since_the_launch_is_read_from_its_start(runs):
    runs.earlier_run(SLOW, 1)  # a short old log: the new file soon grows past its size
    since = runs.at_launch()
    os.rename(runs.log, str(runs.log) + ".1")  # logrotate moved it; the new run writes a new file
    runs.start(GOOD, compile_seconds=0.2, warmup_steps=2)
    result = Gate(str(runs.log), samples=3, skip=2, wait=30, baseline=GOOD, since=since).run()
    assert result["read_from"]["from"] == "rotated" and result["read_from"]["offset"] == 0
    assert result["read_from"]["inode"] != since["inode"]
    assert os.path.getsize(runs.log) > since["offset"]  # read from the offset, the warm-up would be cut off
    assert result["passed"] and result["readings"] == [float(GOOD)] * 3


def test_a_log_truncated_since_the_launch_is_read_from_its_start(runs):
    runs.earlier_run(SLOW, 200)
    since = runs.at_launch()
    os.truncate(runs.log, 0)  # copytruncate
    runs.start(SLOW, compile_seconds=0.2, warmup_steps=1)
    with pytest.raises(GpufleetError) as exc:
        Gate(str(runs.log), samples=3, skip=1, wait=30, baseline=GOOD, since=since).run()
    assert exc.value.partial["read_from"] == {"offset": 0, "inode": since["inode"], "from": "truncated"}
    assert exc.value.partial["readings"] == [float(SLOW)] * 3


def test_a_log_that_did_not_exist_at_launch(runs):
    """No log at launch: the relaunch role passes offset 0 and no inode; all of it is read."""
    runs.start(GOOD, compile_seconds=0.2, warmup_steps=1)
    result = Gate(str(runs.log), samples=3, skip=1, wait=30, baseline=GOOD, since={"offset": 0}).run()
    assert result["passed"] and result["read_from"]["from"] == "launch" and result["read_from"]["offset"] == 0


def test_too_few_new_readings_counts_only_the_new_run(runs):
    runs.earlier_run(GOOD, 20)
    since = runs.at_launch()
    runs.start(GOOD, compile_seconds=30)  # still compiling when the gate gives up
    with pytest.raises(GpufleetError) as exc:
        Gate(str(runs.log), samples=5, wait=1, baseline=GOOD, since=since).run()
    assert "holds 0 throughput readings after skipping 0, 5 needed" in exc.value.msg
    assert exc.value.partial["readings"] == []


@pytest.mark.parametrize("since", [{"offset": -1}, {"offset": 0, "inode": -5}])
def test_bad_since(tmp_path, since):
    with pytest.raises(GpufleetError, match=r"^since\.(offset|inode) must be at least 0 \(got -[15]\)$"):
        Gate(str(tmp_path / "train.log"), since=since)


def test_a_long_wait_in_slices_says_what_it_has_read_and_ends_when_the_whole_wait_does(runs):
    """progress_every: each call of the gate waits at most that long and, the wait not over,
    returns pending with the readings read so far; the calls of one wait (one `started`) end when
    the whole wait does, failing as one call would, the time counted from `started`."""
    since = runs.at_launch() if runs.log.exists() else {"offset": 0}
    runs.start(GOOD, compile_seconds=0.5, warmup_steps=1, every=0.4)  # 1 warm-up, then a reading every 0.4 s
    started = time.time()
    gate = dict(samples=20, skip=1, wait=4, baseline=GOOD, since=since, progress_every=1, started=started)
    first = Gate(str(runs.log), **gate).run()
    assert first["pending"] is True and first["passed"] is False and 0.9 <= first["waited"] < 2.5
    assert first["msg"].startswith("waiting for 20 throughput readings of %s after skipping 1: %d read so far" % (runs.log, first["seen"]))
    later = Gate(str(runs.log), **gate).run()
    assert later["pending"] and later["seen"] > first["seen"] and "(last 20000 tok/s)" in later["msg"]
    failure = None
    while failure is None:  # as the task's until loop calls it
        try:
            result = Gate(str(runs.log), **gate).run()
        except GpufleetError as exc:
            failure = exc
        else:
            assert result["pending"] and time.time() - started < 6
    # 20 readings do not come in 4 s: the call in which the whole wait ran out fails as one call would.
    assert "holds" in failure.msg and "after waiting 4" in failure.msg and failure.partial["waited"] >= 4
    assert 4 <= time.time() - started < 6
    # Enough readings within a slice: it passes, its verdict in msg.
    gate.update(samples=3, started=time.time())
    done = Gate(str(runs.log), **gate).run()
    assert done["passed"] and "pending" not in done
    assert done["msg"].startswith("throughput 20000 tok/s (median of 3 readings, 1 skipped) against a floor of 18000 tok/s")


def test_without_progress_every_one_call_waits_it_all(runs):
    runs.start(GOOD, compile_seconds=0.2, every=0.3)
    started = time.monotonic()
    with pytest.raises(GpufleetError):
        Gate(str(runs.log), samples=50, wait=2, min_value=GOOD, started=time.time() - 100).run()
    assert 2 <= time.monotonic() - started < 4  # started is used only with progress_every
