# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""No plugin, option or return value says it was added in a version after the one galaxy.yml
builds: the version being made is the newest a `version_added` may name, so that what ansible-doc
shows matches the release that brings it."""

from __future__ import annotations

import os
import re

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VERSION_ADDED = re.compile(r"""version_added(?:\s*:\s*|\s*=\s*)["']?(\d+\.\d+\.\d+)""")


def galaxy_version():
    with open(os.path.join(REPO, "galaxy.yml")) as f:
        return yaml.safe_load(f)["version"]


def as_tuple(version):
    return tuple(int(part) for part in version.split("."))


def sources():
    for top in ("plugins", "roles"):
        for root, dirs, files in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith((".py", ".yml", ".yaml")):
                    yield os.path.join(root, name)


def later_than(version, paths):
    out = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for found in VERSION_ADDED.findall(line):
                    if as_tuple(found) > as_tuple(version):
                        out.append("%s:%d: version_added %s" % (os.path.relpath(path, REPO), number, found))
    return out


def test_nothing_is_added_in_a_version_after_the_one_galaxy_yml_builds():
    version = galaxy_version()
    assert later_than(version, sources()) == [], "galaxy.yml builds %s" % version


@pytest.mark.parametrize("line", ["    version_added: 0.4.0\n", '  version_added="0.4.0",\n', "version_added: '1.0.0'\n"])
def test_a_later_version_is_found(tmp_path, line):
    path = tmp_path / "plugin.py"
    path.write_text("DOCUMENTATION = r'''\noptions:\n  x:\n" + line + "'''\n")
    assert len(later_than("0.3.0", [str(path)])) == 1
