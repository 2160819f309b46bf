# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""gpu_state against the nvidia-smi STAND-IN, with REAL training stand-in processes killed by
REAL signals; plus the module's result for mocked nvidia-smi output."""

from __future__ import annotations

import json
import os
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _query, _smi, _state
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc
from ansible_collections.gpufleet.hygiene.plugins.modules import gpu_state
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin


class Rig(object):
    def __init__(self, tmp_path, gpus=2, **config):
        self.state = gpu_standin.make_state(tmp_path / "gpu", gpus=gpus, **config)
        self.smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", self.state)
        self.trainers = gpu_standin.Trainers(self.state)

    def args(self, vantage="container", **kw):
        args = {"nvidia_smi": self.smi, "vantage": vantage, "poll_interval": 0.05, "timeout": 5,
                "device_patterns": [os.path.join(self.state, "dev", "nvidia*")]}
        args.update(kw)
        return args


@pytest.fixture(autouse=True)
def target_side(monkeypatch):
    """Modules run on targets: when another test in this worker has loaded controller code,
    module warnings would go to the controller's display instead of the result."""
    from ansible.module_utils import _internal
    monkeypatch.setattr(_internal, "is_controller", False)


@pytest.fixture
def rig(tmp_path):
    r = Rig(tmp_path, release_delay=0.2)
    try:
        yield r
    finally:
        r.trainers.cleanup()


def gpu_of(result, index):
    return [g for g in result["gpus"] if g["index"] == index][0]


# ----------------------------------------------------------------------------- query


@pytest.mark.parametrize("vantage", ["node", "container"])
def test_query_reports_holder_pid_and_memory(rig, run_module, vantage):
    p = rig.trainers.start(gpu=1, mib=40960)
    res = run_module(gpu_state.main, rig.args(vantage=vantage))
    assert res["changed"] is False and res["vantage"] == vantage and res["backend"] == "nvidia-smi"
    assert res["gpu_available"] is True and res["idle"] is False
    g0, g1 = gpu_of(res, 0), gpu_of(res, 1)
    assert g0["idle"] is True and g0["processes"] == [] and g0["memory_used_mib"] == 0
    assert g1["idle"] is False and g1["memory_used_mib"] == 40960 and g1["memory_total_mib"] == 143771
    assert g1["name"] == "NVIDIA H200" and g1["uuid"].startswith("GPU-") and g1["utilization_pct"] == 90
    [proc] = g1["processes"]
    assert proc["pid"] == p.pid and proc["used_memory_mib"] == 40960
    assert proc["vmid"] is None and proc["container_pid"] == p.pid  # not in an LXC container here
    assert "train_dflash.py" in proc["cmdline"]
    if vantage == "container":
        assert proc["devices"] == [gpu_standin.device(rig.state, 1)]


@pytest.mark.parametrize("vantage", ["node", "container"])
def test_processes_are_asked_for_only_where_they_are_used(rig, run_module, tmp_path, vantage):
    """A node's holders are nvidia-smi's process list: both queries, always. In a container the
    holders are the open device files, and the process list only adds their memory: an idle
    container costs one nvidia-smi run, a held GPU two, with the holder's memory as before."""
    log = tmp_path / "nvidia-smi.calls"
    logged = tmp_path / "logged" / "nvidia-smi"
    logged.parent.mkdir()
    logged.write_text('#!/bin/sh\necho "${1%%%%=*}" >> "%s"\nexec "%s" "$@"\n' % (log, rig.smi))
    logged.chmod(0o755)

    def calls():
        asked = sorted(log.read_text().split()) if log.exists() else []
        log.unlink(missing_ok=True)
        return asked

    both = ["--query-compute-apps", "--query-gpu"]
    idle = run_module(gpu_state.main, rig.args(vantage=vantage, nvidia_smi=str(logged)))
    assert idle["idle"] is True and idle["vantage"] == vantage
    assert calls() == (both if vantage == "node" else ["--query-gpu"])
    p = rig.trainers.start(gpu=1, mib=2048)
    held = run_module(gpu_state.main, rig.args(vantage=vantage, nvidia_smi=str(logged)))
    assert calls() == both
    [proc] = gpu_of(held, 1)["processes"]
    assert (proc["pid"], proc["used_memory_mib"]) == (p.pid, 2048)
    assert gpu_of(held, 0)["processes"] == []


def test_query_selects_gpus_by_index_and_uuid(rig, run_module):
    uuid1 = gpu_standin.read_config(rig.state)["gpus"][1]["uuid"]
    res = run_module(gpu_state.main, rig.args(gpus=[uuid1.lower()]))
    assert [g["index"] for g in res["gpus"]] == [1]
    res = run_module(gpu_state.main, rig.args(gpus=["7"]))
    assert res["failed"] and "GPU '7' was not found; this host has: 0 (GPU-" in res["msg"]


def test_module_result_for_mocked_nvidia_smi(monkeypatch, run_module):
    """Inputs, the exact argv, the mocked outputs, and the module's parsed result."""
    calls = []
    outputs = {
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu":
            "0, GPU-aaa, NVIDIA H200, 41498, 143771, [N/A]\n",
        "--query-compute-apps=gpu_uuid,pid,used_memory,process_name":
            "GPU-aaa, 4000000, 41488, /srv/my runs/python3\n",
    }

    class Popen(object):
        def __init__(self, argv, **_kw):
            calls.append(argv)
            self.returncode, self.pid, self._out = 0, 4000001, outputs[argv[1]].encode()

        def communicate(self, timeout=None):
            return self._out, b""

    monkeypatch.setattr(_smi.subprocess, "Popen", Popen)
    res = run_module(gpu_state.main, {"nvidia_smi": "/opt/nv/nvidia-smi", "vantage": "node"})
    assert calls == [["/opt/nv/nvidia-smi", "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
                      "--format=csv,noheader,nounits"],
                     ["/opt/nv/nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
                      "--format=csv,noheader,nounits"]]
    [g] = res["gpus"]
    assert (g["memory_used_mib"], g["utilization_pct"], g["idle"]) == (41498, None, False)
    [p] = g["processes"]  # a PID this /proc does not have (pid_max is far lower)
    assert (p["pid"], p["name"], p["used_memory_mib"], p["start_time"]) == (4000000, "/srv/my runs/python3", 41488, None)


def test_nvml_backend_is_used_when_importable(monkeypatch, run_module):
    class Mem(object):
        used, total = 2048 * 1048576, 143771 * 1048576

    class Proc(object):
        pid, usedGpuMemory = 4000000, 2000 * 1048576

    class Util(object):
        gpu = 55

    class FakeNvml(object):
        NVMLError = RuntimeError
        nvmlInit = nvmlShutdown = staticmethod(lambda: None)
        nvmlDeviceGetCount = staticmethod(lambda: 1)
        nvmlDeviceGetHandleByIndex = staticmethod(lambda i: i)
        nvmlDeviceGetUUID = staticmethod(lambda h: "GPU-nvml")
        nvmlDeviceGetName = staticmethod(lambda h: "NVIDIA H200")
        nvmlDeviceGetMemoryInfo = staticmethod(lambda h: Mem())
        nvmlDeviceGetUtilizationRates = staticmethod(lambda h: Util())
        nvmlDeviceGetComputeRunningProcesses = staticmethod(lambda h: [Proc()])
        nvmlSystemGetProcessName = staticmethod(lambda pid: b"python3")

    monkeypatch.setattr(_query, "import_pynvml", lambda: FakeNvml)
    monkeypatch.setattr(gpu_state.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    res = run_module(gpu_state.main, {"vantage": "node"})
    assert res["backend"] == "nvml"
    [g] = res["gpus"]
    assert (g["uuid"], g["memory_used_mib"], g["utilization_pct"]) == ("GPU-nvml", 2048, 55)
    assert [(p["pid"], p["name"], p["used_memory_mib"]) for p in g["processes"]] == [(4000000, "python3", 2000)]
    # an explicit nvidia_smi is what gets asked in auto
    res = run_module(gpu_state.main, {"vantage": "node", "nvidia_smi": "/nonexistent/nvidia-smi"})
    assert res["failed"] and "cannot run /nonexistent/nvidia-smi" in res["msg"]


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize("rc, words", [(9, "driver is not loaded"), (12, "libnvidia-ml.so was not found"),
                                       (15, "fallen off the bus")])
def test_exit_codes_fail_clearly(rig, run_module, rc, words):
    gpu_standin.configure(rig.state, fault="exit:%d" % rc)
    res = run_module(gpu_state.main, rig.args())
    assert res["failed"] and res["rc"] == rc and words in res["msg"]
    assert "Traceback" not in res["msg"]


def test_hang_is_bounded(rig, run_module):
    gpu_standin.configure(rig.state, fault="hang", hang_seconds=30)
    started = time.monotonic()
    res = run_module(gpu_state.main, rig.args(command_timeout=0.5))
    assert res["failed"] and res["error_kind"] == "timeout" and "did not answer within 0.5s" in res["msg"]
    assert time.monotonic() - started < 5


def test_no_nvidia_smi(tmp_path, run_module, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_query, "import_pynvml", lambda: None)
    monkeypatch.setattr(gpu_state.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: None)
    res = run_module(gpu_state.main, {})
    assert res["failed"] and "nvidia-smi was not found on PATH" in res["msg"] and "require_gpu=false" in res["msg"]
    res = run_module(gpu_state.main, {"require_gpu": False})
    assert not res.get("failed") and res["gpu_available"] is False and res["idle"] is True and res["gpus"] == []
    assert "nvidia-smi was not found" in res["reason"]


@pytest.mark.parametrize("rc, tolerated", [(9, True), (12, True), (15, False)])
def test_require_gpu_false(rig, run_module, rc, tolerated):
    gpu_standin.configure(rig.state, fault="exit:%d" % rc)
    res = run_module(gpu_state.main, rig.args(require_gpu=False))
    assert bool(res.get("failed")) is not tolerated
    if tolerated:
        assert res["gpu_available"] is False and res["warnings"]


def test_bad_input_fails_cleanly(rig, run_module):
    res = run_module(gpu_state.main, rig.args(state="idle"))
    assert res["failed"] and "scope" in res["msg"]
    res = run_module(gpu_state.main, rig.args(state="idle", scope={"cmdline": ["("]}))
    assert res["failed"] and "invalid regular expression" in res["msg"]
    res = run_module(gpu_state.main, rig.args(state="idle", scope={"vmids": [200]}))
    assert res["failed"] and "vantage=node" in res["msg"]
    res = run_module(gpu_state.main, rig.args(timeout=-1))
    assert res["failed"] and res["msg"] == "timeout must be at least 0 (got -1.0)"
    res = run_module(gpu_state.main, rig.args(command_timeout=0))
    assert res["failed"] and res["msg"] == "command_timeout must be more than 0 (got 0.0)"


# ----------------------------------------------------------------------------- drain


def test_drained_waits_for_the_driver_to_release(rig, run_module):
    gpu_standin.configure(rig.state, release_delay=0.6)
    p = rig.trainers.start(gpu=0, mib=2048)
    first = run_module(gpu_state.main, rig.args())
    assert gpu_of(first, 0)["memory_used_mib"] == 2048
    p.kill()
    p.wait()
    res = run_module(gpu_state.main, rig.args(state="drained", gpus=["0"]))
    assert not res.get("failed") and res["idle"] is True and res["changed"] is False
    assert gpu_of(res, 0)["memory_used_mib"] == 0
    assert 0.4 <= res["drain_seconds"] < 3  # waited for the lingering memory, not only the process


def test_drained_timeout_names_gpu_and_holder(rig, run_module):
    p = rig.trainers.start(gpu=1, mib=4096, tag="stale")
    started = time.monotonic()
    res = run_module(gpu_state.main, rig.args(state="drained", timeout=0.4))
    assert res["failed"] and time.monotonic() - started < 3
    assert "GPU 1 (NVIDIA H200, GPU-" in res["msg"] and "did not drain within 0.4s" in res["msg"]
    assert "pid %d python" % p.pid in res["msg"] and "4096 MiB used" in res["msg"]
    assert gpu_of(res, 1)["processes"][0]["pid"] == p.pid
    assert p.poll() is None  # drained never signals


def test_gpu_that_never_drains(tmp_path, run_module):
    r = Rig(tmp_path, release_delay=0.05, never_drain=[0])
    try:
        p = r.trainers.start(gpu=0, mib=1000)
        res = run_module(gpu_state.main, r.args(state="idle", scope={"cmdline": ["train_dflash"]}, timeout=0.5))
        assert res["failed"] and "no holder visible from this vantage" in res["msg"]
        assert [t["outcome"] for t in res["terminated"]] == ["terminated"]
        assert gpu_standin.wait_exit(p) is not None
        assert gpu_of(res, 0)["memory_used_mib"] == 1000
    finally:
        r.trainers.cleanup()


def test_a_sliced_drain_says_what_it_waits_for_and_fails_at_the_whole_timeout(rig, run_module):
    """With progress_every, a call waits its slice and returns pending with the busy GPU, its memory and
    holder, and how much of the wait has passed; the call after the holder is gone finds the GPU idle; a
    wait whose whole timeout has passed since started fails naming that timeout."""
    p = rig.trainers.start(gpu=1, mib=4096, tag="stale")
    began = time.time()
    t0 = time.monotonic()
    res = run_module(gpu_state.main, rig.args(state="drained", gpus=["1"], timeout=30, progress_every=1, started=began))
    assert not res.get("failed") and res["pending"] is True and res["changed"] is False
    assert 1 <= time.monotonic() - t0 < 5  # one slice, not the whole 30 s
    assert res["msg"].startswith("waiting for the GPUs to drain, 1 of 30 s: GPU 1 (NVIDIA H200, GPU-"), res["msg"]
    assert "4096 MiB used (threshold 64 MiB), held by pid %d python" % p.pid in res["msg"], res["msg"]
    assert 1 <= res["waited"] < 5 and p.poll() is None  # drained never signals
    p.kill()
    p.wait()
    res = run_module(gpu_state.main, rig.args(state="drained", gpus=["1"], timeout=30, progress_every=1, started=began))
    assert not res.get("failed") and "pending" not in res and res["idle"] is True
    q = rig.trainers.start(gpu=1, mib=4096, tag="stale")
    res = run_module(gpu_state.main, rig.args(state="drained", gpus=["1"], timeout=30, progress_every=1,
                                              started=time.time() - 31))
    assert res["failed"] and "did not drain within 30.0s" in res["msg"] and "pid %d" % q.pid in res["msg"]


def test_a_sliced_idle_names_what_it_stopped_while_the_drain_goes_on(tmp_path, run_module):
    r = Rig(tmp_path, release_delay=0.05, never_drain=[0])
    try:
        p = r.trainers.start(gpu=0, mib=1000)
        res = run_module(gpu_state.main, r.args(state="idle", scope={"cmdline": ["train_dflash"]}, timeout=30,
                                                progress_every=1, started=time.time()))
        assert not res.get("failed") and res["pending"] is True and res["changed"] is True
        assert [(t["pid"], t["outcome"]) for t in res["terminated"]] == [(p.pid, "terminated")]
        assert "GPU 0 (NVIDIA H200" in res["msg"] and "1000 MiB used" in res["msg"] and res["msg"].endswith("no holder")
    finally:
        r.trainers.cleanup()


# ----------------------------------------------------------------------------- ensure idle


@pytest.mark.parametrize("vantage", ["node", "container"])
def test_idle_kills_scope_keeps_decoy(rig, run_module, vantage):
    stale = rig.trainers.start(gpu=0, mib=40960, tag="stale-run")
    stubborn = rig.trainers.start(gpu=0, mib=1024, tag="stale-run", ignore_sigterm=True)
    decoy = rig.trainers.start(gpu=1, mib=512, tag="someone-else")
    args = rig.args(vantage=vantage, state="idle", gpus=["0"], scope={"cmdline": ["--tag stale-run"]},
                    grace_period=0.3)
    res = run_module(gpu_state.main, args)
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] is True and res["vantage"] == vantage
    outcome = dict((t["pid"], (t["signals"], t["outcome"])) for t in res["terminated"])
    assert outcome == {stale.pid: (["SIGTERM"], "terminated"), stubborn.pid: (["SIGTERM", "SIGKILL"], "killed")}
    assert gpu_standin.wait_exit(stale) == 0 and gpu_standin.wait_exit(stubborn) == -9
    assert decoy.poll() is None  # outside the scope, on another GPU: untouched
    assert res["out_of_scope"] == [] and res["idle"] is True and [g["index"] for g in res["gpus"]] == [0]
    assert res["drain_seconds"] >= res["terminate_seconds"] >= 0.3
    again = run_module(gpu_state.main, args)
    assert again["changed"] is False and again["terminated"] == []  # idempotent


def test_idle_on_selected_gpu_reports_out_of_scope_holder(rig, run_module):
    target = rig.trainers.start(gpu=0, mib=2000, tag="mine")
    decoy = rig.trainers.start(gpu=0, mib=3000, tag="theirs")
    res = run_module(gpu_state.main, rig.args(state="idle", gpus=["0"], scope={"cmdline": ["--tag mine"]},
                                              timeout=0.5))
    assert res["failed"] and "pid %d" % decoy.pid in res["msg"]
    assert [t["pid"] for t in res["terminated"]] == [target.pid]
    [other] = res["out_of_scope"]
    assert other["pid"] == decoy.pid and "scope.cmdline" in other["reason"]
    assert gpu_standin.wait_exit(target) == 0
    assert decoy.poll() is None  # the decoy survives


def test_idle_check_mode_signals_nothing(rig, run_module):
    p = rig.trainers.start(gpu=0, mib=2000)
    res = run_module(gpu_state.main, rig.args(state="idle", scope={"name": ["^python"], "allow_broad": True}),
                     check_mode=True)
    assert res["changed"] is True
    assert [(t["pid"], t["outcome"], t["signals"]) for t in res["terminated"]] == [(p.pid, "would_signal", [])]
    time.sleep(0.1)
    assert p.poll() is None and "drain_seconds" not in res


def test_idle_diff_names_the_holders_it_stops(rig, run_module):
    """--diff: the holders in scope (PID, user, command line) before, none after; the plan in check mode."""
    p = rig.trainers.start(gpu=0, mib=2000, tag="mine")
    args = rig.args(state="idle", gpus=["0"], scope={"cmdline": ["--tag mine"]}, timeout=10)
    plan = run_module(gpu_state.main, args, check_mode=True, diff=True)
    [line] = plan["diff"]["before"].splitlines()
    assert line.startswith("pid %d (" % p.pid) and "train_dflash.py --state " in line and plan["diff"]["after"] == ""
    assert p.poll() is None
    done = run_module(gpu_state.main, args, diff=True)
    assert done["diff"] == plan["diff"] and gpu_standin.wait_exit(p) is not None
    assert "diff" not in run_module(gpu_state.main, args, diff=True)  # nothing left to stop


def test_idle_nothing_to_do(rig, run_module):
    res = run_module(gpu_state.main, rig.args(state="idle", scope={"users": [str(os.getuid())]}))
    assert res["changed"] is False and res["terminated"] == [] and res["idle"] is True
    assert res["drain_seconds"] < 1


def test_idle_never_signals_its_own_process(rig, run_module):
    """The module's own process (here: pytest, running main()) holds a GPU and matches the
    scope; it is protected, never signalled."""
    dev = gpu_standin.device(rig.state, 0)
    fd = os.open(dev, os.O_RDONLY)
    me = os.getpid()
    with open(os.path.join(rig.state, "claims", "%d.json" % me), "w") as f:
        json.dump({"pid": me, "start_time": _proc.start_time(me), "gpu": 0, "mib": 700,
                   "device": os.path.realpath(dev)}, f)
    try:
        res = run_module(gpu_state.main, rig.args(vantage="node", state="idle", timeout=0.2,
                                                  scope={"users": [str(os.getuid())]}))
    finally:
        os.close(fd)
    # we are still here: nothing signalled us
    assert res["failed"] and "pid %d" % me in res["msg"]
    assert res["terminated"] == []
    assert [p["pid"] for p in res["protected"]] == [me]
    assert "ancestors" in res["protected"][0]["reason"]


def test_idle_pid_reuse_guard(rig, run_module, monkeypatch):
    """Between choosing a holder and signalling it, its PID comes to name another process."""
    p = rig.trainers.start(gpu=0, mib=2000)
    real = _proc.read_stat

    def reused(pid, proc="/proc"):
        st = real(pid, proc)
        if pid == p.pid and st is not None:
            return st[:3] + (st[3] + 12345,)
        return st

    monkeypatch.setattr(_proc, "read_stat", reused)
    # describe() (choosing) reads the true start time; terminate() sees the "new" one
    monkeypatch.setattr(_state, "describe", _describe_with(real))
    res = run_module(gpu_state.main, rig.args(state="idle", scope={"cmdline": ["train_dflash"]}, timeout=0.2))
    [t] = res["terminated"]
    assert (t["pid"], t["signals"], t["outcome"]) == (p.pid, [], "pid_reused")
    assert res["changed"] is False and res["failed"]
    time.sleep(0.1)
    assert p.poll() is None  # never signalled


def _describe_with(read_stat):
    original = _proc.describe

    def describe(pid, proc="/proc"):
        saved = _proc.read_stat
        _proc.read_stat = read_stat
        try:
            return original(pid, proc)
        finally:
            _proc.read_stat = saved
    return describe


def test_container_single_gpu_under_its_host_minor(tmp_path, run_module):
    """One GPU passed through as /dev/nvidia3 (its host minor): its holder is still found."""
    r = Rig(tmp_path, gpus=1)
    try:
        dev3 = os.path.join(r.state, "dev", "nvidia3")
        open(dev3, "w").close()
        p = r.trainers.start(gpu=0, mib=512, device_path=dev3)
        res = run_module(gpu_state.main, r.args())
        [proc] = gpu_of(res, 0)["processes"]
        assert (proc["pid"], proc["devices"], proc["used_memory_mib"]) == (p.pid, [dev3], 512)
    finally:
        r.trainers.cleanup()
