# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role asks readiness (read.yml) and node_readiness (node.yml, through
verify__readiness_args) for the same options, from the same variables."""

from __future__ import annotations

import os
import re

import yaml

ROLE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "roles", "verify"))


def load(*parts):
    with open(os.path.join(ROLE, *parts)) as f:
        return yaml.safe_load(f)


def test_readiness_and_node_readiness_get_the_same_options_from_the_same_variables():
    read = next(t for t in load("tasks", "read.yml") if "gpufleet.hygiene.readiness" in t)["gpufleet.hygiene.readiness"]
    node_args = load("vars", "main.yml")["verify__readiness_args"]
    # {'option': verify_var | filter ...} and combine({'option': verify_var ...} if ...)
    in_node = {m.group(1): m.group(2) for m in re.finditer(r"'(\w+)': (verify_\w+)", node_args)}
    in_read = {k: re.search(r"\{\{ (verify_\w+)", v).group(1) for k, v in read.items() if k != "brief"}
    assert read["brief"] is True
    assert in_read == in_node
    assert len(in_read) == 15
