# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet benchmark's arithmetic and tables (benchmarks/_fleettables.py, printed by
benchmarks/_fleettables.py), without a fleet."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import _fleettables  # noqa: E402 - benchmarks/ is no package: its directory is put on sys.path above

SIZES = [(8, 4), (8, 16), (16, 16)]


def test_slopes_between_consecutive_sizes():
    med = {"B@8x4": 4.0, "B@8x16": 10.0, "B@16x16": 20.0, "A@8x4": 3.0, "A@16x16": 9.0}
    got = _fleettables.slopes(med, SIZES, ["B", "A"])
    assert got["B"] == {"8x4->8x16": pytest.approx(6.0 / 96), "8x16->16x16": pytest.approx(10.0 / 128)}
    assert got["A"] == {"8x4->16x16": pytest.approx(6.0 / 224)}  # a size missing: the next one measured


def test_floors_scale_the_read_with_containers_over_cores():
    reads = [{"self_s": 0.01, "children_s": 0.03}, {"self_s": 0.02, "children_s": 0.04}, {"self_s": 0.5, "children_s": 0}]
    fl, per_read = _fleettables.floors({"T@8x4": 1.5}, reads, SIZES, 2)
    assert per_read == pytest.approx(0.06)  # the median of 0.04, 0.06, 0.5
    assert fl["8x4"] == {"transport_s": 1.5, "work_s": pytest.approx(0.06 * 32 / 2)}
    assert fl["16x16"]["transport_s"] is None and fl["16x16"]["work_s"] == pytest.approx(0.06 * 256 / 2)
    assert _fleettables.floors({}, [], SIZES, 2)[0]["8x4"] == {"transport_s": None, "work_s": None}


def doc():
    configs = ["A", "A2", "B"]
    med = {"%s@%s" % (c, s): v for c, base in (("A", 2.0), ("A2", 1.0), ("B", 4.0), ("T", 0.5))
           for s, v in (("8x4", base), ("8x16", 2 * base))}
    fl, per_read = _fleettables.floors(med, [{"self_s": 0.01, "children_s": 0.02}], [(8, 4), (8, 16)], 2)
    return {"meta": {"machine": "m", "ansible_core": "core", "commit": "c", "peers": {"x.y": "1"}, "method": "lxc-attach",
                     "max_sessions": 10, "rounds": 1, "sizes": ["8x4", "8x16"], "configs": configs, "cores": 2},
            "medians": med, "floors": fl, "read_cpu": [{}], "read_cpu_s": per_read,
            "slopes": _fleettables.slopes(med, [(8, 4), (8, 16)], configs + ["T"]), "retries": {"A": 3}}


def test_render_rows_ratios_floors_and_slopes():
    lines = _fleettables.render(doc()).splitlines()
    assert "| 8x4 (32) | 2.00 s | 1.00 s | 4.00 s | 0.50 s | 0.48 s | 2.00x | 4.00x |" in lines
    assert "| 8x16 | 4.0x / 2.1x | 2.0x / 1.0x | 8.0x / 4.2x |" in lines
    assert "| 8x4 → 8x16 | +21 | +10 | +42 | +5 |" in lines
    assert "ssh refused by sshd and tried again: A 3" in lines


def test_render_leaves_unmeasured_cells_empty():
    d = doc()
    del d["medians"]["A@8x16"]
    d["floors"]["8x16"]["work_s"] = None
    lines = _fleettables.render(d).splitlines()
    assert "| 8x16 (128) |  | 2.00 s | 8.00 s | 1.00 s |  |  | 4.00x |" in lines


PROFILED = """\
PLAY [Preflight - the fleet plan] **********************************************
TASK [Plan the run] ************************************************************
Friday 04 December 2026  23:07:39 +0000 (0:00:00.009)       0:00:00.250 *******
ok: [localhost]
PLAY [Preflight - read by node] ************************************************
TASK [Read] ********************************************************************
Friday 04 December 2026  23:07:40 +0000 (0:00:00.300)       0:00:00.550 *******
ok: [pve1]
TASK [Keep] ********************************************************************
Friday 04 December 2026  23:07:41 +0000 (0:00:01.200)       0:00:01.750 *******
ok: [pve1]
PLAY [Preflight - fail the hosts that are not ready] ***************************
skipping: no hosts matched
PLAY RECAP *********************************************************************
pve1                       : ok=2    changed=0    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
TASKS RECAP ********************************************************************
Friday 04 December 2026  23:07:41 +0000 (0:00:00.100)       0:00:01.850 *******
===============================================================================
Read -------------------------------------------------------------------- 1.20s
"""


def test_a_profiled_run_is_broken_down_by_play():
    """profile_tasks' timestamps (elapsed at each task's start, and at the end) give each play its tasks' time;
    before the first task and after the last is the rest of the wall time; a play with no host costs no task."""
    import _fleetrun

    got = dict(_fleetrun.play_times(PROFILED, wall=3.0))
    assert got == {"before the first task and after the last (Python, ansible-core, inventory, plugins)": pytest.approx(1.4),
                   "Preflight - the fleet plan": pytest.approx(0.3), "Preflight - read by node": pytest.approx(1.3)}
    assert _fleetrun.play_times("PLAY RECAP\n", wall=2.0) == [("the whole run (no task ran)", 2.0)]
