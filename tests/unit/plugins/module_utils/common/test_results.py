# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""common/_results: a result's diff reaches the output only in diff mode, and only when it says
something."""

from __future__ import annotations

import types

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._results import diff_only_in_diff_mode, warnings_to_module


def test_diff_kept_only_in_diff_mode():
    diff = {"before": "a\n", "after": ""}
    assert diff_only_in_diff_mode(types.SimpleNamespace(_diff=True), {"changed": True, "diff": diff}) == {"changed": True, "diff": diff}
    assert diff_only_in_diff_mode(types.SimpleNamespace(_diff=False), {"changed": True, "diff": diff}) == {"changed": True}
    assert diff_only_in_diff_mode(types.SimpleNamespace(_diff=True), {"changed": False, "diff": []}) == {"changed": False}
    assert diff_only_in_diff_mode(types.SimpleNamespace(_diff=True), {"changed": False}) == {"changed": False}


def test_warnings_go_to_module_warn():
    seen = []
    module = types.SimpleNamespace(warn=seen.append)
    assert warnings_to_module(module, {"changed": False, "warnings": ["a", "b"]}) == {"changed": False}
    assert seen == ["a", "b"]
    assert warnings_to_module(module, {"changed": False}) == {"changed": False} and seen == ["a", "b"]
