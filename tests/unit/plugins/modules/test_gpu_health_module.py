# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The gpu_health module and the readiness module's gpu_health option, over a scripted nvidia-smi."""

from __future__ import annotations

import stat

import pytest

from ansible_collections.gpufleet.hygiene.plugins.modules import gpu_health, readiness

# The real H200's answer to the cheap query, then one with a pending row remapping.
ROW = ("0, GPU-53bf7893-d852-962c-602f-a965cfa8109d, NVIDIA H200, 00000000:00:06.0, 580.159.04, Enabled, 0, 0, [N/A], "
       "0x0000000000000001, 5, 5, 16, 16, Disabled, Disabled")
REMAPPED = "GPU-53bf7893-d852-962c-602f-a965cfa8109d, %s, No, 0, 1"


def smi(tmp_path, pending="No"):
    path = tmp_path / "nvidia-smi"
    path.write_text('#!/bin/sh\ncase "$1" in --query-gpu=*) echo "%s";; --query-remapped-rows=*) echo "%s";; '
                    '*) exit 2;; esac\n' % (ROW, REMAPPED % pending))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_module_reads_and_judges(run_module, tmp_path):
    res = run_module(gpu_health.main, {"source": "query", "nvidia_smi": smi(tmp_path), "driver_pin": "580"})
    assert res["changed"] is False and res["healthy"] is True and res["source"] == "query"
    assert res["driver"] == {"version": "580.159.04", "pin": "580"}
    assert res["check"]["name"] == "gpu_healthy" and res["check"]["ok"] is True
    res = run_module(gpu_health.main, {"source": "query", "nvidia_smi": smi(tmp_path, "Yes"), "driver_pin": "575"})
    assert res["healthy"] is False and [f["code"] for f in res["findings"]] == ["driver_pin_mismatch"]
    assert [f["code"] for f in res["gpus"][0]["findings"]] == ["remapped_rows_pending"]


@pytest.mark.parametrize("args, msg", [({"since": "yesterday"}, "since must be an ISO 8601"),
                                       ({"command_timeout": 0}, "command_timeout must be more than 0 (got 0.0)"),
                                       ({"command_timeout": "nan"}, "command_timeout must be more than 0 (got nan)")])
def test_the_module_refuses_bad_options(run_module, args, msg):
    res = run_module(gpu_health.main, args)
    assert res["failed"] is True and msg in res["msg"]


def test_readiness_with_gpu_health(run_module, tmp_path):
    base = {"require_gpu": False, "nvidia_smi": smi(tmp_path, "Yes"), "device_patterns": [str(tmp_path / "dev" / "nvidia*")]}
    res = run_module(readiness.main, base)
    assert res["gpu_health"]["skipped"] is True and "gpu_healthy" not in [c["name"] for c in res["checks"]]
    res = run_module(readiness.main, dict(base, gpu_health=True, gpu_driver_pin="580.159.04"))
    [check] = [c for c in res["checks"] if c["name"] == "gpu_healthy"]
    assert check["ok"] is False and check["summary"] == "GPU 0: remapped_rows_pending" and res["ready"] is False
    assert check["driver"] == {"version": "580.159.04", "pin": "580.159.04"}
