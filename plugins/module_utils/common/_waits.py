# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The part of a long wait (a log's ready line, the throughput gate) that one call of a module spends.

A module runs to its end before Ansible shows anything of it, so a wait of minutes is minutes of
silence. With ``progress_every`` a module waits at most that long in one call and, when the wait is
not over, returns ``pending`` with what it has seen; the task calls it again (``until``) and the
``gpufleet.hygiene.progress`` callback prints that line. ``started`` (seconds since the epoch, the
controller's clock, templated once for all the calls of one task) is when the whole wait began, so
that the wait as a whole still ends ``total`` seconds after it.

Private to gpufleet.hygiene (not a public API). Standard library only.
"""

from __future__ import annotations

import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import check_range

OPTIONS = dict(
    progress_every=dict(type="int", default=0),
    started=dict(type="float"),
)


class Slice:
    """How much of a wait of ``total`` seconds this call spends: all of it; or, with ``every``, at most
    ``every`` seconds of what is left of a wait that began at ``started``. A clock on the target behind
    the controller's makes the wait longer by the difference, one ahead shorter; ``started`` in the
    future counts as now."""

    def __init__(self, total, started=None, every=0, wall=time.time):
        check_range("progress_every", every, least=0)
        self.total = float(total)
        self.every = every
        self.before = 0.0
        if every and started is not None:
            self.before = min(max(0.0, wall() - float(started)), self.total)
        left = self.total - self.before
        self.budget = min(left, float(every)) if every else left

    def waited(self, spent):
        """Seconds of the whole wait behind us, after ``spent`` in this call."""
        return round(self.before + spent, 2)

    def pending(self, spent):
        """Whether this call ends with the wait not over (another call goes on with it)."""
        return bool(self.every) and self.before + spent < self.total


def shown(text, width=120):
    """A line of a user's file fit for the controller's screen: control characters as ?, cut at width."""
    text = "".join(ch if ch.isprintable() else "?" for ch in text.rstrip("\r\n"))
    return text if len(text) <= width else text[: width - 3] + "..."
