# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every module's DOCUMENTATION, EXAMPLES and RETURN is YAML that parses: ansible-doc, the docs site and
ansible-test read each, and a plain scalar that ends in ':' (a sentence closed by a colon) is a mapping
key there. Read from the source with ast, as those tools read it, without importing the module."""

from __future__ import annotations

import ast
import os

import pytest
import yaml

MODULES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "plugins", "modules"))


def blocks(path):
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
                    yield target.id, node.value.value


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(MODULES) if n.endswith(".py") and n != "__init__.py"))
def test_each_documentation_block_parses(name):
    found = dict(blocks(os.path.join(MODULES, name)))
    assert set(found) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, name
    for block, text in found.items():
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            pytest.fail("%s's %s is no YAML: %s" % (name, block, exc))


def test_a_sentence_closed_by_a_colon_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('DOCUMENTATION = r"""\nmodule: bad\n"""\nEXAMPLES = ""\nRETURN = r"""\nx:\n  description:\n'
                   '    - the variables it gives (a filter):\n      a container\'s own\n"""\n')
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(dict(blocks(str(bad)))["RETURN"])
