# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""readiness: one call returns what processes, gpu_state, cuda_contamination, pip_inventory and
torch_cache return one by one, on a REAL seed venv (real wheels installed by uv), a REAL training
stand-in holding a GPU of the nvidia-smi STAND-IN, and a real stale compile cache; and judges them.
node_readiness returns, per container, the same as readiness, through a STAND-IN of the node's
`pct exec` (it runs the command here) and real subprocesses of the container's Python."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from cachetree import INDUCTOR_TREE, flashinfer_tree, make_tree
from cuda_fixtures import SEED_BASE, make_seed_venv, pins
from wheelmaker import build_shared_object

from ansible_collections.gpufleet.hygiene.plugins.filter.verify import verify_record
from ansible_collections.gpufleet.hygiene.plugins.modules import (
    cuda_contamination,
    gpu_state,
    node_readiness,
    pip_inventory,
    processes,
    readiness,
    torch_cache,
)
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

pytestmark = pytest.mark.slow

# Differ from one reading to the next by nature (timings), not by what was read.
VOLATILE = ("query_seconds", "invocation", "warnings")


def stable(result):
    out = {k: v for k, v in result.items() if k not in VOLATILE}
    out.pop("changed", None)
    return out


@pytest.fixture
def rig(tmp_path, seed_wheels):
    """A container's worth of trouble: the seed's venv, a job holding GPU 1, a stale Inductor cache."""
    venv = make_seed_venv(str(tmp_path / "venv"), seed_wheels)
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2, release_delay=0.2)
    smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", state)
    trainers = gpu_standin.Trainers(state)
    env = {"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    make_tree(env["TORCHINDUCTOR_CACHE_DIR"], INDUCTOR_TREE)
    # The JIT modules the seed's flashinfer-python built, where that release puts them in ~.
    make_tree(str(tmp_path / ".cache" / "flashinfer"), flashinfer_tree("0.6.11.post1", "120f"))
    try:
        # This rig's stand-ins only (other tests on the machine run the same program).
        job = [re.escape(gpu_standin.TRAINER) + " --state " + re.escape(str(state)) + " "]
        yield {"job": job, "state": str(state), "venv": venv, "smi": smi, "devices": [os.path.join(state, "dev", "nvidia*")], "trainers": trainers,
               "env": env, "baseline": str(tmp_path / "baseline.txt")}
    finally:
        trainers.cleanup()


def args_of(rig, **kw):
    args = {"job_patterns": rig["job"], "nvidia_smi": rig["smi"], "device_patterns": rig["devices"], "venv": rig["venv"],
            "cache_environment": rig["env"]}
    args.update(kw)
    return args


def test_one_call_reads_what_the_five_modules_read(run_module, rig):
    job = rig["trainers"].start(gpu=1, mib=40960)
    with open(rig["baseline"], "w") as f:
        f.write("\n".join(pins(SEED_BASE)) + "\n")
    res = run_module(readiness.main, args_of(rig, baseline=rig["baseline"], verify_files=True))
    assert res["changed"] is False and "failed" not in res

    alone = {
        "processes": run_module(processes.main, {"scope": {"cmdline": rig["job"]}}),
        "gpu_state": run_module(gpu_state.main, {"nvidia_smi": rig["smi"], "device_patterns": rig["devices"]}),
        "cuda_contamination": run_module(cuda_contamination.main, {"venv": rig["venv"]}),
        "pip_inventory": run_module(pip_inventory.main, {"venv": rig["venv"], "baseline": rig["baseline"], "verify_files": True}),
        "torch_cache": run_module(torch_cache.main, {"venv": rig["venv"], "environment": rig["env"]}),
    }
    for name, result in alone.items():
        assert stable(res[name]) == stable(result), name
    # What was read is the real state, not just the same state twice.
    assert [p["pid"] for p in res["processes"]["processes"]] == [job.pid]
    [g0, g1] = sorted(res["gpu_state"]["gpus"], key=lambda g: g["index"])
    assert g0["idle"] and not g1["idle"] and [p["pid"] for p in g1["processes"]] == [job.pid]
    assert {c["name"] for c in res["cuda_contamination"]["contaminants"]} >= {"nvidia-nccl-cu13", "sglang-kernel"}
    drift = res["pip_inventory"]["drift"]
    assert {d["name"] for d in drift["extra"]} and res["pip_inventory"]["integrity"]["ok"] is False  # the wheels clobbered files

    checks = {c["name"]: c for c in res["checks"]}
    assert list(checks) == ["gpu_idle", "job_live", "job_libraries", "venv_clean", "packages", "caches_fresh", "job_config"]
    assert checks["job_config"] == {"name": "job_config", "severity": "fail", "ok": True, "error": False,
                                    "summary": "the job can be launched as described", "problems": []}
    # No job log given: the job counts as running while its GPU shows utilisation (the stand-in's 90%).
    assert checks["job_live"]["ok"] is True and checks["job_live"]["state"] == "running"
    assert checks["job_live"]["summary"] == "job running (pid %d)" % job.pid and checks["job_live"]["leftovers"] == []
    assert res["liveness"]["state"] == "running" and res["liveness"]["pids"] == [job.pid]
    assert checks["gpu_idle"]["ok"] is False
    # Held by the job the options describe: named as such, with what to do.
    assert checks["gpu_idle"]["summary"].startswith("held by the inventory's own job (pid %d, started %s" % (
        job.pid, time.strftime("%Y-%m-%d %H:", time.gmtime())))
    assert checks["venv_clean"]["ok"] is False
    assert re.match(r"^\d+ package\(s\) built for another CUDA than 12\.8: .*nvidia-nccl-cu13 \S+ \(CUDA 13\)",
                    checks["venv_clean"]["summary"]), checks["venv_clean"]["summary"]
    assert checks["packages"]["ok"] is False
    assert checks["packages"]["summary"].startswith("%d packages; %d missing (" % (res["pip_inventory"]["count"], len(drift["missing"])))
    assert ", %d not in the baseline; files differ from RECORD in " % len(drift["extra"]) in checks["packages"]["summary"]
    assert checks["caches_fresh"]["ok"] is False
    assert checks["caches_fresh"]["summary"].startswith("built for another torch/Triton/CUDA/FlashInfer: inductor %s (" % rig["env"]["TORCHINDUCTOR_CACHE_DIR"])
    assert ", flashinfer %s/.cache/flashinfer (%d entries)" % (rig["env"]["HOME"], len(flashinfer_tree("0.6.11.post1", "120f"))) \
        in checks["caches_fresh"]["summary"]
    assert res["ready"] is False and res["running_job"] is True


def test_the_jobs_own_gpu_use_passes_only_when_allowed(run_module, rig):
    job = rig["trainers"].start(gpu=0, mib=1024)
    res = run_module(readiness.main, args_of(rig, venv=None))
    [gpu, live] = res["checks"]
    started = [p["started_at"] for p in res["processes"]["processes"]]
    assert len(started) == 1 and abs(started[0] - time.time()) < 30, started
    assert gpu["ok"] is False and gpu["summary"].startswith("held by the inventory's own job (pid %d, started %s): " % (
        job.pid, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started[0]))))
    assert gpu["summary"].endswith(": stop it first if a new run needs these GPUs, or let it run with "
                                   "-e gpufleet_allow_running_job=true")
    assert live["name"] == "job_live" and live["ok"] is True
    res = run_module(readiness.main, args_of(rig, venv=None, allow_running_job=True))
    assert res["checks"][0] == {"name": "gpu_idle", "severity": "fail", "ok": True, "error": False,
                                "summary": "held by the running job (pid %d)" % job.pid}
    assert [c["name"] for c in res["checks"]] == ["gpu_idle", "job_live"]
    assert res["ready"] is True and res["running_job"] is True
    # A holder that is not the job still fails, allowed or not.
    res = run_module(readiness.main, args_of(rig, venv=None, allow_running_job=True, job_patterns=["^no-such-job$"]))
    assert res["checks"][0]["ok"] is False and res["running_job"] is False


def test_a_failed_read_is_reported_and_the_others_still_run(run_module, rig, tmp_path):
    missing = str(tmp_path / "no-venv")
    res = run_module(readiness.main, args_of(rig, venv=missing))
    assert "failed" not in res  # the call itself succeeds; each read carries its own failure
    assert res["cuda_contamination"]["failed"] is True and missing in res["cuda_contamination"]["msg"]
    assert res["torch_cache"]["failed"] is True
    assert res["gpu_state"]["gpu_available"] is True and res["gpu_state"]["idle"] is True
    checks = {c["name"]: c for c in res["checks"]}
    assert checks["gpu_idle"] == {"name": "gpu_idle", "severity": "fail", "ok": True, "error": False, "summary": "2 GPU(s) idle"}
    assert checks["venv_clean"]["ok"] is False and checks["venv_clean"]["summary"] == res["cuda_contamination"]["msg"]
    assert checks["caches_fresh"]["ok"] is False and checks["caches_fresh"]["summary"] == res["torch_cache"]["msg"]
    assert res["ready"] is False


def test_what_is_not_asked_is_skipped_and_a_host_without_gpu_can_pass(run_module, tmp_path):
    res = run_module(readiness.main, {"require_gpu": False, "nvidia_smi": str(tmp_path / "no-nvidia-smi"),
                                      "device_patterns": [str(tmp_path / "dev" / "nvidia*")]})
    for name in ("processes", "cuda_contamination", "pip_inventory", "torch_cache"):
        assert res[name]["skipped"] is True, name
    assert res["gpu_state"]["gpu_available"] is False
    [gpu] = res["checks"]
    assert gpu["ok"] is True and gpu["summary"].startswith("no usable GPU (")
    assert res["ready"] is True and res["running_job"] is False
    # With a GPU required, a GPU that cannot be read fails the check with the reason.
    res = run_module(readiness.main, {"nvidia_smi": str(tmp_path / "no-nvidia-smi"),
                                      "device_patterns": [str(tmp_path / "dev" / "nvidia*")]})
    assert res["gpu_state"]["failed"] is True and res["gpu_state"]["gpu_available"] is False
    assert res["checks"] == [{"name": "gpu_idle", "severity": "fail", "ok": False, "error": True, "summary": res["gpu_state"]["msg"]}]
    assert res["ready"] is False


def test_a_hung_nvidia_smi_is_an_error_naming_the_timeout(run_module, tmp_path):
    hung = tmp_path / "nvidia-smi"
    hung.write_text("#!/bin/sh\nexec sleep 60\n")
    hung.chmod(0o755)
    started = time.monotonic()
    res = run_module(readiness.main, {"nvidia_smi": str(hung), "command_timeout": 0.5,
                                      "device_patterns": [str(tmp_path / "dev" / "nvidia*")]})
    assert time.monotonic() - started < 30, "the call was not bounded"
    [gpu] = res["checks"]
    assert gpu["ok"] is False and gpu["error"] is True
    assert "did not answer within 0.5s (command_timeout)" in gpu["summary"]
    assert run_module(readiness.main, {"nvidia_smi": str(hung), "command_timeout": 0})["msg"] == \
        "command_timeout must be more than 0 (got 0.0)"


# ---------------------------------------------------------------------------- node_readiness

# STAND-IN for Proxmox VE's `pct exec VMID -- CMD...` on a node: runs CMD here. Container 105 is
# stopped (pct's own message and status), container 106 hangs.
FAKE_PCT = """#!/bin/sh
[ "$1" = exec ] && [ "$3" = -- ] || { echo "usage: pct exec <vmid> -- <command>" >&2; exit 2; }
vmid=$2
shift 3
case "$vmid" in
  105) echo "container '105' not running!" >&2; exit 255 ;;
  106) exec sleep 30 ;;
  108) echo 'GPUFLEET-READINESS []'; exit 0 ;;
  109) echo 'GPUFLEET-READINESS {"checks": "not a list"}'; exit 0 ;;
esac
exec "$@"
"""


@pytest.fixture
def pct(tmp_path):
    path = tmp_path / "pct"
    path.write_text(FAKE_PCT)
    path.chmod(0o755)
    return str(path)


def test_node_readiness_reads_each_container_as_readiness_does(run_module, rig, pct):
    job = rig["trainers"].start(gpu=1, mib=40960)
    args = args_of(rig, allow_running_job=True)
    alone = run_module(readiness.main, args)
    res = run_module(node_readiness.main, {"read_from": "container", "containers": [
        {"host": "ct-101", "vmid": 101, "pct_path": pct, "python": sys.executable, "args": args},
        {"host": "self", "args": args},  # no vmid: read here, in the module's own process
    ]})
    assert res["changed"] is False and "failed" not in res
    assert res["read"]["containers"] == 2 and res["read"]["failed"] == 0
    for host in ("ct-101", "self"):
        got = res["containers"][host]
        assert "failed" not in got, got
        for name in ("processes", "gpu_state", "cuda_contamination", "pip_inventory", "torch_cache"):
            assert stable(got[name]) == stable(alone[name]), (host, name)
        assert got["checks"] == alone["checks"] and got["ready"] == alone["ready"] and got["running_job"] is True
        assert isinstance(got["warnings"], list)
    # The real state: the job holds GPU 1, the venv is contaminated.
    checks = {c["name"]: c for c in res["containers"]["ct-101"]["checks"]}
    assert checks["gpu_idle"]["ok"] is True and checks["gpu_idle"]["summary"] == "held by the running job (pid %d)" % job.pid
    assert checks["venv_clean"]["ok"] is False and "nvidia-nccl-cu13" in checks["venv_clean"]["summary"]


def test_node_readiness_a_container_that_cannot_be_read_fails_alone(run_module, rig, pct):
    args = args_of(rig, venv=None)
    res = run_module(node_readiness.main, {"read_from": "container", "container_timeout": 2, "containers": [
        {"host": "good", "vmid": 101, "pct_path": pct, "python": sys.executable, "args": args},
        {"host": "stopped", "vmid": 105, "pct_path": pct, "python": sys.executable, "args": args},
        {"host": "hung", "vmid": 106, "pct_path": pct, "python": sys.executable, "args": args},
        {"host": "no-python", "vmid": 102, "pct_path": pct, "python": "/nonexistent/python3", "args": args},
        {"host": "relative-python", "vmid": 103, "pct_path": pct, "python": "python3", "args": args},
        {"host": "bad-timeout", "vmid": 104, "pct_path": pct, "args": dict(args, command_timeout=0)},
        {"host": "unknown-option", "vmid": 107, "pct_path": pct, "args": dict(args, venv_path="/opt/venv")},
        {"host": "bad-vmid", "vmid": 7, "pct_path": pct, "args": args},
        {"host": "hostile-vmid", "vmid": "100; touch /tmp/x", "pct_path": pct, "args": args},
        {"host": "bad-method", "vmid": 101, "method": "ssh", "pct_path": pct, "args": args},
        {"host": "not-a-reading", "vmid": 108, "pct_path": pct, "python": sys.executable, "args": args},
        {"host": "half-a-reading", "vmid": 109, "pct_path": pct, "python": sys.executable, "args": args},
    ]})
    assert "failed" not in res, res
    got = res["containers"]
    assert "failed" not in got["good"] and got["good"]["checks"][0]["name"] == "gpu_idle"
    assert res["read"]["failed"] == 11
    msgs = {host: r["msg"] for host, r in got.items() if r.get("failed")}
    assert msgs["stopped"].startswith("container 105 is not running (stopped); start it (pct start 105)")
    assert msgs["hung"] == ("reading container 106 took more than 2.0 s (container_timeout): %s was stopped on the node, "
                            "the reading in the container may still be running" % pct)
    assert msgs["not-a-reading"] == "container 108 gave a result that is not a reading (list)"
    assert msgs["half-a-reading"] == "container 109 gave a result that is not a reading (dict)"
    assert msgs["no-python"].startswith("no Python at /nonexistent/python3 in container 102 (exit status 127)")
    assert msgs["relative-python"] == "python of relative-python must be an absolute path, got 'python3'"
    assert msgs["bad-timeout"] == "bad readiness options for bad-timeout: command_timeout must be more than 0 (got 0.0)"
    assert msgs["unknown-option"].startswith("bad readiness options for unknown-option: ") and "venv_path" in msgs["unknown-option"]
    assert msgs["bad-vmid"] == "vmid of bad-vmid must be an integer from 100 to 999999999, got 7"
    assert msgs["hostile-vmid"] == "vmid of hostile-vmid must be an integer from 100 to 999999999, got '100; touch /tmp/x'"
    assert msgs["bad-method"] == "method of bad-method must be one of pct, lxc-attach, got 'ssh'"


@pytest.mark.parametrize("args, msg", [
    ({"containers": [{"host": "a"}, {"host": "a"}]}, "containers: each host may be listed once; listed more than once: a"),
    ({"containers": [], "max_parallel": -1}, "max_parallel must be at least 0 (got -1)"),
    ({"containers": [], "container_timeout": 0}, "container_timeout must be more than 0 (got 0.0)"),
])
def test_node_readiness_refuses_bad_options(run_module, args, msg):
    res = run_module(node_readiness.main, args)
    assert res["failed"] is True and res["msg"] == msg


# ----------------------------------------------------------------------------- readiness's action
# The action runs the reads through the bootstrap over the task's connection; the module is sent
# only when the bootstrap cannot be used. A real ansible-playbook on localhost (local connection)
# runs both ways on the same rig; -vvv shows each command run on the target, so the bootstraps
# are counted there.

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
PLAY = """
- hosts: localhost
  gather_facts: false
  vars:
    ansible_python_interpreter: "{{ python }}"
  tasks:
    - name: "{{ item.name }}"
      gpufleet.hygiene.readiness:
      args: "{{ item.args }}"
      vars:
        gpufleet_readiness_bootstrap: "{{ item.bootstrap | default(true) }}"
        ansible_python_interpreter: "{{ item.python | default(python) }}"
      environment: "{{ item.env | default({}) }}"
      register: reading
      # Every run goes on and keeps its result: the tests assert each one's msg (a failure's
      # reason, or none), so a failure that should not be there fails the test.
      failed_when: false
      loop: "{{ runs }}"
      loop_control: {label: "{{ item.name }}"}
    - name: Keep them
      ansible.builtin.copy:
        content: "{{ dict(reading.results | map(attribute='item.name') | zip(reading.results)) | to_json }}"
        dest: "{{ out }}"
        mode: "0600"
"""


# Whose reading it is, for record (the verify role gives inventory_hostname, the node and the VMID).
WHOSE = {"host": "train-100", "node": "pve1", "vmid": 100}

# The launcher's call, as -vvv's EXEC lines show it (within the shell's quoting).
LAUNCHED = "exec(json.loads(sys.stdin.buffer.readline()))"


def ansible_playbook(tmp_path, text, *args, rc=0):
    """Run the playbook text at -vvv with pipelining on, from the repository (its ansible.cfg); its
    output, once its exit status is rc."""
    (tmp_path / "play.yml").write_text(text)
    env = dict(os.environ, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_PIPELINING="1")
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ansible-playbook"), str(tmp_path / "play.yml"), "-vvv", *args],
                          cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, timeout=300)
    assert proc.returncode == rc, proc.stdout[-3000:]
    return proc.stdout


def play(tmp_path, runs, bootstraps):
    """Run PLAY with runs [{name, args, bootstrap?, python?, env?}]; {name: result}. Exactly
    `bootstraps` of them ran the bootstrap (the others sent the module or ran nothing)."""
    extra = {"runs": runs, "python": sys.executable, "out": str(tmp_path / "out.json")}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    out = ansible_playbook(tmp_path, PLAY, "-i", "localhost,", "-c", "local", "-e", "@" + str(tmp_path / "extra.json"))
    assert out.count(LAUNCHED) == bootstraps
    with open(tmp_path / "out.json") as f:
        return json.load(f)


def test_the_action_reads_as_the_module_does_without_sending_it(rig, tmp_path):
    job = rig["trainers"].start(gpu=1, mib=40960)
    with open(rig["baseline"], "w") as f:
        f.write("\n".join(pins(SEED_BASE)) + "\n")
    args = args_of(rig, baseline=rig["baseline"], verify_files=True)
    got = play(tmp_path, [
        {"name": "bootstrap", "args": args},
        {"name": "module", "args": args, "bootstrap": False},
        {"name": "bootstrap-brief", "args": dict(args, brief=True)},
        {"name": "module-brief", "args": dict(args, brief=True), "bootstrap": False},
        {"name": "bootstrap-record", "args": dict(args, record=WHOSE)},
        {"name": "module-record", "args": dict(args, record=WHOSE), "bootstrap": False},
    ], bootstraps=3)
    boot, mod = got["bootstrap"], got["module"]
    assert "msg" not in boot and "msg" not in mod  # failed_when: false leaves a failure its msg
    for name in ("processes", "gpu_state", "cuda_contamination", "pip_inventory", "torch_cache"):
        assert stable(boot[name]) == stable(mod[name]), name
    assert boot["checks"] == mod["checks"] and boot["ready"] is mod["ready"] is False and boot["running_job"] is True
    assert [p["pid"] for p in boot["processes"]["processes"]] == [job.pid]
    # brief: only what the verify role records, the same both ways and the same as the full reading's.
    short, short_mod = got["bootstrap-brief"], got["module-brief"]
    for result in (short, short_mod):
        assert not set(result) & {"processes", "gpu_state", "cuda_contamination", "pip_inventory", "torch_cache"}
        assert result["checks"] == boot["checks"] and result["ready"] is False and result["running_job"] is True
        assert result["contaminants"] == boot["cuda_contamination"]["contaminants"]
        assert result["caches"] == boot["torch_cache"]["caches"]
        assert [stable(g) for g in result["gpus"]] == [stable(g) for g in boot["gpu_state"]["gpus"]]
    # record: the brief reading as the verify role's record, both ways: what verify_record makes of it.
    expected = verify_record(short, "train-100", "pve1", 100)
    for name in ("bootstrap-record", "module-record"):
        rec = {k: v for k, v in got[name].items() if k not in ("changed", "failed", "failed_when_result", "invocation", "item", "ansible_loop_var")}
        assert set(rec) == set(expected), name
        assert {k: v for k, v in rec.items() if k != "gpus"} == {k: v for k, v in expected.items() if k != "gpus"}, name
        assert [stable(g) for g in rec["gpus"]] == [stable(g) for g in expected["gpus"]], name
        assert (rec["host"], rec["node"], rec["vmid"], rec["remediated"], rec["error"]) == ("train-100", "pve1", 100, False, None)


def test_the_action_expands_paths_on_the_target_and_says_what_is_wrong(rig, tmp_path):
    home = os.path.dirname(rig["venv"])
    tilde = args_of(rig, venv="~/" + os.path.basename(rig["venv"]), brief=True)
    assert home != os.path.expanduser("~")  # so that ~ expanded on the controller would miss the venv
    got = play(tmp_path, [
        {"name": "tilde", "args": tilde, "env": {"HOME": home}},
        {"name": "tilde-module", "args": tilde, "env": {"HOME": home}, "bootstrap": False},
        {"name": "bad-type", "args": args_of(rig, threshold_mib="lots")},
        {"name": "unknown", "args": args_of(rig, venv_path="/opt/venv")},
        {"name": "bad-timeout", "args": args_of(rig, command_timeout=0)},
        {"name": "no-python", "args": args_of(rig), "python": "/nonexistent/python3"},
        {"name": "no-python-brief", "args": args_of(rig, brief=True), "python": "/nonexistent/python3"},
        {"name": "no-python-module-brief", "args": args_of(rig, brief=True), "python": "/nonexistent/python3", "bootstrap": False},
        {"name": "bad-type-brief", "args": args_of(rig, threshold_mib="lots", brief=True)},
        {"name": "discover", "args": args_of(rig, brief=True), "python": "auto_silent"},
        {"name": "no-python-record", "args": args_of(rig, record=dict(WHOSE, node="", vmid=None)), "python": "/nonexistent/python3"},
    ], bootstraps=4)  # tilde, no-python, no-python-brief, no-python-record
    for name in ("tilde", "tilde-module"):
        names = {c["name"] for c in got[name]["contaminants"]}
        assert {"nvidia-nccl-cu13", "sglang-kernel"} <= names, (name, got[name])
    assert "msg" not in got["tilde"]
    assert "threshold_mib" in got["bad-type"]["msg"] and "int" in got["bad-type"]["msg"]
    assert "venv_path" in got["unknown"]["msg"]
    assert got["bad-timeout"]["msg"] == "command_timeout must be more than 0 (got 0.0)"
    assert got["no-python"]["msg"].startswith("no Python at /nonexistent/python3 in localhost (exit status 127)"), got["no-python"]["msg"]
    # brief: the call's failure becomes every check it would have made, failed with its message.
    assert [c["name"] for c in got["no-python-brief"]["checks"]] == ["gpu_idle", "job_live", "job_libraries", "venv_clean", "caches_fresh"]
    assert all(c["summary"] == got["no-python-brief"]["msg"] and not c["ok"] for c in got["no-python-brief"]["checks"])
    # The same when the module was sent (its transport failed) or the options were refused.
    for name in ("no-python-module-brief", "bad-type-brief"):
        reading = got[name]
        assert [c["name"] for c in reading["checks"]] == ["gpu_idle", "job_live", "job_libraries", "venv_clean", "caches_fresh"], (name, reading)
        assert reading["msg"] and all(c["summary"] == reading["msg"] and c["error"] and not c["ok"] for c in reading["checks"])
        assert reading["ready"] is False and reading["gpus"] == []
    assert "threshold_mib" in got["bad-type-brief"]["msg"]
    # With record as well, recorded (an empty node and no VMID as null), the call still failed.
    rec = got["no-python-record"]
    assert rec["failed"] is False and rec["failed_when_result"] is False  # failed_when: false, as in the verify role
    assert rec["msg"].startswith("no Python at /nonexistent/python3") and rec["ready"] is False
    assert [c["name"] for c in rec["checks"]] == ["gpu_idle", "job_live", "job_libraries", "venv_clean", "caches_fresh"]
    assert all(c["summary"] == rec["msg"] and not c["ok"] for c in rec["checks"])
    assert (rec["host"], rec["node"], rec["vmid"], rec["error"]) == ("train-100", None, None, None)
    # An interpreter still to be discovered: the module is sent, which discovers it (whether the
    # interpreter found works is this machine's business; the bootstrap was not counted above).
    assert got["discover"]["ansible_facts"]["discovered_interpreter_python"]


def test_with_record_unreachable_stays_unreachable_and_refused_options_fail_the_task(tmp_path):
    """As the verify role runs it (record, failed_when: false): a container that cannot be reached
    stays unreachable (ansible-core's count) and registers a record all the same - not ready, no
    check (nothing was read), error set to the connection's message - both ways (the bootstrap and
    the module, whose temporary directory is never made); options that cannot be used fail the
    task whatever failed_when says, as ansible-core's validation of the role's variables would."""
    with socket.socket() as sock:  # a port on loopback that nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = "ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=%d ansible_python_interpreter=/usr/bin/python3" % port
    (tmp_path / "inv.ini").write_text(
        "gone-bootstrap %s gpufleet_readiness_bootstrap=true\n"
        "gone-module %s gpufleet_readiness_bootstrap=false\n"
        "bad-option ansible_connection=local ansible_python_interpreter=%s threshold=lots\n"
        "localhost ansible_connection=local ansible_python_interpreter=%s\n" % (gone, gone, sys.executable, sys.executable))
    out = ansible_playbook(tmp_path, """
# localhost stays in the play (ansible-playbook stops when a play has no host left) to keep the others' results.
- hosts: gone-bootstrap,gone-module,bad-option,localhost
  gather_facts: false
  tasks:
    - gpufleet.hygiene.readiness:
        venv: /opt/venv
        threshold_mib: "{{ threshold | default(64) }}"
        record: {host: "{{ inventory_hostname }}", node: pve9, vmid: 900}
      register: reading
      failed_when: false
      when: inventory_hostname != 'localhost'
    - ansible.builtin.debug: {msg: still here}
      when: inventory_hostname != 'localhost'
    - ansible.builtin.copy:
        content: "{{ ['gone-bootstrap', 'gone-module', 'bad-option'] | map('extract', hostvars, 'reading') | list | to_json }}"
        dest: "%s"
        mode: "0600"
      when: inventory_hostname == 'localhost'
""" % (tmp_path / "out.json"), "-i", str(tmp_path / "inv.ini"), rc=4)  # a host unreachable (and one failed)
    for host in ("gone-bootstrap", "gone-module"):
        assert re.search(r"^%s +: ok=0 .*unreachable=1 +failed=0" % host, out, re.MULTILINE), out[-2000:]
    assert re.search(r"^bad-option +: ok=0 .*unreachable=0 +failed=1", out, re.MULTILINE), out[-2000:]
    assert "still here" not in out
    gone_bootstrap, gone_module, bad = json.loads((tmp_path / "out.json").read_text())
    for rec in (gone_bootstrap, gone_module):
        assert rec["unreachable"] is True and rec["failed"] is False, rec  # failed: the failed_when's, which does not count first
        # ansible-core's ssh plugin says one of two things, by a race it does not control: ssh's own
        # "Connection refused", or - where ssh exits before the module is written to its stdin
        # (pipelining) - that the data could not be sent, with the broken pipe.
        assert re.search(r"Connection refused|Data could not be sent to remote host '127\.0\.0\.1'.*Broken pipe",
                         rec["msg"]), rec["msg"]
        assert rec["error"] == rec["msg"]
        assert (rec["host"], rec["node"], rec["vmid"], rec["ready"], rec["running_job"]) == (rec["host"], "pve9", 900, False, False)
        assert rec["checks"] == rec["gpus"] == rec["contaminants"] == rec["caches"] == []
    assert bad["failed"] is True and "checks" not in bad, bad
    assert "threshold_mib" in bad["msg"] and "int" in bad["msg"], bad["msg"]


def test_a_delegated_call_starts_the_delegates_python(tmp_path):
    """delegate_to: the bootstrap runs with the delegate's interpreter, as the module would, not
    with the task host's (here a path that does not exist)."""
    (tmp_path / "inv.ini").write_text("elsewhere ansible_connection=local ansible_python_interpreter=/nonexistent/python3\n"
                                      "localhost ansible_connection=local ansible_python_interpreter=%s\n" % sys.executable)
    out = ansible_playbook(tmp_path, """
- hosts: elsewhere
  gather_facts: false
  tasks:
    - gpufleet.hygiene.readiness: {require_gpu: false, brief: true}
      delegate_to: localhost
      register: reading
    - ansible.builtin.copy: {content: "{{ reading | to_json }}", dest: "%s", mode: "0600"}
      delegate_to: localhost
""" % (tmp_path / "out.json"), "-i", str(tmp_path / "inv.ini"))
    assert out.count(LAUNCHED) == 1
    reading = json.loads((tmp_path / "out.json").read_text())
    assert reading["checks"][0]["name"] == "gpu_idle" and "msg" not in reading


def _ppid(pid):
    with open("/proc/%d/stat" % pid) as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_a_job_that_stops_writing_its_log_is_stalled(run_module, rig, tmp_path):
    """A real job writing its log, then hung (SIGSTOP): it still matches the patterns, its log no
    longer grows. Running first, stalled once stall_after has passed; the GPU check alone would
    have let it pass as the running job."""
    log = tmp_path / "train.log"
    with open(log, "ab") as out:
        job = subprocess.Popen([sys.executable, gpu_standin.TRAINER, "--state", rig["state"], "--gpu", "0", "--mib", "2048",
                                "--log-throughput", "20000", "--log-every", "0.1"],
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while log.read_text().count("tokens/s") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        args = args_of(rig, venv=None, allow_running_job=True, job_log=str(log), stall_after=2, job_baseline_tokens_per_s=21000)
        res = run_module(readiness.main, args)
        live = res["checks"][1]
        assert live["name"] == "job_live" and live["ok"] is True and live["state"] == "running", live
        assert live["summary"].startswith("job running (pid %d), its log grew " % job.pid)
        # The last reading the job logged, against the inventory's baseline (the reports show both).
        assert live["throughput"] == {"tokens_per_s": 20000.0, "baseline": 21000.0, "ratio": 0.9524}, live
        assert live["summary"].endswith("; last 20000 tok/s (95% of the 21000 baseline)"), live["summary"]
        # Below the throughput gate's floor (90% of the baseline) it runs, but is not the run the
        # inventory describes: the seed's contaminated run made 64% of its baseline.
        slow = run_module(readiness.main, dict(args, job_baseline_tokens_per_s=25000))["checks"][1]
        assert slow["ok"] is False and slow["slow"] is True and slow["state"] == "running", slow
        assert slow["summary"].endswith("; last 20000 tok/s (80% of the 25000 baseline); below its floor (90% of the baseline): "
                                        "not the run the inventory describes"), slow["summary"]
        os.kill(job.pid, signal.SIGSTOP)  # hung: alive, matching, holding its GPU, writing nothing
        size = log.stat().st_size
        time.sleep(3)
        assert log.stat().st_size == size
        res = run_module(readiness.main, args)
        live = res["checks"][1]
        assert live["ok"] is False and live["state"] == "stalled" and res["ready"] is False
        assert re.match(r"job \(pid %d\) stalled: its log %s has not grown for \d+s \(stall_after 2s\)$" % (job.pid, re.escape(str(log))),
                        live["summary"]), live["summary"]
        assert res["checks"][0]["ok"] is True  # gpu_idle: held by the (stalled) job, allowed
        assert res["running_job"] is True and res["liveness"]["log"]["age_s"] > 2
    finally:
        job.kill()
        job.wait(timeout=10)


def test_a_worker_whose_job_was_killed_is_a_leftover_and_is_stopped(run_module, rig):
    """A job starts a GPU worker (whose command line matches none of the job's patterns), then the
    job is killed: the worker, reparented to init, is a leftover; the repair's scope stops it."""
    state = rig["state"]
    code = ("import subprocess, sys, time\np = subprocess.Popen(sys.argv[1:])\nprint(p.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code, sys.executable, gpu_standin.TRAINER, "--gpu", "0", "--mib", "4096",
                               "--state", state, "--tag", "worker"], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 20
        while not os.path.exists(os.path.join(state, "claims", "%d.json" % worker)) and time.monotonic() < deadline:
            time.sleep(0.05)
        # While its parent lives, the worker is not left over (its parent is no job either: not a leftover, a foreign holder).
        res = run_module(readiness.main, args_of(rig, venv=None, allow_running_job=True))
        assert res["checks"][1]["ok"] is True and res["liveness"]["leftovers"] == []
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _ppid(worker) != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _ppid(worker) == 1, "no reparenting to init on this machine (a subreaper?)"
        # No job runs now: whose a holder is comes from the job's users (gpufleet_job.users).
        res = run_module(readiness.main, args_of(rig, venv=None, allow_running_job=True))
        assert res["checks"][1]["ok"] is True and res["liveness"]["leftovers"] == []
        res = run_module(readiness.main, args_of(rig, venv=None, allow_running_job=True, job_users=["root"]))
        live = res["checks"][1]
        assert live["ok"] is False and live["state"] == "none" and res["ready"] is False
        assert [h["pid"] for h in live["leftovers"]] == [worker] and "--tag worker" in live["leftovers"][0]["cmdline"]
        assert "1 GPU holder(s) left by a job that is gone (parent is init): pid %d " % worker in live["summary"]
        # What the repair role asks of processes: the leftover by its PID and start time.
        scope = {"pids": [{"pid": h["pid"], "start_time": h["start_time"]} for h in live["leftovers"]]}
        done = run_module(processes.main, {"scope": scope, "state": "absent", "grace_period": 5})
        assert [t["pid"] for t in done["terminated"]] == [worker]
        deadline = time.monotonic() + 10
        while os.path.exists("/proc/%d" % worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists("/proc/%d" % worker)
    finally:
        if parent.poll() is None:
            parent.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def comm(pid):
    with open("/proc/%d/comm" % pid) as f:
        return f.read().strip()


def test_job_libraries_names_the_other_majors_library_the_job_maps(run_module, rig, tmp_path):
    """The seed's case: the job (the training stand-in) really dlopens the venv's libnccl.so.2, which
    nvidia-nccl-cu13 overwrote in this torch cu128 venv: job_libraries fails naming the process, the
    file, its package and what to do. A job that maps only the venv's CUDA 12 runtime passes."""
    site = os.path.realpath(glob.glob(os.path.join(rig["venv"], "lib", "python3*", "site-packages"))[0])
    cudart12 = site + "/nvidia/cuda_runtime/lib/libcudart.so.12"
    nccl = site + "/nvidia/nccl/lib/libnccl.so.2"
    build_shared_object(str(tmp_path / "c13"), "libcudart.so.13")  # the cu13 NCCL's DT_NEEDED, from outside the venv
    cudart13 = str(tmp_path / "c13" / "libcudart.so.13")
    clean = rig["trainers"].start(gpu=0, dlopen=[cudart12])
    res = run_module(readiness.main, args_of(rig, allow_running_job=True))
    check = next(c for c in res["checks"] if c["name"] == "job_libraries")
    assert check == {"name": "job_libraries", "severity": "fail", "ok": True, "error": False, "libraries": [],
                     "summary": "1 process(es) map 1 CUDA-side library, all for CUDA 12.8 from the venv"}
    [proc] = res["job_libraries"]["processes"]
    assert proc["pid"] == clean.pid and [lib["path"] for lib in proc["libraries"]] == [cudart12]

    bad = rig["trainers"].start(gpu=1, dlopen=[cudart13, nccl])
    res = run_module(readiness.main, args_of(rig, allow_running_job=True))
    check = next(c for c in res["checks"] if c["name"] == "job_libraries")
    assert check["ok"] is False and check["error"] is False and res["ready"] is False
    by_path = dict((lib["path"], lib) for lib in check["libraries"])
    assert set(by_path) == {cudart13, nccl}
    assert by_path[nccl] == {"pid": bad.pid, "comm": comm(bad.pid),
                             "path": nccl, "package": "nvidia-nccl-cu13", "package_version": "2.28.9", "cuda_major": 13,
                             "deleted": False, "reasons": ["CUDA 13, torch is CUDA 12.8"]}
    assert by_path[cudart13]["package"] is None
    assert by_path[cudart13]["reasons"] == ["CUDA 13, torch is CUDA 12.8", "mapped from outside the venv, which ships %s" % cudart12]
    assert ("pid %d %s maps %s (nvidia-nccl-cu13 2.28.9): CUDA 13, torch is CUDA 12.8" % (bad.pid, comm(bad.pid), nccl)
            in check["summary"])
    assert check["summary"].startswith("2 wrong libraries mapped by the running job: ")
    assert check["summary"].endswith("; stop the job, purge the venv (the remediate playbook) and relaunch it")
    # Hygiene beside a running job: read, never touched.
    assert bad.poll() is None and clean.poll() is None
    # Off: the check is not made, the maps not read.
    res = run_module(readiness.main, args_of(rig, allow_running_job=True, job_libraries=False))
    assert "job_libraries" not in [c["name"] for c in res["checks"]]
    assert res["job_libraries"] == {"changed": False, "skipped": True, "skip_reason": "job_libraries=false"}


def test_job_libraries_without_the_venv_s_reference_judges_no_major_and_does_not_fail(run_module, rig, tmp_path):
    """A venv whose torch is gone has no reference CUDA: venv_clean fails on it and says what to
    set. job_libraries does not fail a second time for the same cause: it reads what the job maps
    and says that the majors were not judged; a deleted library would still fail it."""
    site = os.path.realpath(glob.glob(os.path.join(rig["venv"], "lib", "python3*", "site-packages"))[0])
    for info in glob.glob(os.path.join(site, "torch-*.dist-info")):
        os.rename(info, os.path.join(str(tmp_path), os.path.basename(info)))
    cudart12 = site + "/nvidia/cuda_runtime/lib/libcudart.so.12"
    job = rig["trainers"].start(gpu=0, dlopen=[cudart12])
    res = run_module(readiness.main, args_of(rig, allow_running_job=True))
    checks = dict((c["name"], c) for c in res["checks"])
    assert checks["venv_clean"]["ok"] is False and "no reference CUDA" in checks["venv_clean"]["summary"]
    lib = checks["job_libraries"]
    assert lib["ok"] is True and lib["error"] is False and lib["libraries"] == [], (lib["summary"], lib["libraries"])
    assert lib["summary"].startswith("1 process(es) map 1 CUDA-side library from the venv, none deleted; "
                                     "their CUDA majors not judged: no reference CUDA")
    [proc] = res["job_libraries"]["processes"]
    assert proc["pid"] == job.pid and [m["path"] for m in proc["libraries"]] == [cudart12]
