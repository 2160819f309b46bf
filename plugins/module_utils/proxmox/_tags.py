# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Proxmox VE guest tags: the `tags` key of a container's config, a `;`-separated list.

Proxmox VE reads a tag list split on `;`, `,` and white space (PVE::Tools::split_list), takes
each tag of the pve-tag format, and by default (datacenter tag-style without ordering=config or
case-sensitive) keeps them lower-cased, sorted and once each (PVE::GuestHelpers::get_unique_tags).
"""

from __future__ import annotations

import re

# ASCII only, as Proxmox VE's own pattern is: without re.ASCII, Python's case folding takes U+0130 and
# U+0131 (dotted and dotless i) for letters of it.
_TAG = re.compile(r"[a-z0-9_][a-z0-9_\-+.]*", re.IGNORECASE | re.ASCII)


def split(text):
    """The tags of a `tags` value, as written (order and case kept)."""
    return [t for t in re.split(r"[;,\s]+", text or "") if t]


def bad(tags):
    """The first tag that is not of Proxmox VE's pve-tag format, or None."""
    for tag in tags:
        if not isinstance(tag, str):
            return repr(tag)  # never None, which says that every tag is good
        if not _TAG.fullmatch(tag):
            return tag
    return None


def normalize(tags):
    """Lower-cased, sorted, once each: the list Proxmox VE keeps by default."""
    return sorted({t.lower() for t in tags})


def merged(current, add=(), remove=()):
    """The list after adding ``add`` and removing ``remove`` (compared without case), every other
    tag kept."""
    gone = {t.lower() for t in remove}
    return normalize([t for t in current if t.lower() not in gone] + list(add))


def set_argv(vmid, tags, pct_path="pct"):
    """``pct set`` with the new list (`;`-joined), or dropping the key when it is empty."""
    if tags:
        return [pct_path, "set", str(vmid), "--tags", ";".join(tags)]
    return [pct_path, "set", str(vmid), "--delete", "tags"]
