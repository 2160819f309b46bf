# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Integration tests over the simulated fleet (tests/sim/fleet), driving the real CLIs.

Needs root and the host packages of tests/sim/setup-host.sh. One fleet is brought up for
the whole session (3 nodes x 2 containers, scenario `mixed`: pve1's second container
stopped, pve3 empty) and brought down at the end.
"""

from __future__ import annotations

import os
import subprocess

import pytest
import shorttmp  # tests/lib, on pytest's pythonpath (pytest.ini), as simfleet
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FLEET = os.path.join(REPO, "tests", "sim", "fleet")
VENV_BIN = os.path.join(REPO, ".venv", "bin")


def _worker_fleet(environ):
    """`make integration` runs two pytest-xdist workers, a test module each at a time (--dist
    loadfile): every module fleet has a state, port and inventory of its own, and so must each
    worker's session fleet. The first worker (or a run without xdist) keeps the defaults (or what
    GPUFLEET_SIM_STATE/_PORT/_INVENTORY say); worker N > 0 takes them with -gwN appended and the
    port plus N. Set in this process's environment, so tests/sim/fleet and every CLI a test starts
    find the worker's fleet, as they find the default one without xdist."""
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    n = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    state = os.path.abspath(environ.get("GPUFLEET_SIM_STATE", "/var/tmp/gpufleet-sim"))
    inventory = os.path.abspath(environ.get("GPUFLEET_SIM_INVENTORY", os.path.join(REPO, "inventory", "sim")))
    port = int(environ.get("GPUFLEET_SIM_PORT", "2222"))
    if n:
        state, inventory, port = "%s-gw%d" % (state, n), "%s-gw%d" % (inventory, n), port + n
        environ.update(GPUFLEET_SIM_STATE=state, GPUFLEET_SIM_INVENTORY=inventory, GPUFLEET_SIM_PORT=str(port))
    return state, inventory, port


STATE, _INVENTORY_DIR, PORT = _worker_fleet(os.environ)  # PORT: the session fleet's nodes
INVENTORY = os.path.join(_INVENTORY_DIR, "fleet.yml")
DISCOVERY = os.path.join(_INVENTORY_DIR, "discovered.proxmox_lxc.yml")


@pytest.fixture
def tmp_path():
    """Short enough for ssh's control sockets, which tests keep in it (tests/lib/shorttmp.py)."""
    with shorttmp.directory() as path:
        yield path


@pytest.fixture(scope="session")
def fleet():
    with simfleet.running(STATE, nodes=3, containers=2, scenario="mixed") as (info, _env):
        info["client"] = os.path.join(STATE, "client")
        yield info


@pytest.fixture(scope="session")
def ansible_cli(fleet):
    """Run an ansible CLI from the venv in the repository root (so ansible.cfg applies)."""

    def run(tool, *args, env=None, timeout=600):
        full_env = dict(os.environ, ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
        full_env.update(env or {})
        return subprocess.run([os.path.join(VENV_BIN, tool), *args], cwd=REPO, env=full_env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)

    return run


@pytest.fixture(scope="session")
def node_ssh(fleet):
    """Run one command string on a node over ssh, host-key checking on, as an operator would."""

    def run(node, command, stdin=None):
        n = next(x for x in fleet["nodes"] if x["name"] == node)
        client = fleet["client"]
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", "UserKnownHostsFile=" + os.path.join(client, "known_hosts"), "-o", "IdentitiesOnly=yes",
                "-i", os.path.join(client, "id_ed25519"), "-p", str(n["port"]), "-l", "root", n["address"], command]
        return subprocess.run(argv, input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False, timeout=60)

    return run
