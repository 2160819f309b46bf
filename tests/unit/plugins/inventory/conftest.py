# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""These tests put ssh control sockets in tmp_path: a short one (tests/lib/shorttmp.py)."""

import pytest
import shorttmp


@pytest.fixture
def tmp_path():
    """Short enough for ssh's control sockets (tests/lib/shorttmp.py)."""
    with shorttmp.directory() as path:
        yield path
