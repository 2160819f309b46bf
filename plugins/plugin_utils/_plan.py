# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run's fleet plan (playbooks/plan.yml's fact on localhost), as a callback reads it at the end of a run.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

from collections.abc import Mapping

PLAN_FACT = "gpufleet_plan"


def run_plan(variable_manager):
    """The fleet plan the run set on localhost, or None (no plan: a run without plan.yml, or localhost
    left out of the run)."""
    if variable_manager is None:
        return None
    inventory = getattr(variable_manager, "_inventory", None)
    localhost = inventory.get_host("localhost") if inventory is not None else None
    if localhost is None:
        return None
    plan = variable_manager.get_vars(host=localhost, include_hostvars=False).get(PLAN_FACT)
    return plan if isinstance(plan, Mapping) else None
