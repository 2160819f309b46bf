# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The systemd timer/service and the cron.d example: valid, locked with flock, never overlapping,
naming an inventory and a writable state directory. Their command lines are run against the
simulated fleet in tests/integration/test_schedule_units_run.py."""

from __future__ import annotations

import configparser
import os
import pathlib
import subprocess

import schedfiles  # this directory's helpers (pytest puts a test's directory on sys.path)

SYSTEMD_ANALYZE = "/usr/bin/systemd-analyze"  # Debian's systemd package; scripts/setup-host.sh installs it


def test_systemd_analyze_verify(tmp_path):
    # Never skipped: the set-up installs it, and a unit that is not verified is not shipped.
    assert os.access(SYSTEMD_ANALYZE, os.X_OK), "systemd-analyze missing: run scripts/setup-host.sh (Debian package systemd)"
    proc = subprocess.run([SYSTEMD_ANALYZE, "verify", schedfiles.TIMER, schedfiles.SERVICE], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "gpufleet-hygiene" not in proc.stderr, proc.stderr  # warnings name the unit file
    for name, bad_line in (("gpufleet-hygiene.timer", ("OnCalendar=", "OnCalendar=bogus ")),
                           ("gpufleet-hygiene.service", ("Type=oneshot", "Type=bogus"))):
        bad = tmp_path / name
        bad.write_text(pathlib.Path(schedfiles.UNITS, name).read_text().replace(*bad_line))
        res = subprocess.run([SYSTEMD_ANALYZE, "verify", str(bad)], capture_output=True, text=True, check=False)
        # An error, or a warning naming the file (what the good units must never give).
        assert res.returncode != 0 or name in res.stderr, (name, res.stderr)


def test_timer_settings():
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(schedfiles.TIMER)
    timer = parser["Timer"]
    assert timer["OnCalendar"] == "*-*-* 03:00:00"
    assert timer["Persistent"] == "true"
    assert timer["RandomizedDelaySec"] == "30min"


def service():
    return schedfiles.unit(schedfiles.SERVICE)["Service"]


def test_service_runs_the_playbook_under_a_lock_with_an_inventory():
    svc = service()
    assert schedfiles.setting(svc, "Type") == "oneshot"
    env = schedfiles.service_environment(svc, {}, lambda text: text)
    argv = schedfiles.exec_argv(schedfiles.setting(svc, "ExecStart"), env)
    assert argv[:5] == ["/usr/bin/flock", "--nonblock", "--conflict-exit-code", "75", schedfiles.LOCK]
    assert argv[5] == schedfiles.INSTALL_DIR + "/.venv/bin/ansible-playbook"
    assert argv[6:] == ["-i", schedfiles.CONFIG_DIR + "/inventory.yml", "playbooks/hygiene.yml",
                        "-e", "gpufleet_report_dir=%s/report" % schedfiles.STATE_DIR]
    assert schedfiles.setting(svc, "SuccessExitStatus") == "75"
    assert schedfiles.setting(svc, "WorkingDirectory") == schedfiles.INSTALL_DIR


def test_service_settings_file_overrides_and_splits(tmp_path):
    (tmp_path / "hygiene.env").write_text('# site settings\nGPUFLEET_INVENTORY=/srv/fleet dir/x.proxmox_lxc.yml\n'
                                          'GPUFLEET_HYGIENE_ARGS="-e gpufleet_hygiene_remediate=false --limit pve_gpu"\n')
    env = schedfiles.service_environment(service(), {}, lambda text: text.replace(schedfiles.CONFIG_DIR, str(tmp_path)))
    argv = schedfiles.exec_argv(schedfiles.setting(service(), "ExecStart"), env)
    # ${NAME}: one argument, spaces and all; $NAME: split into words.
    assert argv[6:8] == ["-i", "/srv/fleet dir/x.proxmox_lxc.yml"]
    assert argv[-4:] == ["-e", "gpufleet_hygiene_remediate=false", "--limit", "pve_gpu"]


def test_service_keeps_ansible_s_files_in_its_state_directory():
    """ProtectHome=read-only: nothing Ansible writes may default to ~/.ansible."""
    svc = service()
    assert schedfiles.setting(svc, "ProtectHome") == "read-only"
    assert schedfiles.setting(svc, "StateDirectory") == os.path.basename(schedfiles.STATE_DIR)
    env = schedfiles.service_environment(svc, {}, lambda text: text)
    for name in ("ANSIBLE_HOME", "ANSIBLE_LOCAL_TEMP", "ANSIBLE_SSH_CONTROL_PATH_DIR", "GPUFLEET_PCT_CONTROL_PATH_DIR",
                 "GPUFLEET_REPORT_DIR"):
        assert env[name].startswith(schedfiles.STATE_DIR + "/"), (name, env[name])
    assert env["ANSIBLE_INVENTORY_UNPARSED_FAILED"] == "true"
    assert env["ANSIBLE_CONFIG"] == schedfiles.INSTALL_DIR + "/ansible.cfg"


def test_cron_entry():
    variables, entries = schedfiles.cron()
    assert len(entries) == 1
    when, user, command = entries[0]
    assert when == ("0", "3", "*", "*", "*")
    assert user == "gpufleet"
    assert "%" not in command  # cron would turn it into a newline
    assert "flock -n %s " % schedfiles.LOCK in command and '-i "$GPUFLEET_INVENTORY" playbooks/hygiene.yml' in command
    # The same lock, inventory, state directory and settings file as the systemd service.
    env = schedfiles.service_environment(service(), {}, lambda text: text)
    for name in ("GPUFLEET_INVENTORY", "GPUFLEET_REPORT_DIR", "ANSIBLE_CONFIG", "ANSIBLE_HOME", "ANSIBLE_LOCAL_TEMP",
                 "ANSIBLE_SSH_CONTROL_PATH_DIR", "GPUFLEET_PCT_CONTROL_PATH_DIR", "ANSIBLE_INVENTORY_UNPARSED_FAILED"):
        assert variables[name] == env[name], name
    assert schedfiles.LOCK in schedfiles.setting(service(), "ExecStart")
    assert ". %s/hygiene.env" % schedfiles.CONFIG_DIR in command
    assert "-%s/hygiene.env" % schedfiles.CONFIG_DIR in [v for k, v in service() if k == "EnvironmentFile"]


def test_ansible_cfg_names_no_inventory_that_nothing_creates(tmp_path):
    """Every run names its inventory (-i); a fresh checkout's ansible-inventory warns of no file."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(os.path.join(schedfiles.ROOT, "ansible.cfg"))
    assert "inventory" not in parser["defaults"]
    ansible_inventory = os.path.join(schedfiles.ROOT, ".venv", "bin", "ansible-inventory")
    env = dict(os.environ, HOME=str(tmp_path), ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_INVENTORY", None)
    res = subprocess.run([ansible_inventory, "--list"], cwd=schedfiles.ROOT, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "Unable to parse" not in res.stderr, res.stderr
