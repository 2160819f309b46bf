# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""module_utils import one another without a cycle: the import graph read from their source
with ``ast`` (an import inside a function counted as if it were at the top, so that no import
is made late to dodge a cycle), and each module imported alone in a fresh interpreter."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from importgraph import PACKAGE, collection_imports, find_cycle, module_files


def test_the_reader_sees_every_kind_of_import_line(tmp_path):
    known = {PACKAGE + ".fs._tree", PACKAGE + ".fs._files", PACKAGE + ".venv._cuda", PACKAGE + ".common._errors"}
    source = tmp_path / "probe.py"
    source.write_text("from %s.fs import _tree\n"
                      "from %s.fs._files import (\n    Skipped,\n)\n"
                      "import %s.common._errors\n"
                      "def later():\n    from %s.venv import _cuda\n" % (PACKAGE, PACKAGE, PACKAGE, PACKAGE))
    top, late = collection_imports(source.read_text(), known)
    assert top == {PACKAGE + ".fs._tree", PACKAGE + ".fs._files", PACKAGE + ".common._errors"}
    assert late == {PACKAGE + ".venv._cuda"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_even_counting_late_imports():
    files = module_files()
    assert PACKAGE + ".venv._cuda" in files and PACKAGE + ".venv._evcache" in files
    graph, late_edges = {}, []
    for name, path in files.items():
        with open(path, encoding="utf-8") as handle:
            top, late = collection_imports(handle.read(), files, path)
        graph[name] = top | late
        late_edges += [(name, other) for other in sorted(late)]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: %s (late imports: %s)" % (
        " -> ".join(n[len(PACKAGE) + 1:] for n in cycle), [(a[len(PACKAGE) + 1:], b[len(PACKAGE) + 1:]) for a, b in late_edges])


@pytest.mark.parametrize("name", sorted(module_files()))
def test_each_module_imports_alone_in_a_fresh_interpreter(name):
    proc = subprocess.run([sys.executable, "-c", "import %s" % name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=60, check=False, env={"PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr


# The packages of module_utils, lowest first: a module imports only from its own package or from
# one in a lower layer, so that what reads a container's files and processes (fs/, view/) never
# depends on what decides and acts on them.
LAYERS = (
    ("common",),
    ("fs", "transport"),
    ("view",),
    ("proc", "venv"),
    ("gpu", "cache", "job"),
    ("readiness",),
    ("proxmox",),
)


def package_edges(files):
    """{(package, imported package, module, imported module)} across packages."""
    edges = set()
    for name, path in files.items():
        with open(path, encoding="utf-8") as handle:
            top, late = collection_imports(handle.read(), files, path)
        for other in top | late:
            a, b = name[len(PACKAGE) + 1:].split(".")[0], other[len(PACKAGE) + 1:].split(".")[0]
            if a != b:
                edges.add((a, b, name[len(PACKAGE) + 1:], other[len(PACKAGE) + 1:]))
    return edges


def layering_breaks(edges, layers=LAYERS):
    layer = dict((pkg, i) for i, row in enumerate(layers) for pkg in row)
    return sorted("%s imports %s (%s is not below %s)" % (mod, other, b, a)
                  for a, b, mod, other in edges if layer.get(b, len(layers)) >= layer.get(a, -1))


def test_every_package_imports_only_packages_below_it():
    files = module_files()
    packages = set(name[len(PACKAGE) + 1:].split(".")[0] for name in files)
    assert packages == set(p for row in LAYERS for p in row), "a package missing from LAYERS, or one gone"
    assert layering_breaks(package_edges(files)) == []


def test_the_layering_check_sees_an_import_upwards_and_across():
    edges = {("fs", "view", "fs._files", "view._view"), ("gpu", "job", "gpu._state", "job._liveness"),
             ("proc", "fs", "proc._proc", "fs._root")}
    assert layering_breaks(edges) == ["fs._files imports view._view (view is not below fs)",
                                      "gpu._state imports job._liveness (job is not below gpu)"]
