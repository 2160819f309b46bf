# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which GPU holders are left behind by a job that is gone, on a /proc tree written to disk
(the real-process paths are in test_readiness and the integration tests)."""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness


def _proc(tmp_path, table):
    """A /proc of {pid: (comm, ppid, start_time)}."""
    for pid, (comm, ppid, started) in table.items():
        d = tmp_path / str(pid)
        d.mkdir()
        (d / "stat").write_text("%d (%s) S %d %s %d 0 0\n" % (pid, comm, ppid, " ".join(["0"] * 17), started))
    return str(tmp_path)


def _gpu(*pids):
    return [{"index": 0, "utilization_pct": 50, "processes": [{"pid": p, "name": "python3", "used_memory_mib": 100} for p in pids]}]


def test_a_holder_the_job_runs_under_is_not_a_leftover(tmp_path):
    """A launcher that keeps a GPU open, child of init, with the job below it: the job's, not a
    leftover (the repair stops leftovers with their descendants: that would reach the job)."""
    proc = _proc(tmp_path, {1: ("init", 0, 1), 10: ("launcher", 1, 100), 11: ("python3", 10, 101),
                            20: ("python3", 1, 200), 30: ("python3", 10, 300)})
    live = liveness({"processes": [{"pid": 11}]}, _gpu(10, 11, 20, 30), proc=proc, now=0)
    assert live["state"] == "running"
    # 20: reparented to init, no job process above or below it: left behind, with its start time.
    assert [(h["pid"], h["start_time"]) for h in live["leftovers"]] == [(20, 200)]


def test_without_a_job_every_holder_whose_parent_is_init_is_a_leftover(tmp_path):
    proc = _proc(tmp_path, {1: ("init", 0, 1), 20: ("python3", 1, 200), 21: ("python3", 20, 201)})
    live = liveness({"processes": []}, _gpu(20, 21), proc=proc, now=0)
    assert live["state"] == "none" and [h["pid"] for h in live["leftovers"]] == [20]
