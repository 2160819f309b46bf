# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The marker file a cache root holds: the fingerprint it was last made fresh for, written
atomically through the root's handle and read back bounded (a hostile marker is a problem
reported, never a traceback).

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import datetime
import json
import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._fingerprint import FINGERPRINT_KEYS
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_optional
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import opened, write_file

MARKER = ".gpufleet-hygiene-fingerprint.json"


def read_marker(real_root):
    """``(fingerprint or None, problem or None)`` recorded in the root's marker."""
    path = os.path.join(real_root, MARKER)
    unread = []
    data = read_optional(path, "marker", unread, what="it")
    if unread:  # skipped, or larger than any marker written: not one
        return None, f"marker {path} cannot be read: {unread[0]}; it is rewritten on the next clear"
    if data is None:
        return None, None
    try:
        data = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: nesting deeper than the parser's stack ("[[[[..."), no marker ever written.
        return None, f"marker {path} is not valid JSON ({exc}): it is rewritten on the next clear"
    fp = data.get("fingerprint") if isinstance(data, dict) else None
    if not isinstance(fp, dict):
        return None, f"marker {path} holds no fingerprint: it is rewritten on the next clear"
    return {k: fp.get(k) for k in FINGERPRINT_KEYS}, None


def write_marker(root, fingerprint, venv, owner=None):
    """Record ``fingerprint`` in ``<root>/MARKER`` (root: a Dir or a path) atomically, through
    the root's handle, owned like the root (or by ``owner``)."""
    body = json.dumps({
        "fingerprint": {k: fingerprint.get(k) for k in FINGERPRINT_KEYS},
        "venv": venv,
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recorded_by": "gpufleet.hygiene.torch_cache",
    }, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    with opened(root) as d:
        write_file(d, MARKER, body, owner=owner)
