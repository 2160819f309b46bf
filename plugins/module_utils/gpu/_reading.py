# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One GPU's health reading, the shape the NVML (_nvml), -q -x (_xml) and --query-gpu (_query)
reads all fill in: every field None until read, and what a source could not report noted with
why. The findings (_findings) judge it; nothing here does.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import is_unavailable

# NVML's clocks event (throttle) reason bits, nvml.h; the names are nvidia-smi's -q -x tags without their prefix.
THROTTLE_BITS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
                 (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
                 (0x80, "hw_power_brake_slowdown"), (0x100, "display_clocks_setting"))
THROTTLE_REASONS = tuple(name for _bit, name in THROTTLE_BITS)

# The memory fault fields of nvidia-smi -q -x (R550 and later; as the H200 fixture carries them):
# the flags under ecc_errors, the aggregate uncorrectable SRAM errors by source, and the row
# remapper's histogram (how many memory banks have max/high/partial/low/no spare rows left).
# Only -q -x reports them; the NVML and --query-gpu reads leave them None.
MEMORY_FAULT_FIELDS = ("sram_threshold_exceeded", "unrepairable_memory", "channel_repair_pending", "tpc_repair_pending",
                       "sram_uncorrectable_sources", "row_remapper_histogram")
SRAM_SOURCES = ("l2", "sm", "microcontroller", "pcie", "other")
HISTOGRAM_BINS = ("max", "high", "partial", "low", "none")


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


def throttle_names(bits):
    """The clock event reasons set in NVML's bitmask ``bits``."""
    return [name for bit, name in THROTTLE_BITS if bits & bit]


def note(gpu, field, text):
    """Note a field nvidia-smi's output lacks (-q -x of an older driver) or leaves N/A; return its text."""
    if text is None:
        gpu["not_reported"][field] = "missing from nvidia-smi -q -x"
    elif is_unavailable(text):
        gpu["not_reported"][field] = text
    return text
