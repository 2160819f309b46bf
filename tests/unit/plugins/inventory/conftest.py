# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""These tests put ssh control sockets in tmp_path: a short one (tests/lib/shorttmp.py)."""

from shorttmp import tmp_path  # noqa: F401 - a fixture: pytest finds it here
