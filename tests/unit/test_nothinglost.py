# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The "nothing lost" diff of the integration tests: which processes a step stopped or started."""

from __future__ import annotations

import nothinglost


def snap(**procs):
    """A snapshot with only processes: pid=(start_time, state)."""
    return {"packages": {}, "files": {},
            "processes": {pid[1:]: {"start_time": st, "state": state, "cmdline": "" if state == "Z" else "cmd" + pid}
                          for pid, (st, state) in procs.items()}}


def test_processes_gone_and_new():
    before = snap(p10=(1, "S"), p20=(2, "S"), p30=(3, "Z"), p40=(4, "S"), p60=(6, "Z"))
    after = snap(p10=(1, "S"),      # still running: not gone
                 p20=(2, "Z"),      # exited during the step, not reaped yet: gone
                 p30=(3, "Z"),      # had exited before the step: not the step's doing
                 p40=(9, "S"),      # the PID reused by another process: the first gone, the other new
                 p50=(5, "S"),      # started by the step
                 p70=(7, "Z"))      # started and exited during the step: nothing left
    d = nothinglost.diff(before, after)["processes"]
    assert d == {"gone": [(20, "cmdp20"), (40, "cmdp40")], "new": [(40, "cmdp40"), (50, "cmdp50")]}
    assert not nothinglost.is_empty(nothinglost.diff(before, after))
    assert nothinglost.is_empty(nothinglost.diff(before, before))
