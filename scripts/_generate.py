# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the scripts that write files from a table share (readiness_options.py, ssh_options.py):
a description paragraph as the doc fragments fold it, and writing the files - or, with --check,
naming those that differ from the table, with their diff."""

from __future__ import annotations

import difflib
import json
import os
import sys
import textwrap

WIDTH = 118


def yaml_text(text, indent, width=WIDTH):
    """A description paragraph as a YAML list item at indent, folded at width (a double-quoted
    scalar: its line breaks fold to spaces)."""
    lines = textwrap.wrap(text, width - indent - 4, break_long_words=False, break_on_hyphens=False)
    quoted = [json.dumps(line)[1:-1] for line in lines]
    pad = " " * (indent + 3)
    return "%s- \"%s\"" % (" " * indent, ("\n" + pad).join(quoted))


def write_or_check(outputs, check, root, table, script):
    """Write each file of outputs ({path: the text it must hold}) that differs, or with check
    write nothing and print the diffs; 1 when check found one out of step with table (the path of
    the table, relative to root), naming script to run, else 0."""
    stale = []
    for path, text in sorted(outputs.items()):
        current = None
        if os.path.exists(path):
            with open(path) as f:
                current = f.read()
        if current == text:
            continue
        rel = os.path.relpath(path, root)
        if check:
            stale.append(rel)
            sys.stdout.writelines(difflib.unified_diff((current or "").splitlines(True), text.splitlines(True), rel, rel + " (from the table)"))
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
            print("wrote %s" % rel)
    if stale:
        print("\nout of step with %s: %s\nrun: python %s" % (table, ", ".join(stale), script), file=sys.stderr)
        return 1
    return 0
