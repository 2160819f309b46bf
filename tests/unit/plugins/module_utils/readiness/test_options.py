# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""readiness/_options: the readiness options' one table and what is made from it (scripts/readiness_options.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil

import pytest
import yaml

from ansible_collections.gpufleet.hygiene.plugins.filter import verify as _verify
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
SCRIPT = os.path.join(REPO, "scripts", "readiness_options.py")


def generator(root):
    """scripts/readiness_options.py, pointed at the checkout (or copy) in root."""
    spec = importlib.util.spec_from_file_location("readiness_options_script", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.ROOT = root
    script.TABLE = os.path.join(root, "plugins", "module_utils", "readiness", "_options.py")
    script.ROLE = os.path.join(root, "roles", "verify")
    script.RELAUNCH = os.path.join(root, "roles", "relaunch")
    return script


@pytest.fixture
def copy(tmp_path):
    """The table and every file made from it, in a copy of the checkout's layout."""
    for rel in ("plugins/module_utils/readiness/_options.py", "plugins/doc_fragments/gpu_read.py",
                "plugins/doc_fragments/readiness_options.py", "roles/verify/defaults/main.yml",
                "roles/verify/meta/argument_specs.yml", "roles/verify/vars/main.yml", "roles/relaunch/vars/main.yml"):
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        shutil.copy(os.path.join(REPO, rel), tmp_path / rel)
    return tmp_path


def test_every_file_made_from_the_table_is_in_step_with_it(capsys):
    assert generator(REPO).main(["--check"]) == 0, capsys.readouterr().out


def checked_after_editing_the_table(copy, capsys, old, new):
    """(the script, --check's stderr) once ``old``, found once in the copy's table, is ``new``:
    the table changed alone, nothing written from it yet (--check fails)."""
    table = copy / "plugins/module_utils/readiness/_options.py"
    text = table.read_text()
    assert text.count(old) == 1
    table.write_text(text.replace(old, new))
    script = generator(str(copy))
    assert script.main(["--check"]) == 1
    return script, capsys.readouterr().err


def test_a_default_changed_in_the_table_alone_is_named_in_every_file_that_holds_it(copy, capsys):
    script, err = checked_after_editing_the_table(copy, capsys, '"stall_after", "int", default=900,',
                                                  '"stall_after", "int", default=1800,')
    for rel in ("plugins/doc_fragments/readiness_options.py", "roles/verify/defaults/main.yml",
                "roles/verify/meta/argument_specs.yml"):
        assert rel in err
    assert "roles/verify/vars/main.yml" not in err  # the option is passed by name, its default is not there
    assert "roles/relaunch/vars/main.yml" not in err  # and the relaunch role does not give it
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


def test_the_relaunch_roles_options_are_checked_against_the_table_and_written_from_it(copy, capsys):
    """relaunch__readiness_args (the relaunch role's libraries check) is one of the files made
    from the table: edited by hand, or its rows changed alone, --check names it (and only it)."""
    relaunch = copy / "roles/relaunch/vars/main.yml"
    line = "     | gpufleet.hygiene.verify_readiness_args }}"
    assert line in relaunch.read_text()
    edited = "     | combine({'venv': '/opt/venv'}) | gpufleet.hygiene.verify_readiness_args }}"
    relaunch.write_text(relaunch.read_text().replace(line, edited))
    script = generator(str(copy))
    assert script.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert "roles/relaunch/vars/main.yml" in err and "roles/verify" not in err, err
    assert "-" + edited in out and "+" + line in out
    assert script.main([]) == 0 and line in relaunch.read_text()
    capsys.readouterr()
    # A row that no longer names a relaunch variable: the block leaves it out, the verify role's
    # files do not change.
    script, err = checked_after_editing_the_table(copy, capsys, '        relaunch="relaunch_expected_cuda",\n', "")
    assert "roles/relaunch/vars/main.yml" in err and "roles/verify" not in err, err
    assert script.main([]) == 0
    assert "expected_cuda" not in relaunch.read_text()
    # Made, marks included, where the role has none.
    relaunch.unlink()
    assert script.main(["--check"]) == 1
    assert script.main([]) == 0 and script.main(["--check"]) == 0
    block = yaml.safe_load(relaunch.read_text())["relaunch__readiness_args"]
    assert block.startswith("{{ {'job_patterns': relaunch_patterns,") and script.BEGIN in relaunch.read_text()


def test_the_relaunch_roles_options_are_the_rows_that_name_a_relaunch_variable():
    with open(os.path.join(REPO, "roles/relaunch/vars/main.yml")) as f:
        block = yaml.safe_load(f)["relaunch__readiness_args"]
    rows = _options.relaunch_options()
    assert [row.name for row in rows] == [o.name for o in _options.OPTIONS if o.relaunch]
    for row in rows:
        assert "'%s': %s" % (row.name, row.relaunch) in block, row.name
    # given as the verify role gives them: by the one filter that applies the table's rules
    assert block.rstrip().endswith("| gpufleet.hygiene.verify_readiness_args }}") and "combine" not in block


@pytest.mark.parametrize("role, name, rows", [
    ("verify", "verify__readiness_args", _options.role_options),
    ("relaunch", "relaunch__readiness_args", _options.relaunch_options),
])
def test_the_roles_give_their_variables_values_and_one_filter_applies_the_rules(role, name, rows):
    """When an option is given and how it is converted is worked out once, in Python (the filter
    verify_readiness_args, which the options a node gives each container go through too), not
    again in the roles' Jinja: the generated blocks only name each option's variable."""
    with open(os.path.join(REPO, "roles", role, "vars", "main.yml")) as f:
        block = yaml.safe_load(f)[name]
    values, _sep, rest = block.partition("}")
    assert values.startswith("{{ {") and rest.split() == ["|", "gpufleet.hygiene.verify_readiness_args" + (
        "(verify__cache_vars)" if role == "verify" else ""), "}}"], block
    variable = (lambda row: row.role) if role == "verify" else (lambda row: row.relaunch)
    pairs = dict(re.findall(r"'(\w+)': (\w+)", values))
    assert pairs == {row.name: variable(row) for row in rows()}


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
    assert _options.argument_spec() == _options.ARGUMENT_SPEC
    assert [row[0] for row in _verify.ROLE_DEFAULTS] == [o.name for o in _options.role_options() if o.given == "always"] + [
        o.name for o in _options.role_options() if o.given != "always"]
    # the module's own options that the role does not give
    assert {o.name for o in _options.OPTIONS if not o.role} == {"read_timeout", "evidence_cache"}


# ------------------------------------------------------------------ each default and range once


OPTION_NAMES = ("p", "params", "options", "args")


PLUGINS = os.path.join(REPO, "plugins")


def restated(root=PLUGINS):
    """Where Python code of the collection restates what a row of the table says: a range
    (``out_of_range("stall_after", ...)``), a GPU read option's argument spec written again
    (``command_timeout=dict(type="float", default=15)``), or a default given to ``.get``
    (``p.get("caches", True)``). The table itself excepted. ``[(path, line, what)]``."""
    import ast

    ranged = {o.name for o in _options.OPTIONS if o.least is not None or o.more_than is not None}
    gpu_read = {o.name for o in _options.OPTIONS if o.group == "gpu_read"}
    table = os.path.join(root, "module_utils", "readiness", "_options.py")
    found = []
    for base, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(base, name)
            if not name.endswith(".py") or path == table:
                continue
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                first = node.args[0].value if node.args and isinstance(node.args[0], ast.Constant) else None
                if func == "out_of_range" and first in ranged:
                    found.append((os.path.relpath(path, REPO), node.lineno, "the range of %s" % first))
                # Options by the code's names for them (p, params, options, args); a reading's keys
                # (result.get("caches", [])) are no option.
                receiver = getattr(node.func.value, "id", None) if isinstance(node.func, ast.Attribute) else None
                if func == "get" and receiver in OPTION_NAMES and first in _options.BY_NAME and len(node.args) > 1 and not (
                        isinstance(node.args[1], ast.Constant) and node.args[1].value is None):
                    found.append((os.path.relpath(path, REPO), node.lineno, "the default of %s" % first))
                for kw in node.keywords if func == "dict" else ():
                    value = kw.value
                    if kw.arg in gpu_read and isinstance(value, ast.Call) and getattr(value.func, "id", None) == "dict":
                        found.append((os.path.relpath(path, REPO), node.lineno, "the argument spec of %s" % kw.arg))
    return found


def test_no_default_or_range_of_the_table_is_written_again_in_the_code():
    assert restated() == []


def test_the_scan_finds_a_restated_default_range_and_spec(tmp_path):
    """The scan itself, on code that restates each (as the read and node_readiness used to)."""
    (tmp_path / "module_utils" / "readiness").mkdir(parents=True)
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "bad.py").write_text(
        "spec = dict(command_timeout=dict(type='float', default=15), other=dict(type='str'))\n"
        "problem = out_of_range('stall_after', p['stall_after'], least=1)\n"
        "on = p.get('caches', True) and p.get('venv') and p.get('baseline', None) and result.get('caches', [])\n")
    assert sorted(restated(str(tmp_path))) == [
        ("%s/modules/bad.py" % os.path.relpath(str(tmp_path), REPO), 1, "the argument spec of command_timeout"),
        ("%s/modules/bad.py" % os.path.relpath(str(tmp_path), REPO), 2, "the range of stall_after"),
        ("%s/modules/bad.py" % os.path.relpath(str(tmp_path), REPO), 3, "the default of caches"),
    ]


def test_each_range_is_checked_by_bad_option_on_any_subset_of_the_options():
    assert _options.bad_option({"stall_after": 0}) == "stall_after must be at least 1 (got 0)"
    assert _options.bad_option({"command_timeout": 0.0}) == "command_timeout must be more than 0 (got 0.0)"
    assert _options.bad_option({"read_timeout": -1, "stall_after": 5}) == "read_timeout must be more than 0 (got -1)"
    assert _options.bad_option({"job_baseline_tokens_per_s": None, "threshold_mib": -5}) is None  # no range: the spec's type
    assert _options.value({"caches": None}, "caches") is True and _options.value({}, "venv") is None
