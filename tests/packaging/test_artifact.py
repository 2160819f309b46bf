# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Galaxy artifact as `ansible-galaxy collection build` makes it from this checkout.

Built from the checkout as the other suites leave it: where a cache or an output folder those
suites write is missing, the test writes one, so that packing it would be caught.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

# What the suites and tools leave in a checkout (a file in each, written when missing).
LEFTOVERS = [".hypothesis/examples/probe", ".ruff_cache/probe", ".pytest_cache/v/probe", "tests/unit/.pytest_cache/probe",
             "plugins/modules/__pycache__/probe.cpython-311.pyc", "tests/unit/__pycache__/probe.cpython-311.pyc",
             "build/probe", "tests/output/probe", ".cache/probe", "inventory/sim/fleet.yml", "inventory/local.yml",
             "changelogs/.plugin-cache.yaml", "gpufleet-hygiene-0.0.1.tar.gz"]

# The artifact's top level: what runs, what documents it, what tests it. Nothing else.
TOP_LEVEL = {"MANIFEST.json", "FILES.json", "README.md", "CHANGELOG.rst", "LICENSES", "requirements.txt", "bindep.txt",
             "meta", "plugins", "roles", "playbooks", "docs", "changelogs", "contrib", "extensions", "inventory", "tests"}
MUST = ["README.md", "LICENSES/GPL-3.0-or-later.txt", "meta/runtime.yml", "changelogs/changelog.yaml",
        "changelogs/config.yaml", "requirements.txt", "bindep.txt", "docs/docsite/extra-docs.yml",
        "docs/docsite/links.yml", "docs/docsite/rst/guides.rst", "tests/sanity/get_pip.py"]
# Every tracked file under these is in the artifact.
SHIPPED_TREES = ("plugins/", "roles/", "playbooks/", "meta/", "docs/", "changelogs/", "contrib/", "extensions/", "tests/")
NEVER = ["*/__pycache__*", "*.pyc", ".hypothesis*", "*/.hypothesis*", ".ruff_cache*", "*/.ruff_cache*", ".pytest_cache*",
         "*/.pytest_cache*", ".venv*", ".ansible*", "build/*", ".cache*", "tests/output*", "*.tar.gz", "inventory/sim*",
         "inventory/local.yml", "changelogs/.plugin-cache.yaml", "Makefile", "ansible.cfg", "galaxy.yml",
         "requirements/*", "scripts/*", "benchmarks/*", ".ci/*", ".git*"]


@pytest.fixture(scope="module")
def leftovers():
    made = []
    for rel in LEFTOVERS:
        path = os.path.join(ROOT, rel)
        if os.path.lexists(path):
            continue
        new_dirs = [d for d in _parents(rel) if not os.path.lexists(os.path.join(ROOT, d))]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("left by a test run\n")
        made.append((path, [os.path.join(ROOT, d) for d in new_dirs]))
    try:
        yield LEFTOVERS
    finally:
        for path, dirs in reversed(made):
            os.unlink(path)
            for d in reversed(dirs):
                os.rmdir(d)


def _parents(rel):
    parts = rel.split("/")[:-1]
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


@pytest.fixture(scope="module")
def artifact(leftovers, tmp_path_factory):
    out = tmp_path_factory.mktemp("artifact")
    proc = subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(out)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [name] = os.listdir(out)
    with tarfile.open(out / name) as tar:
        members = tar.getmembers()
        files = json.load(tar.extractfile("FILES.json"))
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    return {"name": name, "members": members, "files": files, "manifest": manifest}


def _tracked():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return {p for p in out.split("\0") if p and os.path.isfile(os.path.join(ROOT, p))}


def test_the_leftovers_are_there_to_be_caught(leftovers):
    assert all(os.path.lexists(os.path.join(ROOT, rel)) for rel in leftovers)


def test_it_is_named_by_galaxy_yml(artifact):
    with open(os.path.join(ROOT, "galaxy.yml")) as f:
        galaxy = yaml.safe_load(f)
    assert artifact["name"] == "gpufleet-hygiene-%s.tar.gz" % galaxy["version"]
    info = artifact["manifest"]["collection_info"]
    assert (info["namespace"], info["name"], info["version"]) == ("gpufleet", "hygiene", galaxy["version"])
    assert info["license"] == ["GPL-3.0-or-later"]


def test_nothing_a_tool_left_in_the_checkout_is_packed(artifact):
    names = [m.name for m in artifact["members"]]
    packed = sorted(n for n in names for pattern in NEVER if fnmatch.fnmatch(n, pattern))
    assert not packed, packed
    assert {n.split("/")[0] for n in names} <= TOP_LEVEL, sorted({n.split("/")[0] for n in names} - TOP_LEVEL)


def test_every_file_is_one_the_checkout_tracks(artifact):
    """A file that git neither tracks nor would add (an output, a cache under a new name) is not packed."""
    extra = {m.name for m in artifact["members"] if m.isfile()} - _tracked() - {"MANIFEST.json", "FILES.json"}
    assert not extra, sorted(extra)


def test_runtime_docs_changelog_licence_and_tests_are_packed(artifact):
    names = {m.name for m in artifact["members"] if m.isfile()}
    missing = [n for n in MUST if n not in names]
    missing += sorted(p for p in _tracked() if p.startswith(SHIPPED_TREES) and p not in names)
    assert not missing, missing
    for kind in ("modules", "module_utils", "action", "connection", "inventory", "callback", "filter", "doc_fragments"):
        assert any(n.startswith("plugins/%s/" % kind) and n.endswith(".py") for n in names), kind
    assert {"roles/%s/meta/argument_specs.yml" % r for r in ("kill", "purge", "relaunch", "verify")} <= names
    assert {"playbooks/preflight.yml", "playbooks/remediate.yml", "playbooks/hygiene.yml"} <= names


def test_files_json_lists_every_file_with_its_checksum(artifact):
    listed = {e["name"] for e in artifact["files"]["files"] if e["ftype"] == "file"}
    packed = {m.name for m in artifact["members"] if m.isfile()} - {"MANIFEST.json", "FILES.json"}
    assert listed == packed
