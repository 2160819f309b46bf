# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The training job's throughput gate: readings from the end of its log, their median, a floor.

The gate judges only what the launched run wrote: given where the log stood at launch (its
inode and size, ``since``) it reads from there, so readings an earlier run left in the log
count for nothing; a log rotated (another inode) or truncated (shorter than that offset)
since the launch is read from its start. It skips the new run's warm-up readings and takes
the median of the last ones, so one slow step passes and a run that is slow throughout (a
venv mixing two CUDA majors) fails.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import math
import re
import statistics
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, check_range
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import Slice
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import Skipped
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tail import check_since, read_window

# A number starts only where no digit or dot precedes it, with one place for blanks on either
# side of the unit: linear on any line (the obvious pattern backtracks on long runs of digits).
# A run below this fraction of its recorded baseline is not the job the inventory describes: the
# throughput gate fails it, and job_live fails a job running below it.
MIN_FRACTION = 0.9
DEFAULT_PATTERN = r"(?<![\d.])(?P<value>\d+(?:\.\d+)?)\s*(?:(?P<unit>[kKM])\s*)?tok(?:ens)?/s"
_UNITS = {None: 1.0, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}


def read_tail(path, max_bytes, since=None):
    """The last max_bytes of the file from where it stood at launch, decoded, and whether the
    start of that part was cut off.

    ``since`` is {inode, offset}: the log's inode and size when the run was launched (inode None
    or absent: the file is the same one). With it the third value says where reading began:
    {offset, inode, from} with from "launch", "rotated" (another inode: read from the start) or
    "truncated" (now shorter than offset: read from the start); without it, None.

    The log is a file the job's user writes: it is read through fs._tail (its directory reached
    from / without following a link, the log itself no link, a regular file, only that window
    read, within a time bound). Raises Skipped with the reason for a log that is refused.
    """
    data, cut, where, _st = read_window(path, max_bytes, since)
    return data.decode("utf-8", "replace"), cut, where


def readings(text, regex):
    """Every finite reading the pattern finds in text, in tokens per second, in order."""
    values = []
    for match in regex.finditer(text):
        groups = match.groupdict()
        try:
            value = float(groups.get("value") if "value" in groups else match.group(1))
        except (TypeError, ValueError, IndexError):
            continue
        value *= _UNITS.get(groups.get("unit"), 1.0)
        if math.isfinite(value):  # hundreds of digits read as a float are inf: no reading, not a pass
            values.append(value)
    return values


class Gate:
    """The options of the throughput module, checked; run() waits for the readings and judges them."""

    def __init__(self, log, pattern=DEFAULT_PATTERN, samples=5, skip=0, wait=0, min_value=None, baseline=None,
                 min_fraction=MIN_FRACTION, max_bytes=1048576, since=None, progress_every=0, started=None):
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise GpufleetError("pattern %r is not a valid regular expression: %s" % (pattern, exc)) from exc
        check_range("samples", samples, least=1)
        check_range("skip", skip, least=0)
        check_range("wait", wait, least=0)
        check_since(since)
        if baseline is not None:
            check_range("baseline", baseline, more_than=0)
            check_range("min_fraction", min_fraction, more_than=0, at_most=1)
        self.log, self.samples, self.skip, self.wait, self.max_bytes = log, samples, skip, wait, max_bytes
        self.baseline, self.min_fraction, self.since = baseline, min_fraction, since
        self.read_from = None
        self.cut = False
        self.floor = max(min_value or 0.0, (baseline or 0.0) * min_fraction)
        self.slice = Slice(wait, started, progress_every)

    def _read(self):
        try:
            text, cut, self.read_from = read_tail(self.log, self.max_bytes, self.since)
        except Skipped as exc:
            if exc.problem.endswith(" does not exist"):
                return []  # not written yet: waited for
            raise GpufleetError("cannot read log %s: %s; point log at the job's own regular file" % (self.log, exc.problem),
                                partial=dict(floor=self.floor, passed=False)) from None
        # A cut view says nothing of how many readings came before it: the warm-up is skipped from
        # what is in view, never assumed out of it (so warm-up readings are never judged).
        self.cut = cut
        return readings(text, self.regex)

    def run(self, sleep=time.sleep, clock=time.monotonic):
        """The result (readings, median, floor, passed, waited); GpufleetError with it when the gate fails."""
        start = clock()
        while True:
            values = self._read()
            if len(values) >= self.skip + self.samples or clock() - start >= self.slice.budget:
                break
            sleep(1.0)
        spent = clock() - start
        waited = self.slice.waited(spent)
        extra = {"read_from": self.read_from} if self.since is not None else {}
        window = values[self.skip:][-self.samples:]
        if len(window) < self.samples and self.slice.pending(spent):
            return dict(pending=True, readings=window, seen=len(values), floor=self.floor, passed=False, waited=waited,
                        msg="waiting for %d throughput readings of %s after skipping %d: %d read so far%s, %ss of %ss" % (
                            self.samples, self.log, self.skip, len(values),
                            " (last %.0f tok/s)" % values[-1] if values else "", int(waited), self.wait), **extra)
        if len(window) < self.samples:
            raise GpufleetError(
                "%s holds %d throughput readings after skipping %d, %d needed, after waiting %ss: is the job "
                "running and logging, and does pattern match its lines?%s" % (
                    self.log, len(window), self.skip, self.samples, waited,
                    " Only its last %d bytes were read (max_bytes): raise it when the job logs much between readings."
                    % self.max_bytes if self.cut else ""),
                partial=dict(readings=window, floor=self.floor, passed=False, waited=waited, **extra))
        median = statistics.median(window)
        result = dict(readings=window, median=median, floor=self.floor, passed=median >= self.floor, waited=waited, **extra)
        result["msg"] = "throughput %.0f tok/s (median of %d readings, %d skipped) against a floor of %.0f tok/s after %ss" % (
            median, len(window), min(self.skip, len(values)), self.floor, waited)
        if not result["passed"]:
            raise GpufleetError(
                "throughput %.0f tok/s (median of %d) is below the floor of %.0f tok/s%s" % (
                    median, len(window), self.floor,
                    " (%.0f%% of the %.0f baseline)" % (self.min_fraction * 100, self.baseline) if self.baseline else ""),
                partial=dict(result, changed=False))
        return result
