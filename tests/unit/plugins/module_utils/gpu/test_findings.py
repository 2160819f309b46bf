# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Judging a reading (gpu/_findings.py): each problem a finding with its severity and action
(docs/gpu_health.md gives them), Xid events on their GPU, the driver pin, the gpu_healthy check
and what the reports make of it, the node's Xid events folded into a container's check."""

from __future__ import annotations

import os
import re

import pytest
from gpufakes import H200_XML, codes, edit, health_of_xml  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _findings, _xid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._findings import check_record
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xml import parse_xml


def test_volatile_uncorrectable_ecc_fails_the_gpu_aggregate_alone_warns():
    text = edit("<volatile>\n\t\t\t\t<sram_correctable>0</sram_correctable>\n\t\t\t\t<sram_uncorrectable_parity>0",
                "<volatile>\n\t\t\t\t<sram_correctable>0</sram_correctable>\n\t\t\t\t<sram_uncorrectable_parity>2")
    _driver, [g], _host = health_of_xml(text)
    assert g["ecc"]["volatile_uncorrected"] == 2 and not g["healthy"]
    assert codes(g["findings"]) == ["ecc_uncorrected_volatile"]
    assert "reset" in g["findings"][0]["action"]
    text = H200_XML.replace("\t\t\t\t<dram_uncorrectable>0</dram_uncorrectable>\n\t\t\t\t<sram_threshold_exceeded>",
                            "\t\t\t\t<dram_uncorrectable>5</dram_uncorrectable>\n\t\t\t\t<sram_threshold_exceeded>")
    _driver, [g], _host = health_of_xml(text)
    assert g["ecc"]["aggregate_uncorrected"] == 5 and g["healthy"]
    assert [(f["code"], f["severity"]) for f in g["findings"]] == [("ecc_uncorrected_aggregate", "warn")]


@pytest.mark.parametrize("tag, code", [("remapped_row_pending", "remapped_rows_pending"),
                                       ("remapped_row_failure", "remapped_rows_failed")])
def test_row_remapping_pending_or_failed_fails_the_gpu(tag, code):
    _driver, [g], _host = health_of_xml(edit("<%s>No</%s>" % (tag, tag), "<%s>Yes</%s>" % (tag, tag)))
    assert codes(g["findings"]) == [code] and not g["healthy"]
    assert ("RMA" in g["findings"][0]["action"]) == (code == "remapped_rows_failed")


def test_throttle_reasons_are_findings_that_warn():
    text = edit("<clocks_event_reason_hw_thermal_slowdown>Not Active", "<clocks_event_reason_hw_thermal_slowdown>Active")
    text = edit("<clocks_event_reason_sync_boost>Not Active", "<clocks_event_reason_sync_boost>Active", text)
    _driver, [g], _host = health_of_xml(text)
    assert g["throttle"] == ["gpu_idle", "hw_thermal_slowdown", "sync_boost"]
    assert [(f["code"], f["severity"]) for f in g["findings"]] == [
        ("throttle_hw_thermal_slowdown", "warn"), ("throttle_sync_boost", "info")]
    assert g["healthy"]  # a slowdown slows the job; it does not make the GPU unusable


def test_pcie_width_below_max_warns_and_gen_only_while_busy():
    text = edit("<current_link_width>16x", "<current_link_width>8x")
    text = edit("<current_link_gen>5", "<current_link_gen>3", text)
    _driver, [g], _host = health_of_xml(text)
    assert g["pcie"] == {"gen": 3, "max_gen": 5, "width": 8, "max_width": 16}
    assert codes(g["findings"]) == ["pcie_width_degraded"]  # idle: a lower generation saves power
    busy = edit("<clocks_event_reason_gpu_idle>Active", "<clocks_event_reason_gpu_idle>Not Active", text)
    _driver, [g], _host = health_of_xml(busy)
    assert codes(g["findings"]) == ["pcie_width_degraded", "pcie_gen_degraded"] and g["healthy"]


def test_persistence_mode_off_warns():
    _driver, [g], _host = health_of_xml(edit("<persistence_mode>Enabled", "<persistence_mode>Disabled"))
    assert g["persistence_mode"] is False and codes(g["findings"]) == ["persistence_mode_off"] and g["healthy"]


MIG_ON = "<current_mig>Enabled</current_mig>\n\t\t\t<pending_mig>Enabled</pending_mig>"


def test_mig_enabled_without_instances_is_a_finding():
    text = edit("<current_mig>Disabled</current_mig>\n\t\t\t<pending_mig>Disabled</pending_mig>", MIG_ON)
    _driver, [g], _host = health_of_xml(text)
    assert g["mig"] == {"current": True, "pending": True, "instances": []}
    assert codes(g["findings"]) == ["mig_no_instances"] and not g["healthy"]


DMESG = """2026-12-01T14:00:00,000000+00:00 NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
2026-12-01T14:01:00,100000+00:00 NVRM: Xid (PCI:0000:00:06): 13, pid=1731, name=python3, Graphics Exception: ESR 0x404490=0x80000002
2026-12-01T15:02:03,000000+00:00 NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
2026-12-01T15:05:00,000000+00:00 NVRM: Xid (PCI:0000:41:00): 48, pid=99, name=train, An uncorrectable double bit error
"""


def test_xid_events_land_on_their_gpu_and_unknown_addresses_on_the_host():
    events = _xid.parse_dmesg(DMESG)
    _driver, [g], host = health_of_xml(H200_XML, events=events, kernel_log=True)
    assert [(f["code"], f["severity"]) for f in g["findings"]] == [("xid_79", "fail"), ("xid_13", "warn")]
    assert "x1" in g["findings"][0]["what"] and "reboot" in g["findings"][0]["action"]
    assert codes(host) == ["xid_48"] and "0000:41:00" in host[0]["what"]
    assert check_record({"gpus": [g], "findings": host, "error": None, "healthy": False,
                         "driver": {"version": "580.159.04", "pin": None}})["gpus"][0]["xid_events"] == {"13": 1, "79": 1}


def test_the_driver_pin():
    assert not health_of_xml(H200_XML, pin="580")[2]
    [found] = health_of_xml(H200_XML, pin="575.57.08")[2]
    assert found["code"] == "driver_pin_mismatch" and "575.57.08" in found["action"]


def test_the_check_record_shape():
    _driver, gpus, host = health_of_xml(edit("<remapped_row_pending>No", "<remapped_row_pending>Yes"), pin="580.159.04")
    check = check_record({"gpus": gpus, "findings": host, "error": None, "healthy": False,
                          "driver": {"version": "580.159.04", "pin": "580.159.04"}})
    assert check["name"] == "gpu_healthy" and check["severity"] == "fail" and check["ok"] is False and check["error"] is None
    assert check["summary"] == "GPU 0: remapped_rows_pending"
    [g] = check["gpus"]
    assert set(g) >= {"index", "uuid", "name", "healthy", "findings", "ecc", "remapped_rows", "throttle", "pcie",
                      "persistence_mode", "mig"}
    assert set(g["findings"][0]) == {"code", "severity", "what", "action"}
    assert check["driver"] == {"version": "580.159.04", "pin": "580.159.04"}


def host_with_health():
    text = edit("<remapped_row_pending>No", "<remapped_row_pending>Yes")
    text = edit("<clocks_event_reason_hw_slowdown>Not Active", "<clocks_event_reason_hw_slowdown>Active", text)
    text = edit("<current_link_width>16x", "<current_link_width>8x", text)
    _driver, gpus, host = health_of_xml(text, events=_xid.parse_dmesg(DMESG), kernel_log=True)
    check = check_record({"gpus": gpus, "findings": host, "error": None, "healthy": False,
                          "driver": {"version": "580.159.04", "pin": None}})
    return {"host": "train-101", "node": "pve1", "vmid": 101, "ready": False, "running_job": False, "remediated": False,
            "error": None, "checks": [check], "gpus": [], "contaminants": [], "caches": []}


def test_prometheus_gpu_health_metrics():
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._prometheus import render_prometheus
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import build_run, parse_timestamp
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import normalize_hosts
    hosts, warnings = normalize_hosts([host_with_health()])
    assert warnings == []
    text = render_prometheus(build_run(hosts, "t", parse_timestamp("2026-12-01T15:00:00Z")))
    lines = set(text.splitlines())
    gl = 'host="train-101",node="pve1",gpu="0"'
    for line in ('gpufleet_hygiene_gpu_healthy{%s} 0' % gl,
                 'gpufleet_hygiene_gpu_xid_events{%s,xid="13"} 1' % gl,
                 'gpufleet_hygiene_gpu_xid_events{%s,xid="79"} 1' % gl,
                 'gpufleet_hygiene_gpu_ecc_uncorrected{%s,kind="volatile"} 0' % gl,
                 'gpufleet_hygiene_gpu_ecc_uncorrected{%s,kind="aggregate"} 0' % gl,
                 'gpufleet_hygiene_gpu_remapped_rows{%s,state="pending"} 1' % gl,
                 'gpufleet_hygiene_gpu_remapped_rows{%s,state="failed"} 0' % gl,
                 'gpufleet_hygiene_gpu_throttle{%s,reason="hw_slowdown"} 1' % gl,
                 'gpufleet_hygiene_gpu_throttle{%s,reason="hw_thermal_slowdown"} 0' % gl,
                 'gpufleet_hygiene_gpu_pcie_degraded{%s} 1' % gl,
                 '# TYPE gpufleet_hygiene_gpu_healthy gauge'):
        assert line in lines, line


def test_junit_names_the_failing_findings_and_what_to_do():
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._junit import render_junit
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import KNOWN_CHECKS, build_run, parse_timestamp
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import normalize_hosts
    assert KNOWN_CHECKS[-1] == "gpu_healthy"
    hosts, _warnings = normalize_hosts([host_with_health()])
    xml = render_junit(build_run(hosts, "t", parse_timestamp("2026-12-01T15:00:00Z")))
    assert 'name="gpu_healthy"' in xml and "GPU 0: remapped_rows_pending: a row remapping is pending" in xml
    assert "GPU 0: xid_79: Xid 79 x1" in xml and "xid_48: Xid 48 on PCI 0000:41:00" in xml


def health_record(events=None):
    driver, gpus, host = health_of_xml(H200_XML, events=events, kernel_log=events is not None)
    return {"gpus": gpus, "driver": {"version": driver, "pin": None}, "findings": host, "error": None,
            "healthy": all(g["healthy"] for g in gpus) and not any(f["severity"] == "fail" for f in host)}


def test_the_node_s_xid_events_fold_into_a_container_s_check_by_uuid():
    """The container's cheap read has no kernel log; the node's Xid events for the same GPU (by its
    UUID) make it unhealthy there, with the node's findings, counts and a new line."""
    node = health_record(events=_xid.parse_dmesg(DMESG))
    by_uuid = _findings.node_xid(node)
    check = check_record(health_record())
    assert check["ok"] and check["gpus"][0]["xid_events"] == {}
    before = dict(check["gpus"][0])
    assert _findings.fold_node_xid(check, by_uuid) is True
    gpu = check["gpus"][0]
    assert gpu["xid_events"] == {"13": 1, "79": 1}
    assert {"xid_13", "xid_79"} <= set(codes(gpu["findings"])) and not gpu["healthy"]
    assert check["ok"] is False and "xid_79" in check["summary"]
    assert [f for f in gpu["findings"] if not f["code"].startswith("xid_")] == before["findings"]
    # Folding again adds nothing twice; another GPU's events change nothing.
    _findings.fold_node_xid(check, by_uuid)
    assert codes(gpu["findings"]).count("xid_79") == 1
    other = check_record(health_record())
    assert _findings.fold_node_xid(other, {"GPU-another": by_uuid[gpu["uuid"]]}) is False and other["ok"]


REPO = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..")


def repo_text(*parts):
    with open(os.path.join(REPO, *parts), encoding="utf-8") as f:
        return f.read()


DOC = repo_text("docs", "gpu_health.md")


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


def read_one(text):
    _driver, [gpu] = parse_xml(text)
    _findings.assess([gpu], "580.159.04")
    return gpu


def edit_once(old, new, text=H200_XML):
    assert text.count(old) == 1, old
    return text.replace(old, new)


def by_code(gpu):
    return dict((f["code"], f) for f in gpu["findings"])


@pytest.mark.parametrize("healthy, faulty, code, severity, action", FLAGS, ids=[f[2] for f in FLAGS])
def test_a_memory_fault_flag_set_is_a_fail_finding_that_says_what_to_do(healthy, faulty, code, severity, action):
    gpu = read_one(edit_once(healthy, faulty))
    assert gpu["memory_faults"][code] is True
    found = by_code(gpu)[code]
    assert (found["severity"], found["action"]) == (severity, action)
    assert gpu["healthy"] is False
    # documented with the same severity and action
    assert re.search(r"^\| `%s` \| %s \| [^|]+ \| %s \|$" % (code, severity, re.escape(action)), DOC, re.MULTILINE), code


def test_uncorrectable_sram_errors_by_source_are_a_warning_naming_each_source():
    text = edit_once("<sram_l2>0</sram_l2>", "<sram_l2>2</sram_l2>")
    text = edit_once("<sram_microcontroller>0</sram_microcontroller>", "<sram_microcontroller>1</sram_microcontroller>", text)
    gpu = read_one(text)
    assert gpu["memory_faults"]["sram_uncorrectable_sources"] == {"l2": 2, "sm": 0, "microcontroller": 1, "pcie": 0, "other": 0}
    found = by_code(gpu)["sram_uncorrectable_sources"]
    assert found["severity"] == "warn" and found["what"].endswith("by source: l2 2, microcontroller 1")
    assert gpu["healthy"] is True  # a warning: the GPU still runs jobs
    assert "| `sram_uncorrectable_sources` | warn |" in DOC


def test_banks_without_a_spare_row_are_a_warning_and_few_left_is_info():
    none_left = read_one(edit_once("<row_remapper_histogram_none>0 bank(s)", "<row_remapper_histogram_none>3 bank(s)"))
    assert none_left["memory_faults"]["row_remapper_histogram"]["none"] == 3
    found = by_code(none_left)["row_remapper_banks_exhausted"]
    assert found["severity"] == "warn" and found["what"].startswith("3 memory banks without a spare row left")
    low = read_one(edit_once("<row_remapper_histogram_low>0 bank(s)", "<row_remapper_histogram_low>5 bank(s)"))
    assert by_code(low)["row_remapper_banks_low"]["severity"] == "info"
    assert "row_remapper_banks_exhausted" not in by_code(low)
    assert "| `row_remapper_banks_exhausted` | warn |" in DOC and "| `row_remapper_banks_low` | info |" in DOC
