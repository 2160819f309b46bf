# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one health read (gpu/_health.py): the source picked, what could not be read as the
read's error with a finding (bad XML, a driver/library mismatch, no tools), the kernel log,
and the readiness read asking for it."""

from __future__ import annotations

from gpufakes import StubNvml, codes, fake_smi, no_nvml  # tests/lib, on pytest's pythonpath
from importgraph import PACKAGE, collection_imports, module_files

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _health, _xid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_health
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin


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


def test_no_nvml_and_no_nvidia_smi():
    result = read_health(source="auto", nvidia_smi=None, cdll=no_nvml)
    assert codes(result["findings"]) == ["no_gpu_tools"] and result["healthy"] is False


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


def test_readiness_judges_gpu_healthy_only_when_asked():
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _checks, _record
    result = {"gpu_state": {"gpus": [], "idle": True}, "processes": {"skipped": True},
              "cuda_contamination": {"skipped": True}, "pip_inventory": {"skipped": True}, "torch_cache": {"skipped": True},
              "gpu_health": {"skipped": True}}
    assert [c["name"] for c in _checks.judge(result, False)] == ["gpu_idle"]
    result["gpu_health"] = read_health(source="nvml", lib=StubNvml())
    checks = _checks.judge(result, False)
    assert [c["name"] for c in checks] == ["gpu_idle", "gpu_healthy"] and checks[1]["ok"] is False
    late = _checks.check_health({"failed": True, "msg": "gpu_health did not finish"})
    assert late["ok"] is False and late["error"] == "gpu_health did not finish"
    failed = _record.failed_checks({"gpu_health": True, "gpu_driver_pin": "580"}, "container stopped")
    assert [c["name"] for c in failed] == ["gpu_idle", "gpu_healthy"]
    assert failed[1]["error"] == "container stopped" and failed[1]["driver"] == {"version": None, "pin": "580"}


def by_code(gpu):
    return dict((f["code"], f) for f in gpu["findings"])


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


# --------------------------------------------------------------------------- one module reads, another judges


def gpu_imports():
    """{gpu module: the gpu modules it imports}, read from the source (importgraph, with ``ast``)."""
    files = module_files()
    out = {}
    for name, path in files.items():
        if name.startswith(PACKAGE + ".gpu."):
            with open(path, encoding="utf-8") as handle:
                top, late = collection_imports(handle.read(), files, path)
            out[name[len(PACKAGE) + 5:]] = sorted(m[len(PACKAGE) + 5:] for m in top | late if m.startswith(PACKAGE + ".gpu."))
    return out


def test_the_readers_read_straight_and_only_the_read_judges():
    graph = gpu_imports()
    readers = ("_smi", "_reading", "_nvml", "_xml", "_query")
    for reader in readers:
        # A source's values and its reading come from _smi and _reading; no reader asks the judge.
        assert set(graph[reader]) <= {"_smi", "_reading", "_nvml"}, (reader, graph[reader])
    # The judge reads nothing: no runner, no parser, no NVML.
    assert set(graph["_findings"]) <= {"_reading", "_xid"}, graph["_findings"]
    assert set(graph["_health"]) == {"_findings", "_nvml", "_query", "_smi", "_xid", "_xml"}
