#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: log_wait
short_description: Wait for a line of a training job's log to match, reading only what the launched run wrote
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Waits until a line the job wrote to its log after O(since) matches O(regex), or O(timeout) seconds pass.
    The relaunch role waits with it for the job's ready line.
  - Without O(regex), only says where the log stands now (RV(log)), to be given as O(since) after a launch;
    the relaunch role records it so before each launch.
  - The log is a file the job's user writes, read as root as every such file is - its directory reached
    from C(/) without following a symbolic link, the log itself opened without following one and only
    when it is a regular file, read from the launch offset a bounded number of bytes at a time. A log
    that is a link (to a root-only file, C(/dev/zero)), a FIFO or a device is refused at once with a
    message that says so; nothing it points to is read.
  - A log rotated (another inode) or truncated (shorter than O(since.offset)) since the launch is read
    from its start, all of it being the new run's.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.INFO_MODULE
  - gpufleet.hygiene.progress
options:
  log:
    description: The training log on the target, an absolute path.
    type: path
    required: true
  regex:
    description:
      - A Python regular expression searched in each line written since O(since).
      - Omitted, nothing is waited for and RV(log) says where the log stands.
    type: str
  since:
    description:
      - Where the log stood when the run was launched (as M(gpufleet.hygiene.throughput)'s O(since)).
      - Omitted, the whole log is searched, whoever wrote it.
    type: dict
    suboptions:
      inode:
        description: The log's inode at launch; omitted when the log did not exist.
        type: int
      offset:
        description: The log's size in bytes at launch; 0 when it did not exist.
        type: int
        required: true
  timeout:
    description: Seconds to wait for a matching line; the module fails after them, naming the log and the regex.
    type: int
    default: 300
  max_line:
    description: The longest line looked at, in bytes; a longer line is searched in its first O(max_line) bytes.
    type: int
    default: 65536
seealso:
  - module: gpufleet.hygiene.throughput
"""

EXAMPLES = r"""
- name: Where the log stands before the launch
  gpufleet.hygiene.log_wait:
    log: /root/train/train.log
  register: at_launch

# ... launch the job, its output appended to /root/train/train.log ...

- name: The relaunched job says it trains
  gpufleet.hygiene.log_wait:
    log: /root/train/train.log
    regex: 'training started'
    since: {inode: 1835021, offset: 48213}
    timeout: 300
"""

RETURN = r"""
log:
  description:
    - Where the log stands now, from C(fstat) of its handle - C(exists), C(inode) and C(size) (null when it does not
      exist); its C(inode) and C(size) (as C(offset)) are the O(since) of a run launched after it.
  returned: always
  type: dict
  sample: {"exists": true, "inode": 1835021, "size": 48213}
matched:
  description: The first line written since O(since) that matched O(regex).
  returned: success
  type: str
  sample: "step 0 | training started"
read_from:
  description: Where in the log reading began (as M(gpufleet.hygiene.throughput)'s).
  returned: once the log exists
  type: dict
  sample: {"offset": 48213, "inode": 1835021, "from": "launch"}
waited:
  description: Seconds spent waiting (with O(progress_every), since O(started)).
  returned: always
  type: float
pending:
  description:
    - With O(progress_every), V(true) when this call ended with no matching line and the wait not over; C(msg) says
      what is awaited and what was written so far. Call again (C(until)).
  returned: with O(progress_every), while the wait goes on
  type: bool
lines:
  description: The lines written since O(since) read so far, none of them matching.
  returned: when RV(pending)
  type: int
last_line:
  description: The last of them, its control characters shown as C(?), cut at 120 characters; null when none.
  returned: when RV(pending)
  type: str
"""

import re
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, check_range, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import OPTIONS as WAIT_OPTIONS
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import Slice, shown
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import Skipped
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tail import Follower, check_since, stat_log


def position(log):
    """{exists, inode, size} of the log now (read as the gate reads it); GpufleetError for a log
    that is refused (a link, not a regular file)."""
    try:
        st = stat_log(log)
    except Skipped as exc:
        if exc.problem.endswith(" does not exist"):
            return {"exists": False, "inode": None, "size": None}
        raise GpufleetError("cannot read log %s: %s; point log at the job's own regular file" % (log, exc.problem)) from None
    return {"exists": True, "inode": st.st_ino, "size": st.st_size}


def wait(log, regex, since=None, timeout=300, max_line=65536, sleep=time.sleep, clock=time.monotonic, progress_every=0,
         started=None):
    """{matched, read_from, waited}: the first line written since ``since`` that matches, or (with
    ``progress_every``) {pending, lines, last_line, waited, msg} when this call's slice of the wait ran out;
    raises GpufleetError (with read_from and waited) on a refused log, a bad regex or the timeout."""
    try:
        pattern = re.compile(regex)
    except re.error as exc:
        raise GpufleetError("regex %r is not a valid regular expression: %s" % (regex, exc)) from None
    check_range("timeout", timeout, least=0)
    check_range("max_line", max_line, least=1)
    check_since(since)
    window = Slice(timeout, started, progress_every)
    follower = Follower(log, since, max_line=max_line)
    start = clock()
    count, last = 0, None
    while True:
        try:
            lines = follower.lines()
        except Skipped as exc:
            raise GpufleetError("cannot read log %s: %s; point log at the job's own regular file" % (log, exc.problem),
                                partial=dict(waited=window.waited(clock() - start))) from None
        for line in lines:
            text = line.decode("utf-8", "replace")
            if pattern.search(text):
                out = dict(matched=text, waited=window.waited(clock() - start))
                if follower.where is not None:
                    out["read_from"] = follower.where
                return out
            count += 1
            last = text
        spent = clock() - start
        if spent >= window.budget and window.pending(spent):
            waited = window.waited(spent)
            out = dict(pending=True, lines=count, last_line=None if last is None else shown(last), waited=waited,
                       msg="waiting for a line of %s matching %r: %s, %ss of %ss" % (
                           log, regex, "%d line(s) written since the launch, the last: %s" % (count, shown(last, 80))
                           if count else ("nothing written since the launch" if follower.where is not None
                                          else "the log does not exist yet"), int(waited), timeout))
            if follower.where is not None:
                out["read_from"] = follower.where
            return out
        if spent >= window.budget:
            partial = dict(waited=window.waited(spent))
            if follower.where is not None:
                partial["read_from"] = follower.where
            raise GpufleetError("no line of %s written since the launch matched %r in %ss%s" % (
                log, regex, timeout, "" if follower.where is not None else " (the log does not exist)"), partial=partial)
        if not follower.more:
            sleep(min(1.0, max(0.0, window.budget - spent)))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            log=dict(type="path", required=True),
            regex=dict(type="str"),
            since=dict(type="dict", options=dict(inode=dict(type="int"), offset=dict(type="int", required=True))),
            timeout=dict(type="int", default=300),
            max_line=dict(type="int", default=65536),
            **WAIT_OPTIONS
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = {} if p["regex"] is None else wait(p["log"], p["regex"], p["since"], p["timeout"], p["max_line"],
                                                    progress_every=p["progress_every"], started=p["started"])
        result["log"] = position(p["log"])
    except GpufleetError as exc:
        fail(module, exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
