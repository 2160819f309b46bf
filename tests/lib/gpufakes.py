# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the GPU read's unit tests put in place of the GPU tools: an nvidia-smi script, a recording
Popen, a missing NVML, a stub NVML library and a stub pynvml; the real H200's recorded outputs
(tests/fixtures/h200) and edits of them; the finding codes of a reading
(tests/unit/plugins/module_utils/gpu)."""

from __future__ import annotations

import os
import stat
import types

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _findings
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xml import parse_xml
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "h200")


def fixture(name):
    """A file recorded on the real H200 (tests/fixtures/h200), as text."""
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


H200_XML = fixture("nvidia-smi-q-x.xml")


def health_of_xml(text, pin=None, events=None, problem=None, kernel_log=False):
    driver, gpus = parse_xml(text)
    host = _findings.assess(gpus, driver, pin, events, problem, kernel_log)
    return driver, gpus, host


def edit(old, new, text=H200_XML):
    assert old in text, old
    return text.replace(old, new)


def codes(findings):
    return [f["code"] for f in findings]


def fake_smi(tmp_path, body):
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def no_nvml(name):
    raise OSError("%s: cannot open shared object file" % name)


class StubNvml(object):
    """A library object as ctypes.CDLL gives one: attributes are functions returning NVML codes."""

    def __init__(self, rcs=None, missing=(), mig=False):
        self.rcs = dict(rcs or {})
        self.missing = set(missing)
        self.mig = mig
        self.calls = []

    def __getattr__(self, name):
        if name.startswith("_") or name in self.missing:
            raise AttributeError(name)

        def fn(*args):
            self.calls.append(name)
            rc = self.rcs.get(name, 0)
            if rc == 0:
                self.answer(name, args)
            return rc
        return fn

    def answer(self, name, args):
        def out(i, value):
            args[i]._obj.value = value
        if name == "nvmlSystemGetDriverVersion":
            args[0].value = b"580.159.04"
        elif name in ("nvmlDeviceGetCount_v2", "nvmlDeviceGetMaxMigDeviceCount"):
            out(-1, 1 if name == "nvmlDeviceGetCount_v2" else 2)
        elif name in ("nvmlDeviceGetUUID", "nvmlDeviceGetName"):
            args[1].value = b"GPU-stub" if name.endswith("UUID") else b"NVIDIA H200"
        elif name == "nvmlDeviceGetPciInfo_v3":
            args[1]._obj.bus, args[1]._obj.device = 0, 6
        elif name == "nvmlDeviceGetTotalEccErrors":
            out(3, 4 if (args[1].value, args[2].value) == (1, 0) else 0)
        elif name == "nvmlDeviceGetRemappedRows":
            for i, v in zip(range(1, 5), (0, 1, 1, 0)):
                out(i, v)
        elif name == "nvmlDeviceGetCurrentClocksEventReasons":
            out(1, 0x1 | 0x40)
        elif name in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration"):
            out(1, 5)
        elif name in ("nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth"):
            out(1, 16)
        elif name == "nvmlDeviceGetPersistenceMode":
            out(1, 1)
        elif name == "nvmlDeviceGetMigMode":
            out(1, int(self.mig))
            out(2, int(self.mig))
        elif name == "nvmlDeviceGetMemoryInfo":
            args[1]._obj.total, args[1]._obj.used = 71040 * 1048576, 0


class FakePopen(object):
    """Records argv; answers with canned (rc, stdout) per query kind (the conftest's fake_popen
    fixture puts it in place of subprocess.Popen in gpu/_smi)."""

    calls = []
    answers = {}

    def __init__(self, argv, **kwargs):
        FakePopen.calls.append(list(argv))
        assert kwargs["start_new_session"] is True
        assert kwargs["env"]["LC_ALL"] == "C"
        kind = "gpu" if argv[1].startswith("--query-gpu") else "apps"
        self.returncode, self._out = FakePopen.answers[kind]
        self.pid = 999999

    def communicate(self, timeout=None):
        return self._out.encode(), b""


class NVMLError(Exception):
    pass


class DriverNotLoaded(NVMLError):
    pass


def fake_pynvml(fail_init=None):
    """pynvml as the module imports it: one H200, utilisation not supported, two processes."""
    calls = []
    mod = types.SimpleNamespace(NVMLError=NVMLError, NVMLError_DriverNotLoaded=DriverNotLoaded)

    def init():
        calls.append("init")
        if fail_init:
            raise fail_init
    mod.nvmlInit = init
    mod.nvmlShutdown = lambda: calls.append("shutdown")
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: "h%d" % i
    mod.nvmlDeviceGetUUID = lambda h: b"GPU-aaa"
    mod.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=41498 * 1048576 + 5, total=143771 * 1048576)

    def util(h):
        raise NVMLError("Not Supported")
    mod.nvmlDeviceGetUtilizationRates = util
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=48211, usedGpuMemory=41488 * 1048576),
        types.SimpleNamespace(pid=48212, usedGpuMemory=None)]
    mod.nvmlSystemGetProcessName = lambda pid: b"python3"
    mod.calls = calls
    return mod


def standins_running(state):
    """PIDs of the nvidia-smi stand-ins running on this state directory (it is in their
    environment, not on their command line)."""
    mark = ("%s=%s" % (gpu_standin.STATE_ENV, state)).encode()
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/stat" % pid, "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
        except OSError:
            continue
        if mark in env and not zombie:
            found.add(int(pid))
    return found
