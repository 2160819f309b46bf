# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The relaunch role's check of the libraries the new run maps (tasks/confirm.yml) takes its
readiness options from the one table (readiness/_options.py's rows' ``relaunch``), through
relaunch__readiness_args (vars/main.yml, written by scripts/readiness_options.py), as the verify
role's read takes its own: each option's name, when it is given and its conversion."""

from __future__ import annotations

import importlib.util
import os
import re

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from trustedvars import trusted

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ROLE = os.path.join(REPO, "roles", "relaunch")
READER = "Name the reader of the new run's libraries"
# What the check fixes, whatever the role's variables say (confirm.yml): the job's own GPU
# holders pass, the caches are not read, the libraries are judged.
FIXED = {"allow_running_job": True, "caches": False, "job_libraries": True}


def load(*parts):
    with open(os.path.join(ROLE, *parts)) as f:
        return yaml.safe_load(f)


def generator():
    spec = importlib.util.spec_from_file_location("readiness_options_script", os.path.join(REPO, "scripts", "readiness_options.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def reader_task():
    return next(t for t in load("tasks", "confirm.yml") if t.get("name") == READER)


def test_the_check_gives_every_relaunch_variable_the_table_names_and_no_other():
    rows = _options.relaunch_options()
    assert rows, "no row of the table names a relaunch variable"
    block = load("vars", "main.yml")["relaunch__readiness_args"]
    given = dict(re.findall(r"'(\w+)': (relaunch_\w+)", block))
    assert given == {row.name: row.relaunch for row in rows}
    assert set(re.findall(r"\brelaunch_\w+", block)) == {row.relaunch for row in rows}
    # Each is a variable of the role, typed as the read's option and defaulting to the inventory
    # variable the verify role's does, with the same fallback.
    script = generator()
    defaults = load("defaults", "main.yml")
    spec = load("meta", "argument_specs.yml")["argument_specs"]["main"]["options"]
    for row in rows:
        assert row.relaunch.startswith("relaunch_") and row.role, row.name
        assert spec[row.relaunch]["type"] == script.ROLE_TYPES.get(row.type, row.type), row.relaunch
        assert defaults[row.relaunch] == '{{ %s | default(%s) }}' % (row.inventory, script.jinja_literal(script.role_default(row))), row.relaunch


def test_the_reader_takes_the_generated_options_and_fixes_only_options_the_variables_do_not_give():
    reader = reader_task()["ansible.builtin.set_fact"]["relaunch__reader"]
    assert reader.split("|")[0].strip() == "{{ relaunch__readiness_args"
    # No option written by hand beside the table's but the fixed ones.
    assert not re.search(r"\brelaunch_(?!_)\w+", reader.split("verify_node_job", 1)[0]), reader
    fixed = re.search(r"combine\((\{[^}]*\})\)", reader)
    assert fixed and yaml.safe_load(fixed.group(1)) == FIXED
    assert set(FIXED) <= set(_options.BY_NAME)
    assert not set(FIXED) & {row.name for row in _options.relaunch_options()}


def expected(variables):
    """The options the table says the check gives, the role's variables being ``variables``."""
    out = dict(FIXED)
    for row in _options.relaunch_options():
        value = variables[row.relaunch]
        if row.given == "always":
            # converted as the read takes it (a bool, a number)
            out[row.name] = {"bool": lambda v: boolean(v, strict=True), "float": float, "int": int}.get(row.type, lambda v: v)(value)
        elif row.given == "positive" and float(value) > 0:
            out[row.name] = float(value)
        elif row.given == "set" and value:
            out[row.name] = str(value) if row.type == "str" else value
    return out


@pytest.mark.parametrize("host_vars", [
    {"gpufleet_job": {"patterns": ["^python3 /opt/train.py"]}, "gpufleet_venv": "/opt/venv"},
    {"gpufleet_job": {"patterns": ["^python3 /opt/train.py"], "users": ["trainer"]}, "gpufleet_venv": "/opt/venv",
     "gpufleet_expected_cuda": 12.8, "gpufleet_nvidia_smi": "/opt/bin/nvidia-smi", "gpufleet_require_gpu": False,
     "gpufleet_nvidia_smi_timeout": 30.5, "gpufleet_gpu_device_patterns": ["/dev/nvidia[0-9]*"]},
    {"gpufleet_job": {"patterns": ["^python3 /opt/train.py"]}, "gpufleet_venv": "/opt/venv", "gpufleet_expected_cuda": "",
     "gpufleet_nvidia_smi": "", "gpufleet_gpu_device_patterns": []},
    {"relaunch_patterns": ["train"], "relaunch_venv": "/srv/venv", "relaunch_expected_cuda": 13, "relaunch_require_gpu": "no",
     "relaunch_nvidia_smi_timeout": "20"},
])
def test_the_reader_is_given_what_the_table_says(host_vars):
    variables = dict(trusted(load("defaults", "main.yml")))
    variables.update(trusted(load("vars", "main.yml")))
    variables.update(host_vars, inventory_hostname="ct101", ansible_connection="ssh")
    templar = Templar(loader=DataLoader(), variables=variables)
    reader = templar.template(trust_as_template(reader_task()["ansible.builtin.set_fact"]["relaunch__reader"]))
    args = reader["entry"]["args"]
    roles = {row.relaunch: templar.template(variables[row.relaunch]) for row in _options.relaunch_options()}
    assert args == expected(roles)
    assert "expected_cuda" not in args or isinstance(args["expected_cuda"], str)  # 12.8 is not read as a number
    # What the read takes (the node validates each container's options as readiness's).
    assert not ArgumentSpecValidator(_options.ARGUMENT_SPEC).validate(dict(args)).error_messages
