# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""``nvidia-smi -q -x`` read (gpu/_xml.py): the real H200's XML and variants of it (an older
driver, memory fault fields), and MIG as real MIG-enabled GPUs print it (tests/fixtures/mig/, its
sources in tests/fixtures/README.md)."""

from __future__ import annotations

import os
import re

import pytest
from gpufakes import H200_XML, codes, edit, health_of_xml  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _findings
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xml import parse_xml


def test_the_real_h200_reads_healthy_with_its_values():
    driver, gpus, host = health_of_xml(H200_XML, pin="580.159.04")
    assert driver == "580.159.04" and host == []
    [g] = gpus
    assert g["index"] == 0 and g["name"] == "NVIDIA H200" and g["uuid"] == "GPU-806378c0-b113-4b6d-8824-362489dbe053"
    assert g["pci"] == "00000000:00:06.0"
    assert g["ecc"] == {"mode": "Enabled", "volatile_uncorrected": 0, "aggregate_uncorrected": 0,
                        "volatile_corrected": 0, "aggregate_corrected": 0}
    # Hopper: retired pages N/A, row remapping instead.
    assert g["retired_pages"] == {"single_bit": None, "double_bit": None, "pending": None}
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False}
    assert g["throttle"] == ["gpu_idle"]
    assert g["pcie"] == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16}
    assert g["persistence_mode"] is True
    assert g["mig"] == {"current": False, "pending": False, "instances": None}
    assert g["findings"] == [] and g["healthy"] is True and g["not_reported"] == {}


def test_an_older_driver_names_them_throttle_reasons():
    text = H200_XML.replace("clocks_event_reasons>", "clocks_throttle_reasons>").replace(
        "clocks_event_reason_", "clocks_throttle_reason_")
    text = edit("<clocks_throttle_reason_hw_slowdown>Not Active", "<clocks_throttle_reason_hw_slowdown>Active", text)
    _driver, [g], _host = health_of_xml(text)
    assert g["throttle"] == ["gpu_idle", "hw_slowdown"]


MIG_ON = "<current_mig>Enabled</current_mig>\n\t\t\t<pending_mig>Enabled</pending_mig>"


MIG_DEVICES = """<mig_devices>
            <mig_device>
                <index>0</index>
                <gpu_instance_id>1</gpu_instance_id>
                <compute_instance_id>0</compute_instance_id>
                <fb_memory_usage>
                    <total>71040 MiB</total>
                    <reserved>0 MiB</reserved>
                    <used>40960 MiB</used>
                    <free>30080 MiB</free>
                </fb_memory_usage>
            </mig_device>
            <mig_device>
                <index>1</index>
                <gpu_instance_id>2</gpu_instance_id>
                <compute_instance_id>0</compute_instance_id>
                <fb_memory_usage>
                    <total>71040 MiB</total>
                    <reserved>0 MiB</reserved>
                    <used>0 MiB</used>
                    <free>71040 MiB</free>
                </fb_memory_usage>
            </mig_device>
        </mig_devices>""".replace("    ", "\t")


PROCESSES = """<processes>
            <process_info>
                <gpu_instance_id>1</gpu_instance_id>
                <compute_instance_id>0</compute_instance_id>
                <pid>1731</pid>
                <type>C</type>
                <process_name>python3</process_name>
                <used_memory>40950 MiB</used_memory>
            </process_info>
        </processes>""".replace("    ", "\t")


def test_mig_instances_with_their_memory_and_holders():
    text = edit("<current_mig>Disabled</current_mig>\n\t\t\t<pending_mig>Disabled</pending_mig>", MIG_ON)
    text = edit("<mig_devices>\n\t\t\tNone\n\t\t</mig_devices>", MIG_DEVICES, text)
    text = edit("<processes>\n\t\t</processes>", PROCESSES, text)
    _driver, [g], _host = health_of_xml(text)
    assert g["mig"]["instances"] == [
        {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_used_mib": 40960, "memory_total_mib": 71040,
         "holders": [{"pid": 1731, "name": "python3", "used_memory_mib": 40950}]},
        {"gpu_instance_id": 2, "compute_instance_id": 0, "memory_used_mib": 0, "memory_total_mib": 71040, "holders": []}]
    assert g["findings"] == [] and g["healthy"]
    pending = edit("<pending_mig>Enabled", "<pending_mig>Disabled", text)
    _driver, [g], _host = health_of_xml(pending)
    assert codes(g["findings"]) == ["mig_pending"]


def test_fields_an_older_driver_lacks_are_findings_not_tracebacks():
    start, end = H200_XML.index("\t\t<remapped_rows>"), H200_XML.index("</remapped_rows>") + len("</remapped_rows>")
    text = H200_XML[:start] + H200_XML[end:]
    start, end = text.index("\t\t<clocks_event_reasons>"), text.index("</clocks_event_reasons>") + len("</clocks_event_reasons>")
    text = text[:start] + text[end:]
    text = edit("<persistence_mode>Enabled</persistence_mode>", "", text)
    _driver, [g], _host = health_of_xml(text)
    assert g["throttle"] is None and g["persistence_mode"] is None and g["remapped_rows"]["pending"] is None
    assert sorted(g["not_reported"]) == ["persistence_mode", "remapped_rows", "throttle"]
    assert [(f["code"], f["severity"]) for f in g["findings"]] == [("field_missing", "info")] * 3
    assert g["healthy"]


@pytest.mark.parametrize("text, words", [("<nvidia_smi_log><gpu>", "does not parse"), ("<html/>", "not <nvidia_smi_log>")])
def test_bad_xml_is_a_value_error(text, words):
    with pytest.raises(ValueError, match=words):
        parse_xml(text)


REPO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..")


def repo_text(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


def read_one(text):
    _driver, [gpu] = parse_xml(text)
    _findings.assess([gpu], "580.159.04")
    return gpu


def by_code(gpu):
    return dict((f["code"], f) for f in gpu["findings"])


def test_the_real_h200_reads_every_memory_fault_field_and_none_is_a_finding():
    gpu = read_one(H200_XML)
    assert gpu["memory_faults"] == {
        "sram_threshold_exceeded": False, "unrepairable_memory": False, "channel_repair_pending": False,
        "tpc_repair_pending": False,
        "sram_uncorrectable_sources": {"l2": 0, "sm": 0, "microcontroller": 0, "pcie": 0, "other": 0},
        "row_remapper_histogram": {"max": 3072, "high": 0, "partial": 0, "low": 0, "none": 0}}
    assert gpu["healthy"] is True and gpu["findings"] == []


def test_a_driver_without_the_fields_reads_them_as_unknown_not_as_a_fault():
    text = re.sub(r"\s*<(unrepairable_memory|channel_repair_pending|tpc_repair_pending|sram_threshold_exceeded)>No</\1>", "", H200_XML)
    text = re.sub(r"\s*<aggregate_uncorrectable_sram_sources>.*?</aggregate_uncorrectable_sram_sources>", "", text, flags=re.DOTALL)
    text = re.sub(r"\s*<row_remapper_histogram>.*?</row_remapper_histogram>", "", text, flags=re.DOTALL)
    gpu = read_one(text)
    assert set(gpu["memory_faults"].values()) == {None}
    assert not set(by_code(gpu)) & {"unrepairable_memory", "sram_threshold_exceeded", "channel_repair_pending",
                                    "tpc_repair_pending", "sram_uncorrectable_sources", "row_remapper_banks_exhausted"}


MIG_XML = repo_text("tests", "fixtures", "mig", "nvidia-smi-q-x-mig.xml")


def read_mig(text):
    driver, gpus = parse_xml(text)
    host = _findings.assess(gpus, driver)
    return gpus, host


def test_two_gpu_instances_with_their_memory_and_the_process_of_each():
    [gpu], host = read_mig(MIG_XML)
    assert host == [] and gpu["mig"]["current"] is True and gpu["mig"]["pending"] is True
    assert gpu["mig"]["instances"] == [
        {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_used_mib": 20778, "memory_total_mib": 71424,
         "holders": [{"pid": 4242, "name": "python3", "used_memory_mib": 20480}]},
        {"gpu_instance_id": 5, "compute_instance_id": 0, "memory_used_mib": 13, "memory_total_mib": 35584, "holders": []},
    ]
    assert gpu["healthy"] is True and [f["code"] for f in gpu["findings"]] == []


def test_mig_on_with_every_instance_destroyed_is_a_finding():
    start, end = MIG_XML.index("<mig_devices>"), MIG_XML.index("</mig_devices>")
    text = MIG_XML[:start] + "<mig_devices>\n\t\t\tNone\n\t\t" + MIG_XML[end:]
    [gpu], _host = read_mig(text)
    assert gpu["mig"]["instances"] == []
    assert [f["code"] for f in gpu["findings"]] == ["mig_no_instances"] and gpu["healthy"] is False


def test_a_gpu_that_cannot_partition_reads_mig_as_unknown_not_off():
    text = MIG_XML.replace("<current_mig>Enabled</current_mig>", "<current_mig>N/A</current_mig>").replace(
        "<pending_mig>Enabled</pending_mig>", "<pending_mig>N/A</pending_mig>")
    [gpu], _host = read_mig(text)
    assert gpu["mig"] == {"current": None, "pending": None, "instances": None}
    assert not [f for f in gpu["findings"] if f["code"].startswith("mig_")]


def test_a_pending_disable_is_a_warning():
    [gpu], _host = read_mig(MIG_XML.replace("<pending_mig>Enabled</pending_mig>", "<pending_mig>Disabled</pending_mig>"))
    assert [(f["code"], f["severity"]) for f in gpu["findings"]] == [("mig_pending", "warn")]
