# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Proxmox VE's container IDs, as the pct connection and node_readiness both take them.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import re

VMID_MIN = 100
VMID_MAX = 999999999


def parse_vmid(value):
    """The vmid as an int when value is an integer in Proxmox's range or its digits as text
    (at most nine); None for anything else (a bool, a float, other text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        vmid = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value):
        vmid = int(value)
    else:
        return None
    return vmid if VMID_MIN <= vmid <= VMID_MAX else None
