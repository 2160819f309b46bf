#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: throughput
short_description: Read a training job's throughput from its log and gate on a floor or a baseline
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Waits until the training log holds enough throughput readings (after skipping the warm-up
    ones), takes their median and fails when it is below O(min_value) or below O(min_fraction) of
    O(baseline). This is the gate that catches a run that starts but runs slow, like the 20K to
    12.8K tok/s drop of a venv holding wheels of two CUDA majors.
  - Only the end of the log is read (O(max_bytes)), so a large log costs little.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.INFO_MODULE
options:
  log:
    description: The training log on the target.
    type: path
    required: true
  pattern:
    description:
      - Python regular expression with a group named C(value) holding the number, and optionally
        a group named C(unit) holding a V(K) or V(M) multiplier.
      - The default starts a number only where no digit or dot precedes it, and has one place
        for blanks on either side of the unit, so that a log line of thousands of digits or
        blanks is read in linear time (the obvious pattern takes minutes on one such line).
    type: str
    default: '(?<![\d.])(?P<value>\d+(?:\.\d+)?)\s*(?:(?P<unit>[kKM])\s*)?tok(?:ens)?/s'
  samples:
    description: How many readings (the last ones, after O(skip)) the median is taken over.
    type: int
    default: 5
  skip:
    description: Readings to skip at the start of the log (warm-up, compilation).
    type: int
    default: 0
  wait:
    description: Seconds to wait for O(skip) + O(samples) readings to appear.
    type: int
    default: 0
  min_value:
    description: Fail when the median is below this many tokens per second.
    type: float
  baseline:
    description: A recorded good throughput; fail when the median is below O(min_fraction) of it.
    type: float
  min_fraction:
    description: The fraction of O(baseline) the median must reach.
    type: float
    default: 0.9
  max_bytes:
    description: How much of the end of the log is read.
    type: int
    default: 1048576
"""

EXAMPLES = r"""
- name: The relaunched run must reach 90% of the recorded 20K tok/s
  gpufleet.hygiene.throughput:
    log: /root/train/train.log
    skip: 3
    samples: 5
    wait: 600
    baseline: 20000
    min_fraction: 0.9
"""

RETURN = r"""
readings:
  description: The readings the median was taken over, in tokens per second.
  returned: when readings were found
  type: list
  elements: float
  sample: [19840.0, 20110.0, 20020.0, 19960.0, 20200.0]
median:
  description: Their median.
  returned: when readings were found
  type: float
  sample: 20020.0
floor:
  description: The throughput the median had to reach (the larger of O(min_value) and O(min_fraction) x O(baseline)).
  returned: always
  type: float
passed:
  description: The median reached the floor.
  returned: always
  type: bool
waited:
  description: Seconds spent waiting for readings.
  returned: always
  type: float
"""

import math
import re
import statistics
import time

from ansible.module_utils.basic import AnsibleModule

# Linear on any text: see the pattern option's description.
DEFAULT_PATTERN = r"(?<![\d.])(?P<value>\d+(?:\.\d+)?)\s*(?:(?P<unit>[kKM])\s*)?tok(?:ens)?/s"
_UNITS = {None: 1.0, "": 1.0, "k": 1e3, "K": 1e3, "M": 1e6}


def read_tail(path, max_bytes):
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        return f.read().decode("utf-8", "replace"), size > max_bytes


def readings(text, regex):
    values = []
    for match in regex.finditer(text):
        groups = match.groupdict()
        try:
            value = float(groups.get("value") if "value" in groups else match.group(1))
        except (TypeError, ValueError, IndexError):
            continue
        value *= _UNITS.get(groups.get("unit"), 1.0)
        if math.isfinite(value):  # 400 digits read as a float are inf: no reading, not a pass
            values.append(value)
    return values


def main():
    module = AnsibleModule(
        argument_spec=dict(
            log=dict(type="path", required=True),
            pattern=dict(type="str", default=DEFAULT_PATTERN),
            samples=dict(type="int", default=5),
            skip=dict(type="int", default=0),
            wait=dict(type="int", default=0),
            min_value=dict(type="float"),
            baseline=dict(type="float"),
            min_fraction=dict(type="float", default=0.9),
            max_bytes=dict(type="int", default=1048576),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        regex = re.compile(p["pattern"])
    except re.error as exc:
        module.fail_json(msg="pattern %r is not a valid regular expression: %s" % (p["pattern"], exc))
    if p["samples"] < 1 or p["skip"] < 0 or p["wait"] < 0:
        module.fail_json(msg="samples must be at least 1, skip and wait at least 0")
    if p["baseline"] is not None and (p["baseline"] <= 0 or not 0 < p["min_fraction"] <= 1):
        module.fail_json(msg="baseline must be positive and min_fraction in (0, 1]")
    floor = max(p["min_value"] or 0.0, (p["baseline"] or 0.0) * p["min_fraction"])
    need = p["skip"] + p["samples"]
    start = time.monotonic()
    values = []
    while True:
        try:
            text, cut = read_tail(p["log"], p["max_bytes"])
            values = readings(text, regex)
            if cut:  # the start of the log is not in view: the warm-up readings are not either
                values = [None] * p["skip"] + values
        except FileNotFoundError:
            values = []
        except OSError as exc:
            module.fail_json(msg="cannot read log %s: %s" % (p["log"], exc.strerror or exc), floor=floor, passed=False)
        if len(values) >= need or time.monotonic() - start >= p["wait"]:
            break
        time.sleep(1.0)
    waited = round(time.monotonic() - start, 2)
    window = [v for v in values[p["skip"]:] if v is not None][-p["samples"]:]
    if len(window) < p["samples"]:
        module.fail_json(
            msg="%s holds %d throughput readings after skipping %d, %d needed, after waiting %ss: is the job "
                "running and logging, and does pattern match its lines?" % (p["log"], len(window), p["skip"], p["samples"], waited),
            readings=window, floor=floor, passed=False, waited=waited)
    median = statistics.median(window)
    result = dict(changed=False, readings=window, median=median, floor=floor, passed=median >= floor, waited=waited)
    if not result["passed"]:
        module.fail_json(
            msg="throughput %.0f tok/s (median of %d) is below the floor of %.0f tok/s%s" % (
                median, len(window), floor,
                " (%.0f%% of the %.0f baseline)" % (p["min_fraction"] * 100, p["baseline"]) if p["baseline"] else ""),
            **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
