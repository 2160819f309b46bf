# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The progress callback: a line per slice of a long wait, the gate's verdict, nothing else."""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.callback import progress

PENDING = {"pending": True, "msg": "waiting for 5 throughput readings of /var/log/t.log after skipping 2: 1 read so far, 15s of 600s"}


def test_a_slice_of_a_wait_is_one_line_with_what_it_has_seen():
    assert progress.progress_line("train-201", "gpufleet.hygiene.throughput", PENDING) == "train-201: " + PENDING["msg"]
    assert progress.progress_line("train-201", "log_wait", dict(PENDING, msg="waiting for a line")) == "train-201: waiting for a line"


def test_other_retries_and_results_print_nothing():
    assert progress.progress_line("h", "gpufleet.hygiene.gpu_state", PENDING) is None  # another module's retry
    assert progress.progress_line("h", "gpufleet.hygiene.throughput", {"msg": "x"}) is None  # not pending
    assert progress.verdict_line("h", "gpufleet.hygiene.log_wait", {"median": 1, "msg": "x"}) is None
    assert progress.verdict_line("h", "gpufleet.hygiene.throughput", PENDING) is None


def test_the_gates_pass_shows_its_verdict():
    ok = {"median": 20000.0, "passed": True, "msg": "throughput 20000 tok/s (median of 5 readings, 2 skipped) against a floor of 18000 tok/s after 9.1s"}
    assert progress.verdict_line("train-201", "gpufleet.hygiene.throughput", ok) == "train-201: " + ok["msg"]
