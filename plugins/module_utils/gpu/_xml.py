# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The full health read: ``nvidia-smi -q -x``, parsed into one reading per GPU (see _reading),
MIG instances with their memory and holders, and the memory fault fields only this XML carries.
A field the XML lacks or leaves N/A is noted as not reported; XML that is not nvidia-smi's is a
ValueError that says so.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._reading import HISTOGRAM_BINS, SRAM_SOURCES, new_gpu, note
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import Pending, flag, is_unavailable, number

# The memory fault flags (R550 and later; as the H200 fixture carries them), by their path under
# <gpu>; each is read into memory_faults under the path's last part.
MEMORY_FAULT_PATHS = ("ecc_errors/unrepairable_memory", "ecc_errors/aggregate/sram_threshold_exceeded",
                      "ecc_errors/channel_repair_pending", "ecc_errors/tpc_repair_pending")


def run_xml(nvidia_smi, timeout):
    """The text of ``nvidia-smi -q -x``, bounded by ``timeout``."""
    return Pending([nvidia_smi, "-q", "-x"], timeout).wait()


def _find_text(el, path):
    node = el.find(path)
    if node is None:
        return None
    return (node.text or "").strip()


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
    gpu = new_gpu(number(_find_text(el, "minor_number")) if number(_find_text(el, "minor_number")) is not None else index)
    gpu["uuid"] = _find_text(el, "uuid")
    gpu["name"] = _find_text(el, "product_name")
    gpu["pci"] = el.get("id")
    ecc = gpu["ecc"]
    ecc["mode"] = note(gpu, "ecc.mode", _find_text(el, "ecc_mode/current_ecc"))
    for counter in ("volatile", "aggregate"):
        base = "ecc_errors/" + counter
        if el.find(base) is None:
            note(gpu, "ecc." + counter, None)
            continue
        # Hopper splits SRAM (parity, SECDED) and DRAM; older schemas have a device_memory/total split.
        unc_tags = ("sram_uncorrectable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")
        unc = [number(_find_text(el, base + "/" + tag)) for tag in unc_tags]
        if all(v is None for v in unc):
            unc = [number(_find_text(el, base + "/double_bit/total"))]
        cor = [number(_find_text(el, base + "/" + tag)) for tag in ("sram_correctable", "dram_correctable")]
        if all(v is None for v in cor):
            cor = [number(_find_text(el, base + "/single_bit/total"))]
        ecc[counter + "_uncorrected"] = None if all(v is None for v in unc) else sum(v for v in unc if v is not None)
        ecc[counter + "_corrected"] = None if all(v is None for v in cor) else sum(v for v in cor if v is not None)
    retired = gpu["retired_pages"]
    retired["single_bit"] = number(_find_text(el, "retired_pages/multiple_single_bit_retirement/retired_count"))
    retired["double_bit"] = number(_find_text(el, "retired_pages/double_bit_retirement/retired_count"))
    retired["pending"] = flag(_find_text(el, "retired_pages/pending_retirement"))
    rows = el.find("remapped_rows")
    if rows is None or is_unavailable((rows.text or "").strip() or "x"):
        note(gpu, "remapped_rows", None if rows is None else (rows.text or "").strip())
    else:
        gpu["remapped_rows"] = {"correctable": number(_find_text(rows, "remapped_row_corr")),
                                "uncorrectable": number(_find_text(rows, "remapped_row_unc")),
                                "pending": flag(_find_text(rows, "remapped_row_pending")),
                                "failed": flag(_find_text(rows, "remapped_row_failure"))}
    reasons = el.find("clocks_event_reasons")
    prefix = "clocks_event_reason_"
    if reasons is None:
        reasons, prefix = el.find("clocks_throttle_reasons"), "clocks_throttle_reason_"
    if reasons is None:
        note(gpu, "throttle", None)
    else:
        gpu["throttle"] = [child.tag[len(prefix):] for child in reasons
                           if child.tag.startswith(prefix) and (child.text or "").strip() == "Active"]
    link = "pci/pci_gpu_link_info/"
    pcie = gpu["pcie"]
    for key, path in (("gen", "pcie_gen/current_link_gen"), ("max_gen", "pcie_gen/max_link_gen"),
                      ("width", "link_widths/current_link_width"), ("max_width", "link_widths/max_link_width")):
        pcie[key] = number(note(gpu, "pcie." + key, _find_text(el, link + path)))
    gpu["persistence_mode"] = flag(note(gpu, "persistence_mode", _find_text(el, "persistence_mode")))
    _xml_memory_faults(gpu, el)
    _xml_mig(gpu, el)
    return gpu


def _xml_memory_faults(gpu, el):
    """The memory fault fields; a driver before R550 lacks them, which is no finding (older GPUs
    report page retirement instead), so a missing one stays None and unnoted."""
    faults = gpu["memory_faults"]
    for path in MEMORY_FAULT_PATHS:
        faults[path.rsplit("/", 1)[1]] = flag(_find_text(el, path))
    sources = el.find("ecc_errors/aggregate_uncorrectable_sram_sources")
    if sources is not None:
        counts = dict((name, number(_find_text(sources, "sram_" + name))) for name in SRAM_SOURCES)
        faults["sram_uncorrectable_sources"] = None if all(v is None for v in counts.values()) else counts
    histogram = el.find("remapped_rows/row_remapper_histogram")
    if histogram is not None:
        bins = dict((name, number(_find_text(histogram, "row_remapper_histogram_" + name))) for name in HISTOGRAM_BINS)
        faults["row_remapper_histogram"] = None if all(v is None for v in bins.values()) else bins


def _xml_mig(gpu, el):
    current = _find_text(el, "mig_mode/current_mig")
    if current is None:
        note(gpu, "mig", None)
        return
    gpu["mig"].update(current=flag(current), pending=flag(_find_text(el, "mig_mode/pending_mig")))
    if not gpu["mig"]["current"]:
        return
    holders = {}
    for p in el.findall("processes/process_info"):
        key = (number(_find_text(p, "gpu_instance_id")), number(_find_text(p, "compute_instance_id")))
        holders.setdefault(key, []).append({"pid": number(_find_text(p, "pid")), "name": _find_text(p, "process_name"),
                                            "used_memory_mib": number(_find_text(p, "used_memory"))})
    instances = []
    for m in el.findall("mig_devices/mig_device"):
        gi, ci = number(_find_text(m, "gpu_instance_id")), number(_find_text(m, "compute_instance_id"))
        instances.append({"gpu_instance_id": gi, "compute_instance_id": ci,
                          "memory_used_mib": number(_find_text(m, "fb_memory_usage/used")),
                          "memory_total_mib": number(_find_text(m, "fb_memory_usage/total")),
                          "holders": holders.get((gi, ci), [])})
    gpu["mig"]["instances"] = instances
