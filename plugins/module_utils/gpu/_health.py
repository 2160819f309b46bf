# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU health read: ECC, retired pages, row remapping, clock event reasons, PCIe link,
persistence, MIG, the driver against a pin, Xid events; each problem a finding that says what to do.

Three sources, one shape (_reading): NVML through ctypes (_nvml: libnvidia-ml, in-process, the
cheap one), ``nvidia-smi --query-gpu`` (_query: one process, when NVML cannot be loaded) and
``nvidia-smi -q -x`` (_xml: the full read, MIG instances with their memory and holders; only when
asked). This file picks the source and reads it, then hands the reading to the judge (_findings).
A field a source does not report is "not reported", never a traceback; bad XML or a
driver/library version mismatch is a finding with its diagnosis.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import ctypes

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._findings import assess, finding, mismatch_finding
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._nvml import (
    NVML_LIB_RM_MISMATCH,
    NvmlError,
    kernel_module_version,
    library_versions,
    load_nvml,
    nvml_read,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import parse_health, run_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import GpuError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xid import read_xid_events
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xml import parse_xml, run_xml

MISMATCH_TEXT = "driver/library version mismatch"


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
        driver, gpus, result["source"] = read_source(source, nvidia_smi, timeout, lib, cdll)
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


def _mismatch(source):
    found = mismatch_finding(kernel_module_version(), library_versions())
    return _Failed(found["what"], found, source)


def read_source(source, nvidia_smi, timeout, lib, cdll):
    """(driver_version, gpus, source read) of one source, the GPUs not judged yet. Raises _Failed
    with the finding that says why when none could be read."""
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
                    raise _mismatch("nvml") from exc
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
            driver, gpus = parse_xml(run_xml(nvidia_smi, timeout))
        else:
            driver, gpus = parse_health(*run_health(nvidia_smi, timeout))
    except GpuError as exc:
        if MISMATCH_TEXT in str(exc).lower():
            raise _mismatch(name) from exc
        raise _Failed(str(exc), finding("nvidia_smi_failed", "fail", str(exc),
                                        "see the message; check the node's kernel log for Xid errors"), name) from exc
    except ValueError as exc:
        raise _Failed(str(exc), finding("bad_output", "fail", str(exc),
                                        "compare nvidia-smi's version with the driver's; report it with the output"), name) from exc
    return driver, gpus, name
