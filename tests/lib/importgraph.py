# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The collection's module_utils and what each imports of them, read from the source with
``ast`` (every form of import statement, at the top of a file or inside a function)."""

from __future__ import annotations

import ast
import os

PACKAGE = "ansible_collections.gpufleet.hygiene.plugins.module_utils"
MODULE_UTILS = os.path.join(os.path.dirname(__file__), "..", "..", "plugins", "module_utils")


def module_files():
    """{module name: path} of every module_utils file but the packages' empty __init__.py."""
    found = {}
    for top, dirs, files in os.walk(MODULE_UTILS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py") and name != "__init__.py":
                rel = os.path.relpath(os.path.join(top, name[:-3]), MODULE_UTILS)
                found[PACKAGE + "." + rel.replace(os.sep, ".")] = os.path.join(top, name)
    return found


def collection_imports(source, known, filename="<source>"):
    """(at the top, late): the modules of ``known`` that ``source`` imports when it is loaded,
    and those it imports only inside a function. ``from P import _m`` names the module P._m
    when that is one of ``known``, else P."""
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

    visit(ast.parse(source, filename), False)
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
