# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the GPU read's unit tests put in place of the GPU tools: an nvidia-smi script, a missing
NVML, a stub NVML library, and the finding codes of a reading (tests/unit/plugins/module_utils/gpu)."""

from __future__ import annotations

import stat


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
