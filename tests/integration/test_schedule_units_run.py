# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The shipped scheduling files run as shipped, against the simulated fleet.

The systemd service's ExecStart (with its Environment= and EnvironmentFile= settings, expanded as
systemd expands them) and the cron entry's command line are read from contrib/ and run, the
documented paths replaced with the test's own: /opt/gpufleet-hygiene by this checkout,
/etc/gpufleet-hygiene and /var/lib/gpufleet-hygiene by temporary directories, the fleet's
inventory where the units look for it. They run with /root and /home read-only (as
ProtectHome=read-only makes them), report-only (GPUFLEET_HYGIENE_ARGS in the settings file:
the session's fleet is shared with the other tests), and must write a report holding every
container of the fleet.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
from conftest import INVENTORY, REPO

_spec = importlib.util.spec_from_file_location("schedfiles", os.path.join(REPO, "tests", "schedule", "schedfiles.py"))
schedfiles = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(schedfiles)

# What systemd gives a service before its own settings (root's, as these tests run as root).
SERVICE_BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "HOME": "/root", "USER": "root",
                    "LOGNAME": "root", "SHELL": "/bin/sh"}
# ProtectHome=read-only, in a mount namespace of the command's own.
READ_ONLY_HOME = 'for d in /root /home; do if [ -d "$d" ]; then mount --bind -o ro "$d" "$d" || exit 99; fi; done; exec "$@"'


def protected_home(argv):
    return ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", READ_ONLY_HOME, "sh", *argv]


@pytest.fixture
def site(tmp_path):
    """(substitute, paths): the documented paths replaced by the test's own, the fleet's inventory
    at the documented inventory path, a settings file making the run report-only and moving the
    report (so that reading it proves the file was read)."""
    paths = {"install": REPO, "config": str(tmp_path / "etc"), "state": str(tmp_path / "state"),
             "report": str(tmp_path / "state" / "nightly")}
    os.makedirs(paths["config"])
    os.makedirs(paths["state"], mode=0o750)  # StateDirectory= (the cron entry: its install step)
    shutil.copy(INVENTORY, os.path.join(paths["config"], "inventory.yml"))
    with open(os.path.join(paths["config"], "hygiene.env"), "w") as f:
        f.write('# report-only\nGPUFLEET_HYGIENE_ARGS="-e gpufleet_hygiene_remediate=false"\nGPUFLEET_REPORT_DIR=%s\n' % paths["report"])
    substitute = schedfiles.substituter({schedfiles.INSTALL_DIR: paths["install"], schedfiles.CONFIG_DIR: paths["config"],
                                         schedfiles.STATE_DIR: paths["state"]})
    return substitute, paths


def containers(fleet):
    return sorted(ct["name"] for node in fleet["nodes"] for ct in node["containers"])


def service_command(substitute):
    """(argv, environment, working directory) of the service, as systemd would start it."""
    svc = schedfiles.unit(schedfiles.SERVICE)["Service"]
    env = schedfiles.service_environment(svc, SERVICE_BASE_ENV, substitute)
    return (schedfiles.exec_argv(substitute(schedfiles.setting(svc, "ExecStart")), env), env,
            substitute(schedfiles.setting(svc, "WorkingDirectory")))


def run(argv, env, cwd):
    return subprocess.run(protected_home(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900, check=False)


def assert_report_holds(report_dir, hosts):
    """Every report file the run wrote names every container."""
    with open(os.path.join(report_dir, "report.json")) as f:
        data = json.load(f)
    assert sorted(h["host"] for h in data["hosts"]) == hosts
    junit = ET.parse(os.path.join(report_dir, "report.junit.xml")).getroot()
    classnames = {tc.get("classname").rsplit(".", 1)[-1] for tc in junit.iter("testcase")}
    assert sorted(classnames) == hosts
    with open(os.path.join(report_dir, "gpufleet_hygiene.prom")) as f:
        ready = [line for line in f if line.startswith("gpufleet_hygiene_host_ready{")]
    assert sorted(line.split('host="', 1)[1].split('"', 1)[0] for line in ready) == hosts
    with open(os.path.join(report_dir, "report.html")) as f:
        html = f.read()
    assert all(host in html for host in hosts)
    return data


def test_service_exec_start_runs_over_the_fleet(fleet, site):
    substitute, paths = site
    argv, env, cwd = service_command(substitute)
    assert argv[argv.index("-i") + 1] == os.path.join(paths["config"], "inventory.yml")
    res = run(argv, env, cwd)
    # The stopped container (train-101) is not read (its node says it is stopped): its report row
    # says so; a report-only hygiene run fails no host for it.
    assert res.returncode == 0, res.stdout[-6000:]
    assert os.path.isdir(paths["report"]), res.stdout[-6000:]
    data = assert_report_holds(paths["report"], containers(fleet))
    by_host = {h["host"]: h for h in data["hosts"]}
    assert by_host["train-101"]["error"] and not by_host["train-101"]["ready"]
    # Report-only, from the settings file: nothing was repaired, whatever the reads found.
    assert not any(h["remediated"] for h in data["hosts"])
    assert "gpufleet_hygiene_remediate=false" in argv
    # Ansible's own files went to the state directory (the home was read-only).
    assert os.path.isdir(os.path.join(paths["state"], "ansible", "tmp"))


def test_service_does_not_overlap_a_running_one(site):
    substitute, paths = site
    argv, env, cwd = service_command(substitute)
    lock = schedfiles.lock_file(argv)
    os.mkdir(os.path.dirname(lock), 0o700)  # as the previous run made it
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        res = run(argv, env, cwd)
    # A run that did not start is a failure (the unit turns red), saying who holds the lock.
    assert res.returncode == 75, res.stdout
    assert res.returncode not in schedfiles.success_statuses(schedfiles.unit(schedfiles.SERVICE)["Service"])
    assert "another run holds the lock %s (pid %d (user root)" % (lock, os.getpid()) in res.stdout, res.stdout
    assert not os.path.exists(paths["report"])


def test_service_fails_on_an_inventory_it_cannot_read(site):
    substitute, paths = site
    os.unlink(os.path.join(paths["config"], "inventory.yml"))
    argv, env, cwd = service_command(substitute)
    res = run(argv, env, cwd)
    assert res.returncode != 0, res.stdout
    assert "inventory.yml as an inventory source" in res.stdout and "No inventory was parsed" in res.stdout, res.stdout
    assert not os.path.exists(paths["report"])


def test_cron_command_runs_over_the_fleet(fleet, site):
    substitute, paths = site
    variables, [(_when, _user, command)] = schedfiles.cron()
    # What cron gives the command: its own few variables, then the file's.
    env = {"HOME": "/root", "LOGNAME": "root", "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}
    env.update({name: substitute(value) for name, value in variables.items()})
    env["GPUFLEET_DELAY_MAX"] = "0"  # the random delay, up to half an hour in the file
    res = run(["/bin/sh", "-c", substitute(command)], env, env["HOME"])
    with open(os.path.join(paths["state"], "hygiene.log")) as f:
        log = f.read()
    assert res.returncode == 0, log[-6000:]  # train-101, stopped, is not read: its report row says so
    assert "PLAY RECAP" in log and res.stdout == ""  # everything went to the log
    assert os.path.isdir(paths["report"]), log[-6000:]
    assert_report_holds(paths["report"], containers(fleet))
    assert os.path.isdir(os.path.join(paths["state"], "ansible", "tmp"))
