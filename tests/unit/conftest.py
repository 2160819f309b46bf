# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import _internal
from ansible.module_utils.testing import patch_module_args
from ansible.plugins.loader import init_plugin_loader

# The collection loader goes in before any test module is imported. A test module that imports
# ansible_collections.gpufleet.hygiene as a plain package (module_utils' tests do) would
# otherwise leave the package without its collection metadata, and every plugin loaded after
# it (fleet_report, the filters, the pct connection) would fail: the unit tests then passed or
# failed by the order pytest collected them in.
init_plugin_loader([os.path.join(os.path.dirname(__file__), "..", "..", ".ansible", "collections")])

from cachetree import FLASHINFER_WHEELS, flashinfer_wheel, torch_wheels  # noqa: E402 - after the collection loader: it may import the collection
from cuda_fixtures import build_seed_wheels  # noqa: E402 - after the collection loader: it may import the collection


@pytest.fixture
def run_module(capsys, monkeypatch):
    """Run a module's main() with args; return its result parsed from its JSON.

    Modules run target-side: a test in the same worker that loaded controller code (a
    connection or inventory plugin) leaves ansible believing it is the controller, and
    module warnings would then go to the screen instead of the result.
    """
    monkeypatch.setattr(_internal, "is_controller", False)

    def _run(main, args, check_mode=False, diff=False):
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        if diff:
            args["_ansible_diff"] = True
        with patch_module_args(args), pytest.raises(SystemExit) as exc:
            main()
        out = capsys.readouterr().out
        result = json.loads(out)
        assert bool(result.get("failed")) == (exc.value.code != 0)
        # A module that uses a deprecated ansible-core interface shows it here (the
        # deprecation can surface in the next module run of the same process).
        assert "deprecations" not in result, result["deprecations"]
        return result

    return _run


@pytest.fixture(scope="session")
def seed_wheels(tmp_path_factory):
    """The seed incident's wheels (tests/lib/cuda_fixtures.py), built once: tests only read them."""
    root = tmp_path_factory.mktemp("seed")
    build_seed_wheels(str(root / "wheels"), str(root / "work"))
    return str(root / "wheels")


@pytest.fixture(scope="session")
def wheel_dir(tmp_path_factory):
    """torch and triton wheels as PyTorch ships them: 2.8.0+cu128 with triton 3.4.0, and two
    CUDA-13 builds with triton 3.5.0, one labelled (+cu130) and one not (2.9.0, CUDA only in
    torch/version.py). Built once: tests install them by exact pins and only read them."""
    d = str(tmp_path_factory.mktemp("torchwheels"))
    torch_wheels(d, torch="2.8.0+cu128", cuda="12.8", triton="3.4.0")
    torch_wheels(d, torch="2.8.0+cu130", cuda="13.0", triton="3.5.0")
    torch_wheels(d, torch="2.9.0", cuda="13.0", triton="3.5.0")  # writes the same triton wheel again
    return d


@pytest.fixture(scope="session")
def flashinfer_wheels():
    """The released flashinfer-python wheels (0.6.11.post1, the seed's, and 0.6.0), as PyPI
    serves them: {version: path}. Downloaded once into .cache/wheels, their hashes checked."""
    return {v: flashinfer_wheel(v) for v in FLASHINFER_WHEELS}


@pytest.fixture(autouse=True)
def _host_root_untouched():
    """The unit tests run as root and hand module_utils real directories: none may change the
    mode or owner of the host's / (a stash or record path that lost its components resolves to
    it), or leave a new entry there. A test that does fails, naming what changed, and the mode
    and owner are put back at once, so that the run's other tests, and every other process of
    the machine, keep a usable /. Entries are named, never removed: one could be another
    program's."""
    before = os.stat("/")
    names = set(os.listdir("/"))
    yield
    after = os.stat("/")
    changed = []
    if (after.st_mode, after.st_uid, after.st_gid) != (before.st_mode, before.st_uid, before.st_gid):
        changed.append("its mode and owner went from %o %d:%d to %o %d:%d (put back)" % (
            before.st_mode & 0o7777, before.st_uid, before.st_gid, after.st_mode & 0o7777, after.st_uid, after.st_gid))
        os.chown("/", before.st_uid, before.st_gid)
        os.chmod("/", before.st_mode & 0o7777)
    new = sorted(set(os.listdir("/")) - names)
    if new:
        changed.append("new entries appeared in it: %s (left there: remove them by hand)" % ", ".join(new))
    assert not changed, "this test changed the host's /: " + "; ".join(changed)
