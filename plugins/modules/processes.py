#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: processes
short_description: Find a training job's processes by scope, and stop them safely
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Reads C(/proc) for the processes that match a scope (command line or name patterns, users, a
    tmux session and its descendants, PIDs with their start times) and returns them, with their start times.
  - With O(state=absent), stops them - SIGTERM, O(grace_period), then SIGKILL - checking before each
    signal that the PID still names the process that was chosen (its start time), so a PID reused in
    between is never signalled.
  - Never signalled, whatever the scope, and listed in RV(protected) with the reason when the scope
    matches them - the init of a PID namespace (PID 1 of the node, or a process whose C(NSpid) in
    C(/proc/<pid>/status) ends in 1, the init of a container), and this module's own process and
    ancestors. Kernel threads (the C(PF_KTHREAD) flag in C(/proc/<pid>/stat)) are never looked at.
    They are told by what they are, not by number - inside a container's PID namespace PID 2 is an
    ordinary process, often the job itself, and is in scope like any other.
  - A O(scope.name) or O(scope.cmdline) pattern that matches an ordinary system process is refused
    unless O(scope.allow_broad).
  - Use M(gpufleet.hygiene.gpu_state) for processes that hold GPUs; this module is for the rest of
    a job (data loaders, wrappers, a detached launcher) and for telling whether a job is running.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
attributes:
  check_mode:
    support: full
    details:
      - With O(state=absent), lists in RV(terminated) what would be signalled; signals nothing.
  diff_mode:
    support: full
    details:
      - With O(state=absent), the processes in scope (PID, user, command line) before and those still running
        after; in check mode, after is what would be left.
  idempotent:
    support: full
    details:
      - A second O(state=absent) run finds nothing in scope and reports no change.
options:
  scope:
    description:
      - Which processes. Every criterion given must match; within one criterion any item may match.
        At least one criterion is required.
    type: dict
    required: true
    suboptions:
      cmdline:
        description: As O(gpufleet.hygiene.gpu_state#module:scope.cmdline) of M(gpufleet.hygiene.gpu_state).
        type: list
        elements: str
      allow_broad:
        description: As O(gpufleet.hygiene.gpu_state#module:scope.allow_broad) of M(gpufleet.hygiene.gpu_state).
        type: bool
        default: false
      name:
        description: Python regular expressions searched in the process name (C(comm), the basename of C(argv[0])).
        type: list
        elements: str
      users:
        description: User names or numeric UIDs.
        type: list
        elements: str
      pids:
        description:
          - As O(gpufleet.hygiene.gpu_state#module:scope.pids) of M(gpufleet.hygiene.gpu_state) - processes
            named by C(pid) and C(start_time) as RV(processes[].start_time) returns them; a PID reused since
            is not in scope.
        type: list
        elements: dict
        version_added: 0.2.0
        suboptions:
          pid: {description: The process ID., type: int, required: true}
          start_time: {description: "Its start time when it was read (RV(processes[].start_time)).", type: int, required: true}
      tmux_session:
        description: As O(gpufleet.hygiene.gpu_state#module:scope.tmux_session) of M(gpufleet.hygiene.gpu_state).
        type: str
      tmux_socket:
        description: The tmux server socket to ask (C(tmux -S)).
        type: path
  descendants:
    description:
      - Whether the descendants of every process in scope are in scope too, as long as they pass
        O(scope.users). A job's data-loader and compile workers hold GPU contexts of their own and
        are left orphaned when only their parent is stopped.
      - They are found when the module starts, before any signal, while their parent still links them
        to the job. The walk stops at the init of a PID namespace (another container is not a worker).
      - The C(kill) role sets it (its C(kill_descendants), true by default).
    type: bool
    default: false
  state:
    description: V(query) only reports; V(absent) stops every process in scope.
    type: str
    choices: [query, absent]
    default: query
  grace_period:
    description: Seconds a process has to exit after SIGTERM before it gets SIGKILL.
    type: float
    default: 10
  kill_wait:
    description: Seconds to wait for a process to disappear after SIGKILL before reporting it as surviving.
    type: float
    default: 5
seealso:
  - module: gpufleet.hygiene.gpu_state
"""

EXAMPLES = r"""
- name: Is the training job running?
  gpufleet.hygiene.processes:
    scope:
      cmdline: ['train_dflash\.py']
  register: job

- name: Stop two processes read earlier, unless their PIDs were reused since
  gpufleet.hygiene.processes:
    scope:
      pids:
        - {pid: 4242, start_time: 1234567}
        - {pid: 4250, start_time: 1234612}
    state: absent

- name: Stop what is left of it
  gpufleet.hygiene.processes:
    scope:
      cmdline: ['train_dflash\.py', 'torchrun']
      users: [root]
    state: absent
    grace_period: 20
"""

RETURN = r"""
processes:
  description: The processes in scope when the module started.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process ID.
      type: int
    ppid:
      description: Parent process ID.
      type: int
    user:
      description: Owner.
      type: str
    comm:
      description: Process name.
      type: str
    cmdline:
      description: Command line, arguments joined by spaces.
      type: str
    start_time:
      description: Start time in clock ticks since boot (field 22 of C(/proc/<pid>/stat)).
      type: int
    started_at:
      description: When the process started, in seconds since the epoch (from its start time and the boot-time clock).
      type: int
      version_added: 0.3.0
    descendant_of:
      description: For a process in scope only as a descendant (O(descendants)), the PID of its matching ancestor; otherwise null.
      type: int
count:
  description: Number of processes in scope.
  returned: always
  type: int
protected:
  description:
    - Processes the scope matched that are never signalled, with C(pid), C(ppid), C(user), C(comm), C(cmdline),
      C(start_time) and the C(reason) - the init of a PID namespace (C(NSpid) ends in 1), or this module's
      own process or one of its ancestors. Not in RV(processes) nor in RV(count).
  returned: always
  type: list
  elements: dict
  sample: [{"pid": 31337, "comm": "systemd", "cmdline": "/sbin/init", "reason": "PID 1 (NSpid ends in 1): ..."}]
terminated:
  description: What was signalled (in check mode, what would be), with C(signals) sent and the C(outcome).
  returned: when O(state=absent)
  type: list
  elements: dict
  sample: [{"pid": 4242, "cmdline": "python3 train_dflash.py", "signals": ["SIGTERM"], "outcome": "terminated"}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._results import diff_only_in_diff_mode, stopped_diff
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import STUCK_ADVICE, find_processes, stuck_text
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._scope import Scope, scope_options
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._terminate import terminate


def main():
    module = AnsibleModule(
        argument_spec=dict(
            scope=dict(type="dict", required=True, options=scope_options()),
            descendants=dict(type="bool", default=False),
            state=dict(type="str", default="query", choices=["query", "absent"]),
            grace_period=dict(type="float", default=10),
            kill_wait=dict(type="float", default=5),
        ),
        supports_check_mode=True,
    )
    p = module.params
    s = p["scope"]
    try:
        scope = Scope(**s)
        if scope.empty():
            module.fail_json(msg="scope names no criterion: give cmdline, name, users, pids or tmux_session")
        protected = []
        found = find_processes(scope, with_descendants=p["descendants"], protected=protected)
    except GpufleetError as exc:
        fail(module, exc)
    for note in scope.notes:
        module.warn(note)
    for entry in protected:
        module.warn("pid %d (%s) is in scope but not signalled: %s" % (entry["pid"], entry["cmdline"][:80],
                                                                       entry["reason"]))
    result = dict(changed=False, processes=found, count=len(found), protected=protected)
    if p["state"] == "absent":
        result["changed"] = bool(found)
        if module.check_mode or not found:
            result["terminated"] = [dict(pid=f["pid"], cmdline=f["cmdline"], signals=[], outcome="would_terminate")
                                    for f in found]
            exit_with_diff(module, result, found)
        outcomes = terminate(found, p["grace_period"], p["kill_wait"])
        result["terminated"] = [dict(pid=f["pid"], cmdline=f["cmdline"], **outcomes[f["pid"]]) for f in found]
        result["changed"] = any(o["signals"] for o in outcomes.values())
        survivors = [t for t in result["terminated"] if t["outcome"] == "survived"]
        if survivors:
            described = []
            for t in survivors:
                how = stuck_text(t["pid"])
                described.append("pid %d (%s%s)" % (t["pid"], t["cmdline"][:80], "; " + how if how else ""))
            module.fail_json(
                msg="%d process(es) still running after SIGTERM, %ss of grace and SIGKILL: %s. %s. The other "
                    "processes in scope were stopped; nothing outside the scope was signalled"
                    % (len(survivors), p["grace_period"], ", ".join(described), STUCK_ADVICE), **result)
    exit_with_diff(module, result, found)


def exit_with_diff(module, result, found):
    """Exit with the processes stopped as a --diff (each one's user from what was found)."""
    users = dict((f["pid"], f.get("user")) for f in found)
    rows = [dict(t, user=users.get(t["pid"])) for t in result.get("terminated") or ()]
    result["diff"] = stopped_diff("processes in scope", rows)
    module.exit_json(**diff_only_in_diff_mode(module, result))


if __name__ == "__main__":
    main()
