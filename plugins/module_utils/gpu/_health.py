# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU health read: ECC, retired pages, row remapping, clock event reasons, PCIe link,
persistence, MIG, the driver against a pin, Xid events; each problem a finding that says what to do.

Three sources, one shape: NVML through ctypes (libnvidia-ml, in-process: the cheap one),
``nvidia-smi --query-gpu`` (one process, when NVML cannot be loaded) and ``nvidia-smi -q -x``
(the full read: MIG instances with their memory and holders; only when asked). A field a source
does not report is "not reported", never a traceback; bad XML or a driver/library version
mismatch is a finding with its diagnosis.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import xml.etree.ElementTree as ET

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import (
    CSV_FORMAT,
    GpuError,
    Pending,
    is_unavailable,
    split_row,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xid import pci_key, read_xid_events

SEVERITY_ORDER = ("fail", "warn", "info")
# NVML's clocks event (throttle) reason bits, nvml.h; the names are nvidia-smi's -q -x tags without their prefix.
THROTTLE_BITS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
                 (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
                 (0x80, "hw_power_brake_slowdown"), (0x100, "display_clocks_setting"))
THROTTLE_REASONS = tuple(name for _bit, name in THROTTLE_BITS)
# The reasons that are findings: (severity, what, action). Idle, application and display clocks are not.
THROTTLE_FINDINGS = {
    "hw_slowdown": ("warn", ("hardware slowdown active: clocks cut by half or more (temperature, power brake or a failing "
                             "power supply)"), "check the node's cooling and power; drain the GPU if it persists under load"),
    "hw_thermal_slowdown": ("warn", "hardware thermal slowdown active: the GPU is too hot",
                            "check the node's airflow and fans; drain the GPU if it persists"),
    "hw_power_brake_slowdown": ("warn", "hardware power brake active: the power supply or the chassis asked to cut power",
                                "check the node's power supplies and power capping"),
    "sw_thermal_slowdown": ("warn", ("software thermal slowdown active: the driver lowers clocks to stay under its "
                                     "temperature target"), "check the node's cooling"),
    "sw_power_cap": ("info", "power cap reached: clocks lowered to stay within the power limit",
                     "none if the limit is intended; otherwise check the power limit (nvidia-smi -q -d POWER)"),
    "sync_boost": ("info", "sync boost: clocks held to those of the slowest GPU of its sync group",
                   "look at the other GPUs of the group"),
}

NVML_ERRORS = {1: "uninitialized", 2: "invalid argument", 3: "not supported", 4: "no permission", 6: "not found",
               7: "insufficient size", 9: "driver not loaded", 10: "timeout", 12: "library not found",
               13: "function not found", 14: "corrupted infoROM", 15: "GPU is lost", 16: "reset required",
               17: "operating system", 18: "driver/library version mismatch", 999: "unknown error"}
NVML_NOT_SUPPORTED, NVML_NOT_FOUND, NVML_GPU_IS_LOST, NVML_LIB_RM_MISMATCH = 3, 6, 15, 18
NVML_LIBRARY = "libnvidia-ml.so.1"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu",
                "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/run/opengl-driver/lib")
DRIVER_VERSION_FILE = "/proc/driver/nvidia/version"
MISMATCH_TEXT = "driver/library version mismatch"

# nvidia-smi --query-gpu fields of the cheap read, in order; pci.bus_id ties Xid events to a GPU.
HEALTH_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version", "persistence_mode",
                 "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
                 "clocks_event_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max",
                 "pcie.link.width.current", "pcie.link.width.max", "mig.mode.current", "mig.mode.pending")
# Drivers before clocks_event_reasons (R535) name the same bitmask so.
LEGACY_FIELDS = tuple("clocks_throttle_reasons.active" if f == "clocks_event_reasons.active" else f for f in HEALTH_FIELDS)
REMAPPED_FIELDS = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.correctable",
                   "remapped_rows.uncorrectable")


# The memory fault fields of nvidia-smi -q -x (R550 and later; as the H200 fixture carries them):
# the flags under ecc_errors, the aggregate uncorrectable SRAM errors by source, and the row
# remapper's histogram (how many memory banks have max/high/partial/low/no spare rows left).
# Only -q -x reports them; the NVML and --query-gpu reads leave them None.
MEMORY_FAULT_FIELDS = ("sram_threshold_exceeded", "unrepairable_memory", "channel_repair_pending", "tpc_repair_pending",
                       "sram_uncorrectable_sources", "row_remapper_histogram")
MEMORY_FAULT_FLAGS = {
    # -q -x path under <gpu>: (code, severity, what, action)
    "ecc_errors/unrepairable_memory": (
        "unrepairable_memory", "fail", "the GPU reports memory it cannot repair (unrepairable_memory)",
        "drain the GPU and RMA it"),
    "ecc_errors/aggregate/sram_threshold_exceeded": (
        "sram_threshold_exceeded", "fail",
        "uncorrectable SRAM errors over the GPU's life passed the driver's threshold (sram_threshold_exceeded)",
        "drain the GPU and RMA it"),
    "ecc_errors/channel_repair_pending": (
        "channel_repair_pending", "fail", "a memory channel repair is pending: it takes effect at the next reset",
        "drain the GPU and reset it (nvidia-smi -r) or reboot the node"),
    "ecc_errors/tpc_repair_pending": (
        "tpc_repair_pending", "fail", "a TPC repair is pending: it takes effect at the next reset",
        "drain the GPU and reset it (nvidia-smi -r) or reboot the node"),
}
SRAM_SOURCES = ("l2", "sm", "microcontroller", "pcie", "other")
HISTOGRAM_BINS = ("max", "high", "partial", "low", "none")


def finding(code, severity, what, action):
    return {"code": code, "severity": severity, "what": what, "action": action}


def new_gpu(index):
    """One GPU's reading before it is read: every field unknown (None)."""
    return {"index": index, "uuid": None, "name": None, "pci": None,
            "ecc": {"mode": None, "volatile_uncorrected": None, "aggregate_uncorrected": None,
                    "volatile_corrected": None, "aggregate_corrected": None},
            "retired_pages": {"single_bit": None, "double_bit": None, "pending": None},
            "remapped_rows": {"correctable": None, "uncorrectable": None, "pending": None, "failed": None},
            "throttle": None, "pcie": {"gen": None, "max_gen": None, "width": None, "max_width": None},
            "persistence_mode": None, "mig": {"current": None, "pending": None, "instances": None},
            "memory_faults": dict((name, None) for name in MEMORY_FAULT_FIELDS),
            "not_reported": {}, "findings": []}


# --------------------------------------------------------------------------- driver/library mismatch


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


def mismatch_finding(kernel=None, libraries=None):
    """The diagnosis of "Driver/library version mismatch": which versions differ and what to do."""
    kernel = kernel if kernel is not None else kernel_module_version()
    libraries = libraries if libraries is not None else library_versions()
    lib = ", ".join(libraries) or "unknown"
    return finding(
        "driver_library_mismatch", "fail",
        "Driver/library version mismatch: the user-space NVML here is libnvidia-ml.so.%s, the node's kernel module "
        "(/proc/driver/nvidia/version) is %s" % (lib, kernel or "unknown"),
        "install the user-space driver libraries of version %s in this container (or restart it so the node's are bound "
        "in again); on the node, reboot if the driver was upgraded without one" % (kernel or "of the kernel module"))


# --------------------------------------------------------------------------- NVML through ctypes


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
    gpu["throttle"] = None if reasons is None else [name for bit, name in THROTTLE_BITS if reasons & bit]
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


# --------------------------------------------------------------------------- nvidia-smi -q -x


def _find_text(el, path):
    node = el.find(path)
    if node is None:
        return None
    return (node.text or "").strip()


def _int(text):
    if text is None or is_unavailable(text):
        return None
    m = re.match(r"^\s*(-?\d+)", text)
    return int(m.group(1)) if m else None


def _yes(text):
    if text is None or is_unavailable(text):
        return None
    return text.strip().lower() in ("yes", "enabled", "active", "1", "true")


def _field(gpu, field, text):
    """Note a field the XML lacks (an older driver) or leaves N/A; return its text."""
    if text is None:
        gpu["not_reported"][field] = "missing from nvidia-smi -q -x"
    elif is_unavailable(text):
        gpu["not_reported"][field] = text
    return text


def parse_xml(text):
    """(driver_version, gpus) of ``nvidia-smi -q -x``. Raises ValueError when it is not that XML."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError("nvidia-smi -q -x returned XML that does not parse: %s" % exc) from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError("nvidia-smi -q -x returned <%s>, not <nvidia_smi_log>" % root.tag)
    gpus = [_xml_gpu(index, el) for index, el in enumerate(root.findall("gpu"))]
    return _find_text(root, "driver_version"), gpus


def _xml_gpu(index, el):
    gpu = new_gpu(_int(_find_text(el, "minor_number")) if _int(_find_text(el, "minor_number")) is not None else index)
    gpu["uuid"] = _find_text(el, "uuid")
    gpu["name"] = _find_text(el, "product_name")
    gpu["pci"] = el.get("id")
    ecc = gpu["ecc"]
    ecc["mode"] = _field(gpu, "ecc.mode", _find_text(el, "ecc_mode/current_ecc"))
    for counter in ("volatile", "aggregate"):
        base = "ecc_errors/" + counter
        if el.find(base) is None:
            _field(gpu, "ecc." + counter, None)
            continue
        # Hopper splits SRAM (parity, SECDED) and DRAM; older schemas have a device_memory/total split.
        unc_tags = ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")
        unc = [_int(_find_text(el, base + "/" + tag)) for tag in unc_tags]
        if all(v is None for v in unc):
            unc = [_int(_find_text(el, base + "/double_bit/total"))]
        cor = [_int(_find_text(el, base + "/" + tag)) for tag in ("sram_correctable", "dram_correctable")]
        if all(v is None for v in cor):
            cor = [_int(_find_text(el, base + "/single_bit/total"))]
        ecc[counter + "_uncorrected"] = None if all(v is None for v in unc) else sum(v for v in unc if v is not None)
        ecc[counter + "_corrected"] = None if all(v is None for v in cor) else sum(v for v in cor if v is not None)
    retired = gpu["retired_pages"]
    retired["single_bit"] = _int(_find_text(el, "retired_pages/multiple_single_bit_retirement/retired_count"))
    retired["double_bit"] = _int(_find_text(el, "retired_pages/double_bit_retirement/retired_count"))
    retired["pending"] = _yes(_find_text(el, "retired_pages/pending_retirement"))
    rows = el.find("remapped_rows")
    if rows is None or is_unavailable((rows.text or "").strip() or "x"):
        _field(gpu, "remapped_rows", None if rows is None else (rows.text or "").strip())
    else:
        gpu["remapped_rows"] = {"correctable": _int(_find_text(rows, "remapped_row_corr")),
                                "uncorrectable": _int(_find_text(rows, "remapped_row_unc")),
                                "pending": _yes(_find_text(rows, "remapped_row_pending")),
                                "failed": _yes(_find_text(rows, "remapped_row_failure"))}
    reasons = el.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons is None:
        reasons, prefix = el.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    if reasons is None:
        _field(gpu, "throttle", None)
    else:
        gpu["throttle"] = [child.tag[len(prefix):] for child in reasons
                           if child.tag.startswith(prefix) and (child.text or "").strip() == "Active"]
    link = "pci/pci_gpu_link_info/"
    pcie = gpu["pcie"]
    for key, path in (("gen", "pcie_gen/current_link_gen"), ("max_gen", "pcie_gen/max_link_gen"),
                      ("width", "link_widths/current_link_width"), ("max_width", "link_widths/max_link_width")):
        pcie[key] = _int(_field(gpu, "pcie." + key, _find_text(el, link + path)))
    gpu["persistence_mode"] = _yes(_field(gpu, "persistence_mode", _find_text(el, "persistence_mode")))
    _xml_memory_faults(gpu, el)
    _xml_mig(gpu, el)
    return gpu


def _xml_memory_faults(gpu, el):
    """The memory fault fields; a driver before R550 lacks them, which is no finding (older GPUs
    report page retirement instead), so a missing one stays None and unnoted."""
    faults = gpu["memory_faults"]
    for path in MEMORY_FAULT_FLAGS:
        faults[path.rsplit("/", 1)[1]] = _yes(_find_text(el, path))
    sources = el.find("ecc_errors/aggregate_uncorrectable_sram_sources")
    if sources is not None:
        counts = dict((name, _int(_find_text(sources, "sram_" + name))) for name in SRAM_SOURCES)
        faults["sram_uncorrectable_sources"] = None if all(v is None for v in counts.values()) else counts
    histogram = el.find("remapped_rows/row_remapper_histogram")
    if histogram is not None:
        bins = dict((name, _int(_find_text(histogram, "row_remapper_histogram_" + name))) for name in HISTOGRAM_BINS)
        faults["row_remapper_histogram"] = None if all(v is None for v in bins.values()) else bins


def _xml_mig(gpu, el):
    current = _find_text(el, "mig_mode/current_mig")
    if current is None:
        _field(gpu, "mig", None)
        return
    gpu["mig"].update(current=_yes(current), pending=_yes(_find_text(el, "mig_mode/pending_mig")))
    if not gpu["mig"]["current"]:
        return
    holders = {}
    for p in el.findall("processes/process_info"):
        key = (_int(_find_text(p, "gpu_instance_id")), _int(_find_text(p, "compute_instance_id")))
        holders.setdefault(key, []).append({"pid": _int(_find_text(p, "pid")), "name": _find_text(p, "process_name"),
                                            "used_memory_mib": _int(_find_text(p, "used_memory"))})
    instances = []
    for m in el.findall("mig_devices/mig_device"):
        gi, ci = _int(_find_text(m, "gpu_instance_id")), _int(_find_text(m, "compute_instance_id"))
        instances.append({"gpu_instance_id": gi, "compute_instance_id": ci,
                          "memory_used_mib": _int(_find_text(m, "fb_memory_usage/used")),
                          "memory_total_mib": _int(_find_text(m, "fb_memory_usage/total")),
                          "holders": holders.get((gi, ci), [])})
    gpu["mig"]["instances"] = instances


# --------------------------------------------------------------------------- nvidia-smi --query-gpu


def query_argv(nvidia_smi, fields=HEALTH_FIELDS):
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), CSV_FORMAT]


def remapped_argv(nvidia_smi):
    return [nvidia_smi, "--query-remapped-rows=" + ",".join(REMAPPED_FIELDS), CSV_FORMAT]


def parse_query(text, remapped_text=None):
    """(driver_version, gpus) of the cheap query (HEALTH_FIELDS), with --query-remapped-rows where it answered."""
    gpus, driver = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        v = split_row(line.strip(), len(HEALTH_FIELDS), 2)
        gpu = new_gpu(_int(v[0]))
        if gpu["index"] is None:
            raise ValueError("nvidia-smi returned no index in line %r" % line)
        gpu.update(uuid=v[1], name=v[2], pci=v[3])
        driver = driver or v[4]
        for field, value in zip(HEALTH_FIELDS[5:], v[5:]):
            _field(gpu, field, value)
        gpu["persistence_mode"] = _yes(v[5])
        gpu["ecc"].update(volatile_uncorrected=_int(v[6]), aggregate_uncorrected=_int(v[7]))
        gpu["retired_pages"]["pending"] = _yes(v[8])
        if not is_unavailable(v[9]):
            try:
                bits = int(v[9], 16)
            except ValueError:
                bits = None
            gpu["throttle"] = None if bits is None else [name for bit, name in THROTTLE_BITS if bits & bit]
        gpu["pcie"] = {"gen": _int(v[10]), "max_gen": _int(v[11]), "width": _int(v[12]), "max_width": _int(v[13])}
        gpu["mig"].update(current=_yes(v[14]), pending=_yes(v[15]))
        gpus.append(gpu)
    by_uuid = dict((g["uuid"], g) for g in gpus)
    for line in (remapped_text or "").splitlines():
        v = [p.strip() for p in line.split(",")]
        gpu = by_uuid.get(v[0]) if len(v) == len(REMAPPED_FIELDS) else None
        if gpu is not None and not is_unavailable(v[1]):
            gpu["remapped_rows"] = {"pending": _yes(v[1]), "failed": _yes(v[2]), "correctable": _int(v[3]),
                                    "uncorrectable": _int(v[4])}
    for gpu in gpus:
        if gpu["remapped_rows"]["pending"] is None:
            gpu["not_reported"]["remapped_rows"] = "not answered by --query-remapped-rows"
    return driver, gpus


def run_query(nvidia_smi, timeout):
    """The cheap read: --query-gpu and --query-remapped-rows at once. Returns (gpu_text, remapped_text)."""
    remapped = Pending(remapped_argv(nvidia_smi), timeout)
    try:
        try:
            gpu_text = Pending(query_argv(nvidia_smi), timeout).wait()
        except GpuError as exc:
            if exc.kind != "usage" or "clocks_event_reasons" not in str(exc):
                raise
            gpu_text = Pending(query_argv(nvidia_smi, LEGACY_FIELDS), timeout).wait()
    except BaseException:
        remapped._kill()
        raise
    try:
        return gpu_text, remapped.wait()
    except GpuError:
        return gpu_text, None  # a GPU without row remapping (before Ampere) or a driver without the query


# --------------------------------------------------------------------------- findings


def _plural(n, word):
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def gpu_findings(gpu, pin=None, driver=None):
    """The findings of one GPU's reading (its xid events included), most severe first."""
    out = []
    ecc = gpu["ecc"]
    if ecc["volatile_uncorrected"]:
        out.append(finding("ecc_uncorrected_volatile", "fail",
                           "%s since the last reset or reboot" % _plural(ecc["volatile_uncorrected"], "uncorrectable ECC error"),
                           "drain the GPU and reset it (nvidia-smi -r); RMA if they come back"))
    elif ecc["aggregate_uncorrected"]:
        out.append(finding("ecc_uncorrected_aggregate", "warn",
                           "%s over the GPU's life" % _plural(ecc["aggregate_uncorrected"], "uncorrectable ECC error"),
                           "watch the count and the row remapping; RMA if it grows or remapping fails"))
    rows = gpu["remapped_rows"]
    if rows["failed"]:
        out.append(finding("remapped_rows_failed", "fail", "row remapping failed: a memory bank has no spare row left",
                           "drain the GPU and RMA it"))
    if rows["pending"]:
        out.append(finding("remapped_rows_pending", "fail", "a row remapping is pending: it takes effect at the next reset",
                           "drain the GPU and reset it (nvidia-smi -r) or reboot the node"))
    faults = gpu.get("memory_faults") or {}
    for code, severity, what, action in MEMORY_FAULT_FLAGS.values():
        if faults.get(code):
            out.append(finding(code, severity, what, action))
    sources = faults.get("sram_uncorrectable_sources") or {}
    if any(sources.values()):
        out.append(finding("sram_uncorrectable_sources", "warn", "uncorrectable SRAM errors over the GPU's life by source: %s" % (
            ", ".join("%s %d" % (name, sources[name]) for name in SRAM_SOURCES if sources.get(name))),
            "watch the counts; give them with an RMA request if sram_threshold_exceeded or Xid 95 appears"))
    histogram = faults.get("row_remapper_histogram") or {}
    if histogram.get("none"):
        out.append(finding("row_remapper_banks_exhausted", "warn", "%s without a spare row left: one more uncorrectable "
                           "error there cannot be remapped" % _plural(histogram["none"], "memory bank"),
                           "plan an RMA; drain the GPU when remapped_rows_failed appears"))
    elif histogram.get("low"):
        out.append(finding("row_remapper_banks_low", "info", "%s with few spare rows left" % _plural(histogram["low"], "memory bank"),
                           "watch the row remapper histogram (nvidia-smi -q -d ROW_REMAPPER)"))
    if gpu["retired_pages"]["pending"]:
        out.append(finding("retired_pages_pending", "fail", "a page retirement is pending: it takes effect at the next reset",
                           "drain the GPU and reset it or reboot the node"))
    for reason in gpu["throttle"] or ():
        if reason in THROTTLE_FINDINGS:
            severity, what, action = THROTTLE_FINDINGS[reason]
            out.append(finding("throttle_" + reason, severity, what, action))
    pcie = gpu["pcie"]
    if None not in (pcie["width"], pcie["max_width"]) and pcie["width"] < pcie["max_width"]:
        out.append(finding("pcie_width_degraded", "warn", "PCIe link x%s where the GPU supports x%s" % (pcie["width"], pcie["max_width"]),
                           "reseat the GPU or its riser at the next maintenance; RMA if it stays narrow"))
    # An idle GPU lowers its link generation to save power: only a busy one below its maximum is a finding.
    if (None not in (pcie["gen"], pcie["max_gen"]) and pcie["gen"] < pcie["max_gen"]
            and "gpu_idle" not in (gpu["throttle"] or ())):
        out.append(finding("pcie_gen_degraded", "warn", "PCIe Gen%s while busy where the link supports Gen%s" % (pcie["gen"], pcie["max_gen"]),
                           "check the slot and the BIOS PCIe settings; reseat the GPU at the next maintenance"))
    if gpu["persistence_mode"] is False:
        out.append(finding("persistence_mode_off", "warn", "persistence mode is off: the driver is set up again for each "
                           "first client, and state is lost between jobs", "enable it (nvidia-persistenced, or nvidia-smi -pm 1)"))
    mig = gpu["mig"]
    if mig["current"] and mig["instances"] is not None and not mig["instances"]:
        out.append(finding("mig_no_instances", "fail", "MIG mode is enabled but no GPU instance exists: no job can use the GPU",
                           "create the GPU and compute instances (nvidia-smi mig -cgi ... -C), or disable MIG (nvidia-smi -mig 0)"))
    if mig["pending"] is not None and mig["current"] is not None and mig["pending"] != mig["current"]:
        out.append(finding("mig_pending", "warn", "MIG mode %s is pending" % ("enable" if mig["pending"] else "disable"),
                           "drain the GPU and reset it to apply the MIG mode"))
    by_code = {}
    for event in gpu.get("xid", []):
        by_code.setdefault(event["xid"], []).append(event)
    for code in sorted(by_code):
        events = by_code[code]
        last = events[-1]
        out.append(finding("xid_%d" % code, last["severity"], "Xid %d x%d (last %s): %s" % (
            code, len(events), last["time"] or "time unknown", last["meaning"]), last["action"]))
    for field in sorted(gpu["not_reported"]):
        reason = gpu["not_reported"][field]
        if "missing" in reason:
            out.append(finding("field_missing", "info", "%s is not in this driver's report (%s)" % (field, reason),
                               "none needed; update the driver for this field to be read"))
    out.sort(key=lambda f: SEVERITY_ORDER.index(f["severity"]))
    return out


def assess(gpus, driver, pin=None, events=None, log_problem=None, kernel_log=False):
    """Attach Xid events and findings to each GPU; return the host-level findings."""
    host = []
    keyed = dict((pci_key(g["pci"]), g) for g in gpus if g["pci"])
    for event in events or ():
        gpu = keyed.get(pci_key(event["pci"])) or (gpus[0] if len(gpus) == 1 and not keyed else None)
        if gpu is not None:
            gpu.setdefault("xid", []).append(event)
        else:
            host.append(finding("xid_%d" % event["xid"], event["severity"], "Xid %d on PCI %s (no GPU read here has that "
                                "address): %s" % (event["xid"], event["pci"], event["meaning"]), event["action"]))
    for gpu in gpus:
        gpu.setdefault("xid", [])
        gpu["findings"] = gpu_findings(gpu)
        gpu["healthy"] = not any(f["severity"] == "fail" for f in gpu["findings"])
    if kernel_log and log_problem:
        host.append(finding("kernel_log_unreadable", "warn", "kernel log unreadable, Xid events not checked: %s" % log_problem,
                            "read it on the node as root (kernel.dmesg_restrict=1 hides it from others), or grant CAP_SYSLOG"))
    if pin and driver and not _same_version(driver, pin):
        host.append(finding("driver_pin_mismatch", "fail", "driver %s where the fleet pins %s" % (driver, pin),
                            "drain the node, install driver %s and reboot it" % pin))
    return host


def _same_version(have, pin):
    # A pin of 580 or 580.159 matches 580.159.04: compare as many parts as the pin has.
    parts = str(pin).strip().split(".")
    return str(have).strip().split(".")[:len(parts)] == parts


# --------------------------------------------------------------------------- one read


def read_health(source="auto", nvidia_smi=None, timeout=15, pin=None, kernel_log=False, since=None, dmesg=None,
                lib=None, cdll=ctypes.CDLL, xid_reader=read_xid_events):
    """The health of every GPU here: {gpus, driver, findings, healthy, source, error, kernel_log}.

    source: auto (NVML when libnvidia-ml loads, else the nvidia-smi query), nvml, query (nvidia-smi
    --query-gpu), xml (nvidia-smi -q -x: MIG instances with their holders). Nothing here raises
    for a GPU in trouble: what could not be read is ``error`` with a finding that says what to do.
    """
    result = {"gpus": [], "driver": {"version": None, "pin": pin or None}, "findings": [], "source": None, "error": None,
              "kernel_log": {"read": False, "problem": None, "events": []}}
    driver, gpus = None, []
    try:
        driver, gpus, result["source"] = _read(source, nvidia_smi, timeout, lib, cdll)
    except _Failed as exc:
        result["error"] = exc.msg
        result["findings"].append(exc.finding)
        result["source"] = exc.source
    result["driver"]["version"] = driver
    if kernel_log:
        events, problem = xid_reader(since=since, dmesg=dmesg, timeout=timeout)
        result["kernel_log"] = {"read": problem is None, "problem": problem, "events": events}
    else:
        events, problem = [], None
    result["findings"].extend(assess(gpus, driver, pin, events, problem, kernel_log))
    result["gpus"] = gpus
    result["healthy"] = result["error"] is None and all(g["healthy"] for g in gpus) and not any(
        f["severity"] == "fail" for f in result["findings"])
    return result


class _Failed(GpufleetError):
    """No source could be read: ``finding`` says why, for the result; ``source`` is the one tried."""

    def __init__(self, msg, found, source):
        super().__init__(msg)
        self.finding, self.source = found, source


def _read(source, nvidia_smi, timeout, lib, cdll):
    if source in ("auto", "nvml"):
        lib = lib if lib is not None else load_nvml(cdll)
        if lib is None and source == "nvml":
            raise _Failed("libnvidia-ml could not be loaded", finding(
                "nvml_unavailable", "fail", "libnvidia-ml.so.1 could not be loaded: no NVIDIA user-space driver here",
                "bind the driver's libraries into the container, or read with source=xml/query"), "nvml")
        if lib is not None:
            try:
                driver, gpus = nvml_read(lib)
                return driver, gpus, "nvml"
            except NvmlError as exc:
                if exc.rc == NVML_LIB_RM_MISMATCH:
                    found = mismatch_finding()
                    raise _Failed(found["what"], found, "nvml") from exc
                if source == "nvml" or not nvidia_smi:
                    raise _Failed(str(exc), finding("nvml_failed", "fail", "NVML failed: %s" % exc,
                                                    "check the node's kernel log for Xid errors; reset the GPU or reboot the node"), "nvml") from exc
    if not nvidia_smi:
        raise _Failed("nvidia-smi was not found and NVML could not be loaded", finding(
            "no_gpu_tools", "fail", "neither libnvidia-ml nor nvidia-smi is available here",
            "install the NVIDIA driver's user-space tools, or bind them into the container"), source)
    name = "xml" if source == "xml" else "query"
    try:
        if name == "xml":
            driver, gpus = parse_xml(Pending([nvidia_smi, "-q", "-x"], timeout).wait())
        else:
            driver, gpus = parse_query(*run_query(nvidia_smi, timeout))
    except GpuError as exc:
        if MISMATCH_TEXT in str(exc).lower():
            found = mismatch_finding()
            raise _Failed(found["what"], found, name) from exc
        raise _Failed(str(exc), finding("nvidia_smi_failed", "fail", str(exc),
                                        "see the message; check the node's kernel log for Xid errors"), name) from exc
    except ValueError as exc:
        raise _Failed(str(exc), finding("bad_output", "fail", str(exc),
                                        "compare nvidia-smi's version with the driver's; report it with the output"), name) from exc
    return driver, gpus, name


# --------------------------------------------------------------------------- the check


def check_record(health):
    """The gpu_healthy check of a health read (the verify role's record and every report read it)."""
    gpus = []
    for g in health["gpus"]:
        gpus.append({
            "index": g["index"], "uuid": g["uuid"], "name": g["name"], "healthy": g["healthy"], "findings": g["findings"],
            "ecc": g["ecc"], "remapped_rows": g["remapped_rows"], "retired_pages": g["retired_pages"],
            "throttle": g["throttle"] or [], "pcie": g["pcie"], "persistence_mode": g["persistence_mode"], "mig": g["mig"],
            "xid_events": dict((str(e["xid"]), sum(1 for x in g["xid"] if x["xid"] == e["xid"])) for e in g["xid"])})
    return {"name": "gpu_healthy", "severity": "fail", "ok": bool(health["healthy"]), "error": health["error"],
            "summary": check_summary(gpus, health["findings"], health["error"]), "gpus": gpus,
            "driver": dict(health["driver"]), "findings": health["findings"]}


def check_summary(gpus, findings, error):
    """The gpu_healthy check's one line: the read's error, else the fail findings of each GPU and
    of the host, else how many GPUs are healthy and the warnings."""
    if error:
        return error
    bad = [f for g in gpus for f in g["findings"] if f["severity"] == "fail"] + [f for f in findings if f["severity"] == "fail"]
    if not bad:
        warn = sum(1 for g in gpus for f in g["findings"] if f["severity"] == "warn") + sum(
            1 for f in findings if f["severity"] == "warn")
        return "%s healthy%s" % (_plural(len(gpus), "GPU"), "; %s" % _plural(warn, "warning") if warn else "")
    parts = ["GPU %s: %s" % (g["index"], ", ".join(f["code"] for f in g["findings"] if f["severity"] == "fail"))
             for g in gpus if not g["healthy"]]
    parts += [f["code"] for f in findings if f["severity"] == "fail"]
    return "; ".join(parts)


def node_xid(health):
    """{GPU UUID: (xid counts, xid findings)} of a node's health read with the kernel log: what the
    node's kernel said of each GPU, to fold into the checks of the containers that use them."""
    out = {}
    for g in health["gpus"]:
        if g.get("uuid") and g.get("xid"):
            counts = {}
            for event in g["xid"]:
                counts[str(event["xid"])] = counts.get(str(event["xid"]), 0) + 1
            out[g["uuid"]] = (counts, [f for f in g["findings"] if f["code"].startswith("xid_")])
    return out


def fold_node_xid(check, by_uuid):
    """Fold the node's Xid events (node_xid) into a container's gpu_healthy check, each GPU matched
    by its UUID (a container numbers its GPUs from 0; the UUID is the GPU's own): its xid_events,
    its findings, its health, the check's verdict and line. True when the check changed."""
    changed = False
    for g in check.get("gpus") or ():
        counts, found = by_uuid.get(g.get("uuid"), ({}, []))
        if not counts:
            continue
        g["xid_events"] = counts
        have = set(f["code"] for f in g["findings"])
        g["findings"] = sorted(g["findings"] + [f for f in found if f["code"] not in have],
                               key=lambda f: SEVERITY_ORDER.index(f["severity"]))
        g["healthy"] = not any(f["severity"] == "fail" for f in g["findings"])
        changed = True
    if changed:
        findings = check.get("findings") or []
        check["ok"] = not check.get("error") and all(g["healthy"] for g in check["gpus"]) and not any(
            f["severity"] == "fail" for f in findings)
        check["summary"] = check_summary(check["gpus"], findings, check.get("error"))
    return changed
