# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet benchmark's plot: wall time by fleet size, and the ratio of the preflight (B) to each
other configuration, from a results document.

Run by benchmarks/bench_fleet.py with the tools venv's Python, where matplotlib is installed
(build/bench-tools); by hand:

    build/bench-tools/bin/python benchmarks/_fleetplot.py RESULTS.json OUT.png NAMES_JSON TITLE
"""

from __future__ import annotations

import json
import sys


def plot(doc, path, names, title):
    """Draw the medians of ``doc`` for ``names`` ({configuration: legend}) into the PNG ``path``."""
    import matplotlib  # the tools venv's, not the collection's venv

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = [tuple(int(x) for x in s.split("x")) for s in doc["meta"]["sizes"]]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8))
    for c, name in names.items():
        pts = sorted((n * m, doc["medians"]["%s@%dx%d" % (c, n, m)], "%dx%d" % (n, m)) for n, m in sizes
                     if "%s@%dx%d" % (c, n, m) in doc["medians"])
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        for p in pts:
            if c == "B":
                ax.annotate(p[2], (p[0], p[1]), textcoords="offset points", xytext=(4, -10), fontsize=7)
        if c != "B":
            ratio = [(n * m, doc["medians"]["B@%dx%d" % (n, m)] / doc["medians"]["%s@%dx%d" % (c, n, m)]) for n, m in sizes
                     if "%s@%dx%d" % (c, n, m) in doc["medians"] and "B@%dx%d" % (n, m) in doc["medians"]]
            ratio.sort()
            bx.plot([p[0] for p in ratio], [p[1] for p in ratio], marker="o", label="B / " + c)
    b0 = [(n * m, doc["medians"]["B0@%dx%d" % (n, m)]) for n, m in sizes if "B0@%dx%d" % (n, m) in doc["medians"]]
    if b0:
        ax.plot([p[0] for p in b0], [p[1] for p in b0], marker="x", ls="none", color="black", label="B0 preflight.yml before")
    ax.set_xlabel("containers (nodes x containers per node)")
    ax.set_ylabel("median wall time (s)")
    ax.set_title("Wall time by fleet size")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    bx.axhline(1.0, color="grey", lw=0.8)
    bx.axhline(1.5, color="grey", lw=0.8, ls="--", label="goal B/A 1.5x")
    bx.axhline(0.3, color="grey", lw=0.8, ls=":", label="goal B/C 0.3x")
    bx.set_xlabel("containers")
    bx.set_ylabel("ratio of medians (same run)")
    bx.set_title("preflight (B) against the others")
    bx.set_ylim(bottom=0)
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7)
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv):
    with open(argv[1]) as f:
        doc = json.load(f)
    plot(doc, argv[2], json.loads(argv[3]), argv[4])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
