# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU state and health read through NVML, in-process (the cheap reads).

The health read loads libnvidia-ml through ctypes: every call guarded, a field NVML cannot give
is noted as not reported, only a failed init or a lost GPU stop the read. The state read (GPUs,
memory, processes; the gpu_state module) uses the pynvml binding (nvidia-ml-py) only when it is
importable; it is never required. Beside them, the versions of the NVML library and of the
kernel module, for the diagnosis of a driver/library version mismatch.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import re
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._reading import new_gpu, throttle_names
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import GpuError

NVML_ERRORS = {1: "uninitialized", 2: "invalid argument", 3: "not supported", 4: "no permission", 6: "not found",
               7: "insufficient size", 9: "driver not loaded", 10: "timeout", 12: "library not found",
               13: "function not found", 14: "corrupted infoROM", 15: "GPU is lost", 16: "reset required",
               17: "operating system", 18: "driver/library version mismatch", 999: "unknown error"}
NVML_NOT_SUPPORTED, NVML_NOT_FOUND, NVML_GPU_IS_LOST, NVML_LIB_RM_MISMATCH = 3, 6, 15, 18
NVML_LIBRARY = "libnvidia-ml.so.1"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu",
                "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/run/opengl-driver/lib")
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"


# --------------------------------------------------------------------------- driver/library versions


def kernel_module_version(path=DRIVER_VERSION_FILE):
    """The loaded kernel module's version from /proc/driver/nvidia/version, or None."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    m = re.search(r"Kernel Module\b.*?\s(\d+\.\d+(?:\.\d+)*)\s", text)
    return m.group(1) if m else None


def library_versions(dirs=LIBRARY_DIRS, maps="/proc/self/maps"):
    """Versions of the libnvidia-ml.so.<version> files: the one this process loaded first, else those on disk."""
    found = []
    try:
        with open(maps) as f:
            for line in f:
                m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)*)\s*$", line)
                if m and m.group(1) not in found:
                    found.append(m.group(1))
    except OSError:
        pass
    if found:
        return found
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "libnvidia-ml.so.*"))):
            m = re.search(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)*)$", path)
            if m and m.group(1) not in found:
                found.append(m.group(1))
    return found


# --------------------------------------------------------------------------- NVML through ctypes: the health read


class NvmlError(GpufleetError):
    """An NVML call that stops the read (a failed init, a lost GPU): ``rc`` is NVML's code."""

    def __init__(self, rc, call):
        super().__init__("%s: %s (NVML error %s)" % (call, NVML_ERRORS.get(rc, "error"), rc))
        self.rc = rc


class _PciInfo(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _Process(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


def load_nvml(cdll=ctypes.CDLL):
    """The NVML library object, or None where it cannot be loaded."""
    for name in (NVML_LIBRARY, "libnvidia-ml.so"):
        try:
            return cdll(name)
        except OSError:
            continue
    return None


class Nvml(object):
    """Every call guarded: a function the library lacks or a code other than success leaves the
    field unreported (with why) instead of raising; only a lost GPU or a failed init stop the read."""

    def __init__(self, lib):
        self.lib = lib

    def call(self, gpu, field, name, *args):
        fn = getattr(self.lib, name, None)
        if fn is None:
            rc = None
        else:
            try:
                rc = fn(*args)
            except (TypeError, ValueError, ctypes.ArgumentError, OSError):
                rc = 999
        if rc == 0:
            return True
        if rc == NVML_GPU_IS_LOST:
            raise NvmlError(rc, name)
        if gpu is not None and field:
            gpu["not_reported"][field] = "not in this driver's NVML" if rc is None else NVML_ERRORS.get(rc, "error %s" % rc)
        return False

    def init(self):
        fn = getattr(self.lib, "nvmlInit_v2", None) or getattr(self.lib, "nvmlInit", None)
        rc = fn() if fn is not None else 13
        if rc != 0:
            raise NvmlError(rc, "nvmlInit_v2")

    def shutdown(self):
        fn = getattr(self.lib, "nvmlShutdown", None)
        if fn is not None:
            fn()

    def text(self, gpu, field, name, *args, size=96):
        buf = ctypes.create_string_buffer(size)
        if self.call(gpu, field, name, *(args + (buf, ctypes.c_uint(size)))):
            return buf.value.decode("utf-8", "replace")
        return None

    def uint(self, gpu, field, name, *args, kind=ctypes.c_uint):
        value = kind()
        return value.value if self.call(gpu, field, name, *(args + (ctypes.byref(value),))) else None


def nvml_read(lib):
    """(driver_version, gpus) through NVML. Raises NvmlError when NVML cannot start."""
    nv = Nvml(lib)
    nv.init()
    try:
        driver = nv.text(None, None, "nvmlSystemGetDriverVersion", size=80)
        count = nv.uint(None, None, "nvmlDeviceGetCount_v2")
        if count is None:
            count = nv.uint(None, None, "nvmlDeviceGetCount") or 0
        gpus = [_nvml_gpu(nv, index) for index in range(count)]
    finally:
        nv.shutdown()
    return driver, gpus


def _nvml_gpu(nv, index):
    gpu = new_gpu(index)
    handle = ctypes.c_void_p()
    if not nv.call(gpu, "handle", "nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle)):
        return gpu
    gpu["uuid"] = nv.text(gpu, "uuid", "nvmlDeviceGetUUID", handle)
    gpu["name"] = nv.text(gpu, "name", "nvmlDeviceGetName", handle)
    pci = _PciInfo()
    if nv.call(gpu, "pci", "nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(pci)):
        gpu["pci"] = "%08x:%02x:%02x.0" % (pci.domain, pci.bus, pci.device)
    ecc = gpu["ecc"]
    for key, error_type, counter in (("volatile_uncorrected", 1, 0), ("aggregate_uncorrected", 1, 1),
                                     ("volatile_corrected", 0, 0), ("aggregate_corrected", 0, 1)):
        ecc[key] = nv.uint(gpu, "ecc." + key, "nvmlDeviceGetTotalEccErrors", handle, ctypes.c_int(error_type),
                           ctypes.c_int(counter), kind=ctypes.c_ulonglong)
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    if nv.call(gpu, "ecc.mode", "nvmlDeviceGetEccMode", handle, ctypes.byref(current), ctypes.byref(pending)):
        ecc["mode"] = "Enabled" if current.value else "Disabled"
    _nvml_memory_health(nv, gpu, handle)
    reasons = nv.uint(gpu, "throttle", "nvmlDeviceGetCurrentClocksEventReasons", handle, kind=ctypes.c_ulonglong)
    if reasons is None:
        gpu["not_reported"].pop("throttle", None)
        reasons = nv.uint(gpu, "throttle", "nvmlDeviceGetCurrentClocksThrottleReasons", handle, kind=ctypes.c_ulonglong)
    gpu["throttle"] = None if reasons is None else throttle_names(reasons)
    pcie = gpu["pcie"]
    for key, name in (("gen", "nvmlDeviceGetCurrPcieLinkGeneration"), ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"),
                      ("width", "nvmlDeviceGetCurrPcieLinkWidth"), ("max_width", "nvmlDeviceGetMaxPcieLinkWidth")):
        pcie[key] = nv.uint(gpu, "pcie." + key, name, handle)
    mode = nv.uint(gpu, "persistence_mode", "nvmlDeviceGetPersistenceMode", handle, kind=ctypes.c_int)
    gpu["persistence_mode"] = None if mode is None else bool(mode)
    _nvml_mig(nv, gpu, handle)
    return gpu


def _nvml_memory_health(nv, gpu, handle):
    rows = [ctypes.c_uint() for _i in range(4)]
    if nv.call(gpu, "remapped_rows", "nvmlDeviceGetRemappedRows", handle, *[ctypes.byref(r) for r in rows]):
        gpu["remapped_rows"] = {"correctable": rows[0].value, "uncorrectable": rows[1].value,
                                "pending": bool(rows[2].value), "failed": bool(rows[3].value)}
    retired = gpu["retired_pages"]
    for key, cause in (("single_bit", 0), ("double_bit", 1)):
        count = ctypes.c_uint(0)
        # A count of 0 with no buffer asks how many there are (success, or insufficient size when any).
        fn = getattr(nv.lib, "nvmlDeviceGetRetiredPages", None)
        rc = fn(handle, ctypes.c_int(cause), ctypes.byref(count), None) if fn is not None else None
        if rc in (0, 7):
            retired[key] = count.value
        else:
            gpu["not_reported"]["retired_pages." + key] = NVML_ERRORS.get(rc, "not in this driver's NVML")
    pending = nv.uint(gpu, "retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle, kind=ctypes.c_int)
    retired["pending"] = None if pending is None else bool(pending)


def _nvml_mig(nv, gpu, handle):
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    if not nv.call(gpu, "mig", "nvmlDeviceGetMigMode", handle, ctypes.byref(current), ctypes.byref(pending)):
        return
    gpu["mig"].update(current=bool(current.value), pending=bool(pending.value))
    if not current.value:
        return
    instances = []
    count = nv.uint(gpu, "mig.instances", "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    for slot in range(count):
        mig = ctypes.c_void_p()
        if not nv.call(None, None, "nvmlDeviceGetMigDeviceHandleByIndex", handle, ctypes.c_uint(slot), ctypes.byref(mig)):
            continue  # an empty slot
        mem = _Memory()
        have_mem = nv.call(None, None, "nvmlDeviceGetMemoryInfo", mig, ctypes.byref(mem))
        procs = (_Process * 64)()
        n = ctypes.c_uint(64)
        holders = []
        if nv.call(None, None, "nvmlDeviceGetComputeRunningProcesses_v3", mig, ctypes.byref(n), procs):
            holders = [{"pid": procs[i].pid, "name": None, "used_memory_mib": procs[i].usedGpuMemory // 1048576}
                       for i in range(min(n.value, 64))]
        instances.append({
            "gpu_instance_id": nv.uint(None, None, "nvmlDeviceGetGpuInstanceId", mig),
            "compute_instance_id": nv.uint(None, None, "nvmlDeviceGetComputeInstanceId", mig),
            "memory_used_mib": mem.used // 1048576 if have_mem else None,
            "memory_total_mib": mem.total // 1048576 if have_mem else None,
            "holders": holders})
    gpu["mig"]["instances"] = instances


# --------------------------------------------------------------------------- NVML through pynvml: the state read


def import_pynvml():
    try:
        import pynvml  # pylint: disable=import-error
    except Exception:  # noqa: BLE001 - ImportError, or any error of a broken install: NVML is optional, the read goes on without it
        return None
    return pynvml


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _nvml_kind(pynvml, exc):
    for attr, kind in (("NVMLError_DriverNotLoaded", "driver"), ("NVMLError_LibraryNotFound", "nvml"),
                       ("NVMLError_GpuIsLost", "bus"), ("NVMLError_FunctionNotFound", "nvml")):
        cls = getattr(pynvml, attr, None)
        if cls is not None and isinstance(exc, cls):
            return kind
    return "failed"


def _nvml_memory(pynvml, handle, error):
    """(used, total) bytes as nvidia-smi reports them.

    NVML's first memory API counts what the driver reserves for itself as used (about
    600 MiB on an idle H200, where nvidia-smi shows 0 MiB), so a drained GPU would never
    look idle. The v2 API reports that reservation apart; use it wherever it exists.
    """
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(mem.used), int(mem.total)
        except (error, TypeError):
            pass  # an older driver or binding: fall back to the first API
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(mem.used), int(mem.total)


def nvml_query(pynvml):
    """The same data as run_queries + parse_*, read through NVML. Returns (gpus, apps, seconds)."""
    started = time.monotonic()
    error = getattr(pynvml, "NVMLError", Exception)
    try:
        pynvml.nvmlInit()
    except error as exc:
        raise GpuError("NVML initialisation failed: %s" % exc, kind=_nvml_kind(pynvml, exc)) from exc
    try:
        gpus, apps = [], []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            used, total = _nvml_memory(pynvml, handle, error)
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except error:
                util = None
            gpus.append({
                "index": index, "uuid": uuid, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "memory_used_mib": used // 1048576, "memory_total_mib": total // 1048576,
                "utilization_pct": util,
            })
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except error:
                procs = []
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                try:
                    name = _text(pynvml.nvmlSystemGetProcessName(p.pid))
                except error:
                    name = None
                apps.append({"gpu_uuid": uuid, "pid": int(p.pid),
                             "used_memory_mib": None if used is None else int(used) // 1048576, "name": name})
    except error as exc:
        raise GpuError("NVML query failed: %s" % exc, kind=_nvml_kind(pynvml, exc)) from exc
    finally:
        with contextlib.suppress(error):
            pynvml.nvmlShutdown()
    return gpus, apps, time.monotonic() - started
