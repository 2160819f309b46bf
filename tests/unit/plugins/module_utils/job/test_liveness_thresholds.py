# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_liveness, both sides of ``stall_after``, on a real log whose modification time is set: a log quiet for
0.9x stall_after is a running job's, one quiet for 1.1x is a stalled job's, for the default
(900 s, as documented in docs/checks.md) and for values given. A threshold halved or doubled
fails one side."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.job import _liveness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._liveness import liveness

STALL_AFTER = [None, 60, 900, 3600]  # None: the default


def _quiet_for(tmp_path, fraction, stall_after):
    """liveness of this process as the job, its log last written fraction x stall_after ago."""
    log = tmp_path / "train.log"
    log.write_text("step 1 tokens/s 20000\n")
    mtime = 1_800_000_000.0
    os.utime(log, (mtime, mtime))
    threshold = stall_after or 900
    kw = {} if stall_after is None else {"stall_after": stall_after}
    job = {"processes": [{"pid": os.getpid()}]}
    return liveness(job, [], log=str(log), now=mtime + fraction * threshold, **kw)


def test_the_default_stall_after_is_the_documented_900_s():
    assert _liveness.DEFAULT_STALL_AFTER == 900


@pytest.mark.parametrize("stall_after", STALL_AFTER, ids=lambda v: "default" if v is None else "%ds" % v)
def test_a_log_quiet_for_0_9x_stall_after_is_a_running_job(tmp_path, stall_after):
    result = _quiet_for(tmp_path, 0.9, stall_after)
    assert result["state"] == "running" and result["reason"] is None
    assert result["stall_after"] == (stall_after or 900)


@pytest.mark.parametrize("stall_after", STALL_AFTER, ids=lambda v: "default" if v is None else "%ds" % v)
def test_a_log_quiet_for_1_1x_stall_after_is_a_stalled_job(tmp_path, stall_after):
    threshold = stall_after or 900
    result = _quiet_for(tmp_path, 1.1, stall_after)
    assert result["state"] == "stalled"
    assert result["reason"] == "its log %s has not grown for %ds (stall_after %ds)" % (
        tmp_path / "train.log", round(1.1 * threshold), threshold)


@pytest.mark.parametrize("stall_after", STALL_AFTER, ids=lambda v: "default" if v is None else "%ds" % v)
def test_a_log_quiet_for_exactly_stall_after_grew_within_it_and_is_a_running_job(tmp_path, stall_after):
    """docs/checks.md: running while the log "grew within the last stall_after seconds"."""
    assert _quiet_for(tmp_path, 1.0, stall_after)["state"] == "running"
