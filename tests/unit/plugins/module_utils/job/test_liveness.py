# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_liveness: which GPU holders are left behind by a job that is gone, on a /proc tree written
to disk (real processes: test_liveness_leftovers.py, the readiness module's tests and the
integration tests)."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness, throughput


def _proc(tmp_path, table):
    """A /proc of {pid: (comm, ppid, start_time)}."""
    for pid, (comm, ppid, started) in table.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text("%d (%s) S %d %s %d 0 0\n" % (pid, comm, ppid, " ".join(["0"] * 17), started))
        (d / "status").write_text("Name:\t%s\nUid:\t0\t0\t0\t0\nNSpid:\t%d\n" % (comm, pid))
    return str(tmp_path)


def _gpu(*pids):
    return [{"index": 0, "utilization_pct": 50, "processes": [{"pid": p, "name": "python3", "used_memory_mib": 100} for p in pids]}]


def test_a_holder_the_job_runs_under_is_not_a_leftover(tmp_path):
    """A launcher that keeps a GPU open, child of init, with the job below it: the job's, not a
    leftover (the repair stops leftovers with their descendants: that would reach the job)."""
    proc = _proc(tmp_path, {1: ("init", 0, 1), 10: ("launcher", 1, 100), 11: ("python3", 10, 101),
                            20: ("python3", 1, 200), 30: ("python3", 10, 300)})
    live = liveness({"processes": [{"pid": 11, "user": "root"}]}, _gpu(10, 11, 20, 30), proc=proc, now=0)
    assert live["state"] == "running"
    # 20: reparented to init, no job process above or below it: left behind, with its start time.
    assert [(h["pid"], h["start_time"]) for h in live["leftovers"]] == [(20, 200)]


def test_without_a_job_the_job_users_holders_whose_parent_is_init_are_leftovers(tmp_path):
    proc = _proc(tmp_path, {1: ("init", 0, 1), 20: ("python3", 1, 200), 21: ("python3", 20, 201)})
    live = liveness({"processes": []}, _gpu(20, 21), proc=proc, now=0, users=["root"])
    assert live["state"] == "none" and [h["pid"] for h in live["leftovers"]] == [20]


def test_throughput_is_the_last_reading_of_the_log_against_the_baseline(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1 | 9000 tok/s (warm-up)\nstep 2 | 19.5K tok/s\nsaving checkpoint\nstep 3 | 12800 tokens/s\n")
    assert throughput(str(log), baseline=20000.0) == {"tokens_per_s": 12800.0, "baseline": 20000.0, "ratio": 0.64, "problem": None}
    # The job's own pattern (gpufleet_job.throughput_regex), no baseline: no ratio.
    got = throughput(str(log), pattern=r"step \d+ \| (?P<value>[\d.]+)(?P<unit>K)? tok/s")
    assert got == {"tokens_per_s": 19500.0, "baseline": None, "ratio": None, "problem": None}


def test_throughput_reads_only_the_end_of_a_long_log_and_not_a_cut_number(tmp_path):
    log = tmp_path / "train.log"
    # The tail starts inside "123456 tok/s": read as "3456 tok/s" it would be a false reading.
    log.write_text("old 100 tok/s\n" + "x" * 100 + "\n123456 tok/s\n" + "y" * 30 + "\n")
    got = throughput(str(log), tail=40)
    assert got["tokens_per_s"] is None and "no throughput reading in the last 40 bytes" in got["problem"]
    assert throughput(str(log), tail=64)["tokens_per_s"] == 123456.0


def test_throughput_of_a_log_that_cannot_be_read_says_why(tmp_path):
    assert "does not exist" in throughput(str(tmp_path / "none.log"))["problem"]
    os.mkfifo(str(tmp_path / "fifo.log"))  # a FIFO would block a plain open(): refused, not read
    assert "a FIFO, not a regular file" in throughput(str(tmp_path / "fifo.log"))["problem"]
    (tmp_path / "real.log").write_text("1 tok/s\n")
    os.symlink(str(tmp_path / "real.log"), str(tmp_path / "link.log"))
    assert "symbolic link" in throughput(str(tmp_path / "link.log"))["problem"]
    bad = throughput(str(tmp_path / "real.log"), pattern="(")
    assert bad["tokens_per_s"] is None and "not a valid regular expression" in bad["problem"]
