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
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time

import pytest
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
    assert argv[:4] == ["/usr/bin/python3", schedfiles.RUNNER, schedfiles.LOCK_DIR, "--"]
    assert schedfiles.lock_file(argv) == schedfiles.LOCK
    assert argv[4] == schedfiles.INSTALL_DIR + "/.venv/bin/ansible-playbook"
    assert argv[5:] == ["-i", schedfiles.CONFIG_DIR + "/inventory.yml", "playbooks/hygiene.yml",
                        "-e", "gpufleet_report_dir=%s/report" % schedfiles.STATE_DIR]
    # A run that did not start (the lock held) is a failure: no exit status but 0 is a success.
    assert schedfiles.success_statuses(svc) == {0}
    assert schedfiles.setting(svc, "WorkingDirectory") == schedfiles.INSTALL_DIR


def test_service_settings_file_overrides_and_splits(tmp_path):
    (tmp_path / "hygiene.env").write_text('# site settings\nGPUFLEET_INVENTORY=/srv/fleet dir/x.proxmox_lxc.yml\n'
                                          'GPUFLEET_HYGIENE_ARGS="-e gpufleet_hygiene_remediate=false --limit pve_gpu"\n')
    env = schedfiles.service_environment(service(), {}, lambda text: text.replace(schedfiles.CONFIG_DIR, str(tmp_path)))
    argv = schedfiles.exec_argv(schedfiles.setting(service(), "ExecStart"), env)
    # ${NAME}: one argument, spaces and all; $NAME: split into words.
    assert argv[argv.index("-i"):argv.index("-i") + 2] == ["-i", "/srv/fleet dir/x.proxmox_lxc.yml"]
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
    assert "/usr/bin/python3 contrib/bin/gpufleet-hygiene-run %s -- " % schedfiles.LOCK_DIR in command
    assert '-i "$GPUFLEET_INVENTORY" playbooks/hygiene.yml' in command
    # The same lock, inventory, state directory and settings file as the systemd service.
    env = schedfiles.service_environment(service(), {}, lambda text: text)
    for name in ("GPUFLEET_INVENTORY", "GPUFLEET_REPORT_DIR", "ANSIBLE_CONFIG", "ANSIBLE_HOME", "ANSIBLE_LOCAL_TEMP",
                 "ANSIBLE_SSH_CONTROL_PATH_DIR", "GPUFLEET_PCT_CONTROL_PATH_DIR", "ANSIBLE_INVENTORY_UNPARSED_FAILED"):
        assert variables[name] == env[name], name
    assert " %s -- " % schedfiles.LOCK_DIR in schedfiles.setting(service(), "ExecStart")
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


# ------------------------------------------------------------------ the run lock

LOCAL_USER = "nobody"


@pytest.fixture
def box():
    """(substitute, paths) for running the service's own command line here: the documented paths
    under a directory every local user can reach, as / is. The state directory is 0750 and
    root's (StateDirectory=, of User=: these tests run as root); /run/lock is a directory of mode
    1777, as it is on every host."""
    top = tempfile.mkdtemp(prefix="gpufleet-sched-", dir="/tmp")
    os.chmod(top, 0o755)
    paths = {"state": os.path.join(top, "state"), "run_lock": os.path.join(top, "run-lock"),
             "marker": os.path.join(top, "ran")}
    os.mkdir(paths["state"], 0o750)
    os.mkdir(paths["run_lock"])
    os.chmod(paths["run_lock"], 0o1777)
    substitute = schedfiles.substituter({schedfiles.INSTALL_DIR: schedfiles.ROOT, schedfiles.STATE_DIR: paths["state"],
                                         schedfiles.CONFIG_DIR: os.path.join(top, "etc"), "/run/lock": paths["run_lock"]})
    yield substitute, paths
    shutil.rmtree(top)


def service_argv(substitute, command):
    """The service's ExecStart, its paths substituted, the playbook replaced by command."""
    env = schedfiles.service_environment(service(), {}, substitute)
    return schedfiles.with_command(schedfiles.exec_argv(substitute(schedfiles.setting(service(), "ExecStart")), env), command)


def marking(paths, seconds=0):
    return ["/bin/sh", "-c", "echo ran >> %s; sleep %d" % (paths["marker"], seconds)]


def test_a_local_user_cannot_make_the_scheduled_run_skip(box):
    """Any local user takes the run's lock before the run: the run must then either run, or fail
    (an exit status systemd does not count as success). With the lock in /run/lock the unit exited
    75, SuccessExitStatus=75: no run, no report, and the unit green."""
    substitute, paths = box
    argv = service_argv(substitute, marking(paths))
    lock = schedfiles.lock_file(argv)
    if os.path.dirname(lock) != paths["run_lock"]:
        # The lock directory is made by a first run, as the timer's first run makes it.
        first = subprocess.run(service_argv(substitute, ["/bin/true"]), capture_output=True, text=True, check=False)
        assert first.returncode == 0, first.stderr
    holder = subprocess.Popen(["runuser", "-u", LOCAL_USER, "--", "flock", "--nonblock", lock, "sleep", "60"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        try:
            held = holder.wait(timeout=1.5) is None
        except subprocess.TimeoutExpired:
            held = True  # flock got the lock and sleeps under it
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        holder.kill()
        _out, err = holder.communicate()
    ran = os.path.exists(paths["marker"])
    succeeded = res.returncode in schedfiles.success_statuses(service())
    assert ran or not succeeded, "the run did not start and the unit counts it a success (exit %d): %s" % (
        res.returncode, res.stderr)
    assert ran and succeeded and not held, (res.returncode, res.stderr, err)
    assert "Permission denied" in err  # the user could not even open it


def test_a_run_that_finds_the_lock_held_fails_naming_the_holder(box):
    substitute, paths = box
    first = subprocess.Popen(service_argv(substitute, marking(paths, 30)), stderr=subprocess.PIPE, text=True)
    try:
        for _n in range(100):  # until the first run has started its command (it holds the lock then)
            if os.path.exists(paths["marker"]):
                break
            time.sleep(0.05)
        res = subprocess.run(service_argv(substitute, marking(paths)), capture_output=True, text=True, timeout=60, check=False)
    finally:
        first.terminate()
        first.wait(30)
    assert res.returncode not in schedfiles.success_statuses(service()), res
    assert res.returncode == 75
    lock = schedfiles.lock_file(service_argv(substitute, ["x"]))
    assert "another run holds the lock %s (pid %d (user root): /usr/bin/python3 " % (lock, first.pid) in res.stderr, res.stderr
    assert "this run did not start" in res.stderr
    with open(paths["marker"]) as f:
        assert f.read() == "ran\n"  # the first run's only
    # SIGTERM reached the first run's command (systemd's stop): it ended, with it the lock.
    assert first.returncode == 128 + signal.SIGTERM
    again = subprocess.run(service_argv(substitute, ["/bin/true"]), capture_output=True, text=True, check=False)
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("make, message", [
    (lambda d: (os.mkdir(d, 0o700), os.chown(d, 65534, 65534)),
     r"the lock directory {d} belongs to nobody, not to root that runs this: .* Remove it \(the next run makes it\) or chown root it"),
    (lambda d: (os.mkdir(d), os.chmod(d, 0o755)), r"the lock directory {d} has mode 0755: others can enter or write it\. chmod 0700 {d}"),
    (lambda d: (os.mkdir(d), os.chmod(d, 0o1777)), r"the lock directory {d} has mode 1777"),
    (lambda d: os.symlink("/tmp", d), r"the lock directory {d} is not a directory of its own \(a symbolic link or another file: .*\): remove it"),
])
def test_a_lock_directory_of_another_owner_or_mode_is_refused(box, make, message):
    substitute, paths = box
    argv = service_argv(substitute, marking(paths))
    lock_dir = os.path.dirname(schedfiles.lock_file(argv))
    make(lock_dir)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 78, res
    assert re.search(message.format(d=re.escape(lock_dir)), res.stderr), res.stderr
    assert not os.path.exists(paths["marker"])
    assert not os.path.lexists(os.path.join(lock_dir, "gpufleet-hygiene.lock")) or os.path.islink(lock_dir)


def test_the_lock_directory_is_made_private_and_the_command_s_status_is_the_run_s(box):
    substitute, paths = box
    res = subprocess.run(service_argv(substitute, ["/bin/sh", "-c", "exit 4"]), capture_output=True, text=True, check=False)
    assert res.returncode == 4, res.stderr  # ansible-playbook's own (4: a host unreachable)
    lock = schedfiles.lock_file(service_argv(substitute, ["x"]))
    st = os.lstat(os.path.dirname(lock))
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    st = os.lstat(lock)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
