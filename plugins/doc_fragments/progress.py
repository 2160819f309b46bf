# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment(object):

    # A long wait in slices, each call returning what it has seen (log_wait, throughput).
    DOCUMENTATION = r"""
options:
  progress_every:
    description:
      - With a value above 0, one call waits at most this many seconds and, when the wait is not over and not yet
        met, returns C(pending=true) with what it has seen so far and a C(msg) that says so, instead of
        waiting on in silence. The task calls the module again with C(until) (see the examples); the
        C(gpufleet.hygiene.progress) callback prints each of those lines at default verbosity.
      - The wait as a whole still ends when the module's wait (C(timeout) of log_wait and gpu_state, C(wait) of throughput) has
        passed since O(started); the call in which it does fails as a single call would.
      - V(0) waits in one call.
    type: int
    default: 0
  started:
    description:
      - When the whole wait began, in seconds since the epoch by the controller's clock. Give it as
        C("{{ now().timestamp() }}") in the task; Ansible templates a task's options once, so every call of
        an C(until) loop gets the same value.
      - A target clock behind the controller's makes the wait longer by the difference, one ahead makes it shorter.
      - Only used with O(progress_every).
    type: float
"""
