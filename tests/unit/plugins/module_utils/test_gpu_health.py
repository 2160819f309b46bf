# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The GPU health read: the real H200's -q -x and variants of it, the query, the kernel log,
NVML's error handling through a stub library object, and the findings."""

from __future__ import annotations

import datetime
import os
import stat

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _health, _xid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import (
    check_record,
    kernel_module_version,
    parse_query,
    parse_xml,
    read_health,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "h200")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


H200_XML = fixture("nvidia-smi-q-x.xml")


def codes(findings):
    return [f["code"] for f in findings]


def health_of_xml(text, pin=None, events=None, problem=None, kernel_log=False):
    driver, gpus = parse_xml(text)
    host = _health.assess(gpus, driver, pin, events, problem, kernel_log)
    return driver, gpus, host


def edit(old, new, text=H200_XML):
    assert old in text, old
    return text.replace(old, new)


# --------------------------------------------------------------------------- the real H200


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


def test_the_kernel_module_version_of_the_real_h200(tmp_path):
    path = tmp_path / "version"
    path.write_text(fixture("proc-driver-nvidia-version.txt"))
    assert kernel_module_version(str(path)) == "580.159.04"
    assert kernel_module_version(str(tmp_path / "absent")) is None


# --------------------------------------------------------------------------- injected states


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


def test_an_older_driver_names_them_throttle_reasons():
    text = H200_XML.replace("clocks_event_reasons>", "clocks_throttle_reasons>").replace(
        "clocks_event_reason_", "clocks_throttle_reason_")
    text = edit("<clocks_throttle_reason_hw_slowdown>Not Active", "<clocks_throttle_reason_hw_slowdown>Active", text)
    _driver, [g], _host = health_of_xml(text)
    assert g["throttle"] == ["gpu_idle", "hw_slowdown"]


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


def test_mig_enabled_without_instances_is_a_finding():
    text = edit("<current_mig>Disabled</current_mig>\n\t\t\t<pending_mig>Disabled</pending_mig>", MIG_ON)
    _driver, [g], _host = health_of_xml(text)
    assert g["mig"] == {"current": True, "pending": True, "instances": []}
    assert codes(g["findings"]) == ["mig_no_instances"] and not g["healthy"]


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


# --------------------------------------------------------------------------- nvidia-smi as a command


def fake_smi(tmp_path, body):
    path = tmp_path / "nvidia-smi"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def no_nvml(name):
    raise OSError("%s: cannot open shared object file" % name)


def test_bad_xml_from_nvidia_smi_is_the_reads_error(tmp_path):
    smi = fake_smi(tmp_path, "echo '<nvidia_smi_log><gpu>'\n")
    result = read_health(source="xml", nvidia_smi=smi)
    assert result["healthy"] is False and "does not parse" in result["error"]
    assert codes(result["findings"]) == ["bad_output"] and result["gpus"] == []


def test_a_driver_library_mismatch_is_diagnosed(tmp_path, monkeypatch):
    smi = fake_smi(tmp_path, "echo 'Failed to initialize NVML: Driver/library version mismatch'\n"
                             "echo 'NVML library version: 580.95'\nexit 18\n")
    monkeypatch.setattr(_health, "kernel_module_version", lambda path=None: "580.159.04")
    monkeypatch.setattr(_health, "library_versions", lambda dirs=None, maps=None: ["580.95.05"])
    result = read_health(source="auto", nvidia_smi=smi, cdll=no_nvml)
    [found] = result["findings"]
    assert found["code"] == "driver_library_mismatch" and found["severity"] == "fail"
    assert "libnvidia-ml.so.580.95.05" in found["what"] and "580.159.04" in found["what"]
    assert "580.159.04" in found["action"] and result["error"] == found["what"]


def test_the_query_reads_the_cheap_fields(tmp_path):
    row = ("0, GPU-53bf7893-d852-962c-602f-a965cfa8109d, NVIDIA H200, 00000000:00:06.0, 580.159.04, Enabled, 0, 0, [N/A], "
           "0x0000000000000001, 5, 5, 16, 16, Disabled, Disabled")  # the real H200's answer
    remapped = "GPU-53bf7893-d852-962c-602f-a965cfa8109d, No, No, 0, 0"
    driver, [g] = parse_query(row, remapped)
    assert driver == "580.159.04" and g["pci"] == "00000000:00:06.0"
    assert g["ecc"]["volatile_uncorrected"] == 0 and g["throttle"] == ["gpu_idle"] and g["persistence_mode"] is True
    assert g["remapped_rows"] == {"pending": False, "failed": False, "correctable": 0, "uncorrectable": 0}
    assert g["pcie"] == {"gen": 5, "max_gen": 5, "width": 16, "max_width": 16} and g["mig"]["current"] is False
    smi = fake_smi(tmp_path, 'case "$1" in --query-gpu=*) echo "%s";; *) echo "%s";; esac\n' % (row, remapped))
    result = read_health(source="auto", nvidia_smi=smi, cdll=no_nvml)
    assert result["source"] == "query" and result["healthy"] and result["gpus"][0]["remapped_rows"]["pending"] is False


def test_an_older_nvidia_smi_is_asked_the_legacy_throttle_field(tmp_path):
    row = "0, GPU-1, Tesla V100, 00000000:3B:00.0, 470.1, Disabled, 1, 1, No, 0x0000000000000048, 3, 3, 16, 16, [N/A], [N/A]"
    smi = fake_smi(tmp_path, 'case "$1" in *clocks_event_reasons*) echo \'Field "clocks_event_reasons.active" is not a valid '
                             'field to query.\'; exit 2;; --query-gpu=*) echo "%s";; *) exit 2;; esac\n' % row)
    result = read_health(source="query", nvidia_smi=smi)
    [g] = result["gpus"]
    assert g["throttle"] == ["hw_slowdown", "hw_thermal_slowdown"] and g["remapped_rows"]["pending"] is None
    assert not g["healthy"] and codes(g["findings"])[0] == "ecc_uncorrected_volatile"
    assert "persistence_mode_off" in codes(g["findings"])


def test_no_nvml_and_no_nvidia_smi():
    result = read_health(source="auto", nvidia_smi=None, cdll=no_nvml)
    assert codes(result["findings"]) == ["no_gpu_tools"] and result["healthy"] is False


# --------------------------------------------------------------------------- NVML through a stub library object


class StubNvml(object):
    """A library object as ctypes.CDLL gives one: attributes are functions returning NVML codes."""

    def __init__(self, rcs=None, missing=(), mig=False):
        self.rcs = dict(rcs or {})
        self.missing = set(missing)
        self.mig = mig
        self.calls = []

    def __getattr__(self, name):
        if name.startswith("_") or name in self.missing:
            raise AttributeError(name)

        def fn(*args):
            self.calls.append(name)
            rc = self.rcs.get(name, 0)
            if rc == 0:
                self.answer(name, args)
            return rc
        return fn

    def answer(self, name, args):
        def out(i, value):
            args[i]._obj.value = value
        if name == "nvmlSystemGetDriverVersion":
            args[0].value = b"580.159.04"
        elif name in ("nvmlDeviceGetCount_v2", "nvmlDeviceGetMaxMigDeviceCount"):
            out(-1, 1 if name == "nvmlDeviceGetCount_v2" else 2)
        elif name in ("nvmlDeviceGetUUID", "nvmlDeviceGetName"):
            args[1].value = b"GPU-stub" if name.endswith("UUID") else b"NVIDIA H200"
        elif name == "nvmlDeviceGetPciInfo_v3":
            args[1]._obj.bus, args[1]._obj.device = 0, 6
        elif name == "nvmlDeviceGetTotalEccErrors":
            out(3, 4 if (args[1].value, args[2].value) == (1, 0) else 0)
        elif name == "nvmlDeviceGetRemappedRows":
            for i, v in zip(range(1, 5), (0, 1, 1, 0)):
                out(i, v)
        elif name == "nvmlDeviceGetCurrentClocksEventReasons":
            out(1, 0x1 | 0x40)
        elif name in ("nvmlDeviceGetCurrPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkGeneration"):
            out(1, 5)
        elif name in ("nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth"):
            out(1, 16)
        elif name == "nvmlDeviceGetPersistenceMode":
            out(1, 1)
        elif name == "nvmlDeviceGetMigMode":
            out(1, int(self.mig))
            out(2, int(self.mig))
        elif name == "nvmlDeviceGetMemoryInfo":
            args[1]._obj.total, args[1]._obj.used = 71040 * 1048576, 0


def test_nvml_reads_every_field_and_judges_it():
    result = read_health(source="nvml", lib=StubNvml())
    assert result["source"] == "nvml" and result["driver"]["version"] == "580.159.04"
    [g] = result["gpus"]
    assert g["uuid"] == "GPU-stub" and g["pci"] == "00000000:00:06.0"
    assert g["ecc"]["volatile_uncorrected"] == 4 and g["ecc"]["aggregate_uncorrected"] == 0
    assert g["remapped_rows"] == {"correctable": 0, "uncorrectable": 1, "pending": True, "failed": False}
    assert g["throttle"] == ["gpu_idle", "hw_thermal_slowdown"] and g["persistence_mode"] is True
    assert codes(g["findings"]) == ["ecc_uncorrected_volatile", "remapped_rows_pending", "throttle_hw_thermal_slowdown"]
    assert not g["healthy"] and not result["healthy"] and result["error"] is None


def test_nvml_not_supported_or_missing_functions_are_not_reported_never_a_traceback():
    lib = StubNvml(rcs={"nvmlDeviceGetRemappedRows": 3, "nvmlDeviceGetCurrPcieLinkWidth": 4},
                   missing={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"})
    result = read_health(source="nvml", lib=lib)
    [g] = result["gpus"]
    assert g["not_reported"]["remapped_rows"] == "not supported"
    assert g["not_reported"]["pcie.width"] == "no permission"
    assert g["not_reported"]["throttle"] == "not in this driver's NVML"
    assert g["remapped_rows"]["pending"] is None and g["throttle"] is None and g["pcie"]["width"] is None
    assert "nvmlShutdown" in lib.calls


def test_nvml_init_mismatch_and_a_lost_gpu(monkeypatch):
    monkeypatch.setattr(_health, "kernel_module_version", lambda path=None: "580.159.04")
    monkeypatch.setattr(_health, "library_versions", lambda dirs=None, maps=None: ["575.57.08"])
    result = read_health(source="nvml", lib=StubNvml(rcs={"nvmlInit_v2": 18}))
    assert codes(result["findings"]) == ["driver_library_mismatch"] and "575.57.08" in result["error"]
    lib = StubNvml(rcs={"nvmlDeviceGetTotalEccErrors": 15})
    result = read_health(source="nvml", lib=lib)
    assert codes(result["findings"]) == ["nvml_failed"] and "GPU is lost" in result["error"]
    assert "nvmlShutdown" in lib.calls


def test_nvml_mig_instances():
    result = read_health(source="nvml", lib=StubNvml(mig=True))
    [g] = result["gpus"]
    assert g["mig"]["current"] is True and len(g["mig"]["instances"]) == 2
    assert g["mig"]["instances"][0]["memory_total_mib"] == 71040 and "mig_no_instances" not in codes(g["findings"])
    empty = StubNvml(mig=True, rcs={"nvmlDeviceGetMigDeviceHandleByIndex": 6})
    [g] = read_health(source="nvml", lib=empty)["gpus"]
    assert g["mig"]["instances"] == [] and "mig_no_instances" in codes(g["findings"])


def test_load_nvml_returns_none_where_the_library_is_absent():
    assert _health.load_nvml(no_nvml) is None
    assert _health.load_nvml(lambda name: name) == "libnvidia-ml.so.1"


# --------------------------------------------------------------------------- the kernel log

DMESG = """2026-12-01T14:00:00,000000+00:00 NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04
2026-12-01T14:01:00,100000+00:00 NVRM: Xid (PCI:0000:00:06): 13, pid=1731, name=python3, Graphics Exception: ESR 0x404490=0x80000002
2026-12-01T15:02:03,000000+00:00 NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
2026-12-01T15:05:00,000000+00:00 NVRM: Xid (PCI:0000:41:00): 48, pid=99, name=train, An uncorrectable double bit error
"""


def test_xid_lines_of_dmesg_since_a_time():
    events = _xid.parse_dmesg(DMESG)
    assert [(e["pci"], e["xid"], e["pid"], e["process"]) for e in events] == [
        ("0000:00:06", 13, 1731, "python3"), ("0000:00:06", 79, None, "<unknown>"), ("0000:41:00", 48, 99, "train")]
    assert events[1]["severity"] == "fail" and "fallen off the bus" in events[1]["meaning"]
    since = _xid.parse_since("2026-12-01T15:00:00Z")
    assert [e["xid"] for e in _xid.parse_dmesg(DMESG, since)] == [79, 48]


def test_kmsg_records_and_since():
    boot = datetime.datetime(2026, 12, 1, 14, 0, tzinfo=datetime.timezone.utc).timestamp()
    records = ["6,100,1000000,-;NVRM: loading", ("4,101,3600000000,-;NVRM: Xid (PCI:0000:00:06): 94, pid=5, name=x, Contained\n"
               " SUBSYSTEM=pci\n"), "4,102,7200000000,-;NVRM: Xid (PCI:0000:00:06): 119, pid=5, name=x, Timeout"]
    events = _xid.parse_kmsg(records, boot)
    assert [(e["xid"], e["time"]) for e in events] == [(94, "2026-12-01T15:00:00+00:00"), (119, "2026-12-01T16:00:00+00:00")]
    later = _xid.parse_kmsg(records, boot, since=_xid.parse_since("2026-12-01T15:30:00+00:00"))
    assert [e["xid"] for e in later] == [119]


def test_every_common_code_is_explained():
    for code in (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119):
        e = _xid.explain(code)
        assert e["severity"] in ("fail", "warn") and e["meaning"] and e["action"]
    assert _xid.explain(999)["meaning"].startswith("Xid not in")


def test_xid_events_land_on_their_gpu_and_unknown_addresses_on_the_host():
    events = _xid.parse_dmesg(DMESG)
    _driver, [g], host = health_of_xml(H200_XML, events=events, kernel_log=True)
    assert [(f["code"], f["severity"]) for f in g["findings"]] == [("xid_79", "fail"), ("xid_13", "warn")]
    assert "x1" in g["findings"][0]["what"] and "reboot" in g["findings"][0]["action"]
    assert codes(host) == ["xid_48"] and "0000:41:00" in host[0]["what"]
    assert check_record({"gpus": [g], "findings": host, "error": None, "healthy": False,
                         "driver": {"version": "580.159.04", "pin": None}})["gpus"][0]["xid_events"] == {"13": 1, "79": 1}


def test_an_unreadable_kernel_log_is_a_finding_not_a_failure(tmp_path):
    calls = []

    def refuse(dmesg, timeout):
        calls.append(dmesg)
        return 1, "", "dmesg: read kernel buffer failed: Operation not permitted\n"

    events, problem = _xid.read_xid_events(dmesg="/bin/dmesg", kmsg=str(tmp_path / "kmsg"), run=refuse)
    assert events == [] and calls == ["/bin/dmesg"]
    assert "No such file" in problem and "Operation not permitted" in problem
    result = read_health(source="nvml", lib=StubNvml(), kernel_log=True,
                         xid_reader=lambda **kw: ([], "/dev/kmsg: Operation not permitted; dmesg is not installed"))
    assert "kernel_log_unreadable" in codes(result["findings"]) and result["kernel_log"]["read"] is False
    assert [f["severity"] for f in result["findings"]] == ["warn"]


def test_a_readable_kmsg_file_is_read_to_its_end(tmp_path):
    path = tmp_path / "kmsg"
    path.write_text("4,1,1000000,-;NVRM: Xid (PCI:0000:00:06): 31, pid=7, name=a, MMU Fault\n")
    (tmp_path / "uptime").write_text("100.0 50.0\n")
    events, problem = _xid.read_xid_events(kmsg=str(path), proc=str(tmp_path), kmsg_device=None)
    assert problem is None and [e["xid"] for e in events] == [31]
    # Without the test's leave, a regular file in the place of /dev/kmsg is not the kernel's log.
    events, problem = _xid.read_xid_events(kmsg=str(path), proc=str(tmp_path))
    assert events == [] and "not the kernel's log device" in problem


# --------------------------------------------------------------------------- pin and the check


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


# --------------------------------------------------------------------------- readiness, the record and the reports


def test_readiness_judges_gpu_healthy_only_when_asked():
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _readiness, _record
    result = {"gpu_state": {"gpus": [], "idle": True}, "processes": {"skipped": True},
              "cuda_contamination": {"skipped": True}, "pip_inventory": {"skipped": True}, "torch_cache": {"skipped": True},
              "gpu_health": {"skipped": True}}
    assert [c["name"] for c in _readiness.judge(result, False)] == ["gpu_idle"]
    result["gpu_health"] = read_health(source="nvml", lib=StubNvml())
    checks = _readiness.judge(result, False)
    assert [c["name"] for c in checks] == ["gpu_idle", "gpu_healthy"] and checks[1]["ok"] is False
    late = _readiness.check_health({"failed": True, "msg": "gpu_health did not finish"})
    assert late["ok"] is False and late["error"] == "gpu_health did not finish"
    failed = _record.failed_checks({"gpu_health": True, "gpu_driver_pin": "580"}, "container stopped")
    assert [c["name"] for c in failed] == ["gpu_idle", "gpu_healthy"]
    assert failed[1]["error"] == "container stopped" and failed[1]["driver"] == {"version": None, "pin": "580"}


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
    by_uuid = _health.node_xid(node)
    check = check_record(health_record())
    assert check["ok"] and check["gpus"][0]["xid_events"] == {}
    before = dict(check["gpus"][0])
    assert _health.fold_node_xid(check, by_uuid) is True
    gpu = check["gpus"][0]
    assert gpu["xid_events"] == {"13": 1, "79": 1}
    assert {"xid_13", "xid_79"} <= set(codes(gpu["findings"])) and not gpu["healthy"]
    assert check["ok"] is False and "xid_79" in check["summary"]
    assert [f for f in gpu["findings"] if not f["code"].startswith("xid_")] == before["findings"]
    # Folding again adds nothing twice; another GPU's events change nothing.
    _health.fold_node_xid(check, by_uuid)
    assert codes(gpu["findings"]).count("xid_79") == 1
    other = check_record(health_record())
    assert _health.fold_node_xid(other, {"GPU-another": by_uuid[gpu["uuid"]]}) is False and other["ok"]
