# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every module_utils file has its mirror test file (module_utils/<package>/_<name>.py ->
tests/unit/plugins/module_utils/<package>/test_<name>.py), so that a maintainer finds a file's
tests where they look first. The few tested through the module they serve are named here, each
with the test files that import it."""

from __future__ import annotations

import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_UTILS = os.path.join(HERE, "..", "..", "..", "..", "plugins", "module_utils")
TESTS = os.path.join(HERE, "..", "..")

# Tested through their module's tests, which exercise them as the module uses them.
THROUGH = {
    "common/_hostlock.py": ["plugins/modules/test_host_lock_throughput.py"],
    "fs/_root.py": ["plugins/module_utils/view/test_view.py", "plugins/module_utils/view/test_node_read_paths.py"],
    "fs/_tree.py": ["plugins/module_utils/cache/test_clear.py", "plugins/module_utils/cache/test_roots.py"],
    "gpu/_state.py": ["plugins/modules/test_gpu_state.py"],
}


def module_utils_files():
    for package in sorted(os.listdir(MODULE_UTILS)):
        folder = os.path.join(MODULE_UTILS, package)
        if os.path.isdir(folder) and package != "__pycache__":
            for name in sorted(os.listdir(folder)):
                if name.startswith("_") and name.endswith(".py") and name != "__init__.py":
                    yield "%s/%s" % (package, name)


def test_every_module_utils_file_has_its_mirror_test_file():
    missing = [rel for rel in module_utils_files() if rel not in THROUGH
               and not os.path.isfile(os.path.join(HERE, os.path.dirname(rel), "test" + os.path.basename(rel)))]
    assert missing == [], "no mirror test file: %s" % ", ".join(missing)


def test_the_files_tested_through_their_module_are_imported_there():
    files = set(module_utils_files())
    for rel, tests in THROUGH.items():
        assert rel in files, rel  # an entry for a file that is gone
        assert not os.path.isfile(os.path.join(HERE, os.path.dirname(rel), "test" + os.path.basename(rel))), (
            "%s has its mirror test file now: drop it from THROUGH" % rel)
        dotted = "module_utils.%s.%s" % (os.path.dirname(rel), os.path.basename(rel)[:-3])
        for test in tests:
            assert dotted in imported(os.path.join(TESTS, test)), (rel, test)


def imported(path):
    """The modules a test file imports (``import a.b``, ``from a import b`` as a.b, ``from a.b import c`` as a.b)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update("%s.%s" % (node.module, alias.name) for alias in node.names)
    return {name.split("plugins.", 1)[-1] for name in names}
