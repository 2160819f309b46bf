# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job_libraries on the simulated fleet: what the running job really maps.

One fleet for the module (1 node x 1 container, scenario `incident`): the container holds the
seed's contaminated venv - torch cu128 with nvidia-nccl-cu13 installed over nvidia-nccl-cu12, so
libnccl.so.2 in the venv is CUDA 13's (a real ELF linking libcudart.so.13). A job (the training
stand-in) is started that really dlopens that libnccl.so.2, after a CUDA 13 runtime left on the
container's disk (/opt/cuda-13): preflight must fail job_libraries on it, naming the process,
the file and its package. remediate then stops the job, purges the venv (restoring CUDA 12's
libnccl.so.2) and relaunches the inventory's job, which dlopens the venv's CUDA runtime and NCCL;
the relaunch role judges what the new run maps, and the test reads the new process's
/proc/<pid>/maps in the container itself: the right NCCL, nothing of CUDA 13, nothing deleted.

Own fleet: $GPUFLEET_LIBRARIES_STATE (default /var/tmp/gpufleet-sim-libraries) and
$GPUFLEET_LIBRARIES_PORT (default 2890).
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import subprocess
import time

import pytest
import simfleet
from wheelmaker import build_shared_object

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._elf import dt_needed

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STATE = os.path.abspath(os.environ.get("GPUFLEET_LIBRARIES_STATE", "/var/tmp/gpufleet-sim-libraries"))
PORT = os.environ.get("GPUFLEET_LIBRARIES_PORT", "2890")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
QUICK = ["-e", "kill_grace_period=2", "-e", "kill_drain_timeout=15", "-e", "relaunch_settle_seconds=0"]
CUDA13 = "/opt/cuda-13/lib64/libcudart.so.13"
NCCL = "/opt/venv/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2"
CUDART12 = "/opt/venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12"
JOB = re.compile(r"^\S*python3? /opt/gpufleet/train_dflash\.py")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("libraries")
    with simfleet.running(STATE, nodes=1, containers=1, scenario="incident", inventory=work / "inventory", port=PORT,
                          timeout=300) as (info, env):
        [node] = info["nodes"]
        [ct] = node["containers"]
        assert ct["incident"] == "contaminated"
        lxc = simfleet.lxcpath(STATE, node["name"])
        yield {"env": env, "inventory": str(work / "inventory" / "fleet.yml"), "ct": ct, "lxc": lxc, "work": work,
               "rootfs": os.path.join(lxc, str(ct["vmid"]), "rootfs")}


def ansible(fleet, tool, *args):
    # JSON results (ansible.cfg shows them as YAML): the ad-hoc reading is parsed below.
    env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json")
    res = subprocess.run([os.path.join(VENV_BIN, tool), "-i", fleet["inventory"], *args], cwd=REPO, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
    logs = os.path.join(str(fleet["work"]), "logs")
    os.makedirs(logs, exist_ok=True)
    with open(os.path.join(logs, "%02d-%s.log" % (len(os.listdir(logs)), tool)), "w") as f:
        f.write(res.stdout)
    return res.returncode, res.stdout


def jobs(fleet):
    return {pid: cmd for pid, cmd in simfleet.processes(fleet["lxc"], fleet["ct"]["vmid"]).items() if JOB.search(cmd)}


def maps(fleet, pid):
    return simfleet.sh(fleet["lxc"], fleet["ct"]["vmid"], "cat /proc/%d/maps" % pid)


def wait_job(fleet, old=(), timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        new = [pid for pid in jobs(fleet) if pid not in old]
        if new and "libnccl.so.2" in maps(fleet, new[0]):
            return new[0]
        time.sleep(0.2)
    raise AssertionError("no job mapping libnccl.so.2 in %ss: %s" % (timeout, jobs(fleet)))


def test_a_job_on_the_cu13_nccl_is_flagged_and_the_relaunched_one_maps_the_right_one(fleet):
    host = fleet["ct"]["name"]
    rootfs = fleet["rootfs"]
    [nccl] = glob.glob(rootfs + NCCL)
    assert "libcudart.so.13" in dt_needed(nccl)  # the seed's clobbered file: CUDA 13's NCCL
    # A CUDA 13 runtime left on the container's disk, which the cu13 NCCL links.
    build_shared_object(str(fleet["work"] / "cuda13"), "libcudart.so.13")
    os.makedirs(os.path.join(rootfs, CUDA13.lstrip("/").rsplit("/", 1)[0]))
    os.link(str(fleet["work"] / "cuda13" / "libcudart.so.13"), rootfs + CUDA13)
    rc, out = ansible(fleet, "ansible-inventory", "--host", host)
    assert rc == 0, out
    command = json.loads(out)["gpufleet_job"]["command"]
    # The inventory's job, loading the CUDA 13 runtime and the venv's NCCL (the last --dlopen wins).
    argv = command + ["--dlopen", "%s,%s" % (CUDA13, NCCL), "--tag", "contaminated"]
    simfleet.sh(fleet["lxc"], fleet["ct"]["vmid"],
                "setsid %s </dev/null >>/var/log/gpufleet-train.log 2>&1 &" % " ".join(shlex.quote(a) for a in argv))
    old = wait_job(fleet)
    mapped = maps(fleet, old)
    venv_nccl = nccl[len(rootfs):]
    assert venv_nccl in mapped and CUDA13 in mapped

    rc, out = ansible(fleet, "ansible-playbook", "playbooks/preflight.yml")
    flat = re.sub(r"\s+", " ", out.replace("\\n", " "))
    assert rc != 0, out
    assert "job_libraries" in flat, out
    assert ("pid %d python3 maps %s (nvidia-nccl-cu13 2.28.9): CUDA 13, torch is CUDA 12.8" % (old, venv_nccl)) in flat, out
    assert ("maps %s (no package of the venv): CUDA 13, torch is CUDA 12.8; mapped from outside the venv, which ships "
            % CUDA13) in flat, out
    assert "stop the job, purge the venv (the remediate playbook) and relaunch it" in flat, out
    assert old in jobs(fleet)  # preflight reads, never touches

    rc, out = ansible(fleet, "ansible-playbook", "playbooks/remediate.yml", *QUICK)
    assert rc == 0, out
    assert re.search(r"TASK \[gpufleet\.hygiene\.relaunch : The new run maps only the right CUDA libraries\] \*+\nok: \[%s\]"
                     % re.escape(host), out), out
    assert old not in jobs(fleet)
    new = wait_job(fleet, old=[old])
    assert "contaminated" not in jobs(fleet)[new]  # the inventory's own command
    mapped = maps(fleet, new)
    # The relaunched run maps the venv's NCCL, now CUDA 12's again, and nothing of CUDA 13, nothing deleted.
    assert venv_nccl in mapped and "(deleted)" not in mapped and "libcudart.so.13" not in mapped, mapped
    assert "libcudart.so.12" in dt_needed(nccl) and "libcudart.so.13" not in dt_needed(nccl)

    # The reading itself, beside the running job: job_libraries passes and names what it read.
    args = {"job_patterns": [JOB.pattern], "venv": "/opt/venv", "allow_running_job": True, "caches": False,
            "nvidia_smi": "/opt/gpufleet/bin/nvidia-smi"}
    rc, out = ansible(fleet, "ansible", host, "-m", "gpufleet.hygiene.readiness", "-a", json.dumps(args))
    assert rc == 0, out
    result = json.loads(out.split("=>", 1)[1])
    check = next(c for c in result["checks"] if c["name"] == "job_libraries")
    assert check["ok"] is True and check["libraries"] == [], check
    [proc] = result["job_libraries"]["processes"]
    libs = {lib["path"]: lib for lib in proc["libraries"]}
    assert proc["pid"] == new
    assert (libs[venv_nccl]["package"], libs[venv_nccl]["cuda_major"], libs[venv_nccl]["deleted"]) == ("nvidia-nccl-cu12", 12, False)


def test_the_relaunch_fails_a_new_run_that_maps_another_majors_library(fleet):
    """The relaunch role alone (as remediate runs it), its command loading the CUDA 13 runtime left
    on the disk besides the venv's: the run starts and logs its ready line, and the role fails the
    host naming that library. Runs after the test above (the same fleet, its clean job running)."""
    host = fleet["ct"]["name"]
    rootfs = fleet["rootfs"]
    if not os.path.exists(rootfs + CUDA13):  # this test run alone
        build_shared_object(str(fleet["work"] / "cuda13"), "libcudart.so.13")
        os.makedirs(os.path.join(rootfs, CUDA13.lstrip("/").rsplit("/", 1)[0]), exist_ok=True)
        os.link(str(fleet["work"] / "cuda13" / "libcudart.so.13"), rootfs + CUDA13)
    for pid in jobs(fleet):  # by PID: only the job's processes, each one the test saw
        simfleet.sh(fleet["lxc"], fleet["ct"]["vmid"], "kill %d" % pid)
    deadline = time.monotonic() + 15
    while jobs(fleet) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not jobs(fleet)
    rc, out = ansible(fleet, "ansible-inventory", "--host", host)
    command = json.loads(out)["gpufleet_job"]["command"]
    playbook = fleet["work"] / "relaunch.yml"
    playbook.write_text(json.dumps([{
        "name": "Relaunch alone", "hosts": host, "gather_facts": False,
        "roles": [{"role": "gpufleet.hygiene.relaunch", "vars": {
            "relaunch_method": "setsid", "relaunch_settle_seconds": 0,
            # The venv's NCCL is CUDA 12's again (remediate restored it): its runtime is loaded too.
            "relaunch_command": command + ["--dlopen", "%s,%s,%s" % (CUDA13, CUDART12, NCCL)]}}]}]))
    rc, out = ansible(fleet, "ansible-playbook", str(playbook))
    flat = re.sub(r"\s+", " ", out.replace("\\n", " "))
    assert rc != 0, out
    assert "TASK [gpufleet.hygiene.relaunch : The log says it runs]" in out, out  # it ran and logged its ready line
    assert "%s: the relaunched job runs on the wrong libraries: 1 wrong library mapped by the running job: " % host in flat, out
    assert ("maps %s (no package of the venv): CUDA 13, torch is CUDA 12.8; mapped from outside the venv, which ships "
            % CUDA13) in flat, out
    [new] = jobs(fleet)
    assert CUDA13 in maps(fleet, new)
