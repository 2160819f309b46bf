# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: concise
type: stdout
short_description: Ansible's default screen output, each failure once in its own words
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - "The output of C(ansible.builtin.default), but at default verbosity a failed task is one line,
    C(fatal: [host]: FAILED! <its message>), instead of the message three times over - an C([ERROR]) block, the
    task's place in the playbook with the source lines before it (comments of the role included), and the whole
    result (C(assertion), C(evaluated_to), ...) in YAML."
  - A failed command adds the last lines of its standard error when its message says no more than its exit code; a
    module that did not run to its end (its interpreter missing, a crash) the last lines of what it wrote to its
    standard error.
  - With C(-v) or more, and for loops and ignored failures, failures are shown as C(ansible.builtin.default) shows
    them.
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
requirements:
  - set as the stdout callback - C(stdout_callback = gpufleet.hygiene.concise) in C(ansible.cfg), or
    C(ANSIBLE_STDOUT_CALLBACK=gpufleet.hygiene.concise)
"""

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

STDERR_LINES = 3  # of a failed command's standard error, when its message is only its exit code


def _tail(text):
    return [line.strip() for line in str(text or "").splitlines() if line.strip()][-STDERR_LINES:]


def failure_text(result):
    """A failed task's message as one text: ``msg``; with the end of ``stderr`` when ``msg`` says no more
    than that the command failed (``non-zero return code``), and of ``module_stderr`` when the module itself
    did not run to its end (its interpreter missing, a crash: ``MODULE FAILURE``, ``deserialization failed``)."""
    msg = " ".join(str(result.get("msg") or "").split()) or "failed (run with -v for the whole result)"
    stderr = _tail(result.get("stderr")) if not result.get("msg") or result.get("msg") == "non-zero return code" else []
    stderr = stderr or _tail(result.get("module_stderr"))
    if stderr:
        msg = "%s (rc %s): %s" % (msg, result.get("rc"), " | ".join(stderr))
    return msg


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "gpufleet.hygiene.concise"

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if self._display.verbosity > 0 or ignore_errors or (result.task.loop and "results" in result.result):
            super().v2_runner_on_failed(result, ignore_errors)
            return
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        self._handle_warnings(result.result)
        self._display.display("fatal: [%s]: FAILED! %s" % (self.host_label(result), failure_text(result.result)),
                              color=C.COLOR_ERROR, stderr=self.get_option("display_failed_stderr"))
