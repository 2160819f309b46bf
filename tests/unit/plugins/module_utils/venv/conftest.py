# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Fixtures of the tests of venv/_contamination, _removal, _restore and _stash (plain-file venvs:
tests/lib/plainvenv.py). Not autouse: each of those files asks for state_dir and
_no_collection_within_a_test with its pytestmark; the other tests here need neither."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile

import pytest
from plainvenv import BODY, NOBODY, _write

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _restore


@pytest.fixture
def _no_collection_within_a_test():
    """No garbage collection while a test runs: a Venv's site anchors close their descriptors when
    collected, and those an earlier test left in a cycle (a traceback it kept) would otherwise
    close between two counts of _fds(), at whatever moment the collector chose."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def state_dir(monkeypatch, tmp_path):
    """The record of failed restores and the stash, in this test's own directory."""
    path = str(tmp_path / "state" / "restore")
    monkeypatch.setattr(_restore, "STATE_DIR", path)
    return path


@pytest.fixture
def site(monkeypatch, tmp_path):
    """A site directory of nobody's holding pkg/sub/data.bin (nobody's, 0640), and the stash's
    state directory in this test's own tree."""
    monkeypatch.setattr(_restore, "STATE_DIR", str(tmp_path / "state" / "restore"))
    root = tempfile.mkdtemp(prefix="gpufleet-owned-", dir="/tmp")
    os.chmod(root, 0o755)
    path = os.path.join(root, "site-packages")
    os.makedirs(os.path.join(path, "pkg", "sub"))
    with open(os.path.join(path, "pkg", "sub", "data.bin"), "wb") as f:
        f.write(BODY)
    os.chmod(os.path.join(path, "pkg", "sub", "data.bin"), 0o640)
    os.chmod(os.path.join(path, "pkg", "sub"), 0o750)
    for top, _dirs, files in os.walk(path):
        for name in [top] + [os.path.join(top, n) for n in files]:
            os.chown(name, NOBODY, NOBODY)
    yield path
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def plain_site(tmp_path):
    """A site directory of ours holding pkg/data.bin (BODY)."""
    site = tmp_path / "site"
    _write(str(site / "pkg" / "data.bin"), BODY)
    return str(site)
