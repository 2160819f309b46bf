# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every memory fault field the real H200's ``nvidia-smi -q -x`` carries (tests/fixtures/h200/),
read from that XML with one field changed at a time, and through the nvidia-smi stand-in:
each fault is its finding with the severity and action docs/gpu_health.md gives it."""

from __future__ import annotations

import os
import re

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import parse_xml, read_health
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

HERE = os.path.dirname(__file__)
with open(os.path.join(HERE, "..", "..", "..", "fixtures", "h200", "nvidia-smi-q-x.xml")) as _f:
    H200_XML = _f.read()
with open(os.path.join(HERE, "..", "..", "..", "..", "docs", "gpu_health.md")) as _f:
    DOC = _f.read()

DRAIN_RESET = "drain the GPU and reset it (nvidia-smi -r) or reboot the node"
# (element as the H200 prints it, healthy text, faulty text, finding code, severity, action)
FLAGS = [
    ("<unrepairable_memory>No</unrepairable_memory>", "<unrepairable_memory>Yes</unrepairable_memory>",
     "unrepairable_memory", "fail", "drain the GPU and RMA it"),
    ("<sram_threshold_exceeded>No</sram_threshold_exceeded>", "<sram_threshold_exceeded>Yes</sram_threshold_exceeded>",
     "sram_threshold_exceeded", "fail", "drain the GPU and RMA it"),
    ("<channel_repair_pending>No</channel_repair_pending>", "<channel_repair_pending>Yes</channel_repair_pending>",
     "channel_repair_pending", "fail", DRAIN_RESET),
    ("<tpc_repair_pending>No</tpc_repair_pending>", "<tpc_repair_pending>Yes</tpc_repair_pending>",
     "tpc_repair_pending", "fail", DRAIN_RESET),
]


def read(text):
    _driver, [gpu] = parse_xml(text)
    _health.assess([gpu], "580.159.04")
    return gpu


def edit(old, new, text=H200_XML):
    assert text.count(old) == 1, old
    return text.replace(old, new)


def by_code(gpu):
    return dict((f["code"], f) for f in gpu["findings"])


def test_the_real_h200_reads_every_memory_fault_field_and_none_is_a_finding():
    gpu = read(H200_XML)
    assert gpu["memory_faults"] == {
        "sram_threshold_exceeded": False, "unrepairable_memory": False, "channel_repair_pending": False,
        "tpc_repair_pending": False,
        "sram_uncorrectable_sources": {"l2": 0, "sm": 0, "microcontroller": 0, "pcie": 0, "other": 0},
        "row_remapper_histogram": {"max": 3072, "high": 0, "partial": 0, "low": 0, "none": 0}}
    assert gpu["healthy"] is True and gpu["findings"] == []


@pytest.mark.parametrize("healthy, faulty, code, severity, action", FLAGS, ids=[f[2] for f in FLAGS])
def test_a_memory_fault_flag_set_is_a_fail_finding_that_says_what_to_do(healthy, faulty, code, severity, action):
    gpu = read(edit(healthy, faulty))
    assert gpu["memory_faults"][code] is True
    found = by_code(gpu)[code]
    assert (found["severity"], found["action"]) == (severity, action)
    assert gpu["healthy"] is False
    # documented with the same severity and action
    assert re.search(r"^\| `%s` \| %s \| [^|]+ \| %s \|$" % (code, severity, re.escape(action)), DOC, re.MULTILINE), code


def test_uncorrectable_sram_errors_by_source_are_a_warning_naming_each_source():
    text = edit("<sram_l2>0</sram_l2>", "<sram_l2>2</sram_l2>")
    text = edit("<sram_microcontroller>0</sram_microcontroller>", "<sram_microcontroller>1</sram_microcontroller>", text)
    gpu = read(text)
    assert gpu["memory_faults"]["sram_uncorrectable_sources"] == {"l2": 2, "sm": 0, "microcontroller": 1, "pcie": 0, "other": 0}
    found = by_code(gpu)["sram_uncorrectable_sources"]
    assert found["severity"] == "warn" and found["what"].endswith("by source: l2 2, microcontroller 1")
    assert gpu["healthy"] is True  # a warning: the GPU still runs jobs
    assert "| `sram_uncorrectable_sources` | warn |" in DOC


def test_banks_without_a_spare_row_are_a_warning_and_few_left_is_info():
    none_left = read(edit("<row_remapper_histogram_none>0 bank(s)", "<row_remapper_histogram_none>3 bank(s)"))
    assert none_left["memory_faults"]["row_remapper_histogram"]["none"] == 3
    found = by_code(none_left)["row_remapper_banks_exhausted"]
    assert found["severity"] == "warn" and found["what"].startswith("3 memory banks without a spare row left")
    low = read(edit("<row_remapper_histogram_low>0 bank(s)", "<row_remapper_histogram_low>5 bank(s)"))
    assert by_code(low)["row_remapper_banks_low"]["severity"] == "info"
    assert "row_remapper_banks_exhausted" not in by_code(low)
    assert "| `row_remapper_banks_exhausted` | warn |" in DOC and "| `row_remapper_banks_low` | info |" in DOC


def test_a_driver_without_the_fields_reads_them_as_unknown_not_as_a_fault():
    text = re.sub(r"\s*<(unrepairable_memory|channel_repair_pending|tpc_repair_pending|sram_threshold_exceeded)>No</\1>", "", H200_XML)
    text = re.sub(r"\s*<aggregate_uncorrectable_sram_sources>.*?</aggregate_uncorrectable_sram_sources>", "", text, flags=re.DOTALL)
    text = re.sub(r"\s*<row_remapper_histogram>.*?</row_remapper_histogram>", "", text, flags=re.DOTALL)
    gpu = read(text)
    assert set(gpu["memory_faults"].values()) == {None}
    assert not set(by_code(gpu)) & {"unrepairable_memory", "sram_threshold_exceeded", "channel_repair_pending",
                                    "tpc_repair_pending", "sram_uncorrectable_sources", "row_remapper_banks_exhausted"}


def test_the_stand_ins_xml_carries_injected_memory_faults_to_gpu_health(tmp_path):
    health = tmp_path / "health.json"
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2, health_file=str(health))
    uuids = [g["uuid"] for g in gpu_standin.read_config(state)["gpus"]]
    gpu_standin.set_health(health, uuids[1], memory_faults={
        "unrepairable_memory": True, "tpc_repair_pending": True, "sram_sources": {"sm": 4},
        "row_remapper_histogram": {"max": 3070, "none": 2}})
    smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", state)
    result = read_health(source="xml", nvidia_smi=str(smi), timeout=30)
    assert result["error"] is None and result["source"] == "xml"
    first, second = result["gpus"]
    assert first["healthy"] is True and first["memory_faults"]["unrepairable_memory"] is False
    assert second["memory_faults"]["row_remapper_histogram"] == {"max": 3070, "high": 0, "partial": 0, "low": 0, "none": 2}
    assert {"unrepairable_memory", "tpc_repair_pending", "sram_uncorrectable_sources",
            "row_remapper_banks_exhausted"} <= set(by_code(second))
    assert "channel_repair_pending" not in by_code(second) and result["healthy"] is False
