# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The readiness options' one table and what is made from it (scripts/readiness_options.py)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest
import yaml

from ansible_collections.gpufleet.hygiene.plugins.filter import verify as _verify
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options, _readiness

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "readiness_options.py")


def generator(root):
    """scripts/readiness_options.py, pointed at the checkout (or copy) in root."""
    spec = importlib.util.spec_from_file_location("readiness_options_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.ROOT = root
    script.TABLE = os.path.join(root, "plugins", "module_utils", "readiness", "_options.py")
    script.ROLE = os.path.join(root, "roles", "verify")
    return script


@pytest.fixture
def copy(tmp_path):
    """The table and every file made from it, in a copy of the checkout's layout."""
    for rel in ("plugins/module_utils/readiness/_options.py", "plugins/doc_fragments/gpu_read.py",
                "plugins/doc_fragments/readiness_options.py", "roles/verify/defaults/main.yml",
                "roles/verify/meta/argument_specs.yml", "roles/verify/vars/main.yml"):
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        shutil.copy(os.path.join(REPO, rel), tmp_path / rel)
    return tmp_path


def test_every_file_made_from_the_table_is_in_step_with_it(capsys):
    assert generator(REPO).main(["--check"]) == 0, capsys.readouterr().out


def test_a_default_changed_in_the_table_alone_is_named_in_every_file_that_holds_it(copy, capsys):
    table = copy / "plugins/module_utils/readiness/_options.py"
    text = table.read_text()
    assert text.count('"stall_after", "int", default=900,') == 1
    table.write_text(text.replace('"stall_after", "int", default=900,', '"stall_after", "int", default=1800,'))
    script = generator(str(copy))
    assert script.main(["--check"]) == 1
    err = capsys.readouterr().err
    for rel in ("plugins/doc_fragments/readiness_options.py", "roles/verify/defaults/main.yml",
                "roles/verify/meta/argument_specs.yml"):
        assert rel in err
    assert "roles/verify/vars/main.yml" not in err  # the option is passed by name, its default is not there
    assert script.main([]) == 0
    assert script.main(["--check"]) == 0
    defaults = yaml.safe_load((copy / "roles/verify/defaults/main.yml").read_text())
    assert defaults["verify_stall_after"] == "{{ gpufleet_stall_after | default(1800) }}"
    spec = yaml.safe_load((copy / "roles/verify/meta/argument_specs.yml").read_text())
    assert spec["argument_specs"]["read"]["options"]["verify_stall_after"]["default"] == 1800
    assert spec["argument_specs"]["main"]["options"]["verify_stall_after"]["default"] == 1800  # through the anchor


def test_an_option_added_to_the_table_reaches_the_role_and_the_read(copy):
    table = copy / "plugins/module_utils/readiness/_options.py"
    row = ('    Option("max_holders", "int", default=8, role="verify_max_holders", inventory="gpufleet_max_holders",\n'
           '           given="always", description=("At most this many holders.",)),\n)\n\nBY_NAME')
    table.write_text(table.read_text().replace("\n)\n\nBY_NAME", "\n" + row, 1))
    assert generator(str(copy)).main([]) == 0
    defaults = yaml.safe_load((copy / "roles/verify/defaults/main.yml").read_text())
    assert defaults["verify_max_holders"] == "{{ gpufleet_max_holders | default(8) }}"
    assert "'max_holders': verify_max_holders" in (copy / "roles/verify/vars/main.yml").read_text()
    fragment = (copy / "plugins/doc_fragments/readiness_options.py").read_text()
    assert "  max_holders:\n    description:\n      - \"At most this many holders.\"\n    type: int\n    default: 8\n" in fragment


def test_the_generated_yaml_parses_and_the_blocks_are_where_the_marks_are():
    with open(os.path.join(REPO, "roles/verify/meta/argument_specs.yml")) as f:
        spec = yaml.safe_load(f)
    read = spec["argument_specs"]["read"]["options"]
    for option in _options.role_options():
        assert option.role in read, option.role
        assert read[option.role]["type"] == {"path": "str"}.get(option.type, option.type)
    # main takes the read's options through the YAML anchor
    assert set(read) <= set(spec["argument_specs"]["main"]["options"])
    with open(os.path.join(REPO, "roles/verify/defaults/main.yml")) as f:
        defaults = yaml.safe_load(f)
    assert {o.role for o in _options.role_options()} <= set(defaults)


def test_the_read_and_the_node_take_their_options_from_the_table():
    assert _options.argument_spec() == _readiness.ARGUMENT_SPEC
    assert [row[0] for row in _verify.ROLE_DEFAULTS] == [o.name for o in _options.role_options() if o.given == "always"] + [
        o.name for o in _options.role_options() if o.given != "always"]
    # the module's own options that the role does not give
    assert {o.name for o in _options.OPTIONS if not o.role} == {"read_timeout", "evidence_cache"}
