# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one error every layer raises and every module catches once, at its edge.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations


class GpufleetError(Exception):
    """Something the user must fix or know: ``msg`` says what, ``partial`` is the part of the
    result that was read or done before it (returned with the failure)."""

    def __init__(self, msg, partial=None):
        super().__init__(msg)
        self.msg = msg
        self.partial = dict(partial or {})


def fail(module, exc, warnings=()):
    """fail_json with the error's message and partial result (a module's one except clause).

    ``warnings`` (what the module noted before failing) and those the partial result carries go
    to ``module.warn``; a ``diff`` in it is kept only in diff mode, as on success."""
    result = dict(exc.partial)
    result.pop("msg", None)
    result.setdefault("changed", False)  # what Ansible reports of a result without it
    for warning in list(warnings) + list(result.pop("warnings", None) or []):
        module.warn(warning)
    diff = result.pop("diff", None)
    if module._diff and diff:
        result["diff"] = diff
    module.fail_json(msg=exc.msg, **result)
