# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The one error every layer raises and every module catches once, at its edge, and the one
wording of a number option out of its range.

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


def out_of_range(name, value, least=None, more_than=None, at_most=None):
    """What is wrong with a number option, in the one wording every module and module_util
    uses, or None when ``value`` is in range: ``NAME must be at least LEAST (got VALUE)``,
    ``NAME must be more than MORE_THAN (got VALUE)`` or ``NAME must be at most AT_MOST (got
    VALUE)``. NaN is in no range."""
    if least is not None and not value >= least:
        return "%s must be at least %s (got %s)" % (name, least, value)
    if more_than is not None and not value > more_than:
        return "%s must be more than %s (got %s)" % (name, more_than, value)
    if at_most is not None and not value <= at_most:
        return "%s must be at most %s (got %s)" % (name, at_most, value)
    return None


def check_range(name, value, least=None, more_than=None, at_most=None):
    """out_of_range(), raised as a GpufleetError."""
    problem = out_of_range(name, value, least, more_than, at_most)
    if problem:
        raise GpufleetError(problem)


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
