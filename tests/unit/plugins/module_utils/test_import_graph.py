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
