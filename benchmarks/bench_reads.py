# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The bounded reads against the reads before them: one venv, both versions, one run.

Usage:

    .venv/bin/python benchmarks/bench_reads.py [--before main] [--rounds 9] [--venv PATH]

The version of module_utils at git revision --before (the unbounded reads) is exported to a
temporary directory; this checkout's is the other. Without --venv, the 400-package venv of
bench_inventory.py is built (the seed incident's wheels and 380 generated packages, one in ten
with a real ELF extension). Each round runs, in a fresh process per version (their order
alternating from round to round), one untimed pass and then, timed, three reads through the
public entry points both versions share (the fastest of five passes, the least disturbed by
anything else on the machine):

  inventory      _inventory.inventory() (every dist-info's METADATA and INSTALLER);
  scan           Contamination(venv).scan() (every RECORD, shared files hashed, evidence
                 layers, DT_NEEDED of shared objects, torch/version.py);
  verify_files   _inventory.inventory(verify_files=True) (every RECORD-listed file hashed).

Prints the median of each and the ratio of this checkout to --before.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

WORK_CODE = r"""
import json, subprocess, sys, time
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._inventory import inventory
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination

venv = sys.argv[1]

def run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr

WORK = {
    "inventory": lambda: inventory(venv, None, None, False, run),
    "scan": lambda: Contamination(venv, run).scan()[0],
    "verify_files": lambda: inventory(venv, None, None, True, run),
}
out = {}
for name, work in WORK.items():
    work()  # imports done, page cache warm
    passes = []
    for _ in range(5):
        start = time.perf_counter()
        result = work()
        passes.append((time.perf_counter() - start) * 1000)
    out[name] = min(passes)  # the least disturbed pass: the machine is shared
    out[name + "_count"] = len(result.get("packages") or result.get("contaminants") or [])
print(json.dumps(out))
"""


def collection_at(tree, base):
    """A directory to put on PYTHONPATH where ansible_collections.gpufleet.hygiene is ``tree``."""
    path = os.path.join(base, "ansible_collections", "gpufleet")
    os.makedirs(path)
    os.symlink(tree, os.path.join(path, "hygiene"))
    return base


def export(revision, where):
    """plugins/ of git revision ``revision``, exported under ``where``."""
    os.makedirs(where)
    archive = subprocess.run(["git", "-C", ROOT, "archive", revision, "plugins"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", where], input=archive, check=True)
    return where


def measure(pythonpath, venv):
    env = dict(os.environ, PYTHONPATH=pythonpath)
    out = subprocess.run([sys.executable, "-c", WORK_CODE, venv], capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--before", default="main")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--venv")
    ap.add_argument("--packages", type=int, default=400)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-reads-")
    try:
        venv = args.venv
        if not venv:
            from bench_inventory import build_venv

            venv = build_venv(os.path.join(tmp, "venv"), args.packages)
        versions = {
            args.before: collection_at(export(args.before, os.path.join(tmp, "old-tree")), os.path.join(tmp, "old")),
            "this checkout": collection_at(ROOT, os.path.join(tmp, "new")),
        }
        names = list(versions)
        times = {name: {} for name in names}
        counts = {}
        for rnd in range(args.rounds):
            for name in (names if rnd % 2 == 0 else names[::-1]):
                got = measure(versions[name], venv)
                for key, value in got.items():
                    if key.endswith("_count"):
                        counts.setdefault(key, set()).add(value)
                    else:
                        times[name].setdefault(key, []).append(value)
        assert all(len(v) == 1 for v in counts.values()), "the versions read different things: %s" % counts
        print("%d rounds, venv %s (%s packages)" % (args.rounds, venv, counts["inventory_count"].pop()))
        print("| read | %s (ms) | this checkout (ms) | ratio |" % args.before)
        print("| --- | ---: | ---: | ---: |")
        for key in ("inventory", "scan", "verify_files"):
            old = statistics.median(times[args.before][key])
            new = statistics.median(times["this checkout"][key])
            print("| %s | %.1f | %.1f | %.2fx |" % (key, old, new, new / old))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
