# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""galaxy.yml, meta/runtime.yml, the execution environment and the pinned tools agree on versions."""

from __future__ import annotations

import os
import re

import yaml
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load(path):
    with open(os.path.join(ROOT, path)) as f:
        return yaml.safe_load(f)


def pinned(name):
    with open(os.path.join(ROOT, "requirements", "dev.txt")) as f:
        [version] = re.findall(r"^%s==(\S+)$" % re.escape(name), f.read(), re.MULTILINE)
    return Version(version)


def test_ansible_core_the_tests_run_is_the_one_the_collection_and_the_ee_require():
    requires = SpecifierSet(load("meta/runtime.yml")["requires_ansible"])
    ee = load("execution-environment.yml")["dependencies"]["ansible_core"]["package_pip"]
    assert ee.startswith("ansible-core")
    ee_spec = SpecifierSet(ee[len("ansible-core"):])
    tested = pinned("ansible-core")
    assert tested in requires and tested in ee_spec, (tested, requires, ee_spec)
    # The EE takes the same minor series the tests run, which the collection accepts.
    series = Version("%d.%d" % (tested.major, tested.minor))
    assert series in ee_spec and Version("%d.%d" % (tested.major, tested.minor + 1)) not in ee_spec, ee_spec
    assert series in requires, requires


def test_the_ee_installs_the_artifact_galaxy_yml_names():
    version = load("galaxy.yml")["version"]
    ee = load("execution-environment.yml")
    [collection] = ee["dependencies"]["galaxy"]["collections"]
    assert collection == {"name": "/build/collections/gpufleet-hygiene-%s.tar.gz" % version, "type": "file"}
    with open(os.path.join(ROOT, "execution-environment.yml")) as f:
        tags = re.findall(r"gpufleet-hygiene-ee:(\S+)", f.read())
    assert tags and set(tags) <= {version, "latest"}, tags
