# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Safe termination of chosen processes: SIGTERM, a grace period, SIGKILL.

A PID is signalled only while its start time (field 22 of /proc/<pid>/stat, proc/_proc.py) is the
one recorded when it was chosen, through a pidfd where the kernel has them (no window for PID
reuse). Which processes are chosen is proc/_scope.py's (scopes), and which are never signalled
proc/_proc.py's (protection); this module only ends the ones it is given.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import signal
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc


class _Handle(object):
    """A target PID, pinned by a pidfd where possible, verified against its start time."""

    def __init__(self, pid, started, proc=_proc.PROC):
        self.pid = pid
        self.started = started
        self.proc = proc
        self.fd = None
        pidfd_open = getattr(os, "pidfd_open", None)
        if pidfd_open is not None:
            try:
                self.fd = pidfd_open(pid)
            except OSError:
                self.fd = None  # gone (checked below) or no pidfd support in this kernel

    def valid(self):
        """The PID still names the process that was chosen."""
        st = _proc.read_stat(self.pid, self.proc)
        return st is not None and st[3] == self.started

    def alive(self):
        return _proc.is_alive(self.pid, self.started, self.proc)

    def send(self, sig):
        """Send sig if (and only if) the PID is still the chosen process; True when sent."""
        if not self.valid():
            return False
        try:
            if self.fd is not None and hasattr(signal, "pidfd_send_signal"):
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _wait_gone(handles, deadline, interval=0.02):
    while True:
        living = [h for h in handles if h.alive()]
        if not living or time.monotonic() >= deadline:
            return living
        time.sleep(interval)


def terminate(targets, grace, kill_wait=5.0, proc=_proc.PROC):
    """SIGTERM every target, SIGKILL those alive after ``grace`` seconds.

    targets: dicts with ``pid`` and ``start_time`` (as chosen). Returns a dict per target
    with ``signals`` (names sent) and ``outcome``: terminated (gone after SIGTERM), killed
    (gone after SIGKILL), already_gone, pid_reused (the PID now names another process:
    nothing sent), survived (alive after SIGKILL, e.g. stuck in the driver).
    """
    results, handles = {}, []
    for t in targets:
        pid, started = t["pid"], t["start_time"]
        results[pid] = {"signals": [], "outcome": None}
        h = _Handle(pid, started, proc)  # pin the PID first, then check who it names
        st = _proc.read_stat(pid, proc)
        if st is not None and st[3] != started:
            results[pid]["outcome"] = "pid_reused"
            h.close()
            continue
        if st is None or st[1] in ("Z", "X"):
            results[pid]["outcome"] = "already_gone"
            h.close()
            continue
        if h.send(signal.SIGTERM):
            results[pid]["signals"].append("SIGTERM")
            handles.append(h)
        else:
            results[pid]["outcome"] = "pid_reused" if _proc.start_time(pid, proc) not in (None, started) else "already_gone"
            h.close()
    try:
        living = _wait_gone(handles, time.monotonic() + grace)
        for h in handles:
            if h not in living:
                results[h.pid]["outcome"] = "terminated"
        killed = []
        for h in living:
            if h.send(signal.SIGKILL):
                results[h.pid]["signals"].append("SIGKILL")
                killed.append(h)
            else:
                results[h.pid]["outcome"] = "terminated"
        still = _wait_gone(killed, time.monotonic() + kill_wait)
        for h in killed:
            results[h.pid]["outcome"] = "survived" if h in still else "killed"
    finally:
        for h in handles:
            h.close()
    return results
