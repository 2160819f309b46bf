# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What every run's controller loads of the collection: ansible-core's collection loader compiles it
from source at each start (no bytecode cache), so the plugins a preflight loads must not pull in the
read's code or the report's. The plugins are imported in a fresh interpreter, as a run would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PREFIX = "ansible_collections.gpufleet.hygiene.plugins."

# What preflight loads on the controller: ansible.cfg's callbacks, the playbooks' filters, the
# plan's and the read's actions and the pct connection.
LOADED = ["callback.concise", "callback.outcome", "callback.preload", "callback.progress", "callback.unattempted",
          "filter.fleet", "filter.run_checks", "filter.verify", "filter.proxmox", "action.fleet_plan",
          "action.node_readiness", "action.node_reached", "connection.pct"]

# Code that runs on the targets (the read, the repair) or writes a report: none of it is needed to
# start a run, plan it or print its summary.
NOT_AT_START = ["module_utils.readiness._readiness", "module_utils.venv.", "module_utils.cache.", "module_utils.job.",
                "module_utils.proc.", "module_utils.gpu._state", "module_utils.gpu._health", "plugin_utils.report."]


def loaded(modules):
    code = ("import importlib, json, sys\n"
            "for name in %r: importlib.import_module(%r + name)\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith(%r))))" % (modules, PREFIX, PREFIX))
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, ".ansible", "collections"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    return [m[len(PREFIX):] for m in json.loads(out)]


def test_a_run_s_controller_plugins_load_neither_the_read_nor_the_report():
    found = loaded(LOADED)
    assert [m for m in found if m.startswith(tuple(NOT_AT_START))] == [], found
    assert "module_utils.readiness._options" in found  # the checks' table, and nothing behind it


def test_the_check_sees_what_a_plugin_pulls_in():
    # fleet_report's action writes the report: the report's code, as it should.
    assert any(m.startswith("plugin_utils.report.") for m in loaded(["action.fleet_report"]))
