# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The simulated fleet (tests/sim/fleet) as the integration tests use it.

running() brings a fleet up for a session or a test module and always brings it down;
sh() and processes() look inside a container as an operator on its node would, through
lxc-attach, so what they see is the container's own /proc and file system.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FLEET = os.path.join(REPO, "tests", "sim", "fleet")
STANDINS = os.path.join(REPO, "tests", "standins")
EXIT_IN_USE = 3  # tests/sim/fleet up: the state holds a fleet that runs, or is being brought up


def lxcpath(state, node):
    """The LXC path of one node of the fleet in state."""
    return os.path.join(state, "nodes", node, "lxc")


def node_path(state, node, *parts):
    """A path in one node's directory of the fleet in state (gpu-health/health.json, kernel.log, ...)."""
    return os.path.join(state, "nodes", node, *parts)


def _gpu_standin():
    if STANDINS not in sys.path:
        sys.path.insert(0, STANDINS)
    return importlib.import_module("gpu_standin")


def inject_health(state, node, uuid, **entry):
    """Set a GPU's injected health on a node of a gpubox fleet (nvidia_smi.py's health keys; a key
    given None is healthy again): the node's nvidia-smi and its containers' answer it at once."""
    return _gpu_standin().set_health(node_path(state, node, "gpu-health", "health.json"), uuid, **entry)


def inject_xid(state, node, bus_id, code, **kw):
    """Append an Xid event of the GPU at bus_id (nvidia-smi's form) to the node's kernel log; the line."""
    return _gpu_standin().append_xid(node_path(state, node, "kernel.log"), bus_id, code, **kw)


def node_nvidia_smi(state, node, *args):
    """The node's nvidia-smi stand-in (gpubox), run as the node runs it: its stdout."""
    env = dict(os.environ, GPUFLEET_SIM_NODE=node)
    env.pop("GPU_STANDIN_STATE", None)
    res = subprocess.run([os.path.join(state, "bin", "nvidia-smi")] + list(args), env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=False)
    assert res.returncode == 0, (node, args, res.stdout, res.stderr)
    return res.stdout


def attach_argv(lxcpath, vmid, argv):
    return ["lxc-attach", "-n", str(vmid), "-P", lxcpath, "--"] + list(argv)


def sh(lxcpath, vmid, script, check=True, timeout=60):
    """Run a shell script in the container; its stdout (the exit status asserted unless check=False)."""
    res = subprocess.run(attach_argv(lxcpath, vmid, ["/bin/sh", "-c", script]), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, check=False)
    if check:
        assert res.returncode == 0, (vmid, script, res.stdout, res.stderr)
    return res.stdout


def processes(lxcpath, vmid):
    """{pid: cmdline} of every process in the container, as it sees them, this listing aside."""
    # One line per process: a command line's NULs and newlines (python -c '<program>') become spaces.
    out = sh(lxcpath, vmid, "for d in /proc/[0-9]*; do printf '%s ' ${d#/proc/}; tr '\\0\\n' '  ' <$d/cmdline 2>/dev/null; echo; done")
    procs = {}
    for line in out.splitlines():
        pid, _sep, cmd = line.partition(" ")
        if cmd.strip() and "for d in /proc" not in cmd and not cmd.startswith("tr "):
            procs[int(pid)] = cmd.strip()
    return procs


def process_table(lxcpath, vmid):
    """{pid: (uid, cmdline)} of every process in the container as it sees them (its pids, its
    uids: 1000, not the node's 101000, in an unprivileged container), this listing aside."""
    out = sh(lxcpath, vmid, "for d in /proc/[0-9]*; do printf '%s %s ' ${d#/proc/} $(awk '/^Uid:/{print $2}' $d/status 2>/dev/null || echo -);"
                            " tr '\\0\\n' '  ' <$d/cmdline 2>/dev/null; echo; done")
    procs = {}
    for line in out.splitlines():
        pid, _sep, rest = line.partition(" ")
        uid, _sep, cmd = rest.partition(" ")
        if cmd.strip() and uid.isdigit() and "for d in /proc" not in cmd and not cmd.startswith("tr "):
            procs[int(pid)] = (int(uid), cmd.strip())
    return procs


def owners(lxcpath, vmid, path):
    """{(uid, gid)} of path and everything under it, as the container sees them (find -printf)."""
    out = subprocess.run(attach_argv(lxcpath, vmid, ["find", path, "-printf", "%U %G\\n"]), text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=60, check=True).stdout
    return {tuple(int(x) for x in line.split()) for line in out.splitlines() if line.strip()}


def init_pid(lxcpath, vmid):
    """The node's pid of the container's init."""
    out = subprocess.run(["lxc-info", "-n", str(vmid), "-P", lxcpath, "-p", "-H"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=True).stdout
    return int(out.strip())


def node_pid(lxcpath, vmid, pid):
    """The node's pid of the container's process ``pid``: the process of the node whose NSpid
    ends in it and whose cgroup is under the container's (that of its init)."""
    with open("/proc/%d/cgroup" % init_pid(lxcpath, vmid)) as f:
        top = "/" + f.read().split("::", 1)[1].strip().strip("/").split("/")[0] + "/"
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as f:
                nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
            with open("/proc/%s/cgroup" % name) as f:
                cgroup = f.read().split("::", 1)[1].strip() + "/"
        except (OSError, IndexError):
            continue
        if len(nspid) >= 2 and nspid[1] == str(pid) and cgroup.startswith(top):
            return int(name)
    raise LookupError("no process %d of container %s on the node" % (pid, vmid))


def id_map(lxcpath, vmid, kind="uid"):
    """The container's uid_map (or gid_map) as the node reads it from /proc/<init pid>/:
    [(first id inside, first id on the node, count)]."""
    with open("/proc/%d/%s_map" % (init_pid(lxcpath, vmid), kind)) as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


@contextlib.contextmanager
def running(state, nodes, containers, scenario, inventory=None, port=None, timeout=600, unprivileged=None, extra=()):
    """Bring a fleet up in state (its inventory in the directory inventory, else $GPUFLEET_SIM_INVENTORY or inventory/sim/)
    and yield (its fleet.json, the environment to run against it); bring it down at the end,
    also when it failed to come up. unprivileged: the nodes whose containers are unprivileged
    (tests/sim/fleet --unprivileged: node names, comma separated, or all); extra: more arguments
    of tests/sim/fleet up."""
    if os.geteuid() != 0:
        pytest.fail("the simulated fleet needs root (privileged LXC containers, sshd, cgroups, mounts)")
    env = dict(os.environ, GPUFLEET_SIM_STATE=state)
    if inventory:
        env["GPUFLEET_SIM_INVENTORY"] = str(inventory)
    if port:
        env["GPUFLEET_SIM_PORT"] = str(port)
    extra = (["--unprivileged", unprivileged] if unprivileged else []) + list(extra)
    up = [FLEET, "up", "--nodes", str(nodes), "--containers", str(containers), "--scenario", scenario] + extra
    # `up` clears what a fleet that is gone left in state, and refuses (EXIT_IN_USE) a fleet that runs:
    # that one is not this run's to bring down.
    started = subprocess.run(up, cwd=REPO, env=env, check=False, timeout=timeout)
    if started.returncode == EXIT_IN_USE:
        pytest.fail("%s holds a fleet that runs (another test session, or an operator's): tests/sim/fleet down "
                    "with GPUFLEET_SIM_STATE=%s, or give this run another state" % (state, state))
    try:
        if started.returncode:
            raise subprocess.CalledProcessError(started.returncode, up)
        with open(os.path.join(state, "fleet.json")) as f:
            info = json.load(f)
        yield info, env
    finally:
        subprocess.run([FLEET, "down"], cwd=REPO, env=env, check=True, timeout=timeout)
    assert not os.path.exists(state), "the fleet left %s behind" % state
