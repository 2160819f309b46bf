# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The seed incident in unprivileged containers, as Proxmox VE makes them by default.

Its own fleet (2 nodes x 3 containers, scenario `incident`, `--unprivileged pve2`): pve2's
containers run in a user namespace with root mapped to 100000 (`unprivileged: 1` in `pct
config`), and they hold the three bad containers: 200 with the CUDA-13 contamination in a venv
that belongs to trainer (container uid 1000, node uid 101000), 201 with trainer's stale run
holding GPU memory, 202 with trainer's stale Inductor cache; each also runs a decoy process of
trainer's. pve1's containers are privileged and healthy. Before any repair the reads run in the
containers (gpu_state, processes, torch_cache) and from their node (node_readiness); then
preflight (read by container and by node), remediate, preflight again and hygiene run over
it, and the real state inside the
containers is checked: the contaminants removed and the clobbered files restored by the venv's
owner (every file of the venv still trainer's), the stale process gone by a real signal and its
GPU memory freed, the cache cleared, the decoys alive, and what the reads reported shows owners
as the container sees them (uid 1000 and 0, never the node's 101000 or 100000).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import cachetree  # tests/lib, on pytest's pythonpath (pytest.ini)
import cuda_fixtures
import pytest
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
# Its own fleet; overridable so that two checkouts can run this test at once.
STATE = os.environ.get("GPUFLEET_UNPRIV_TEST_STATE", "/var/tmp/gpufleet-sim-unpriv-test")
PORT = os.environ.get("GPUFLEET_UNPRIV_TEST_PORT", "2552")
NODE = "pve2"
BASE = 100000  # Proxmox VE's default map: container uid u is node uid 100000 + u
TRAINER = 1000
# The stale run holds the GPUs and runs at 64% of its baseline: the job the inventory describes does not.
CHECK_OF = {"contaminated": {"venv_clean"}, "stale_holder": {"gpu_idle", "job_live"}, "stale_cache": {"caches_fresh"}}


def lxcpath(node=NODE):
    return simfleet.lxcpath(STATE, node)


def playbook(env, inv, name, *args):
    res = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", inv, os.path.join("playbooks", name), *args],
                         cwd=REPO, env=dict(env, ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0"), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900, check=False)
    return res


def module(env, inv, host, name, args):
    """One module on one host (ad hoc, through the inventory's connection): its result."""
    res = subprocess.run([os.path.join(VENV_BIN, "ansible"), "-i", inv, host, "-m", name, "-a", json.dumps(args)],
                         cwd=REPO, env=dict(env, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1"), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
    assert " | SUCCESS => " in res.stdout or " | CHANGED => " in res.stdout, res.stdout
    return json.loads(res.stdout.split(" => ", 1)[1])


def recap(text):
    out = {}
    for m in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", text.split("PLAY RECAP")[-1], re.MULTILINE):
        out[m.group(1)] = {"changed": int(m.group(3)), "unreachable": int(m.group(4)), "failed": int(m.group(5))}
    return out


def not_ready(text):
    """{host: [checks]} of the hosts a preflight failed, from its verdict messages."""
    out = {}
    for host, why in re.findall(r"([\w.-]+) is not ready: (.*)", text):
        out.setdefault(host, set()).update(re.findall(r"\[(\w+)\]", why))
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The fleet, what its containers held before, and the runs over it, in order."""
    work = tmp_path_factory.mktemp("unprivileged")
    with simfleet.running(STATE, nodes=2, containers=3, scenario="incident", inventory=work / "inventory",
                          port=PORT, unprivileged=NODE) as (info, env):
        inv = str(work / "inventory" / "fleet.yml")
        [node] = [n for n in info["nodes"] if n["name"] == NODE]
        by_role = {ct["incident"]: ct for ct in node["containers"]}
        out = {"info": info, "env": env, "inv": inv, "work": work, "by_role": by_role, "before": {}}
        # What the reads report inside the unprivileged containers, before any repair.
        holder = by_role["stale_holder"]
        out["before"]["procs"] = {ct["vmid"]: simfleet.process_table(lxcpath(), ct["vmid"]) for ct in node["containers"]}
        out["before"]["gpu_state"] = module(env, inv, holder["name"], "gpufleet.hygiene.gpu_state",
                                            {"nvidia_smi": "/opt/gpufleet/bin/nvidia-smi"})
        out["before"]["torch_cache"] = module(env, inv, by_role["stale_cache"]["name"], "gpufleet.hygiene.torch_cache",
                                              {"state": "present", "caches": ["inductor"], "user": "trainer"})
        out["before"]["scope"] = module(env, inv, holder["name"], "gpufleet.hygiene.processes",
                                        {"scope": {"cmdline": [r"^\S*python3? /opt/gpufleet/train_dflash\.py"]}})
        # The same reads, of all three at once from their node (the node read).
        args = {"venv": "/opt/venv", "nvidia_smi": "/opt/gpufleet/bin/nvidia-smi", "cache_user": "trainer",
                "job_patterns": [r"^\S*python3? /opt/gpufleet/train_dflash\.py"]}
        out["before"]["node_read"] = module(env, inv, NODE, "gpufleet.hygiene.node_readiness", {"containers": [
            {"host": ct["name"], "vmid": ct["vmid"], "lxc_path": lxcpath(), "args": args} for ct in node["containers"]]})
        out["preflight"] = playbook(env, inv, "preflight.yml", "-e", "gpufleet_read_by=container")
        out["preflight_node"] = playbook(env, inv, "preflight.yml", "-e", "gpufleet_read_by=node")
        out["remediate"] = playbook(env, inv, "remediate.yml")
        out["after"] = playbook(env, inv, "preflight.yml", "-e", "gpufleet_allow_running_job=true")
        out["hygiene"] = playbook(env, inv, "hygiene.yml", "-e", "gpufleet_report_dir=%s" % (work / "report"))
        yield out


def test_the_unprivileged_node_is_as_proxmox_makes_it(run):
    env = run["env"]
    client = os.path.join(STATE, "client")
    for node in run["info"]["nodes"]:
        ssh = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
               "-o", "UserKnownHostsFile=" + os.path.join(client, "known_hosts"), "-i", os.path.join(client, "id_ed25519"),
               "-p", str(node["port"]), "-l", "root", node["address"]]
        # As on a Proxmox VE node, root's subordinate ids are the unprivileged containers'.
        subid = subprocess.run(ssh + ["cat /etc/subuid /etc/subgid"], text=True, stdout=subprocess.PIPE, env=env,
                               timeout=60, check=True).stdout
        assert subid == "root:100000:65536\nroot:100000:65536\n", subid
        for ct in node["containers"]:
            conf = subprocess.run(ssh + ["pct config %d" % ct["vmid"]], text=True, stdout=subprocess.PIPE, env=env,
                                  timeout=60, check=True).stdout
            if node["name"] == NODE:
                assert "\nunprivileged: 1\n" in conf + "\n", conf
                # The node sees the container's init in a user namespace: root is 100000.
                assert simfleet.id_map(lxcpath(), ct["vmid"]) == [(0, BASE, 65536)]
                assert simfleet.id_map(lxcpath(), ct["vmid"], "gid") == [(0, BASE, 65536)]
                rootfs = os.path.join(lxcpath(), str(ct["vmid"]), "rootfs")
                assert os.stat(rootfs).st_uid == BASE
                assert os.stat(os.path.join(rootfs, "opt", "venv")).st_uid == BASE + TRAINER
                # Inside: the venv is trainer's, the root file system root's, the shared /usr too
                # (idmapped), the GPU device files nobody's (host devices), as in a real container.
                assert simfleet.owners(lxcpath(), ct["vmid"], "/opt/venv") == {(TRAINER, TRAINER)}
                assert simfleet.sh(lxcpath(), ct["vmid"], "stat -c '%u %g' / /usr/bin/python3 /dev/nvidia-uvm") == \
                    "0 0\n0 0\n65534 65534\n"
            else:
                assert "unprivileged" not in conf, conf
                assert simfleet.id_map(simfleet.lxcpath(STATE, node["name"]), ct["vmid"]) == [(0, 0, 4294967295)]


def test_the_inventory_plugin_marks_the_unprivileged_containers(run):
    res = subprocess.run([os.path.join(VENV_BIN, "ansible-inventory"), "-i",
                          str(run["work"] / "inventory" / "discovered.proxmox_lxc.yml"), "--list"],
                         cwd=REPO, env=run["env"], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120, check=True)
    inv = json.loads(res.stdout)
    hostvars = inv["_meta"]["hostvars"]
    for node in run["info"]["nodes"]:
        for ct in node["containers"]:
            assert hostvars[ct["name"]]["pve_unprivileged"] is (node["name"] == NODE), hostvars[ct["name"]]
    assert sorted(inv["pve_unprivileged"]["hosts"]) == sorted(ct["name"] for ct in run["by_role"].values())


def test_reads_show_owners_as_the_container_sees_them(run):
    before = run["before"]
    holder = run["by_role"]["stale_holder"]
    stale = [(pid, cmd) for pid, (uid, cmd) in before["procs"][holder["vmid"]].items() if "--tag stale" in cmd]
    assert len(stale) == 1, before["procs"]
    pid = stale[0][0]
    assert before["procs"][holder["vmid"]][pid][0] == TRAINER
    # gpu_state in the container: the holder is trainer's (uid 1000), under the container's pid.
    holders = [p for g in before["gpu_state"]["gpus"] for p in g["processes"]]
    assert [(p["pid"], p["user"], p.get("uid")) for p in holders] == [(pid, "trainer", TRAINER)], holders
    found = before["scope"]["processes"]
    assert [(p["pid"], p["user"]) for p in found] == [(pid, "trainer")], found
    # torch_cache for the container's user finds trainer's cache, with its entries.
    [inductor] = before["torch_cache"]["caches"]
    assert inductor["path"] == "/tmp/torchinductor_trainer", inductor
    assert inductor["exists"] and inductor["entries"] >= 2, inductor


def test_the_node_read_shows_owners_as_the_container_sees_them(run):
    by_role, read = run["by_role"], run["before"]["node_read"]["containers"]
    holder = by_role["stale_holder"]
    [stale] = [pid for pid, (_uid, cmd) in run["before"]["procs"][holder["vmid"]].items() if "--tag stale" in cmd]
    rec = read[holder["name"]]
    holders = [p for g in rec["gpu_state"]["gpus"] for p in g["processes"]]
    assert [(p["container_pid"], p["user"], p["uid"]) for p in holders] == [(stale, "trainer", TRAINER)], holders
    assert [(p["pid"], p["user"]) for p in rec["processes"]["processes"]] == [(stale, "trainer")], rec["processes"]
    # trainer's caches, by the container's own password database (its home is /home/trainer).
    caches = {c["name"]: c for c in read[by_role["stale_cache"]["name"]]["torch_cache"]["caches"]}
    assert (caches["inductor"]["path"], caches["inductor"]["exists"], caches["inductor"]["stale"], caches["inductor"]["entries"]) == (
        "/tmp/torchinductor_trainer", True, True, 2), caches["inductor"]
    assert caches["triton"]["path"] == "/home/trainer/.triton/cache", caches["triton"]
    # The seed's FlashInfer workspace in trainer's home, no record: stale too.
    workspace = cachetree.flashinfer_tree(dict(cuda_fixtures.SEED_ADDED)["flashinfer-python"], "120f")
    assert (caches["flashinfer"]["path"], caches["flashinfer"]["exists"], caches["flashinfer"]["stale"],
            caches["flashinfer"]["entries"]) == ("/home/trainer/.cache/flashinfer", True, True, len(workspace)), caches["flashinfer"]
    found = {c["name"] for c in read[by_role["contaminated"]["name"]]["cuda_contamination"]["contaminants"]}
    assert found == cuda_fixtures.SEED_CUDA13, found


def test_preflight_fails_exactly_the_unprivileged_bad_containers(run):
    for key in ("preflight", "preflight_node"):
        res = run[key]
        assert res.returncode != 0, res.stdout[-3000:]
        want = {ct["name"]: CHECK_OF[role] for role, ct in run["by_role"].items()}
        assert not_ready(res.stdout) == want, (key, res.stdout[-5000:])
        assert "3 of 6 ready" in res.stdout, res.stdout[-3000:]
        # Trainer's stale run, named by the container's own pid: the inventory's job, below its floor.
        holder = run["by_role"]["stale_holder"]
        assert re.search(r"%s is not ready: \[gpu_idle\] held by the inventory's own job \(pid \d+, started [^)]*, last 12800 "
                         r"tok/s \(64%% of the 20000 baseline\)\)" % holder["name"], res.stdout), res.stdout[-3000:]
        assert "/tmp/torchinductor_trainer" in res.stdout


def test_remediate_repairs_exactly_the_broken_containers(run):
    res = run["remediate"]
    assert res.returncode == 0, res.stdout[-8000:]
    rc = recap(res.stdout)
    bad = {ct["name"] for ct in run["by_role"].values()}
    for node in run["info"]["nodes"]:
        for ct in node["containers"]:
            assert rc[ct["name"]]["failed"] == 0 and rc[ct["name"]]["unreachable"] == 0, rc
            assert (rc[ct["name"]]["changed"] > 0) is (ct["name"] in bad), (ct["name"], rc)


def test_contamination_removed_as_the_venv_owner(run):
    ct = run["by_role"]["contaminated"]
    inv = module(run["env"], run["inv"], ct["name"], "gpufleet.hygiene.pip_inventory", {"venv": "/opt/venv", "verify_files": True})
    names = {p["name"]: p["version"] for p in inv["packages"]}
    for gone in cuda_fixtures.SEED_CUDA13 | set(cuda_fixtures.SEED_LEFTOVERS):
        assert gone not in names, names
    for name, version in cuda_fixtures.SEED_BASE:
        assert names.get(name) == version, (name, names)
    assert inv["integrity"]["ok"], inv["integrity"]  # the clobbered cu12 files are back
    # Removed and restored by trainer: every file and directory of the venv is still trainer's,
    # the restored libraries included (root's would be 0 here, and 100000 on the node).
    assert simfleet.owners(lxcpath(), ct["vmid"], "/opt/venv") == {(TRAINER, TRAINER)}
    rootfs_site = os.path.join(lxcpath(), str(ct["vmid"]), "rootfs", "opt", "venv", "lib")
    restored = [os.path.join(d, f) for d, _s, files in os.walk(rootfs_site) for f in files if f.startswith("libnccl.so")]
    assert restored and all(os.lstat(p).st_uid == BASE + TRAINER for p in restored), restored


def test_stale_holder_gone_decoy_alive(run):
    holder = run["by_role"]["stale_holder"]
    before = run["before"]["procs"][holder["vmid"]]
    [stale] = [pid for pid, (_uid, cmd) in before.items() if "--tag stale" in cmd]
    [decoy] = [pid for pid, (_uid, cmd) in before.items() if cmd.endswith("gpufleet-decoy")]
    now = simfleet.process_table(lxcpath(), holder["vmid"])
    assert stale not in now or "--tag stale" not in now[stale][1], now
    assert not [c for _u, c in now.values() if "--tag stale" in c], now
    # trainer's other process (same user, outside the job's patterns) lives on, the same process.
    assert now.get(decoy) == before[decoy] and before[decoy][0] == TRAINER, (before, now)
    # The relaunched job is the GPU's only holder; the stale claim is gone, its memory freed.
    out = simfleet.sh(lxcpath(), holder["vmid"], "/opt/gpufleet/bin/nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits")
    apps = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    assert len(apps) == 1 and apps[0][1] == "40960", apps
    assert "--tag" not in now[int(apps[0][0])][1]
    assert simfleet.sh(lxcpath(), holder["vmid"], "ls /opt/gpufleet/gpu/claims").split() == ["%s.json" % apps[0][0]]
    for ct in run["by_role"].values():
        procs = simfleet.process_table(lxcpath(), ct["vmid"])
        assert [u for u, c in procs.values() if c.endswith("gpufleet-decoy")] == [TRAINER], procs


def test_stale_cache_cleared_and_left_to_its_owner(run):
    ct = run["by_role"]["stale_cache"]
    listing = simfleet.sh(lxcpath(), ct["vmid"], "cd /tmp/torchinductor_trainer && find . -mindepth 1 | sort").split()
    assert listing == ["./.gpufleet-hygiene-fingerprint.json"], listing
    assert simfleet.owners(lxcpath(), ct["vmid"], "/tmp/torchinductor_trainer") == {(TRAINER, TRAINER)}
    marker = json.loads(simfleet.sh(lxcpath(), ct["vmid"], "cat /tmp/torchinductor_trainer/.gpufleet-hygiene-fingerprint.json"))
    assert marker["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}
    # FlashInfer's workspace too: emptied, recorded, still trainer's.
    workspace = "/home/trainer/.cache/flashinfer"
    listing = simfleet.sh(lxcpath(), ct["vmid"], "cd %s && find . -mindepth 1 | sort" % workspace).split()
    assert listing == ["./.gpufleet-hygiene-fingerprint.json"], listing
    assert simfleet.owners(lxcpath(), ct["vmid"], workspace) == {(TRAINER, TRAINER)}
    marker = json.loads(simfleet.sh(lxcpath(), ct["vmid"], "cat %s/.gpufleet-hygiene-fingerprint.json" % workspace))
    assert marker["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}


def test_privileged_healthy_containers_untouched(run):
    for node in run["info"]["nodes"]:
        if node["name"] == NODE:
            continue
        for ct in node["containers"]:
            lp = simfleet.lxcpath(STATE, node["name"])
            procs = simfleet.process_table(lp, ct["vmid"])
            assert [u for u, c in procs.values() if c.endswith("gpufleet-decoy")] == [0], procs
            assert not [c for _u, c in procs.values() if "train_dflash" in c], procs
            assert simfleet.sh(lp, ct["vmid"], "cat /root/decoy-notes.txt") == "healthy container %d: leave me alone\n" % ct["vmid"]


def test_preflight_and_hygiene_pass_after_remediation(run):
    for key in ("after", "hygiene"):
        res = run[key]
        assert res.returncode == 0, (key, res.stdout[-6000:])
        assert not [h for h, r in recap(res.stdout).items() if r["failed"] or r["unreachable"]], res.stdout[-3000:]
    report = json.loads((run["work"] / "report" / "report.json").read_text())
    hosts = report.get("hosts", report) if isinstance(report, dict) else report
    names = sorted(ct["name"] for n in run["info"]["nodes"] for ct in n["containers"])
    assert sorted(h["host"] for h in hosts if h.get("ready")) == names, hosts


def test_the_job_relaunched_in_every_repaired_container(run):
    for ct in run["by_role"].values():
        assert simfleet.sh(lxcpath(), ct["vmid"], "tmux has-session -t =train && echo yes").strip() == "yes"
        log = simfleet.sh(lxcpath(), ct["vmid"], "cat /var/log/gpufleet-train.log")
        assert "20000 tokens/s" in log, log[-500:]
        procs = simfleet.process_table(lxcpath(), ct["vmid"])
        jobs = [(u, c) for u, c in procs.values() if c.startswith("/usr/bin/python3 /opt/gpufleet/train_dflash.py")]
        # The relaunched job is the container root's (uid 0 inside, 100000 on the node).
        assert [u for u, c in jobs] == [0] and "--tag" not in jobs[0][1], jobs
