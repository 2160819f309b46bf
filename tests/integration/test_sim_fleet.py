# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The simulated fleet itself: the pct stand-in's formats over real ssh, and `down`."""

from __future__ import annotations

import hashlib
import os
import subprocess

from conftest import FLEET, PORT, REPO


def test_pct_list_exact_format(node_ssh):
    res = node_ssh("pve1", "pct list")
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode() == (
        "VMID       Status     Lock         Name                \n"
        "100        running                 train-100           \n"
        "101        stopped                 train-101           \n"
    )


def test_pct_list_empty_node_prints_nothing(node_ssh):
    res = node_ssh("pve3", "pct list")
    assert (res.returncode, res.stdout, res.stderr) == (0, b"", b"")


def test_pct_status(node_ssh):
    assert node_ssh("pve1", "pct status 100").stdout == b"status: running\n"
    assert node_ssh("pve1", "pct status 101").stdout == b"status: stopped\n"
    res = node_ssh("pve1", "pct status 999")
    assert res.returncode == 255
    assert res.stderr == b"Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n"


def test_pct_config_gpu_passthrough(node_ssh):
    mount_style = node_ssh("pve2", "pct config 200").stdout.decode().splitlines()
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in mount_style
    assert "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file" in mount_style
    assert "lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file" in mount_style
    assert "hostname: train-200" in mount_style
    dev_style = node_ssh("pve2", "pct config 201").stdout.decode().splitlines()
    assert "dev0: /dev/nvidia1" in dev_style and "dev1: /dev/nvidiactl" in dev_style


def test_pct_exec_status_stdin_and_devices(node_ssh):
    res = node_ssh("pve2", "pct exec 200 -- sh -c 'cat; ls /dev/nvidia0; exit 7'", stdin=b"through stdin\n")
    assert res.returncode == 7
    assert res.stdout == b"through stdin\n/dev/nvidia0\n"
    assert node_ssh("pve2", "pct exec 200 -- cat /etc/hostname").stdout == b"train-200\n"


def test_pct_exec_stopped_container(node_ssh):
    res = node_ssh("pve1", "pct exec 101 -- true")
    assert res.returncode == 255
    assert res.stderr == b"container '101' not running!\n"


def test_pct_push_pull_start_stop(node_ssh, tmp_path):
    payload = os.urandom(300000)
    digest = hashlib.sha256(payload).hexdigest()
    res = node_ssh("pve2", "cat > /tmp/pushme && pct push 201 /tmp/pushme '/root/pushed file' --perms 0600 && "
                   "pct exec 201 -- sha256sum '/root/pushed file' && pct exec 201 -- stat -c %a '/root/pushed file' && "
                   "pct pull 201 '/root/pushed file' /tmp/pulled && sha256sum < /tmp/pulled; rm -f /tmp/pushme /tmp/pulled",
                   stdin=payload)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode().splitlines()
    assert lines[0].split()[0] == digest and lines[1] == "600" and lines[2].split()[0] == digest
    try:
        assert node_ssh("pve1", "pct start 101").returncode == 0
        assert node_ssh("pve1", "pct status 101").stdout == b"status: running\n"
        assert node_ssh("pve1", "pct start 101").stderr == b"CT 101 already running\n"
    finally:
        assert node_ssh("pve1", "pct stop 101").returncode == 0
    assert node_ssh("pve1", "pct status 101").stdout == b"status: stopped\n"


def test_fleet_status(fleet):
    out = subprocess.run([FLEET, "status"], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "pve1   127.0.1.1:%d sshd pid" % PORT in out
    assert "100:running 101:stopped" in out
    assert "pve3" in out and "(no containers)" in out


def test_second_fleet_up_and_down_leaves_nothing(fleet, tmp_path):
    """A separate small fleet (own state, port, inventory) comes up and goes without a trace."""
    state = str(tmp_path / "state")
    env = dict(os.environ, GPUFLEET_SIM_STATE=state, GPUFLEET_SIM_INVENTORY=str(tmp_path / "inv"))
    subprocess.run([FLEET, "up", "--nodes", "1", "--containers", "2", "--port", "2299", "--scenario", "training"],
                   env=env, cwd=REPO, check=True)
    assert os.path.exists(tmp_path / "inv" / "fleet.yml")
    subprocess.run([FLEET, "down"], env=env, cwd=REPO, check=True)
    assert not os.path.exists(state) and not os.path.exists(tmp_path / "inv")
    with open("/proc/self/mounts") as f:
        assert state not in f.read()
    procs = subprocess.run(["ps", "-ww", "-eo", "stat,args"], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert not [line for line in procs.splitlines() if state in line and not line.startswith("Z")]
    links = subprocess.run(["ip", "-o", "link"], stdout=subprocess.PIPE, text=True, check=False).stdout
    assert "veth" not in links


def test_up_refuses_a_fleet_that_runs_and_leaves_it_running(fleet):
    """`up` over the session's fleet (its state, its port) neither brings it down nor touches it."""
    before = subprocess.run([FLEET, "status"], stdout=subprocess.PIPE, text=True, check=True).stdout
    res = subprocess.run([FLEET, "up", "--nodes", "1", "--containers", "1"], cwd=REPO, stderr=subprocess.PIPE,
                         text=True, check=False)
    assert res.returncode == 3, res.stderr
    assert "its fleet runs" in res.stderr and "fleet down" in res.stderr
    assert subprocess.run([FLEET, "status"], stdout=subprocess.PIPE, text=True, check=True).stdout == before


def test_up_clears_what_a_fleet_that_no_longer_runs_left(fleet, tmp_path):
    """A run killed before its `down`, or a machine started from an image of one whose fleet was
    up, leaves the state directory with no process behind it: the next `up` clears it and
    brings a working fleet up in its place."""
    state = str(tmp_path / "state")
    env = dict(os.environ, GPUFLEET_SIM_STATE=state, GPUFLEET_SIM_INVENTORY=str(tmp_path / "inv"))
    up = [FLEET, "up", "--nodes", "1", "--containers", "1", "--port", "2299", "--scenario", "training"]
    subprocess.run(up, env=env, cwd=REPO, check=True)
    try:
        # what a killed machine leaves: every process of the fleet gone at once, its files kept
        procs = subprocess.run(["ps", "-ww", "-eo", "pid,args"], stdout=subprocess.PIPE, text=True, check=True).stdout
        for line in procs.splitlines()[1:]:
            pid, args = line.strip().split(None, 1)
            if state + "/" in args and int(pid) != os.getpid():
                subprocess.run(["kill", "-9", pid], check=False)
        lxcpath = os.path.join(state, "nodes", "pve1", "lxc")
        subprocess.run(["lxc-stop", "-n", "100", "-P", lxcpath, "-k"], check=False, stderr=subprocess.DEVNULL)
        assert os.path.exists(os.path.join(lxcpath, "100", "config"))
        left = os.path.join(state, "left-behind")
        with open(left, "w") as f:
            f.write("a file of the fleet that is gone\n")

        res = subprocess.run(up, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True, check=False)
        assert res.returncode == 0, res.stderr
        assert "left from a fleet that no longer runs; clearing it" in res.stderr
        status = subprocess.run([FLEET, "status"], env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
        assert "pve1   127.0.1.1:2299 sshd pid" in status and "100:running" in status
        assert not os.path.exists(left)  # cleared, not brought up over the old files
    finally:
        subprocess.run([FLEET, "down"], env=env, cwd=REPO, check=True)
    assert not os.path.exists(state)
