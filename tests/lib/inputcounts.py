# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""How many bad inputs the tests tried, counted as they run (docs/reliability.md, Counts).

Tests call record(suite, test, n); with $GPUFLEET_INPUT_COUNTS naming a directory, each
process appends one JSON line per call to its own file there (pytest-xdist workers too).

    GPUFLEET_INPUT_COUNTS=build/counts pytest tests/unit/test_parser_properties.py ...
    python3 tests/lib/inputcounts.py build/counts      # totals per suite and test
"""

from __future__ import annotations

import collections
import json
import os
import sys

ENV = "GPUFLEET_INPUT_COUNTS"


def record(suite, test, count):
    """Add ``count`` inputs tried by ``test`` of ``suite`` (nothing without $GPUFLEET_INPUT_COUNTS)."""
    where = os.environ.get(ENV)
    if not where or not count:
        return
    os.makedirs(where, exist_ok=True)
    with open(os.path.join(where, "%s-%d.jsonl" % (suite, os.getpid())), "a") as f:
        f.write(json.dumps({"suite": suite, "test": test, "count": count}) + "\n")


def totals(where):
    """{suite: {test: count}} of every record under ``where``."""
    out = collections.defaultdict(collections.Counter)
    for name in sorted(os.listdir(where)):
        if name.endswith(".jsonl"):
            with open(os.path.join(where, name)) as f:
                for line in f:
                    rec = json.loads(line)
                    out[rec["suite"]][rec["test"]] += rec["count"]
    return out


def main(argv):
    if len(argv) != 1:
        sys.stderr.write("usage: inputcounts.py DIRECTORY\n")
        return 2
    grand = 0
    for suite, tests in sorted(totals(argv[0]).items()):
        print("%-22s %8d  (%d tests)" % (suite, sum(tests.values()), len(tests)))
        for test, count in sorted(tests.items()):
            print("    %-62s %7d" % (test, count))
        grand += sum(tests.values())
    print("%-22s %8d" % ("total", grand))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
