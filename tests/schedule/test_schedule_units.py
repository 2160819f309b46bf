# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd timer/service and the cron.d example: valid, locked with flock, never overlapping."""

from __future__ import annotations

import configparser
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNITS = os.path.join(ROOT, "contrib", "systemd")
CRON = os.path.join(ROOT, "contrib", "cron", "gpufleet-hygiene")


def _unit(name):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(os.path.join(UNITS, name))
    return parser


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path):
    proc = subprocess.run(["systemd-analyze", "verify", os.path.join(UNITS, "gpufleet-hygiene.timer"),
                           os.path.join(UNITS, "gpufleet-hygiene.service")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "gpufleet-hygiene" not in proc.stderr, proc.stderr  # warnings name the unit file
    bad = tmp_path / "gpufleet-hygiene.timer"
    bad.write_text(pathlib.Path(UNITS, "gpufleet-hygiene.timer").read_text().replace("OnCalendar=", "OnCalendar=bogus "))
    assert subprocess.run(["systemd-analyze", "verify", str(bad)], capture_output=True, check=False).returncode != 0


def test_timer_settings():
    timer = _unit("gpufleet-hygiene.timer")["Timer"]
    assert timer["OnCalendar"] == "*-*-* 03:00:00"
    assert timer["Persistent"] == "true"
    assert timer["RandomizedDelaySec"] == "30min"


def test_service_runs_the_playbook_under_a_lock():
    service = _unit("gpufleet-hygiene.service")["Service"]
    assert service["Type"] == "oneshot"
    argv = service["ExecStart"].replace("\\\n", " ").split()
    assert argv[:5] == ["/usr/bin/flock", "--nonblock", "--conflict-exit-code", "75", "/run/lock/gpufleet-hygiene.lock"]
    assert argv[5].endswith("/.venv/bin/ansible-playbook") and argv[6] == "playbooks/hygiene.yml"
    assert service["SuccessExitStatus"] == "75"
    assert os.path.isabs(service["WorkingDirectory"])


def test_cron_entry():
    entries = [x for x in pathlib.Path(CRON).read_text().splitlines() if x and not x.startswith("#") and not re.match(r"^[A-Z_]+=", x)]
    assert len(entries) == 1
    fields = entries[0].split(None, 6)
    minute, hour, dom, month, dow, user, command = fields
    assert (minute, hour, dom, month, dow) == ("0", "3", "*", "*", "*")
    assert user == "gpufleet"
    assert "%" not in command  # cron would turn it into a newline
    assert "flock -n /run/lock/gpufleet-hygiene.lock" in command and "ansible-playbook playbooks/hygiene.yml" in command
    # the same lock as the systemd service, so the two never overlap either
    assert "/run/lock/gpufleet-hygiene.lock" in _unit("gpufleet-hygiene.service")["Service"]["ExecStart"]
