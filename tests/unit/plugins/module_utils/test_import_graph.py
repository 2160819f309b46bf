# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""module_utils import one another without a cycle: the import graph read from their source
with ``ast`` (an import inside a function counted as if it were at the top, so that no import
is made late to dodge a cycle), and each module imported alone in a fresh interpreter."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

PACKAGE = "ansible_collections.gpufleet.hygiene.plugins.module_utils"
ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "plugins", "module_utils")


def module_files():
    """{module name: path} of every module_utils file but the packages' empty __init__.py."""
    found = {}
    for top, dirs, files in os.walk(ROOT):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py") and name != "__init__.py":
                rel = os.path.relpath(os.path.join(top, name[:-3]), ROOT)
                found[PACKAGE + "." + rel.replace(os.sep, ".")] = os.path.join(top, name)
    return found


def collection_imports(path, known):
    """(at the top, late): the collection modules ``path`` imports when it is loaded, and those it
    imports inside a function. ``from P import _m`` names the module P._m when that is one."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    top, late = set(), set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            names = []
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                names = [child.module + "." + alias.name if child.module + "." + alias.name in known else child.module
                         for alias in child.names]
            (late if inner else top).update(n for n in names if n in known)
            visit(child, inner)

    visit(tree, False)
    return top, late - top


def find_cycle(graph):
    """One cycle of ``graph`` ({node: set of nodes}) as a list of its nodes, or None."""
    state, stack = {}, []

    def dfs(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_the_reader_sees_every_kind_of_import_line(tmp_path):
    known = {PACKAGE + ".fs._tree", PACKAGE + ".fs._files", PACKAGE + ".venv._cuda", PACKAGE + ".common._errors"}
    source = tmp_path / "probe.py"
    source.write_text("from %s.fs import _tree\n"
                      "from %s.fs._files import (\n    Skipped,\n)\n"
                      "import %s.common._errors\n"
                      "def later():\n    from %s.venv import _cuda\n" % (PACKAGE, PACKAGE, PACKAGE, PACKAGE))
    top, late = collection_imports(str(source), known)
    assert top == {PACKAGE + ".fs._tree", PACKAGE + ".fs._files", PACKAGE + ".common._errors"}
    assert late == {PACKAGE + ".venv._cuda"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_even_counting_late_imports():
    files = module_files()
    assert PACKAGE + ".venv._cuda" in files and PACKAGE + ".venv._evcache" in files
    graph, late_edges = {}, []
    for name, path in files.items():
        top, late = collection_imports(path, files)
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
