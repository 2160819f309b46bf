# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The concise stdout callback, as users meet it: ansible-playbook with the repository's ansible.cfg."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.hygiene.plugins.callback.concise import failure_text

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
MESSAGE = "train-101 is not ready: [gpu_idle] held by the inventory's own job (pid 160); stop it first"
PLAY = """
- name: A failure of each kind
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Read
      block:
        # an internal comment of the role, which the operator must not be shown
        - name: Fail when not ready
          ansible.builtin.assert:
            quiet: true
            that: verify__verdict_ready | default(false)
            fail_msg: "%s"
      rescue:
        - name: A command that fails
          ansible.builtin.command:
            argv: [sh, -c, "echo first >&2; echo 'uv: Operation not permitted' >&2; exit 2"]
""" % MESSAGE


def playbook(tmp_path, *args):
    path = tmp_path / "play.yml"
    path.write_text(PLAY)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", "ansible_python_interpreter=" + sys.executable, str(path), *args],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, check=False)


def test_each_failure_is_one_line_in_its_own_words(tmp_path):
    out = playbook(tmp_path)
    assert out.returncode == 2
    assert out.stdout.count("train-101 is not ready") == 1, out.stdout
    assert "fatal: [localhost]: FAILED! %s\n" % MESSAGE in out.stdout
    assert "fatal: [localhost]: FAILED! non-zero return code (rc 2): first | uv: Operation not permitted\n" in out.stdout
    for internal in ("internal comment", "Origin:", "assertion:", "evaluated_to", "verify__verdict_ready", "[ERROR]"):
        assert internal not in out.stdout, internal


@pytest.mark.parametrize("verbose", ["-v"])
def test_verbose_shows_what_the_default_callback_shows(tmp_path, verbose):
    out = playbook(tmp_path, verbose)
    assert "assertion: verify__verdict_ready | default(false)" in out.stdout and "Origin:" in out.stdout


def test_failure_text():
    assert failure_text({"msg": "  two\n lines "}) == "two lines"
    assert failure_text({}) == "failed (run with -v for the whole result)"
    assert failure_text({"msg": "non-zero return code", "rc": 1, "stderr": "a\nb\nc\nd\n"}) == "non-zero return code (rc 1): b | c | d"
    assert failure_text({"msg": "uv failed: see above", "rc": 1, "stderr": "x"}) == "uv failed: see above"
    crash = {"msg": "Module result deserialization failed: No start of json char found", "rc": 127,
             "module_stderr": "pyenv: python3.13: command not found\n\nThe `python3.13' command exists in 3.13.0\n"}
    assert failure_text(crash) == ("Module result deserialization failed: No start of json char found (rc 127): "
                                   "pyenv: python3.13: command not found | The `python3.13' command exists in 3.13.0")
