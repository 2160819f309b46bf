# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: unattempted
type: aggregate
short_description: Lists, at the end of a run, the containers it never attempted and the jobs it left down
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - A rolling C(remediate.yml) stops before its next batch when a batch fails (the canary, or more than
    C(gpufleet_max_fail_percentage) of a batch) or when every host of a batch is failed or unreachable, and
    ansible-playbook then runs no later play, so no play of the run can say what was left. This callback does, after
    the recap - the containers of the run's fleet plan (C(gpufleet_plan), set by C(playbooks/plan.yml)) that no task
    ran for, neither on the container nor on the node that reads it, with the hosts that stopped the run, and how to
    go on.
  - It also lists the containers whose repair failed after it stopped their job, when that job is not running now
    (the repair role records them, C(gpufleet_jobs_down) in the run's custom stats), each with why and the command
    that starts it again once fixed.
  - It prints nothing when every container of the plan was attempted and no job was left down, or when the run has no
    fleet plan (another playbook, or a run that failed in the plan itself, before any host was read). It changes no
    result and no exit status.
requirements:
  - enabled in C(ansible.cfg) - C(callbacks_enabled = gpufleet.hygiene.unattempted) - or with
    C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.hygiene.unattempted)
"""

from collections.abc import Mapping

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._plan import run_plan

# The fact plan.yml sets on localhost.
MAX_NAMED = 50


def unattempted(plan, attempted):
    """The plan's containers that no task ran for: neither the container itself nor, read by
    node, the node that reads it (``attempted``: the hosts a task ran for)."""
    if not isinstance(plan, Mapping) or not isinstance(plan.get("containers"), (list, tuple)):
        return []
    reader = {}
    for node, containers in (plan.get("by_node") or {}).items():
        for name in containers or ():
            reader[name] = node
    return [c for c in plan["containers"] if c not in attempted and reader.get(c) not in attempted]


def jobs_down(stats):
    """{host: {why, relaunch}} of the jobs the repair role left down (its set_stats), or {}."""
    custom = getattr(stats, "custom", None) or {}
    down = (custom.get("_run") or {}).get("gpufleet_jobs_down")
    return dict(down) if isinstance(down, Mapping) else {}


def down_message(down):
    """What the end of the run says of the jobs it left down."""
    lines = ["JOBS DOWN: the repair of %d container(s) failed after it stopped their job, which is not running now:"
             % len(down)]
    for host in sorted(down):
        entry = down[host] if isinstance(down[host], Mapping) else {}
        lines.append("  %s: %s - once fixed, start it again with: %s"
                     % (host, entry.get("why") or "the repair failed", entry.get("relaunch") or "remediate.yml"))
    return "\n".join(lines)


def message(left, stats):
    """What the end of the run says of the containers it left, and of the hosts that stopped it."""
    stopped = []
    for host in sorted(set(stats.failures) | set(stats.dark)):
        stopped.append("%s (%s)" % (host, "unreachable" if host in stats.dark else "failed"))
    named = ", ".join(left[:MAX_NAMED]) + (" and %d more" % (len(left) - MAX_NAMED) if len(left) > MAX_NAMED else "")
    return ("NEVER ATTEMPTED: %d container(s) of this run's plan, nothing read or changed on them: %s. The run stopped "
            "early%s: fix that and run again (the containers done are ready and skipped), or let failures go on with "
            "-e gpufleet_max_fail_percentage=100." % (len(left), named, ", after " + ", ".join(stopped) if stopped else ""))


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.hygiene.unattempted"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._attempted = set()
        self._variables = None

    def v2_playbook_on_play_start(self, play):
        self._variables = play.get_variable_manager()

    def _ran(self, result, **_kwargs):
        # A task run once for the play and delegated (plan.yml's checks) attempted no host of it.
        task = result._task
        if not (task.run_once and task.delegate_to):
            self._attempted.add(result._host.get_name())

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_unreachable = v2_runner_on_skipped = _ran

    def v2_playbook_on_stats(self, stats):
        down = jobs_down(stats)
        if down:
            self._display.display(down_message(down), color=C.COLOR_ERROR, stderr=False)
        left = unattempted(run_plan(self._variables), self._attempted)
        if left:
            self._display.display(message(left, stats), color=C.COLOR_WARN, stderr=False)
