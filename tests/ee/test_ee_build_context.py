# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""execution-environment.yml: ansible-builder generates a build context holding this collection and its dependencies.

Nothing is built (no container engine): `ansible-builder create` only. ansible-builder runs from a throwaway
venv under build/ (tests/ee/setup-builder.sh makes it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL_VENV = os.path.join(ROOT, "build", "ee-tool", "venv")
BIN = os.path.dirname(sys.executable)


def _galaxy_version():
    with open(os.path.join(ROOT, "galaxy.yml")) as f:
        return yaml.safe_load(f)["version"]


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    subprocess.run(["bash", os.path.join(ROOT, "tests", "ee", "setup-builder.sh"), TOOL_VENV], check=True, cwd=ROOT,
                   capture_output=True)
    # The EE file takes the collection tarball from build/ee/collections (see its comments).
    collections = os.path.join(ROOT, "build", "ee", "collections")
    os.makedirs(collections, exist_ok=True)
    for name in os.listdir(collections):
        os.unlink(os.path.join(collections, name))
    subprocess.run([os.path.join(BIN, "ansible-galaxy"), "collection", "build", "--force", "--output-path", collections],
                   check=True, cwd=ROOT, capture_output=True)
    ctx = str(tmp_path_factory.mktemp("ee") / "context")
    proc = subprocess.run([os.path.join(TOOL_VENV, "bin", "ansible-builder"), "create", "--file", "execution-environment.yml",
                           "--context", ctx, "--output-filename", "Containerfile"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return ctx


def test_definition_is_schema_v3():
    with open(os.path.join(ROOT, "execution-environment.yml")) as f:
        ee = yaml.safe_load(f)
    assert ee["version"] == 3
    assert ee["dependencies"]["python"] == "requirements.txt" and ee["dependencies"]["system"] == "bindep.txt"


def test_containerfile(context):
    with open(os.path.join(context, "Containerfile")) as f:
        text = f.read()
    assert 'ARG EE_BASE_IMAGE="quay.io/fedora/fedora:42"' in text
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core>=2.19,<2.20 ansible-runner"' in text
    assert 'ARG PKGMGR="/usr/bin/dnf"' in text
    lines = text.splitlines()
    # the galaxy stage copies _build to /build and installs the collection from requirements.yml there
    galaxy = lines.index("FROM base AS galaxy")
    assert lines.index("COPY _build /build", galaxy) < lines.index("WORKDIR /build", galaxy)
    assert any("ansible-galaxy collection install" in x and "-r requirements.yml" in x for x in lines[galaxy:])
    assert "COPY _build/requirements.txt requirements.txt" in lines
    assert "COPY _build/bindep.txt bindep.txt" in lines
    assert any("introspect.py introspect --user-pip=requirements.txt --user-bindep=bindep.txt" in x for x in lines)


def test_collection_and_its_requirements_are_in_the_context(context):
    version = _galaxy_version()
    with open(os.path.join(context, "_build", "requirements.yml")) as f:
        reqs = yaml.safe_load(f)
    assert reqs == {"collections": [{"name": "/build/collections/gpufleet-hygiene-%s.tar.gz" % version, "type": "file"}]}, \
        "execution-environment.yml names another version than galaxy.yml (%s)" % version
    tarball = os.path.join(context, "_build", "collections", "gpufleet-hygiene-%s.tar.gz" % version)
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        manifest = json.load(tar.extractfile("MANIFEST.json"))
    assert manifest["collection_info"]["namespace"] == "gpufleet" and manifest["collection_info"]["name"] == "hygiene"
    assert {"plugins/modules/fleet_report.py", "plugins/plugin_utils/report/_report.py", "requirements.txt", "bindep.txt",
            "plugins/connection/pct.py", "plugins/inventory/proxmox_lxc.py"} <= names
    assert not [n for n in names if n.startswith((".venv", "build/", ".ansible"))]
    with open(os.path.join(context, "_build", "requirements.txt")) as f:
        # No Python package beyond ansible-core: both plugins reach the nodes with OpenSSH.
        assert not [line for line in f if line.strip() and not line.startswith("#")]
    with open(os.path.join(context, "_build", "bindep.txt")) as f:
        bindep = f.read()
    assert "openssh-clients [platform:rpm]" in bindep


def test_introspection_finds_the_collections_dependencies(context, tmp_path):
    """The builder's own introspect script, run on the collection as the image would hold it."""
    version = _galaxy_version()
    dest = tmp_path / "ansible_collections" / "gpufleet" / "hygiene"
    dest.mkdir(parents=True)
    with tarfile.open(os.path.join(context, "_build", "collections", "gpufleet-hygiene-%s.tar.gz" % version)) as tar:
        tar.extractall(dest, filter="data")
    proc = subprocess.run([os.path.join(TOOL_VENV, "bin", "python"), os.path.join(context, "_build", "scripts", "introspect.py"),
                           "introspect", str(tmp_path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "paramiko" not in out and "# from collection gpufleet.hygiene" in out
    assert "openssh-clients [platform:rpm]" in out
