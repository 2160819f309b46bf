# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the GPU read's unit tests."""

from __future__ import annotations

import pytest
from gpufakes import FakePopen  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _smi
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin


@pytest.fixture
def fake_popen(monkeypatch):
    """gpu/_smi's subprocess.Popen replaced by FakePopen, with no calls recorded yet; set its
    ``answers`` per query kind."""
    FakePopen.calls = []
    FakePopen.answers = {}
    monkeypatch.setattr(_smi.subprocess, "Popen", FakePopen)
    return FakePopen


@pytest.fixture
def standin(tmp_path):
    """(state directory, path of the nvidia-smi stand-in) for two GPUs."""
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2)
    return state, gpu_standin.install_nvidia_smi(tmp_path / "bin", state)
