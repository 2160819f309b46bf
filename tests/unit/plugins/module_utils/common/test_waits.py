# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""common/_waits: how much of a long wait one module call spends (Slice), with the controller's
clock ahead of or behind the target's, and the line of a user's file shown on the controller."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import OPTIONS, Slice, shown


def clock(now):
    return lambda: now


def test_without_progress_every_one_call_spends_the_whole_wait():
    s = Slice(300, started=1000.0, every=0, wall=clock(1200.0))
    assert (s.before, s.budget) == (0.0, 300.0)  # started is not read without every
    assert not s.pending(299.9) and s.waited(12.345) == 12.35


def test_with_progress_every_a_call_spends_at_most_every_seconds_of_what_is_left():
    first = Slice(300, started=1000.0, every=30, wall=clock(1000.0))
    assert (first.before, first.budget) == (0.0, 30.0)
    assert first.pending(30.0) and first.waited(30.0) == 30.0
    later = Slice(300, started=1000.0, every=30, wall=clock(1285.0))
    assert (later.before, later.budget) == (285.0, 15.0)  # the last slice: only what is left
    assert not later.pending(15.0) and later.waited(15.0) == 300.0


def test_a_wait_begun_longer_ago_than_it_lasts_has_nothing_left():
    s = Slice(60, started=0.0, every=10, wall=clock(5000.0))
    assert (s.before, s.budget) == (60.0, 0.0) and not s.pending(0.0)


def test_started_in_the_future_counts_as_now():
    """The target's clock behind the controller's: the wait is not cut short."""
    s = Slice(60, started=2000.0, every=10, wall=clock(1000.0))
    assert (s.before, s.budget) == (0.0, 10.0) and s.pending(10.0)


@pytest.mark.parametrize("every", [-1, -30])
def test_a_negative_progress_every_is_refused_by_name(every):
    with pytest.raises(GpufleetError) as exc:
        Slice(60, every=every)
    assert "progress_every" in str(exc.value)


def test_the_options_every_waiting_module_takes():
    assert OPTIONS == {"progress_every": {"type": "int", "default": 0}, "started": {"type": "float"}}


@pytest.mark.parametrize("text, width, want", [
    ("step 10 loss 2.1\n", 120, "step 10 loss 2.1"),
    ("ready\r\n", 120, "ready"),
    ("a\x1b[2Jb\tc\x00d", 120, "a?[2Jb?c?d"),  # a terminal escape cannot reach the controller's screen
    ("x" * 200, 20, "x" * 17 + "..."),
    ("x" * 20, 20, "x" * 20),
])
def test_a_line_of_a_user_s_file_is_shown_printable_and_cut(text, width, want):
    assert shown(text, width) == want
