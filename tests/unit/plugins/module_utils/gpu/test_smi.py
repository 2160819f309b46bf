# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Running nvidia-smi (gpu/_smi.py): exit codes mapped to kinds, a missing binary, a hang
bounded and killed, mocked and through the nvidia-smi stand-in."""

from __future__ import annotations

import time

import pytest
from gpufakes import standins_running  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import (
    read_gpus,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import GpuError
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin


@pytest.mark.parametrize("rc, kind, words", [
    (9, "driver", "driver is not loaded"),
    (12, "nvml", "libnvidia-ml.so was not found"),
    (15, "bus", "fallen off the bus"),
    (6, "no_devices", "found no NVIDIA GPU"),
    (77, "failed", "nvidia-smi failed"),
])
def test_exit_codes_mocked(fake_popen, rc, kind, words):
    fake_popen.answers = {"gpu": (rc, "some driver text"), "apps": (0, "")}
    with pytest.raises(GpuError) as exc:
        read_gpus("nvidia-smi", "/usr/bin/nvidia-smi", 5)
    assert exc.value.kind == kind and exc.value.rc == rc
    assert words in str(exc.value) and "some driver text" in str(exc.value)


def test_missing_binary_is_kind_missing(tmp_path):
    with pytest.raises(GpuError) as exc:
        read_gpus("nvidia-smi", str(tmp_path / "nvidia-smi"), 5)
    assert exc.value.kind == "missing"
    with pytest.raises(GpuError, match="not found on PATH") as exc:
        read_gpus("nvidia-smi", None, 5)
    assert exc.value.kind == "missing"


@pytest.mark.parametrize("rc, kind", [(9, "driver"), (12, "nvml"), (15, "bus")])
def test_exit_codes_from_the_standin(standin, rc, kind):
    state, smi = standin
    gpu_standin.configure(state, fault="exit:%d" % rc)
    with pytest.raises(GpuError) as exc:
        read_gpus("nvidia-smi", smi, 10)
    assert (exc.value.kind, exc.value.rc) == (kind, rc)


def test_hang_is_bounded_and_killed(standin):
    state, smi = standin
    gpu_standin.configure(state, fault="hang", hang_seconds=60)
    started = time.monotonic()
    with pytest.raises(GpuError, match="did not answer within 0.5s") as exc:
        read_gpus("nvidia-smi", smi, 0.5)
    assert exc.value.kind == "timeout"
    assert time.monotonic() - started < 5
    # the hung process was killed, not left behind
    assert standins_running(state) == set()
