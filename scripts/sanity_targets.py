# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Print the ansible-test sanity targets the Galaxy artifact leaves out: the entries of
galaxy.yml's build_ignore that exist in the current directory (a copy of the checkout), a
directory with a trailing slash (how ansible-test names one). `make sanity` checks them in that
copy, after the artifact: together, the whole checkout.

    python scripts/sanity_targets.py galaxy.yml
"""

from __future__ import annotations

import os
import sys

import yaml


def targets(galaxy):
    with open(galaxy, encoding="utf-8") as handle:
        ignored = yaml.safe_load(handle).get("build_ignore") or []
    found = []
    for entry in ignored:
        if os.path.isdir(entry) and os.listdir(entry):
            found.append(entry.rstrip("/") + "/")
        elif os.path.isfile(entry):
            found.append(entry)
    return found


def main(argv):
    if len(argv) != 2:
        sys.stderr.write("usage: %s GALAXY_YML\n" % argv[0])
        return 2
    found = targets(argv[1])
    if not found:
        sys.stderr.write("no file of build_ignore in %s: nothing to check\n" % os.getcwd())
        return 1
    print(" ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
