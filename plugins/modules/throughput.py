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
  - A job's log is usually appended to by every run. With O(since) (where the log stood when the
    run was launched) only what the launched run wrote is judged, and readings an earlier run left
    in the log (a slow contaminated run, or a fast one before a slow relaunch) count for
    nothing. The relaunch role records it before each launch.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.INFO_MODULE
  - gpufleet.hygiene.progress
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
        blanks is read in linear time (the obvious pattern backtracks on such a line).
    type: str
    default: '(?<![\d.])(?P<value>\d+(?:\.\d+)?)\s*(?:(?P<unit>[kKM])\s*)?tok(?:ens)?/s'
  samples:
    description: How many readings (the last ones, after O(skip)) the median is taken over.
    type: int
    default: 5
  skip:
    description:
      - Readings to skip at the start of the log (warm-up, compilation); with O(since), the first
        readings of the launched run.
      - Skipped from the readings read (O(max_bytes)) - fewer than O(skip) + O(samples) readings
        there when the wait ends fail the gate with their count; no warm-up reading is judged.
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
  since:
    description:
      - Where the log stood when the run was launched; only what was written after it is read.
      - A log whose inode is no longer O(since.inode) (rotated) or that is now shorter than
        O(since.offset) (truncated) is read from its start, all of it being the new run's.
      - Omitted, the end of the log is read whoever wrote it (a job already running when the
        gate was set).
    type: dict
    suboptions:
      inode:
        description: The log's inode at launch (the C(inode) of M(ansible.builtin.stat)); omitted when the log did not exist.
        type: int
      offset:
        description: The log's size in bytes at launch (the C(size) of M(ansible.builtin.stat)); 0 when it did not exist.
        type: int
        required: true
"""

EXAMPLES = r"""
- name: Where the log stands before the launch
  ansible.builtin.stat:
    path: /root/train/train.log
    get_checksum: false
  register: log_at_launch

# ... launch the job, its output appended to /root/train/train.log ...

- name: The relaunched run must reach 90% of the recorded 20K tok/s
  gpufleet.hygiene.throughput:
    log: /root/train/train.log
    skip: 3
    samples: 5
    wait: 600
    baseline: 20000
    min_fraction: 0.9
    since: >-
      {{ {'inode': log_at_launch.stat.inode, 'offset': log_at_launch.stat.size}
         if log_at_launch.stat.exists else {'offset': 0} }}

- name: The same gate, saying every 15 s what it has read so far
  gpufleet.hygiene.throughput:
    log: /root/train/train.log
    skip: 3
    samples: 5
    wait: 600
    baseline: 20000
    progress_every: 15
    started: "{{ now().timestamp() }}"
  register: gate
  until: not gate.pending | default(false)
  retries: 42  # 600 / 15, and two for a clock skew
  delay: 0
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
  description: Seconds spent waiting for readings (with O(progress_every), since O(started)).
  returned: always
  type: float
pending:
  description:
    - With O(progress_every), V(true) when this call ended with too few readings and the wait not over; RV(readings)
      holds those after O(skip) so far and C(msg) says what is awaited. Call again (C(until)).
  returned: with O(progress_every), while the wait goes on
  type: bool
seen:
  description: The readings read so far, those skipped included.
  returned: when RV(pending)
  type: int
read_from:
  description: Where in the log reading began.
  returned: with O(since), once the log exists
  type: dict
  contains:
    offset:
      description: The byte offset reading began at (0 for a rotated or truncated log).
      type: int
    inode:
      description: The log's inode now.
      type: int
    from:
      description: V(launch) (O(since.offset) of the same file), V(rotated) or V(truncated) (from its start).
      type: str
  sample: {"offset": 48213, "inode": 1835021, "from": "launch"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import OPTIONS as WAIT_OPTIONS
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import DEFAULT_PATTERN, Gate


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
            since=dict(type="dict", options=dict(inode=dict(type="int"), offset=dict(type="int", required=True))),
            **WAIT_OPTIONS
        ),
        supports_check_mode=True,
    )
    try:
        result = Gate(**module.params).run()
    except GpufleetError as exc:
        fail(module, exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
