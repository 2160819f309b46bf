# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet plan as the outcome and unattempted callbacks read it at the end of a run (plugin_utils/_plan.py),
from a real inventory and variable manager."""

from __future__ import annotations

from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._plan import run_plan


def manager(tmp_path, hosts="localhost ansible_connection=local\ntrain-100\n"):
    (tmp_path / "hosts").write_text(hosts)
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[str(tmp_path / "hosts")])
    return VariableManager(loader=loader, inventory=inventory), inventory


def test_the_plan_is_localhost_s_fact(tmp_path):
    variables, inventory = manager(tmp_path)
    assert run_plan(variables) is None  # no plan.yml in this run
    plan = {"containers": ["train-100"], "by": "node"}
    variables.set_host_facts("localhost", {"gpufleet_plan": plan})
    assert run_plan(variables) == plan
    variables.set_host_facts("localhost", {"gpufleet_plan": "not a plan"})
    assert run_plan(variables) is None


def test_no_variable_manager_and_no_localhost_give_no_plan(tmp_path):
    assert run_plan(None) is None
    variables, _inventory = manager(tmp_path, hosts="train-100\n")
    # An inventory without localhost: ansible-core makes an implicit one, which holds no plan.
    assert run_plan(variables) is None
