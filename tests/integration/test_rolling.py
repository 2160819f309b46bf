# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""remediate.yml's rolling defaults on the simulated fleet: a failing batch stops the run.

One fleet for the module (2 nodes x 2 containers, scenario `seed`): every container holds the
seed incident - a venv mixing CUDA 12.8 and 13 wheels, a stale process holding its GPU, a stale
Inductor cache - so every one of them would be repaired. The first container of a batch cannot
be: another run holds its lock. remediate.yml, run with its defaults (the canary batch of one
first, a failure budget of 0), must stop after that batch; the others keep their broken venvs
and their stale processes, compared before and after from inside each container.

Own fleet: $GPUFLEET_ROLLING_STATE (default /var/tmp/gpufleet-sim-rolling) and
$GPUFLEET_ROLLING_PORT (default 2870).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import nothinglost
import pytest
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STATE = os.path.abspath(os.environ.get("GPUFLEET_ROLLING_STATE", "/var/tmp/gpufleet-sim-rolling"))
PORT = os.environ.get("GPUFLEET_ROLLING_PORT", "2870")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
LOCK = "/run/gpufleet-hygiene.lock"
# What a repair changes: the venv, the Inductor cache, the processes.
WATCHED = ("/opt/venv/", "/tmp/torchinductor_root/")
QUICK = ["-e", "kill_grace_period=2", "-e", "kill_drain_timeout=15", "-e", "relaunch_settle_seconds=0",
         "-e", "gpufleet_lock_timeout=1"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("rolling")
    with simfleet.running(STATE, nodes=2, containers=2, scenario="seed", inventory=work / "inventory", port=PORT,
                          timeout=300) as (info, env):
        cts = {ct["name"]: dict(ct, node=node["name"]) for node in info["nodes"] for ct in node["containers"]}
        inventory = str(work / "inventory" / "fleet.yml")
        listed = subprocess.run([os.path.join(VENV_BIN, "ansible"), "-i", inventory, "pve_containers", "--list-hosts"],
                                cwd=REPO, env=env, text=True, capture_output=True, check=True).stdout
        # The play's order: the hosts as the inventory lists them.
        order = [line.strip() for line in listed.splitlines()[1:] if line.strip()]
        assert sorted(order) == sorted(cts), (order, cts)
        yield {"env": env, "inventory": inventory, "cts": cts, "order": order, "work": work}


def lxcpath(fleet, host):
    return os.path.join(STATE, "nodes", fleet["cts"][host]["node"], "lxc")


def hold_lock(fleet, host, owner):
    """Another run's lock on the host, valid for an hour (as host_lock writes it)."""
    now = time.time()
    text = json.dumps({"owner": owner, "taken": now, "expires": now + 3600, "pid": 1})
    simfleet.sh(lxcpath(fleet, host), fleet["cts"][host]["vmid"], "printf '%%s' '%s' > %s" % (text, LOCK))


def lock_owner(fleet, host):
    text = simfleet.sh(lxcpath(fleet, host), fleet["cts"][host]["vmid"], "cat %s 2>/dev/null || true" % LOCK)
    return json.loads(text)["owner"] if text.strip() else None


def state(fleet, host):
    """What a repair would change: the venv's packages, its and the cache's files, the live processes."""
    snap = nothinglost.snapshot(lxcpath(fleet, host), fleet["cts"][host]["vmid"])
    return {
        "packages": {name: p["version"] for name, p in snap["packages"].items()},
        "files": {p: v for p, v in snap["files"].items() if p.startswith(WATCHED)},
        "processes": sorted((int(pid), p["start_time"], p["cmdline"]) for pid, p in snap["processes"].items()
                            if p["state"] not in ("Z", "X")),
    }


def stale_jobs(st):
    return [p for p in st["processes"] if re.search(r"train_dflash\.py|train-standin", p[2])]


def remediate(fleet, *args):
    env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    res = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", fleet["inventory"], "playbooks/remediate.yml",
                          *QUICK, *args], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=600, check=False)
    logs = os.path.join(str(fleet["work"]), "logs")
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(logs, "%02d.log" % len(os.listdir(logs))), "w") as f:
        f.write(res.stdout)
    return res.returncode, res.stdout


def recap(out):
    """{host: {ok, changed, failed, ...}} of the run's PLAY RECAP."""
    rows = {}
    for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", out, re.MULTILINE):
        rows[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return rows


def test_a_failing_canary_leaves_the_rest_of_the_fleet_untouched(fleet):
    canary, rest = fleet["order"][0], fleet["order"][1:]
    hold_lock(fleet, canary, "another-run")
    before = {host: state(fleet, host) for host in fleet["order"]}
    for host in fleet["order"]:  # every container is broken: each would be repaired
        assert before[host]["packages"].get("nvidia-cublas", "").startswith("13."), host  # the CUDA-13 wheel
        assert stale_jobs(before[host]), host

    rc, out = remediate(fleet)
    assert rc != 0, out
    assert "is held by another-run" in out, out
    rows = recap(out)
    assert rows[canary]["failed"] == 1, rows
    for host in rest:
        # Listed in the recap, never run: the play stopped after the canary's batch.
        assert rows.get(host, {}).get("ok", 0) == 0 and rows.get(host, {}).get("changed", 0) == 0, (host, rows)

    after = {host: state(fleet, host) for host in fleet["order"]}
    for host in fleet["order"]:
        assert after[host]["packages"] == before[host]["packages"], host  # the broken venv still broken
        assert after[host]["files"] == before[host]["files"], host
        assert after[host]["processes"] == before[host]["processes"], host  # the stale process still alive
    assert lock_owner(fleet, canary) == "another-run"


def test_a_failure_in_a_batch_stops_the_run_before_the_next_batch(fleet):
    """Two at a time with the default budget (0): the batch's other host goes on with its repair
    (the repair runs in a block, and Ansible counts a host failed once it has left it), then the
    run stops; the next batch never starts."""
    first, second, rest = fleet["order"][0], fleet["order"][1], fleet["order"][2:]
    hold_lock(fleet, first, "another-run")
    before = {host: state(fleet, host) for host in fleet["order"]}

    rc, out = remediate(fleet, "-e", "gpufleet_batch=2")
    assert rc != 0, out
    rows = recap(out)
    assert rows[first]["failed"] == 1, rows
    assert rows[second]["changed"] > 0, rows

    after = {host: state(fleet, host) for host in fleet["order"]}
    assert lock_owner(fleet, first) == "another-run"
    assert after[first] == before[first]
    # The other host of the batch was repaired beside it: its stale process stopped, its lock given back.
    assert stale_jobs(before[second]) and not set(stale_jobs(before[second])) & set(after[second]["processes"])
    assert lock_owner(fleet, second) is None
    for host in rest:
        assert rows.get(host, {}).get("ok", 0) == 0, (host, rows)
        assert after[host] == before[host], host
