# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What the modules do with a result before returning it.

Private to gpufleet.hygiene (not a public API). Standard library only.
"""

from __future__ import annotations


def diff_only_in_diff_mode(module, result):
    """Drop the before/after ``diff`` a result carries unless the run asked for ``--diff``
    (and keep it only when there is something in it). Returns the result."""
    diff = result.pop("diff", None)
    if module._diff and diff:
        result["diff"] = diff
    return result


def warnings_to_module(module, result):
    """Hand the ``warnings`` a result carries to ``module.warn`` (passing them to exit_json or
    fail_json is deprecated in ansible-core). Returns the result without them."""
    for warning in result.pop("warnings", None) or []:
        module.warn(warning)
    return result
