# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node read (node_readiness read_from=node: every container read from its node's own process
through its root directory handle, nothing of it run) against the read inside each container
(read_from=container: the container's own Python), on fleets of their own:

1. the same record, field by field, for every container of the `incident` fleet (2 nodes x 3
   containers: contamination, a stale GPU holder, a stale cache, healthy ones) and of the
   `gpubox` fleet (8 GPUs a node, MIG, injected GPU health read once on the node);
2. a hostile container (incident fleet): its /usr/bin/python3 a script that prints a clean reading,
   an /etc/ld.so.preload naming a library, a venv whose lib is a link to /, a dist-info linked to a
   root-only file of the node: the node read reports the real packages, follows nothing out of
   the container and runs nothing of it (the marker files the hostile programs would write stay
   absent).

Fleets: state $GPUFLEET_NODEREAD_STATE (default /var/tmp/gpufleet-sim-noderead-<scenario>), ports
2960 (incident) and 2962 (gpubox).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess

import noderead
import pytest
import simfleet
from noderead import differences, node_read, readiness_args, steady

STATE = os.environ.get("GPUFLEET_NODEREAD_STATE", "/var/tmp/gpufleet-sim-noderead")
PORTS = {"incident": "2960", "gpubox": "2962"}
SIZES = {"incident": (2, 3), "gpubox": (2, 1)}
SITE = "/opt/venv/lib/python3.11/site-packages"


# One fleet at a time, each brought down after its test: the two scenarios' containers share vmids
# (100, 200, ...) and, simulated on one machine, the node's /proc; a node with two containers of
# one vmid is read as neither (view/_view.open_views), which no Proxmox VE node ever has.
@pytest.fixture
def incident(tmp_path_factory):
    yield from bring_up("incident", tmp_path_factory)


@pytest.fixture
def gpubox(tmp_path_factory):
    yield from bring_up("gpubox", tmp_path_factory)


def bring_up(scenario, tmp_path_factory):
    inventory = tmp_path_factory.mktemp(scenario) / "inventory"
    state = "%s-%s" % (STATE, scenario)
    nodes, containers = SIZES[scenario]
    with simfleet.running(state, nodes=nodes, containers=containers, scenario=scenario, inventory=inventory,
                          port=PORTS[scenario]) as (info, env):
        yield noderead.load(info, inventory, state, scenario, env)


@pytest.mark.parametrize("scenario", ["incident", "gpubox"])
def test_the_node_read_gives_every_container_the_record_of_the_read_inside_it(request, scenario):
    fleet = request.getfixturevalue(scenario)
    read_any = False
    for node in fleet["nodes"]:
        running = [ct for ct in node["containers"] if ct["running"]]
        if not running:
            continue
        inside = node_read(fleet, node, "container", running)
        from_node = node_read(fleet, node, "node", running)
        for ct in running:
            a, b = steady(inside[ct["name"]]), steady(from_node[ct["name"]])
            assert not a.get("failed"), a
            diff = differences(a, b)
            assert diff == [], "%s: %s" % (ct["name"], "\n".join(diff))
            read_any = True
            # Not an empty record that equals another: the reads were made, and they found what the
            # scenario put there.
            assert b["checks"] and b["gpu_state"]["gpus"], b
            role = ct.get("incident")
            if role == "contaminated":
                assert b["cuda_contamination"]["contaminants"] and not b["ready"], b
            if role == "stale_holder":
                assert not b["gpu_state"]["idle"] and b["gpu_state"]["gpus"][0]["processes"], b
            if role == "stale_cache":
                assert any(c["stale"] for c in b["torch_cache"]["caches"]), b
            if fleet["scenario_name"] == "gpubox":
                assert b["processes"]["count"] >= 1 and not b["gpu_state"]["idle"], b
    assert read_any


EVIL_LIB = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open("/opt/%s-preload", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}
"""


def planted(fleet, token):
    """Every marker a hostile program would have written: in the containers (their root file
    systems on the node's disk) and on the node itself."""
    roots = ["/"] + [os.path.join(fleet["state"], "nodes", n["name"], "lxc", str(ct["vmid"]), "rootfs")
                     for n in fleet["nodes"] for ct in n["containers"]]
    return sorted(os.path.join(r, "opt", name) for r in roots if os.path.isdir(os.path.join(r, "opt"))
                  for name in os.listdir(os.path.join(r, "opt")) if name.startswith(token))


def test_a_hostile_container_is_read_as_it_is_and_runs_nothing(incident, tmp_path):
    """train-102: /usr/bin/python3, the venv's python and its nvidia-smi replaced by scripts that
    print a clean reading and leave a marker, an /etc/ld.so.preload naming a library that leaves
    one too, a venv whose lib64 is a link to / and a second venv whose lib is a link to a
    directory of the node, a dist-info that is a link to a root-only directory of the node."""
    fleet = incident
    token = "gpufleet-noderead-" + secrets.token_hex(4)
    node = fleet["nodes"][0]
    ct = next(c for c in node["containers"] if c["running"] and c.get("incident") == "healthy") if any(
        c.get("incident") == "healthy" for c in node["containers"]) else node["containers"][-1]
    lxc = os.path.join(fleet["state"], "nodes", node["name"], "lxc")
    rootfs = os.path.join(lxc, str(ct["vmid"]), "rootfs")
    # The node's own secret: a root-only directory with what would look like a package.
    trap = os.path.join(fleet["state"], "node-only-" + token)
    os.makedirs(os.path.join(trap, "python3.11", "site-packages", "nodesecret-6.6.6.dist-info"))
    with open(os.path.join(trap, "python3.11", "site-packages", "nodesecret-6.6.6.dist-info", "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: nodesecret\nVersion: 6.6.6\n")
    os.chmod(trap, 0o700)
    real = sorted(n for n in os.listdir(os.path.join(rootfs, SITE.lstrip("/"))) if n.endswith(".dist-info"))
    clean = json.dumps({"changed": False, "ready": True, "checks": []})
    script = "#!/bin/sh\ntouch /opt/%s-$(basename $0)\necho '%s'\n" % (token, clean)
    simfleet.sh(lxc, ct["vmid"], "; ".join([
        "printf '%%s' \"$HOSTILE\" > /opt/%s-python3.sh" % token,
        "chmod 755 /opt/%s-python3.sh" % token,
        "mount --bind /opt/%s-python3.sh /usr/bin/python3" % token,
        "rm -f /opt/venv/bin/python && cp /opt/%s-python3.sh /opt/venv/bin/python" % token,
        "ln -sfn / /opt/venv/lib64",
        "cp -a /opt/venv /opt/venv-hostile && rm -rf /opt/venv-hostile/lib && ln -s %s /opt/venv-hostile/lib" % trap,
        "ln -s %s/python3.11/site-packages/nodesecret-6.6.6.dist-info %s/nodesecret-6.6.6.dist-info" % (trap, SITE),
        "rm -f /opt/%s-python3.sh" % token,
    ]).replace("\"$HOSTILE\"", "'%s'" % script.replace("'", "'\\''")))
    if ct["gpus"]:
        smi = os.path.join(rootfs, "opt", "gpufleet", "bin", "nvidia-smi")
        with open(smi, "w") as f:
            f.write(script)
    # The preload library last: from now on every program started in the container loads it.
    src = tmp_path / "evil.c"
    src.write_text(EVIL_LIB % token)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", os.path.join(rootfs, "opt", "libevil-%s.so" % token), str(src)], check=True)
    with open(os.path.join(rootfs, "etc", "ld.so.preload"), "w") as f:
        f.write("/opt/libevil-%s.so\n" % token)
    try:
        hostile = dict(ct, name=ct["name"] + "-hostile-venv")
        entries = [ct, hostile]
        got = node_read(fleet, node, "node", entries, {hostile["name"]: dict(readiness_args(fleet, ct), venv="/opt/venv-hostile")})
        assert planted(fleet, token) == [], "a hostile program ran"
        mine = got[ct["name"]]
        assert not mine.get("failed"), mine
        # The real packages: every dist-info of the venv, nothing of the node's.
        names = sorted("%s-%s.dist-info" % (p["name"].replace("-", "_"), p["version"]) for p in mine["pip_inventory"]["packages"])
        assert [n.lower() for n in names] == [n.lower() for n in real], (names, real)
        assert "nodesecret" not in json.dumps(mine).lower()
        # The venv whose lib leads to the node's directory is read as what it is in the container: no site-packages.
        other = got[hostile["name"]]
        assert "nodesecret" not in json.dumps(other).lower()
        assert "has no lib/python*/site-packages" in other["cuda_contamination"]["msg"], other["cuda_contamination"]
    finally:
        os.remove(os.path.join(rootfs, "etc", "ld.so.preload"))
