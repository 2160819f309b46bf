# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The relaunch role waits for the new run's ready line, not an earlier run's left in the log:
log_search_since on real files, searched as ansible.builtin.wait_for searches (bytes, MULTILINE,
over the whole file), and the role itself launching the training stand-in."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.hygiene.plugins.filter import relaunch

STANDIN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "standins", "train_dflash.py")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
STALE = b"ready 4242\ncompile start\ncompiled in 30 s\nstep 1 loss 1.9 12800 tokens/s\n"


def _stat(path):
    """ansible.builtin.stat's stat, the keys the filter reads."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return {"exists": False}
    return {"exists": True, "inode": st.st_ino, "size": st.st_size}


def _found(regex, path):
    """As wait_for searches: the pattern compiled to bytes with MULTILINE, over the whole file."""
    with open(path, "rb") as f:
        return re.compile(regex.encode(), re.MULTILINE).search(f.read()) is not None


def test_a_ready_line_an_earlier_run_left_is_not_found(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(STALE)
    at_launch = _stat(log)
    with open(log, "ab") as f:
        f.write(b"ready 5151\ncompile start\n")  # the new run, still compiling
    regex = relaunch.log_search_since(r"^compiled in", at_launch, _stat(log))
    assert _found(r"^compiled in", log) and not _found(regex, log)
    with open(log, "ab") as f:
        f.write(b"compiled in 2 s\n")
    assert _found(relaunch.log_search_since(r"^compiled in", at_launch, _stat(log)), log)


@pytest.mark.parametrize("how", ["rotated", "truncated", "new"])
def test_a_log_rotated_truncated_or_new_since_the_launch_is_searched_from_its_start(tmp_path, how):
    log = tmp_path / "train.log"
    log.write_bytes(STALE * 3)
    at_launch = _stat(log)
    if how == "rotated":
        os.rename(log, tmp_path / "train.log.1")
        log.write_bytes(STALE)  # a new file, shorter, holding only the new run's lines
    elif how == "truncated":
        log.write_bytes(STALE)
    else:
        at_launch = {"exists": False}
    assert _found(relaunch.log_search_since(r"^compiled in", at_launch, _stat(log)), log)


def test_offsets_past_the_largest_repeat_and_inline_flags(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"x" * (3 * (1 << 20) + 17) + b"\nREADY\n")
    at_launch = _stat(log)
    assert not _found(relaunch.log_search_since(r"(?i)^ready$", at_launch, _stat(log)), log)
    with open(log, "ab") as f:
        f.write(b"Ready\n")
    regex = relaunch.log_search_since(r"(?i)^ready$", at_launch, _stat(log))
    assert regex.startswith("(?i)\\A") and _found(regex, log)


def test_bad_input_is_refused():
    with pytest.raises(AnsibleFilterError, match="not a valid regular expression"):
        relaunch.log_search_since("(", {"exists": False}, {"exists": False})
    with pytest.raises(AnsibleFilterError, match="at_launch must be a stat result"):
        relaunch.log_search_since("ready", None, {"exists": False})


def _kill_tagged(tag):
    """SIGKILL the stand-in this test started (setsid: not our child), by its --tag."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            if tag.encode() in argv:
                os.kill(int(entry), signal.SIGKILL)


PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: gpufleet.hygiene.relaunch
  post_tasks:
    - name: The log as the role left it
      ansible.builtin.copy:
        src: "{{ gpufleet_job.log }}"
        dest: "{{ gpufleet_job.log }}.at-end"
        remote_src: true
        mode: "0600"
"""


def test_the_relaunch_role_waits_for_the_new_runs_ready_line(tmp_path):
    """The log holds an earlier run's "compiled in" line; the relaunched stand-in compiles for 5 s
    before writing its own. The role's wait ends on the new line, not at once on the old one: when
    it is done, the new line is in the log."""
    tag = "gpufleet-test-%s" % uuid.uuid4().hex[:10]
    state = tmp_path / "gpu"
    (state / "dev").mkdir(parents=True)
    (state / "dev" / "nvidia0").write_bytes(b"")
    log = tmp_path / "train.log"
    log.write_bytes(STALE)
    job = {"command": [sys.executable, os.path.abspath(STANDIN), "--state", str(state), "--compile-seconds", "5",
                       "--tag", tag],
           "workdir": str(tmp_path), "method": "setsid", "log": str(log), "patterns": [re.escape(tag) + "$"],
           "ready_regex": "^compiled in"}
    play = tmp_path / "relaunch.yml"
    play.write_text(PLAY)
    extra = {"gpufleet_job": job, "relaunch_expect_gpu": False, "relaunch_settle_seconds": 0, "relaunch_log_timeout": 30,
             "ansible_python_interpreter": sys.executable}
    try:
        out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), "-i", "localhost,",
                              str(play), "-e", json.dumps(extra)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, timeout=120, check=False)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        assert (tmp_path / "train.log.at-end").read_bytes().count(b"compiled in") == 2  # the old line and the new run's
    finally:
        _kill_tagged(tag)
