# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The documentation site's extra docs name every guide in docs/ (the site itself: `make docs`)."""

from __future__ import annotations

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_guides_page_lists_every_guide_and_only_those():
    guides = {os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    with open(os.path.join(ROOT, "docs", "docsite", "rst", "guides.rst")) as f:
        listed = set(re.findall(r"^``(docs/\S+\.md)``$", f.read(), re.MULTILINE))
    assert guides == listed, "add to docs/docsite/rst/guides.rst: %s; no such guide: %s" % (
        sorted(guides - listed), sorted(listed - guides))
