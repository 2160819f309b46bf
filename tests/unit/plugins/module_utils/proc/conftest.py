# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The real processes of proc/'s tests: the GPU stand-in's state and its trainers, which hold its
device files."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin


@pytest.fixture
def gpu(tmp_path):
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2)
    with gpu_standin.Trainers(state) as trainers:
        yield state, trainers
