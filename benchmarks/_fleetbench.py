# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the benchmarks share: a simulated fleet of their own, its inventory, the peer
collections taken from the `ansible` package's wheel, a tools venv, ansible's environment.

Benchmark code only: nothing here is part of the collection, and `make test` never imports it.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLEET = os.path.join(ROOT, "tests", "sim", "fleet")
BIN = os.path.dirname(sys.executable)
PEER = os.path.join(ROOT, "build", "bench-peer")
PEER_COLLECTIONS = os.path.join(PEER, "collections")
OWN_COLLECTIONS = os.path.join(ROOT, ".ansible", "collections")
# What the benchmarks take from the `ansible` wheel: community.proxmox (proxmox_pct_remote)
# and ansible.posix (the profile_tasks callback).
PEER_PREFIXES = ("ansible_collections/community/proxmox/", "ansible_collections/ansible/posix/")
PEER_PLUGIN = os.path.join(
    PEER_COLLECTIONS, "ansible_collections", "community", "proxmox", "plugins", "connection", "proxmox_pct_remote.py")
PEER_PCT = "'/usr/sbin/pct'"


def log(msg):
    print("bench: " + msg, file=sys.stderr, flush=True)


class Fleet(object):
    """tests/sim/fleet with its own state directory, inventory directory and port."""

    def __init__(self, state, inventory_dir, port):
        self.state = state
        self.inventory_dir = inventory_dir
        self.port = port

    def env(self):
        env = dict(os.environ)
        env["GPUFLEET_SIM_STATE"] = self.state
        env["GPUFLEET_SIM_INVENTORY"] = self.inventory_dir
        env["GPUFLEET_SIM_PORT"] = str(self.port)
        env["PATH"] = BIN + os.pathsep + env.get("PATH", "")  # uv for the scenarios that install venvs
        return env

    def run(self, args, check=True):
        return subprocess.run([FLEET] + args, cwd=ROOT, env=self.env(), check=check)

    def up(self, nodes, containers, extra=()):
        if os.path.exists(self.state):
            log("a fleet is left in %s: bringing it down first" % self.state)
            self.down()
        self.run(["up", "--nodes", str(nodes), "--containers", str(containers), "--port", str(self.port)] + list(extra))

    def down(self):
        self.run(["down"], check=False)

    def inventory(self):
        """The fleet's inventory (fleet.yml, JSON)."""
        with open(os.path.join(self.inventory_dir, "fleet.yml")) as f:
            return json.loads("".join(line for line in f if not line.startswith("#")))

    def nodes(self):
        """[[container host vars (common vars merged, `name` added), ...] per node], by vmid."""
        children = self.inventory()["all"]["children"]
        common = children["pve_containers"]["vars"]
        nodes = []
        for group in children["pve_containers"]["children"].values():
            hosts = [dict(common, name=name, **hv) for name, hv in group["hosts"].items()]
            hosts.sort(key=lambda h: h["ansible_pct_vmid"])
            nodes.append(hosts)
        nodes.sort(key=lambda hosts: hosts[0]["ansible_pct_vmid"])
        return nodes

    def close_masters(self):
        """Cold start: close the pct plugin's ssh masters to the nodes (not timed)."""
        for sock in glob.glob(os.path.join(self.state, "cp", "*[!k]")):  # not the .lock files
            subprocess.run(["ssh", "-o", "ControlPath=" + sock, "-O", "exit", "x"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def ensure_peer(wheel=None):
    """community.proxmox and ansible.posix from the `ansible` 12 wheel (downloaded once into
    build/bench-peer/dl by pip), with the one change the fleet needs. Returns their versions."""
    if not all(os.path.exists(os.path.join(PEER_COLLECTIONS, p, "MANIFEST.json")) for p in PEER_PREFIXES):
        if not wheel:
            dl = os.path.join(PEER, "dl")
            found = sorted(glob.glob(os.path.join(dl, "ansible-12.*.whl")))
            if not found:
                log("downloading the ansible 12 wheel (about 55 MB) for community.proxmox and ansible.posix")
                subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-d", dl, "ansible>=12,<13"],
                               check=True)
                found = sorted(glob.glob(os.path.join(dl, "ansible-12.*.whl")))
            wheel = found[-1]
        with zipfile.ZipFile(wheel) as z:
            z.extractall(PEER_COLLECTIONS, [m for m in z.namelist() if m.startswith(PEER_PREFIXES)])
        with open(os.path.join(PEER, "SOURCE"), "w") as f:
            f.write(os.path.basename(wheel) + "\n")
    with open(PEER_PLUGIN) as f:
        text = f.read()
    if PEER_PCT in text:
        # The plugin runs pct by the absolute path /usr/sbin/pct; the simulated nodes have
        # their pct on PATH. Only the path changes: everything else is as shipped.
        with open(PEER_PLUGIN, "w") as f:
            f.write(text.replace(PEER_PCT, "'pct'"))
    versions = {}
    for prefix in PEER_PREFIXES:
        with open(os.path.join(PEER_COLLECTIONS, prefix, "MANIFEST.json")) as f:
            info = json.load(f)["collection_info"]
        versions["%s.%s" % (info["namespace"], info["name"])] = info["version"]
    return versions


def ensure_tools(venv, packages):
    """A venv of its own for the benchmark's tools (never the project's .venv): `packages`
    (pip requirement strings) installed once. Returns its site-packages directory."""
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        log("creating the benchmark tools venv %s" % venv)
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    marker = os.path.join(venv, "gpufleet-bench-tools.json")
    try:
        with open(marker) as f:
            have = json.load(f)
    except (IOError, OSError, ValueError):
        have = []
    if sorted(have) != sorted(packages):
        log("installing %s into %s" % (" ".join(packages), venv))
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"] + list(packages),
                       check=True)
        with open(marker, "w") as f:
            json.dump(sorted(packages), f)
    out = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         stdout=subprocess.PIPE, text=True, check=True)
    return out.stdout.strip()


def ansible_env(home, collections=(), extra=None):
    """ansible's environment for a benchmark run: a HOME of its own (paramiko reads host keys
    from ~/.ssh/known_hosts only), `collections` first (the peers' community.proxmox, patched to
    find the simulated nodes' pct, before the unpatched copy the set-up installs beside this
    collection), then the repository's collections."""
    env = dict(os.environ)
    # A controller keeps the bytecode of ansible-core and of the collections it runs; without it
    # every forked worker compiles each plugin it loads again, a cost no user's controller pays.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update({
        "HOME": home,
        "ANSIBLE_COLLECTIONS_PATH": os.pathsep.join(list(collections) + [OWN_COLLECTIONS]),
        "ANSIBLE_LOCAL_TEMP": os.path.join(home, "tmp"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_DEPRECATION_WARNINGS": "False",
    })
    env.update(extra or {})
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env
