# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_liveness paths that no test pinned until mutation testing (make mutation liveness) showed
their mutants surviving: the stall judged by GPU utilisation when no log is known, the log's age
and its absence, the leftovers' edge cases, the default tail of the throughput read and a read
that fails half-way. A /proc tree written to disk, real files."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import Skipped
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job import _liveness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness, throughput


def _proc(tmp_path, table):
    """A /proc of {pid: (comm, ppid, start_time)}, every process root's (uid 0), its own namespace's."""
    for pid, (comm, ppid, started) in table.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text("%d (%s) S %d %s %d 0 0\n" % (pid, comm, ppid, " ".join(["0"] * 17), started))
        (d / "status").write_text("Name:\t%s\nPPid:\t%d\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nNSpid:\t%d\n" % (comm, ppid, pid))
    return str(tmp_path)


def _gpus(*rows):
    """GPUs of (index, utilisation %, holder PIDs)."""
    return [{"index": i, "utilization_pct": util, "processes": [{"pid": p, "name": "python3", "used_memory_mib": 100} for p in pids]}
            for i, util, pids in rows]


@pytest.fixture
def tree(tmp_path):
    # 10: the job (child of init); 11: its worker; 99: another process, child of init.
    (tmp_path / "proc").mkdir()
    return _proc(tmp_path / "proc", {1: ("init", 0, 1), 10: ("python3", 1, 100), 11: ("python3", 10, 110), 99: ("python3", 1, 990)})


def test_without_a_log_a_job_whose_every_gpu_shows_0_pct_is_stalled_naming_them(tree):
    # GPU 0 held by the worker, GPU 1 by the job, GPU 2 (busy) by another job's process only.
    live = liveness({"processes": [{"pid": 10}]}, _gpus((0, 0, [11]), (1, 0, [10]), (2, 50, [99])), proc=tree, now=0)
    assert live["state"] == "stalled" and live["reason"] == "the GPUs it holds (0, 1) show 0% utilisation"


@pytest.mark.parametrize("rows", [[(0, 5, [10])], [(0, None, [10])], [(0, 0, [10]), (1, 1, [11])], [(0, 0, [99])]],
                         ids=["busy_5pct", "utilisation_unknown", "one_gpu_busy", "holds_no_gpu"])
def test_without_a_log_a_job_is_running_unless_every_gpu_it_holds_shows_0_pct(tree, rows):
    live = liveness({"processes": [{"pid": 10}]}, _gpus(*rows), proc=tree, now=0)
    assert live["state"] == "running" and live["reason"] is None


def test_a_log_not_written_yet_is_reported_and_the_job_is_running(tree, tmp_path):
    path = str(tmp_path / "not-yet.log")
    live = liveness({"processes": [{"pid": 10}]}, [], log=path, proc=tree, now=0)
    assert live["state"] == "running"
    assert live["log"] == {"path": path, "exists": False, "error": "%s does not exist" % path}


@pytest.mark.parametrize("ago, age", [(12.34, 12.3), (-5.0, 0.0), (0.4, 0.4)], ids=["tenths", "log_in_the_future", "under_1s"])
def test_the_logs_age_is_in_tenths_of_a_second_and_never_negative(tree, tmp_path, ago, age):
    log = tmp_path / "train.log"
    log.write_text("step 1\n")
    os.utime(log, (1_800_000_000.0, 1_800_000_000.0))
    live = liveness({"processes": [{"pid": 10}]}, [], log=str(log), proc=tree, now=1_800_000_000.0 + ago)
    assert live["log"]["age_s"] == age and live["state"] == "running"


def test_the_job_itself_and_the_containers_init_holding_a_gpu_are_no_leftovers(tree):
    # The job (10) is a child of init and holds a GPU: it is the job, not left behind. PID 1 (its
    # parent is 0, not init) holding a GPU is not left behind by any job either.
    live = liveness({"processes": [{"pid": 10}]}, _gpus((0, 50, [10, 1]), (1, 50, [10])), proc=tree, now=0)
    assert live["leftovers"] == []
    alone = liveness({"processes": []}, _gpus((0, 50, [1, 99])), proc=tree, now=0, users=["root"])
    assert [h["pid"] for h in alone["leftovers"]] == [99]


def test_the_throughput_read_takes_the_last_64_kib_of_the_log(tmp_path):
    log = tmp_path / "train.log"
    head = b"step 9 | 20000 tok/s\n"
    log.write_bytes(head + b"x" * (65536 - len(head) - 1) + b"\n")  # exactly 64 KiB: the reading is in
    assert _liveness.TAIL_BYTES == 65536 and throughput(str(log))["tokens_per_s"] == 20000.0
    log.write_bytes(b"0" + head + b"x" * (65536 - len(head) - 1) + b"\n")  # one byte more: its line is cut, no reading
    got = throughput(str(log))
    assert got["tokens_per_s"] is None and got["problem"] == "no throughput reading in the last 65536 bytes of %s" % log


def test_a_read_that_fails_after_the_open_says_which_log_and_why(tmp_path, monkeypatch):
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tail

    log = tmp_path / "train.log"
    log.write_text("step 1 | 20000 tok/s\n")

    def broken(*_args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_tail.os, "pread", broken)
    assert throughput(str(log))["problem"] == "%s cannot be read: Input/output error" % log
    monkeypatch.undo()

    def refused(*_args, **_kw):
        raise Skipped("%s grew past the read's bound" % log)

    monkeypatch.setattr(_liveness, "read_window", refused)
    assert throughput(str(log))["problem"] == "%s grew past the read's bound" % log


def test_the_ratio_to_the_baseline_has_four_decimals(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1 | 10000 tok/s\n")
    assert throughput(str(log), baseline=30000.0)["ratio"] == 0.3333


def test_a_leftover_carries_what_the_repair_names_it_by(tree):
    gpus = [{"index": 3, "utilization_pct": 0, "processes": [
        {"pid": 99, "name": None, "cmdline": "python3 worker.py --rank 1", "used_memory_mib": 4096}]}]
    [left] = liveness({"processes": []}, gpus, proc=tree, now=0, users=["root"])["leftovers"]
    # the name /proc gives when nvidia-smi gave none; the command line as read
    assert left == {"pid": 99, "start_time": 990, "name": "python3", "cmdline": "python3 worker.py --rank 1", "gpu": 3,
                    "used_memory_mib": 4096, "user": "root"}


def test_a_leftover_on_two_gpus_is_listed_once_and_one_beside_a_job_worker_is_still_found(tree, tmp_path):
    # 99 (child of init) holds GPUs 0 and 1: one leftover, named by its first GPU. On GPU 2 the
    # job's worker comes first and 99 after it: the worker is skipped, 99 still seen.
    live = liveness({"processes": [{"pid": 10}]}, _gpus((0, 50, [99]), (1, 50, [99])), proc=tree, now=0, users=["root"])
    assert [(h["pid"], h["gpu"]) for h in live["leftovers"]] == [(99, 0)]
    beside = liveness({"processes": [{"pid": 10}]}, _gpus((2, 50, [11, 99])), proc=tree, now=0, users=["root"])
    assert [(h["pid"], h["gpu"]) for h in beside["leftovers"]] == [(99, 2)]
