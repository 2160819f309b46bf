# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""proc/_terminate: real processes (the GPU stand-in's trainers) ended by real signals - SIGTERM, the
grace period, SIGKILL - each only while its PID still names the process chosen (its start time, a
pidfd where the kernel has them). The gpu fixture is conftest.py's."""

from __future__ import annotations

import os
import signal
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc, _terminate
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import start_time
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._terminate import terminate
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin


def _target(proc):
    return {"pid": proc.pid, "start_time": start_time(proc.pid)}


def test_a_process_is_the_one_chosen_only_at_its_own_start_time():
    """A start time recorded before or after the process's own names another process."""
    now = start_time(os.getpid())
    assert _proc.is_alive(os.getpid(), now)
    assert not _proc.is_alive(os.getpid(), now - 1) and not _proc.is_alive(os.getpid(), now + 1)
    for started, valid in ((now, True), (now - 1, False), (now + 1, False)):
        handle = _terminate._Handle(os.getpid(), started)
        try:
            assert handle.valid() is valid
        finally:
            handle.close()


def test_terminate_sigterm(gpu):
    _state, trainers = gpu
    p = trainers.start(term_delay=0.1)
    res = terminate([_target(p)], grace=5)
    assert res[p.pid] == {"signals": ["SIGTERM"], "outcome": "terminated"}
    assert gpu_standin.wait_exit(p) == 0  # exited by itself, after its "checkpoint"


def test_terminate_escalates_to_sigkill(gpu):
    _state, trainers = gpu
    p = trainers.start(ignore_sigterm=True)
    started = time.monotonic()
    res = terminate([_target(p)], grace=0.3)
    assert res[p.pid] == {"signals": ["SIGTERM", "SIGKILL"], "outcome": "killed"}
    assert gpu_standin.wait_exit(p) == -9
    assert 0.3 <= time.monotonic() - started < 5


@pytest.mark.parametrize("offset", [-1, 1], ids=["recorded_before_it_started", "recorded_after_it_started"])
def test_terminate_refuses_a_reused_pid(gpu, offset):
    """A PID whose start time is not the one recorded names another process: no signal, whichever
    side of the recorded time it started on (a start time given from elsewhere can be later)."""
    _state, trainers = gpu
    p = trainers.start()
    res = terminate([{"pid": p.pid, "start_time": start_time(p.pid) + offset}], grace=0.2)
    assert res[p.pid] == {"signals": [], "outcome": "pid_reused"}
    time.sleep(0.1)
    assert p.poll() is None  # still running


def test_a_process_that_ends_between_the_check_and_the_signal_is_already_gone(gpu, monkeypatch):
    """The race terminate() guards against: the target passed its start-time check, then ended
    (and was reaped) before the signal. Nothing is sent and it counts as gone, not reused."""
    _state, trainers = gpu
    p = trainers.start()
    target = _target(p)
    real_send = _terminate._Handle.send

    def ending_first(handle, sig):
        p.kill()
        p.wait()
        return real_send(handle, sig)

    monkeypatch.setattr(_terminate._Handle, "send", ending_first)
    assert terminate([target], grace=0.2)[p.pid] == {"signals": [], "outcome": "already_gone"}


def test_the_kill_handle_sends_nothing_to_a_pid_that_names_another_process_or_none(gpu, monkeypatch):
    _state, trainers = gpu
    p = trainers.start(ignore_sigterm=False)
    handle = _terminate._Handle(p.pid, start_time(p.pid) + 1)
    try:
        assert handle.send(signal.SIGTERM) is False
    finally:
        handle.close()
    time.sleep(0.1)
    assert p.poll() is None  # nothing was sent
    # Valid when checked, gone when signalled (ended and reaped in between): not sent.
    handle = _terminate._Handle(p.pid, start_time(p.pid))
    try:
        p.kill()
        p.wait()
        monkeypatch.setattr(_terminate._Handle, "valid", lambda self: True)
        assert handle.send(signal.SIGTERM) is False
    finally:
        handle.close()


def test_each_target_is_judged_on_its_own_and_no_descriptor_is_left_open(gpu):
    """A reused PID and a gone one listed first do not end the list: the live target after
    them is stopped; the PIDs pinned for the run (pidfds) are all closed at its end."""
    _state, trainers = gpu
    reused, gone, live = trainers.start(), trainers.start(), trainers.start()
    stale = {"pid": reused.pid, "start_time": start_time(reused.pid) - 1}
    ended = _target(gone)
    gone.kill()
    gone.wait()
    before = sorted(os.listdir("/proc/self/fd"))
    res = terminate([stale, ended, _target(live)], grace=5)
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert (res[reused.pid]["outcome"], res[gone.pid]["outcome"], res[live.pid]["outcome"]) == (
        "pid_reused", "already_gone", "terminated")
    assert reused.poll() is None and gpu_standin.wait_exit(live) == 0


def test_a_process_that_outlives_sigkill_is_reported_after_the_kill_wait(gpu, monkeypatch):
    """A process stuck in the kernel (state D) outlives SIGKILL: terminate waits ``kill_wait``
    seconds for it, then reports it survived. The kernel's side is what is faked: the process
    still counts as alive after its SIGKILL."""
    _state, trainers = gpu
    p = trainers.start(ignore_sigterm=True)
    monkeypatch.setattr(_terminate._Handle, "alive", lambda handle: handle.pid == p.pid)
    started = time.monotonic()
    res = terminate([_target(p)], grace=0.2, kill_wait=0.5)
    assert res[p.pid] == {"signals": ["SIGTERM", "SIGKILL"], "outcome": "survived"}
    assert 0.7 <= time.monotonic() - started < 10
    assert gpu_standin.wait_exit(p) == -9


def test_terminate_gone_and_zombie(gpu):
    _state, trainers = gpu
    p = trainers.start()
    target = _target(p)
    p.kill()
    time.sleep(0.2)  # a zombie until reaped: not alive
    assert terminate([target], grace=0.2)[p.pid]["outcome"] == "already_gone"
    p.wait()
    assert terminate([target], grace=0.2)[p.pid]["outcome"] == "already_gone"


def test_terminate_without_pidfd(gpu, monkeypatch):
    monkeypatch.delattr(_proc.os, "pidfd_open", raising=False)
    _state, trainers = gpu
    p = trainers.start()
    assert terminate([_target(p)], grace=2)[p.pid]["outcome"] == "terminated"
