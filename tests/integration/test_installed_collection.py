# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection as a user who does not clone has it: the artifact installed with ansible-galaxy into
an empty collections path, verified, and its preflight playbook run by its fully qualified name over the
session's simulated fleet, from a folder outside the checkout with a configuration that names no file
of it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile

import pytest
from conftest import INVENTORY, REPO, VENV_BIN
from test_preflight import expect_cuda, recap, running, summary

INSTALLED = ("ansible_collections", "gpufleet", "hygiene")


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """Build the artifact, install it into an empty collections path; a working folder and an
    environment that know only that path."""
    base = tmp_path_factory.mktemp("user")
    dist, collections, work = base / "dist", base / "collections", base / "work"
    for d in (dist, collections, work):
        d.mkdir()
    subprocess.run([os.path.join(VENV_BIN, "ansible-galaxy"), "collection", "build", "--output-path", str(dist), REPO],
                   cwd=str(work), check=True, capture_output=True)
    [tarball] = dist.iterdir()
    (work / "ansible.cfg").write_text(
        "[defaults]\ncollections_path = %s\ncollections_scan_sys_path = false\n"
        "callbacks_enabled = gpufleet.hygiene.preload\ncallback_result_format = yaml\n"
        "interpreter_python = auto_silent\nretry_files_enabled = false\ngathering = explicit\nforks = 50\n"
        "[ssh_connection]\npipelining = true\n" % collections)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_CONFIG=str(work / "ansible.cfg"), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", HOME=str(base))

    def run(tool, *args):
        return subprocess.run([os.path.join(VENV_BIN, tool), *args], cwd=str(work), env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)

    res = run("ansible-galaxy", "collection", "install", "--offline", "-p", str(collections), str(tarball))
    assert res.returncode == 0, res.stdout
    return {"tarball": str(tarball), "collections": str(collections), "root": os.path.join(str(collections), *INSTALLED),
            "work": work, "run": run}


def test_the_installed_copy_verifies_against_the_artifact(user):
    res = user["run"]("ansible-galaxy", "collection", "verify", "--offline", "-p", user["collections"], "gpufleet.hygiene")
    assert res.returncode == 0, res.stdout
    assert "Installed collection found at '%s'" % user["root"] in res.stdout, res.stdout
    with tarfile.open(user["tarball"]) as tar:
        packed = hashlib.sha256(tar.extractfile("MANIFEST.json").read()).hexdigest()
    # The manifest verify checked the files against is the artifact's own.
    assert "MANIFEST.json hash: %s" % packed in res.stdout, res.stdout


def test_verify_finds_a_changed_file(user):
    path = os.path.join(user["root"], "plugins", "modules", "gpu_state.py")
    saved = path + ".orig"
    shutil.copy2(path, saved)
    try:
        with open(path, "a") as f:
            f.write("# changed after install\n")
        res = user["run"]("ansible-galaxy", "collection", "verify", "--offline", "-p", user["collections"],
                          "gpufleet.hygiene")
        assert res.returncode != 0, res.stdout
        assert "plugins/modules/gpu_state.py" in res.stdout, res.stdout
    finally:
        os.replace(saved, path)


def test_modules_and_playbooks_resolve_from_the_installed_copy(user):
    res = user["run"]("ansible-doc", "--json", "-t", "module", "gpufleet.hygiene.readiness")
    assert res.returncode == 0, res.stdout
    doc = json.loads(res.stdout)["gpufleet.hygiene.readiness"]["doc"]
    assert doc["filename"].startswith(user["root"] + os.sep), doc["filename"]
    assert not doc["filename"].startswith(REPO + os.sep)


def test_preflight_by_its_fully_qualified_name_over_the_fleet(user, fleet):
    """The playbook by name, the inventory copied next to the user's configuration: the read, the
    summary and the verdict run from the installed roles, modules, actions and filters."""
    inventory = user["work"] / "fleet.yml"
    shutil.copy(INVENTORY, inventory)
    bad, good = running(fleet)[:2]
    res = user["run"]("ansible-playbook", "-i", str(inventory), "-i", expect_cuda(user["work"], good),
                      "gpufleet.hygiene.preflight", "-e", "gpufleet_hosts=%s:%s" % (bad, good))
    assert res.returncode == 2, res.stdout[-3000:]
    assert REPO not in res.stdout, res.stdout[-3000:]
    said, section = summary(res.stdout)
    assert said == {bad: "NOT READY", good: "ready"}, section
    assert "1 of 2 ready; not ready: %s" % bad in section, section
    # Read by their nodes (the play's hosts): the verdict for the one not ready, no task for the other;
    # localhost plans the run (gpufleet_plan) and shows the summary.
    got = recap(res.stdout)
    assert got[bad] == (0, 1) and good not in got and got["localhost"] == (2, 0), res.stdout[-3000:]
    assert "Read the containers' processes, GPUs, venvs, packages and caches on the node" in res.stdout
