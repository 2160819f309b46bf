# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The main job (scripts/main-job.sh, what `make run` runs) on its own simulated fleet.

The script brings up the `incident` fleet, runs preflight (must fail on exactly the three
bad containers), remediate, preflight again and hygiene, and checks the recaps itself.
Here it runs with KEEP_FLEET=1 in its own state directory, inventory and port (so it can
run beside another fleet), and the real state of every container is then checked: the
contaminants gone and the venv's files intact (pip_inventory), the stale process gone and
its GPU memory freed per the nvidia-smi stand-in, the relaunched job holding the GPU and
logging, the stale cache cleared, and the healthy containers untouched (a decoy process,
a decoy file and a fresh cache survive, no job started there).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import cuda_fixtures  # tests/lib, on pytest's pythonpath (pytest.ini)
import pytest
import simfleet

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Its own fleet; overridable so that two checkouts can run this test at once.
STATE = os.environ.get("GPUFLEET_MAIN_TEST_STATE", "/var/tmp/gpufleet-sim-main-test")
PORT = os.environ.get("GPUFLEET_MAIN_TEST_PORT", "2532")
FLEET = os.path.join(REPO, "tests", "sim", "fleet")


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the main job needs root (privileged LXC containers, sshd)")
    work = tmp_path_factory.mktemp("main-job")
    env = dict(os.environ, GPUFLEET_SIM_STATE=STATE, GPUFLEET_SIM_INVENTORY=str(work / "inventory"),
               GPUFLEET_MAIN_PORT=PORT, GPUFLEET_REPORT_DIR=str(work / "report"),
               GPUFLEET_MAIN_LOGS=str(work / "logs"), KEEP_FLEET="1")
    try:
        res = subprocess.run([os.path.join(REPO, "scripts", "main-job.sh")], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900, check=False)
        with open(os.path.join(STATE, "fleet.json")) as f:
            fleet = json.load(f)
        yield {"res": res, "fleet": fleet, "work": work, "env": env}
    finally:
        subprocess.run([FLEET, "down"], cwd=REPO, env=env, check=True)
    assert not os.path.exists(STATE)


def containers(job):
    for node in job["fleet"]["nodes"]:
        for ct in node["containers"]:
            yield node["name"], ct


def by_role(job, role):
    return [(n, ct) for n, ct in containers(job) if ct["incident"] == role]


def sh(node, ct, script):
    return simfleet.sh(simfleet.lxcpath(STATE, node), ct["vmid"], script)


def processes(node, ct):
    return simfleet.processes(simfleet.lxcpath(STATE, node), ct["vmid"])


def smi(node, ct, query):
    out = sh(node, ct, "/opt/gpufleet/bin/nvidia-smi --query-%s --format=csv,noheader,nounits" % query)
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def module(job, host, name, args):
    env = dict(job["env"], ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1")
    res = subprocess.run([os.path.join(REPO, ".venv", "bin", "ansible"), "-i",
                          os.path.join(job["env"]["GPUFLEET_SIM_INVENTORY"], "fleet.yml"), host, "-m", name, "-a", args],
                         cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                         check=False)
    assert " | SUCCESS => " in res.stdout, res.stdout
    return json.loads(res.stdout.split(" => ", 1)[1])


def test_main_job_succeeds(main_job):
    res = main_job["res"]
    assert res.returncode == 0, res.stdout[-6000:]
    # The demo fleet has a node of unprivileged containers, as Proxmox VE makes them by default,
    # and the incident's bad containers are there.
    unpriv = [n["name"] for n in main_job["fleet"]["nodes"] if n.get("unprivileged")]
    assert unpriv == ["pve2"], unpriv
    assert all(ct.get("unprivileged") for _n, ct in containers(main_job) if ct["incident"] != "healthy")
    assert "every expectation met" in res.stdout
    # The gate judged the relaunch on its own readings, the stale run's slow ones still in its log.
    assert "the job log starts with the stale run's" in res.stdout
    bad = sorted(ct["name"] for _n, ct in containers(main_job) if ct["incident"] != "healthy")
    assert len(bad) == 3
    assert "it failed exactly the broken containers, %s, each for its own fault" % ", ".join(bad) in res.stdout
    # In the user's words, about a screen: what preflight found on each container, what remediate did
    # on each it changed, where the report is; every playbook's whole output is in its log.
    lines = res.stdout.splitlines()
    assert len(lines) <= 60, res.stdout
    for name in bad:
        assert [line for line in lines if line.strip().startswith(name + " - NOT READY")], (name, res.stdout)
        assert [line for line in lines if line.strip().startswith(name + ": ")], (name, res.stdout)  # the outcome line
    assert "OUTCOME: 3 of 6 container(s) changed" in res.stdout
    assert "The report (open it in a browser): %s" % (main_job["work"] / "report" / "report.html") in res.stdout
    assert "TASK [" not in res.stdout and "PLAY RECAP" not in res.stdout
    html = (main_job["work"] / "report" / "report.html").read_text()
    for _n, ct in containers(main_job):
        assert ct["name"] in html


def test_contamination_gone_and_files_restored(main_job):
    [(_node, ct)] = by_role(main_job, "contaminated")
    inv = module(main_job, ct["name"], "gpufleet.hygiene.pip_inventory", "venv=/opt/venv verify_files=true")
    names = {p["name"]: p["version"] for p in inv["packages"]}
    for gone in cuda_fixtures.SEED_CUDA13 | set(cuda_fixtures.SEED_LEFTOVERS):
        assert gone not in names, names
    for name, version in cuda_fixtures.SEED_BASE:
        assert names.get(name) == version, (name, names)
    assert inv["integrity"]["ok"], inv["integrity"]  # the clobbered cu12 files were restored


def test_stale_holder_gone_and_memory_freed(main_job):
    [(node, ct)] = by_role(main_job, "stale_holder")
    procs = processes(node, ct)
    assert not [c for c in procs.values() if "--tag stale" in c], procs
    # The relaunched job (not the stale one) is the only holder; the stale claim is gone.
    apps = smi(node, ct, "compute-apps=pid,used_memory")
    assert len(apps) == 1, apps
    pid, mib = int(apps[0][0]), int(apps[0][1])
    assert "/opt/gpufleet/train_dflash.py" in procs[pid] and "--tag" not in procs[pid]
    assert mib == 40960
    assert smi(node, ct, "gpu=memory.used") == [["40960"]]
    claims = sh(node, ct, "ls /opt/gpufleet/gpu/claims").split()
    assert claims == ["%d.json" % pid], claims


def test_relaunched_job_logs_throughput(main_job):
    for node, ct in [x for r in ("contaminated", "stale_holder", "stale_cache") for x in by_role(main_job, r)]:
        assert sh(node, ct, "tmux has-session -t =train && echo yes").strip() == "yes"
        log = sh(node, ct, "cat /var/log/gpufleet-train.log")
        assert "20000 tokens/s" in log, log[-500:]
        assert int(smi(node, ct, "gpu=memory.used")[0][0]) == 40960
    [(node, ct)] = by_role(main_job, "stale_holder")
    log = sh(node, ct, "cat /var/log/gpufleet-train.log")
    # As in the seed: the relaunched run appended to a log that starts with the stale run's slow
    # readings, and after them come only the relaunched run's (a compile phase, then its rate).
    stale, fresh = log.split("compile start\n")[1], log.split("compile start\n")[2]
    assert "12800 tokens/s" in stale and "20000 tokens/s" not in stale, log[:1000]
    assert "20000 tokens/s" in fresh and "12800 tokens/s" not in fresh, log[-1000:]


def test_stale_cache_cleared(main_job):
    [(node, ct)] = by_role(main_job, "stale_cache")
    # The job's user's cache: trainer's in an unprivileged container (the demo's pve2), else root's.
    cache = "/tmp/torchinductor_%s" % ("trainer" if ct.get("unprivileged") else "root")
    listing = sh(node, ct, "cd %s && find . -mindepth 1 | sort" % cache).split()
    assert listing == ["./.gpufleet-hygiene-fingerprint.json"], listing
    marker = json.loads(sh(node, ct, "cat %s/.gpufleet-hygiene-fingerprint.json" % cache))
    assert marker["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}
    # The seed's FlashInfer workspace in the same user's home: emptied and recorded as well.
    workspace = "%s/.cache/flashinfer" % ("/home/trainer" if ct.get("unprivileged") else "/root")
    listing = sh(node, ct, "cd %s && find . -mindepth 1 | sort" % workspace).split()
    assert listing == ["./.gpufleet-hygiene-fingerprint.json"], listing
    marker = json.loads(sh(node, ct, "cat %s/.gpufleet-hygiene-fingerprint.json" % workspace))
    assert marker["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}


def test_healthy_containers_untouched(main_job):
    healthy = by_role(main_job, "healthy")
    assert len(healthy) == 3
    for node, ct in healthy:
        procs = processes(node, ct)
        assert [c for c in procs.values() if c.endswith("gpufleet-decoy")], procs
        assert not [c for c in procs.values() if "train_dflash" in c], procs
        assert sh(node, ct, "cat /root/decoy-notes.txt") == "healthy container %d: leave me alone\n" % ct["vmid"]
        assert smi(node, ct, "gpu=memory.used") == [["0"]]
        assert not os.path.exists(os.path.join(STATE, "nodes", node, "lxc", str(ct["vmid"]), "rootfs", "var", "log",
                                               "gpufleet-train.log"))
        if ct["vmid"] % 2:
            marker = json.loads(sh(node, ct, "cat /tmp/torchinductor_root/.gpufleet-hygiene-fingerprint.json"))
            assert marker["recorded_by"] == "tests/sim/fleet"  # not rewritten
            assert sh(node, ct, "cat /tmp/torchinductor_root/fxgraph/cd/fx-entry") == "compiled for torch 2.8.0+cu128\n"


def test_the_report_page_shows_the_incident_phase_by_phase(main_job):
    """The page `make run` leaves, in a real browser: a row per container with what preflight found, what
    remediate did and the verdict now; the broken containers each with their own fault and repair."""
    sys.path.insert(0, os.path.join(REPO, "tests", "browser"))
    import browserkit

    dom = browserkit.dump_dom(str(main_job["work"] / "report" / "report.html"))
    assert "This incident, phase by phase" in dom
    table = dom[dom.index('<table id="phases">'):]
    table = table[:table.index("</table>")]
    head = table[:table.index("</thead>")]
    assert head.index("preflight found") < head.index("remediate did") < head.index("GPU fleet hygiene"), head
    rows = {}
    for row in table.split("<tr>")[2:]:
        name = row.split('<th class="who">', 1)[1].split("<", 1)[0]
        rows[name] = [cell.split('"', 1)[0] for cell in row.split('<div class="cell ')[1:]]
        rows[name + " text"] = row
    want = {"contaminated": ("venv_clean", "removed nvidia-"), "stale_holder": ("gpu_idle", "stopped pid"),
            "stale_cache": ("caches_fresh", "cleared")}
    for _n, ct in containers(main_job):
        name = ct["name"]
        if ct["incident"] == "healthy":
            assert rows[name] == ["pass", "pass", "pass"], (name, rows[name + " text"])
            continue
        assert rows[name] == ["fail", "fix", "pass"], (name, rows[name + " text"])
        check, action = want[ct["incident"]]
        cells = rows[name + " text"].split('<div class="cell ')
        assert check in cells[1] and action in cells[2] and "relaunched" in cells[2], (name, rows[name + " text"])
