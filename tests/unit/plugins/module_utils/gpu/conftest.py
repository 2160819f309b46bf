# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures of the GPU read's unit tests."""

from __future__ import annotations

import pytest
from gpufakes import FakePopen  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _smi


@pytest.fixture
def fake_popen(monkeypatch):
    """gpu/_smi's subprocess.Popen replaced by FakePopen, with no calls recorded yet; set its
    ``answers`` per query kind."""
    FakePopen.calls = []
    FakePopen.answers = {}
    monkeypatch.setattr(_smi.subprocess, "Popen", FakePopen)
    return FakePopen
