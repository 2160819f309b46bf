# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Project names as the packaging standards compare them, shared by the dist-info reader and the
lock-file reader (which _dist calls, so it cannot import _dist).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations


def canonical_name(name):
    """Normalise a project name as packaging.utils.canonicalize_name does (PEP 503):
    runs of ``-``, ``_`` and ``.`` become one ``-``, and the name is lower-cased."""
    out = name.lower().replace("_", "-").replace(".", "-")
    while "--" in out:
        out = out.replace("--", "-")
    return out
