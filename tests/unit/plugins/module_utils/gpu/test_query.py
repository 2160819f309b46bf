# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""nvidia-smi's query interface (gpu/_query.py): argv, CSV parsing, the state read and the
cheap health read (--query-gpu, --query-remapped-rows), mocked and through the stand-in."""

from __future__ import annotations

import subprocess
import time

import pytest
from gpufakes import DriverNotLoaded, codes, fake_pynvml, fake_smi, no_nvml, standins_running  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _query
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import (
    parse_apps,
    parse_gpus,
    parse_health,
    query_apps_argv,
    query_gpu_argv,
    read_gpus,
    split_row,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import GpuError, GpuParseError
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

GPU_ARGV = ["/usr/bin/nvidia-smi", "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
            "--format=csv,noheader,nounits"]


APPS_ARGV = ["/usr/bin/nvidia-smi", "--query-compute-apps=gpu_uuid,pid,used_memory,process_name",
             "--format=csv,noheader,nounits"]


def test_argv_exact():
    assert query_gpu_argv("/usr/bin/nvidia-smi") == GPU_ARGV
    assert query_apps_argv("/usr/bin/nvidia-smi") == APPS_ARGV
    # the free-text field is last, whatever else is asked
    assert _query.QUERY_APP_FIELDS[-1] == "process_name"


@pytest.mark.parametrize("line, n, free, expected", [
    ("0, GPU-a, NVIDIA H200, 3, 143771, 0", 6, 2, ["0", "GPU-a", "NVIDIA H200", "3", "143771", "0"]),
    # a model name with commas: the free-text field absorbs them, the others keep their place
    ("1, GPU-b, Weird, Inc. GPU, 5, 100, 7", 6, 2, ["1", "GPU-b", "Weird, Inc. GPU", "5", "100", "7"]),
    ("GPU-a, 42, 100, /opt/my app, v2/python3", 4, 3, ["GPU-a", "42", "100", "/opt/my app, v2/python3"]),
])
def test_split_row(line, n, free, expected):
    assert split_row(line, n, free) == expected


def test_split_row_too_few_fields():
    with pytest.raises(GpuParseError, match="2 fields where 6"):
        split_row("0, GPU-a", 6, 2)


def test_parse_gpus_placeholders_and_units():
    text = ("0, GPU-aaa, NVIDIA H200, 41498, 143771, 87\n"
            "1, GPU-bbb, NVIDIA H200, [N/A], 143771, [Not Supported]\n"
            "\n"
            "2, GPU-ccc, NVIDIA A100-SXM4-80GB, 4 MiB, 81920 MiB, 0 %\n")
    assert parse_gpus(text) == [
        {"index": 0, "uuid": "GPU-aaa", "name": "NVIDIA H200", "memory_used_mib": 41498,
         "memory_total_mib": 143771, "utilization_pct": 87},
        {"index": 1, "uuid": "GPU-bbb", "name": "NVIDIA H200", "memory_used_mib": None,
         "memory_total_mib": 143771, "utilization_pct": None},
        {"index": 2, "uuid": "GPU-ccc", "name": "NVIDIA A100-SXM4-80GB", "memory_used_mib": 4,
         "memory_total_mib": 81920, "utilization_pct": 0},
    ]


def test_parse_gpus_skips_a_header_line():
    text = ("index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n"
            "0, GPU-aaa, NVIDIA H200, 0 MiB, 143771 MiB, 0 %\n")
    assert [g["index"] for g in parse_gpus(text)] == [0]


def test_parse_gpus_garbage_is_a_clear_error():
    with pytest.raises(GpuParseError, match="'lots' for memory.used"):
        parse_gpus("0, GPU-aaa, NVIDIA H200, lots, 143771, 0\n")


@pytest.mark.parametrize("text", ["", "\n", "No running processes found\n"])
def test_parse_apps_none(text):
    assert parse_apps(text) == []


def test_parse_apps_names_with_commas_and_spaces():
    text = ("GPU-aaa, 40170, 185, /opt/rh/rh-python38/root/usr/bin/python3\n"
            "GPU-aaa, 40171, [N/A], /srv/my runs/train, v2.py\n"
            "GPU-bbb, [N/A], 10, ghost\n")
    assert parse_apps(text) == [
        {"gpu_uuid": "GPU-aaa", "pid": 40170, "used_memory_mib": 185, "name": "/opt/rh/rh-python38/root/usr/bin/python3"},
        {"gpu_uuid": "GPU-aaa", "pid": 40171, "used_memory_mib": None, "name": "/srv/my runs/train, v2.py"},
    ]


def test_a_malformed_app_row_is_that_row_s_problem_not_the_reading_s():
    """A process names itself with any bytes: a newline in its name continues it on the next line,
    which starts no row. A stray line before any row, or memory nvidia-smi prints as garbage,
    spoil no other row."""
    text = ("stray line, before any row\n"
            "GPU-aaa, 121, 40960, python3 evil\nname, on two lines\n"
            "GPU-aaa, 122, lots, python3\n"
            "GPU-bbb, 123, 512, /usr/bin/python3\n\n")
    assert parse_apps(text) == [
        {"gpu_uuid": "GPU-aaa", "pid": 121, "used_memory_mib": 40960, "name": "python3 evil\nname, on two lines"},
        {"gpu_uuid": "GPU-aaa", "pid": 122, "used_memory_mib": None, "name": "python3"},
        {"gpu_uuid": "GPU-bbb", "pid": 123, "used_memory_mib": 512, "name": "/usr/bin/python3"},
    ]


def test_read_gpus_mocked(fake_popen):
    fake_popen.answers = {
        "gpu": (0, "0, GPU-aaa, NVIDIA H200, 41498, 143771, 87\n"),
        "apps": (0, "GPU-aaa, 48211, 41488, python3\n"),
    }
    gpus, apps, backend, seconds = read_gpus("nvidia-smi", "/usr/bin/nvidia-smi", 5)
    assert fake_popen.calls == [GPU_ARGV, APPS_ARGV]
    assert backend == "nvidia-smi" and seconds >= 0
    assert gpus == [{"index": 0, "uuid": "GPU-aaa", "name": "NVIDIA H200", "memory_used_mib": 41498,
                     "memory_total_mib": 143771, "utilization_pct": 87}]
    assert apps == [{"gpu_uuid": "GPU-aaa", "pid": 48211, "used_memory_mib": 41488, "name": "python3"}]


def test_standin_header_units_and_field_order(standin):
    _state, smi = standin
    out = subprocess.run([smi, "--query-gpu=memory.total,index,name", "--format=csv"],
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    assert out.splitlines() == ["memory.total [MiB], index, name", "143771 MiB, 0, NVIDIA H200",
                                "143771 MiB, 1, NVIDIA H200"]
    bad = subprocess.run([smi, "--query-gpu=index,bogus", "--format=csv"], stdout=subprocess.PIPE, check=False)
    assert bad.returncode == 2 and b'Field "bogus" is not a valid field' in bad.stdout


def test_nvml_failure_falls_back_to_nvidia_smi_in_auto(fake_popen):
    fake_popen.answers = {"gpu": (9, "NVIDIA-SMI has failed"), "apps": (0, "")}
    lib = fake_pynvml(fail_init=DriverNotLoaded("Driver Not Loaded"))
    with pytest.raises(GpuError) as exc:
        read_gpus("auto", "/usr/bin/nvidia-smi", 5, pynvml=lib)
    assert exc.value.kind == "driver" and exc.value.rc == 9  # nvidia-smi's word, with its exit code
    with pytest.raises(GpuError, match="NVML initialisation failed") as exc:
        read_gpus("nvml", "/usr/bin/nvidia-smi", 5, pynvml=lib)
    assert exc.value.kind == "driver"


def test_the_process_list_is_asked_for_as_a_function_decides_while_the_gpu_query_runs(standin):
    state, smi = standin
    seen = []

    def decide(own):  # called while the GPU query runs, with that nvidia-smi's PID
        for pid in own:
            deadline, cmdline = time.monotonic() + 10, b""
            while not cmdline and time.monotonic() < deadline:  # empty until the child has exec'd
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmdline = f.read()
            seen.append(cmdline)
        return False

    gpus, apps, _backend, _s = read_gpus("nvidia-smi", smi, 10, apps=decide)
    assert len(gpus) == 2 and apps is None
    assert len(seen) == 1 and b"--query-gpu=" in seen[0]  # the wrapper script, or the stand-in it became
    _gpus, apps, _backend, _s = read_gpus("nvidia-smi", smi, 10, apps=lambda own: True)
    assert apps == []
    # What the function raises comes through, and the GPU query it ran beside is not left behind.
    gpu_standin.configure(state, fault="hang", hang_seconds=60)

    def scan_failed(own):
        deadline = time.monotonic() + 10
        while standins_running(state) != own and time.monotonic() < deadline:
            time.sleep(0.02)  # until the wrapper has become the (hanging) stand-in
        assert standins_running(state) == own
        raise OSError("the scan failed")

    with pytest.raises(OSError, match="the scan failed"):
        read_gpus("nvidia-smi", smi, 30, apps=scan_failed)
    assert standins_running(state) == set()


def test_the_query_reads_the_cheap_fields(tmp_path):
    row = ("0, GPU-53bf7893-d852-962c-602f-a965cfa8109d, NVIDIA H200, 00000000:00:06.0, 580.159.04, Enabled, 0, 0, [N/A], "
           "0x0000000000000001, 5, 5, 16, 16, Disabled, Disabled")  # the real H200's answer
    remapped = "GPU-53bf7893-d852-962c-602f-a965cfa8109d, No, No, 0, 0"
    driver, [g] = parse_health(row, remapped)
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
