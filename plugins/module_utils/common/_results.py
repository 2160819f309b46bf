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


def stopped_diff(header, terminated, width=160):
    """A before/after diff of the processes a module stopped (or, in check mode, would stop):
    before, each one of ``terminated`` (``pid``, ``user`` when known, the start of ``cmdline``);
    after, those whose outcome is ``survived``. None when it stops nothing."""
    if not terminated:
        return None

    def text(rows):
        return "".join("pid %s%s %s\n" % (t.get("pid"), " (%s)" % t["user"] if t.get("user") else "",
                                          " ".join(str(t.get("cmdline") or "").split())[:width]) for t in rows)

    return {"before_header": header, "after_header": header, "before": text(terminated),
            "after": text(t for t in terminated if t.get("outcome") == "survived")}
