# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The documentation site's extra docs name every guide in docs/ and render each as a page (the
site itself: `make docs`)."""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_guides_page_lists_every_guide_and_only_those():
    guides = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    with open(os.path.join(ROOT, "docs", "docsite", "rst", "guides.rst")) as f:
        listed = set(re.findall(r"^``(docs/\S+\.md)``$", f.read(), re.MULTILINE))
    assert guides == listed, "add to docs/docsite/rst/guides.rst: %s; no such guide: %s" % (
        sorted(guides - listed), sorted(listed - guides))


def _docsite():
    spec = importlib.util.spec_from_file_location("docsite", os.path.join(ROOT, "scripts", "docsite.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_guide_becomes_a_page_of_the_site(tmp_path):
    """Each guide is copied into the site's sources, in the guides page's toctree, and expected as a
    built page (the build fails without it); links out of docs/ point at the repository."""
    docsite = _docsite()
    (tmp_path / "docsite").mkdir()
    shutil.copy(os.path.join(ROOT, "docs", "docsite", "rst", "guides.rst"), tmp_path / "docsite" / "guides.rst")
    docsite.copy_guides(str(tmp_path))
    guides = docsite.guides()
    assert "architecture" in guides and "validation/h200" in guides
    page = (tmp_path / "docsite" / "guides.rst").read_text()
    toctree = page.split(".. toctree::", 1)[1]
    for guide in guides:
        assert (tmp_path / "docsite" / "guides" / (guide + ".md")).is_file(), guide
        assert "   guides/%s\n" % guide in toctree, guide
        assert ":doc:`guides/%s`" % guide in page, guide
    assert not re.search(r"^``docs/", page, re.MULTILINE)
    architecture = (tmp_path / "docsite" / "guides" / "architecture.md").read_text()
    assert "](../README.md)" not in architecture and "/blob/main/README.md)" in architecture
    assert "](benchmarks.md)" in architecture  # between guides: left for MyST to resolve
    h200 = (tmp_path / "docsite" / "guides" / "validation" / "h200.md").read_text()
    assert "](../benchmarks.md#" in h200


def test_the_build_expects_a_page_per_guide(monkeypatch):
    docsite = _docsite()
    monkeypatch.setattr(docsite.subprocess, "run", lambda *a, **k: type("P", (), {"stdout": '{"all": {}}'})())
    pages = docsite.expected_pages()
    assert {"docsite/guides/%s.html" % g for g in docsite.guides()} <= pages
    assert "docsite/guides/validation/h200.html" in pages
