# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: aggregate
short_description: Shows what a long wait of a repair (the drain, the log's ready line, the throughput gate) has seen so far
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - The relaunch role waits for the job's ready line (M(gpufleet.hygiene.log_wait)) and for the throughput gate's
    readings (M(gpufleet.hygiene.throughput)) in slices of C(relaunch_progress_every) seconds (10 by default), an
    C(until) loop over one wait. Each slice that ends with the wait not over returns C(pending) and what it has seen;
    this callback prints that, one line per slice at default verbosity, under Ansible's own
    C(FAILED - RETRYING) line for the retry.
  - "For example C(train-201: waiting for 5 throughput readings of /var/log/train.log after skipping 2: 3 read so far),
    then the last reading and how much of the whole wait has passed."
  - The kill role waits for the GPUs to drain (M(gpufleet.hygiene.gpu_state)) the same way, in slices of
    C(kill_progress_every) seconds; each line names the GPUs still busy, their memory and holders.
  - When the throughput gate passes, its verdict under its C(ok) line - the median, the readings counted and skipped,
    the floor and the seconds waited. (A gate that fails says the same in its failure message.)
  - It prints nothing for any other task, and changes no result and no exit status.
requirements:
  - enabled in C(ansible.cfg) - C(callbacks_enabled = gpufleet.hygiene.progress) - or with
    C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.hygiene.progress)
"""

from ansible import constants as C
from ansible.plugins.callback import CallbackBase

GATE = ("gpufleet.hygiene.throughput", "throughput")
WAITS = GATE + ("gpufleet.hygiene.log_wait", "log_wait", "gpufleet.hygiene.gpu_state", "gpu_state")


def progress_line(host, action, result):
    """The line for one retry of a task, or None when it is no slice of a wait."""
    if action not in WAITS or not result.get("pending") or not result.get("msg"):
        return None
    return "%s: %s" % (host, result["msg"])


def verdict_line(host, action, result):
    """The line for the throughput gate's pass (its median, readings and floor), or None."""
    if action not in GATE or result.get("pending") or "median" not in result or not result.get("msg"):
        return None
    return "%s: %s" % (host, result["msg"])


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.hygiene.progress"
    CALLBACK_NEEDS_ENABLED = True

    def v2_runner_on_ok(self, result, **_kwargs):
        # A wait's first slice in a task of its own (the kill role's drain) ends ok, pending.
        line = progress_line(result._host.get_name(), result._task.action, result._result) or verdict_line(
            result._host.get_name(), result._task.action, result._result)
        if line:
            self._display.display(line, color=C.COLOR_OK)

    def v2_runner_retry(self, result):
        line = progress_line(result._host.get_name(), result._task.action, result._result)
        if line:
            self._display.display(line, color=C.COLOR_VERBOSE)
