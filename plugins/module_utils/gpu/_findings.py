# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Judging a GPU health reading: each problem a finding (code, severity, what, action), most
severe first; Xid events tied to their GPU; the driver against the fleet's pin; the gpu_healthy
check every record and report reads, and the node's Xid events folded into a container's check.
Nothing here reads a GPU: the readings come from _nvml, _xml and _query.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._reading import SRAM_SOURCES
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xid import pci_key

SEVERITY_ORDER = ("fail", "warn", "info")
# The clock event reasons that are findings: (severity, what, action). Idle, application and display clocks are not.
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
# The memory fault flags (see _xml) that are findings: (severity, what, action).
MEMORY_FAULT_FINDINGS = {
    "unrepairable_memory": ("fail", "the GPU reports memory it cannot repair (unrepairable_memory)",
                            "drain the GPU and RMA it"),
    "sram_threshold_exceeded": (
        "fail", "uncorrectable SRAM errors over the GPU's life passed the driver's threshold (sram_threshold_exceeded)",
        "drain the GPU and RMA it"),
    "channel_repair_pending": ("fail", "a memory channel repair is pending: it takes effect at the next reset",
                               "drain the GPU and reset it (nvidia-smi -r) or reboot the node"),
    "tpc_repair_pending": ("fail", "a TPC repair is pending: it takes effect at the next reset",
                           "drain the GPU and reset it (nvidia-smi -r) or reboot the node"),
}


def finding(code, severity, what, action):
    return {"code": code, "severity": severity, "what": what, "action": action}


def mismatch_finding(kernel, libraries):
    """The diagnosis of "Driver/library version mismatch": which versions differ (the kernel
    module's, or None; the NVML libraries', see _nvml) and what to do."""
    lib = ", ".join(libraries) or "unknown"
    return finding(
        "driver_library_mismatch", "fail",
        "Driver/library version mismatch: the user-space NVML here is libnvidia-ml.so.%s, the node's kernel module "
        "(/proc/driver/nvidia/version) is %s" % (lib, kernel or "unknown"),
        "install the user-space driver libraries of version %s in this container (or restart it so the node's are bound "
        "in again); on the node, reboot if the driver was upgraded without one" % (kernel or "of the kernel module"))


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
    for code, (severity, what, action) in MEMORY_FAULT_FINDINGS.items():
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
