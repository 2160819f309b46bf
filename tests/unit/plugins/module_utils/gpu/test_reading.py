# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu/_reading: the one shape every GPU health source fills in (nothing known until read), NVML's
clock event bits by name, and what a source could not report noted with why."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _reading


def leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and v:
            yield from leaves(v, prefix + k + ".")
        else:
            yield prefix + k, v


def test_a_gpu_before_it_is_read_knows_nothing():
    gpu = _reading.new_gpu(3)
    assert gpu["index"] == 3
    unknown = {k: v for k, v in leaves(gpu) if k not in ("index", "not_reported", "findings")}
    assert unknown and all(v is None for v in unknown.values()), unknown
    assert (gpu["not_reported"], gpu["findings"]) == ({}, [])
    assert set(gpu["memory_faults"]) == set(_reading.MEMORY_FAULT_FIELDS)


def test_each_gpu_gets_its_own_dicts():
    a, b = _reading.new_gpu(0), _reading.new_gpu(1)
    a["ecc"]["mode"] = "Enabled"
    a["not_reported"]["ecc"] = "N/A"
    a["memory_faults"]["unrepairable_memory"] = True
    assert b["ecc"]["mode"] is None and b["not_reported"] == {} and b["memory_faults"]["unrepairable_memory"] is None


@pytest.mark.parametrize("bits, want", [
    (0, []),
    (0x1, ["gpu_idle"]),
    (0x4 | 0x40, ["sw_power_cap", "hw_thermal_slowdown"]),
    (0x1FF, list(_reading.THROTTLE_REASONS)),
    (0x200 | 0x8, ["hw_slowdown"]),  # a bit nvml.h does not name here is not guessed at
])
def test_clock_event_bits_by_name(bits, want):
    assert _reading.throttle_names(bits) == want


def test_the_reasons_are_nvml_s_bits_in_order():
    assert [bit for bit, _name in _reading.THROTTLE_BITS] == [1 << i for i in range(9)]
    assert _reading.THROTTLE_REASONS[3] == "hw_slowdown" and len(set(_reading.THROTTLE_REASONS)) == 9


@pytest.mark.parametrize("text, noted", [
    (None, "missing from nvidia-smi -q -x"),
    ("N/A", "N/A"),
    ("[N/A]", "[N/A]"),
    ("[Not Supported]", "[Not Supported]"),
    ("Enabled", None),
    ("0", None),
])
def test_what_a_source_could_not_report_is_noted_with_why(text, noted):
    gpu = _reading.new_gpu(0)
    assert _reading.note(gpu, "ecc.mode", text) == text
    assert gpu["not_reported"] == ({} if noted is None else {"ecc.mode": noted})
