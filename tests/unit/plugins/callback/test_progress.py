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
    assert progress.progress_line("h", "gpufleet.hygiene.processes", PENDING) is None  # another module's retry
    assert progress.progress_line("h", "gpufleet.hygiene.throughput", {"msg": "x"}) is None  # not pending
    assert progress.verdict_line("h", "gpufleet.hygiene.log_wait", {"median": 1, "msg": "x"}) is None
    assert progress.verdict_line("h", "gpufleet.hygiene.throughput", PENDING) is None


def test_the_gates_pass_shows_its_verdict():
    ok = {"median": 20000.0, "passed": True, "msg": "throughput 20000 tok/s (median of 5 readings, 2 skipped) against a floor of 18000 tok/s after 9.1s"}
    assert progress.verdict_line("train-201", "gpufleet.hygiene.throughput", ok) == "train-201: " + ok["msg"]


def test_the_drain_says_what_it_waits_for_on_its_first_call_and_on_each_retry():
    """The kill role's drain: its first slice is a task of its own (ok, pending), the rest an until loop."""
    drain = {"pending": True, "changed": True, "msg": "waiting for the GPUs to drain, 10 of 120 s: GPU 0 (NVIDIA H200, GPU-1): "
             "40960 MiB used (threshold 64 MiB), held by pid 9 python3 (40960 MiB)"}
    shown = []

    class Display:
        def display(self, line, **_kw):
            shown.append(line)

    class Host:
        def get_name(self):
            return "train-201"

    class Task:
        action = "gpufleet.hygiene.gpu_state"

    class Result:
        _host, _task, _result = Host(), Task(), drain

    cb = progress.CallbackModule()
    cb._display = Display()
    cb.v2_runner_on_ok(Result())
    cb.v2_runner_retry(Result())
    Result._result = dict(drain, pending=False)
    cb.v2_runner_on_ok(Result())  # drained: nothing more to say
    assert shown == ["train-201: " + drain["msg"]] * 2
