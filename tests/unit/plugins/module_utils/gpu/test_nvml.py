# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""NVML (gpu/_nvml.py): the health read through a stub library object (every field, calls a
driver lacks, a lost GPU, MIG), the state read against a fake pynvml, and the versions of the
kernel module and the library."""

from __future__ import annotations

import types

from gpufakes import StubNvml, codes, fake_pynvml, fixture, no_nvml  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _health, _nvml
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._nvml import kernel_module_version
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import (
    read_gpus,
)


def test_nvml_reader():
    lib = fake_pynvml()
    gpus, apps, backend, _s = read_gpus("auto", "/usr/bin/nvidia-smi", 5, pynvml=lib)
    assert backend == "nvml" and lib.calls == ["init", "shutdown"]
    assert gpus == [{"index": 0, "uuid": "GPU-aaa", "name": "NVIDIA H200", "memory_used_mib": 41498,
                     "memory_total_mib": 143771, "utilization_pct": None}]

    assert apps == [{"gpu_uuid": "GPU-aaa", "pid": 48211, "used_memory_mib": 41488, "name": "python3"},
                    {"gpu_uuid": "GPU-aaa", "pid": 48212, "used_memory_mib": None, "name": "python3"}]


def test_nvml_memory_excludes_the_drivers_reservation():
    """Seen on an H200: NVML's v1 API reports 615 MiB used on a drained GPU (the driver's
    reservation) where nvidia-smi reports 0 MiB; the v2 API keeps them apart."""
    lib = fake_pynvml()
    lib.nvmlMemory_v2 = 0x02000028

    def memory(handle, version=None):
        if version == lib.nvmlMemory_v2:
            return types.SimpleNamespace(used=0, reserved=615 * 1048576, total=143771 * 1048576)
        return types.SimpleNamespace(used=615 * 1048576, total=143771 * 1048576)
    lib.nvmlDeviceGetMemoryInfo = memory
    gpus, _apps, _backend, _s = read_gpus("nvml", "/usr/bin/nvidia-smi", 5, pynvml=lib)
    assert gpus[0]["memory_used_mib"] == 0 and gpus[0]["memory_total_mib"] == 143771


def test_the_kernel_module_version_of_the_real_h200(tmp_path):
    path = tmp_path / "version"
    path.write_text(fixture("proc-driver-nvidia-version.txt"))
    assert kernel_module_version(str(path)) == "580.159.04"
    assert kernel_module_version(str(tmp_path / "absent")) is None


def test_nvml_reads_every_field_and_judges_it():
    result = read_health(source="nvml", lib=StubNvml())
    assert result["source"] == "nvml" and result["driver"]["version"] == "580.159.04"
    [g] = result["gpus"]
    assert g["uuid"] == "GPU-stub" and g["pci"] == "00000000:00:06.0"
    assert g["ecc"]["volatile_uncorrected"] == 4 and g["ecc"]["aggregate_uncorrected"] == 0
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": True, "failed": False}
    assert g["throttle"] == ["gpu_idle", "hw_thermal_slowdown"] and g["persistence_mode"] is True
    assert codes(g["findings"]) == ["ecc_uncorrected_volatile", "remapped_rows_pending", "throttle_hw_thermal_slowdown"]
    assert not g["healthy"] and not result["healthy"] and result["error"] is None


def test_nvml_not_supported_or_missing_functions_are_not_reported_never_a_traceback():
    lib = StubNvml(rcs={"nvmlDeviceGetRemappedRows": 3, "nvmlDeviceGetCurrPcieLinkWidth": 4},
                   missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"})
    result = read_health(source="nvml", lib=lib)
    [g] = result["gpus"]
    assert g["not_reported"]["remapped_rows"] == "not supported"
    assert g["not_reported"]["pcie.width"] == "no permission"
    assert g["not_reported"]["throttle"] == "not in this driver's NVML"
    assert g["remapped_rows"]["pending"] is None and g["throttle"] is None and g["pcie"]["width"] is None
    assert "nvmlShutdown" in lib.calls


def test_nvml_init_mismatch_and_a_lost_gpu(monkeypatch):
    monkeypatch.setattr(_health, "kernel_module_version", lambda path=None: "580.159.04")
    monkeypatch.setattr(_health, "library_versions", lambda dirs=None, maps=None: ["575.57.08"])
    result = read_health(source="nvml", lib=StubNvml(rcs={"nvmlInit_v2": 18}))
    assert codes(result["findings"]) == ["driver_library_mismatch"] and "575.57.08" in result["error"]
    lib = StubNvml(rcs={"nvmlDeviceGetTotalEccErrors": 15})
    result = read_health(source="nvml", lib=lib)
    assert codes(result["findings"]) == ["nvml_failed"] and "GPU is lost" in result["error"]
    assert "nvmlShutdown" in lib.calls


def test_nvml_mig_instances():
    result = read_health(source="nvml", lib=StubNvml(mig=True))
    [g] = result["gpus"]
    assert g["mig"]["current"] is True and len(g["mig"]["instances"]) == 2
    assert g["mig"]["instances"][0]["memory_total_mib"] == 71040 and "mig_no_instances" not in codes(g["findings"])
    empty = StubNvml(mig=True, rcs={"nvmlDeviceGetMigDeviceHandleByIndex": 6})
    [g] = read_health(source="nvml", lib=empty)["gpus"]
    assert g["mig"]["instances"] == [] and "mig_no_instances" in codes(g["findings"])


def test_load_nvml_returns_none_where_the_library_is_absent():
    assert _nvml.load_nvml(no_nvml) is None
    assert _nvml.load_nvml(lambda name: name) == "libnvidia-ml.so.1"
