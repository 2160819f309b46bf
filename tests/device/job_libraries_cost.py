# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the job_libraries read adds to one readiness read, measured in-process.

    python3 tests/device/job_libraries_cost.py --venv VENV --pattern REGEX [--rounds 15] [--json FILE]
        [--nvidia-smi PATH]

Runs readiness's read() (the module's whole reading, in this process) with job_libraries on and
off, alternating, ``--rounds`` times each after one warm-up of each, on a job that runs now (its
processes matching REGEX). Prints the medians, their difference, and the median of the maps read
itself (job_libraries.read_s: the maps of every job process and GPU holder, each mapped library's
DT_NEEDED, the venv's RECORD index). The evidence cache is left on, as in a real run.
ANSIBLE_COLLECTIONS_PATH (or PYTHONPATH) must make ansible_collections.gpufleet.hygiene importable.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

# Run as a script: the collection is imported from ANSIBLE_COLLECTIONS_PATH (or PYTHONPATH).
sys.path[:0] = [p for p in os.environ.get("ANSIBLE_COLLECTIONS_PATH", "").split(":") if p]
_readiness = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._readiness")
_options = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options")
ARGUMENT_SPEC, read = _options.ARGUMENT_SPEC, _readiness.read


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def options(args, on):
    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(job_patterns=[args.pattern], venv=args.venv, allow_running_job=True, job_libraries=on,
             nvidia_smi=args.nvidia_smi, require_gpu=bool(args.nvidia_smi) or args.require_gpu)
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", required=True)
    ap.add_argument("--pattern", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--nvidia-smi")
    ap.add_argument("--require-gpu", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    timings = {True: [], False: []}
    maps = []
    last = None
    for n in range(args.rounds + 1):
        for on in (True, False):
            start = time.perf_counter()
            result = read(options(args, on), run, shutil.which)
            took = time.perf_counter() - start
            if n == 0:
                continue  # warm-up: the page cache, the evidence cache
            timings[on].append(took)
            if on:
                maps.append(result["job_libraries"].get("read_s", 0.0))
                last = result
    check = next((c for c in last["checks"] if c["name"] == "job_libraries"), None)
    libs = last["job_libraries"]
    out = {
        "rounds": args.rounds,
        "read_on_s": statistics.median(timings[True]),
        "read_off_s": statistics.median(timings[False]),
        "maps_read_s": statistics.median(maps),
        "processes": len(libs.get("processes", [])),
        "libraries": sum(len(p["libraries"]) for p in libs.get("processes", [])),
        "check": check,
    }
    out["added_s"] = out["read_on_s"] - out["read_off_s"]
    out["added_pct"] = 100.0 * out["added_s"] / out["read_off_s"] if out["read_off_s"] else None
    out["maps_pct_of_read"] = 100.0 * out["maps_read_s"] / out["read_off_s"] if out["read_off_s"] else None
    print("readiness read, median of %d: job_libraries on %.4f s, off %.4f s (difference %+.4f s, %+.1f%%); "
          "the maps read itself %.4f s (%.1f%% of a read) for %d process(es), %d mapped CUDA-side libraries; check ok=%s"
          % (args.rounds, out["read_on_s"], out["read_off_s"], out["added_s"], out["added_pct"], out["maps_read_s"],
             out["maps_pct_of_read"], out["processes"], out["libraries"], check and check["ok"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
