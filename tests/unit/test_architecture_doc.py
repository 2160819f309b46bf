# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""docs/architecture.md is the map a new maintainer reads first: it names every file of plugins/, every
role and every playbook, so a file added without its place on the map fails here."""

from __future__ import annotations

import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(REPO, "docs", "architecture.md")


def unnamed(text, root=REPO):
    """The collection's pieces ``text`` does not name: each plugin file by its name (``_clear``,
    ``concise``), each role, each playbook."""
    pieces = []
    for base, dirs, files in os.walk(os.path.join(root, "plugins")):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        pieces += [os.path.join(base, f) for f in files if f.endswith(".py") and f != "__init__.py"]
    pieces += [os.path.join(root, "roles", r) for r in os.listdir(os.path.join(root, "roles"))]
    pieces += [os.path.join(root, "playbooks", p) for p in os.listdir(os.path.join(root, "playbooks")) if p.endswith(".yml")]
    out = []
    for path in sorted(pieces):
        name = os.path.basename(path)
        stem = name.removesuffix(".py")
        if not re.search(r"(?<![\w])%s(?![\w])" % re.escape(stem), text):
            out.append(os.path.relpath(path, root))
    return out


def test_the_architecture_names_every_plugin_file_role_and_playbook():
    with open(DOC) as f:
        assert unnamed(f.read()) == []


def test_the_check_sees_a_file_left_off_the_map(tmp_path):
    for rel in ("plugins/module_utils/cache/_clear.py", "plugins/callback/concise.py", "roles/kill/x", "playbooks/plan.yml"):
        os.makedirs(os.path.dirname(str(tmp_path / rel)), exist_ok=True)
        (tmp_path / rel).write_text("")
    assert unnamed("`_clear`, `plan.yml`, the `kill` role; clear_all, concise_x", str(tmp_path)) == ["plugins/callback/concise.py"]
