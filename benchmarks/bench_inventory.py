# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Side-by-side cost of listing and scanning a venv of about 400 packages.

Usage: .venv/bin/python benchmarks/bench_inventory.py [--venv PATH] [--packages 400] [--rounds 15]

Without --venv it builds one: the seed incident's wheels (torch cu128 and the CUDA 12
family, then the CUDA 13 additions) plus generated packages, installed with uv, so the
venv is contaminated the way the seed's was. With --venv it measures an existing venv
(for example a real training venv); pass --expected-cuda when it has no torch.

Every command runs as its own process, interleaved round by round so drift in machine
load hits all of them alike; the report gives medians and the ratio to `uv pip list`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

SCAN_CODE = r"""
import sys, json
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import iter_distributions
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import venv_site_dirs
venv, mode, expected = sys.argv[1], sys.argv[2], sys.argv[3] or None
dists, _ = iter_distributions(venv_site_dirs(venv))
if mode == "inventory":
    out = [d.as_dict() for d in dists]
else:
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import reference, scan
    ref, _w = reference(dists, expected)
    cache = None
    if mode == "cached":
        from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._evcache import EvidenceCache
        cache = EvidenceCache.open(sys.argv[4], venv)
    out = scan(dists, ref["cuda_major"], True, cache)[0]
    if cache is not None:
        cache.close()
json.dump(out, sys.stdout)
"""

# The same work timed inside one process whose imports are done and whose page cache is warm
# (one untimed pass first): what the work itself costs, apart from starting a Python.
WORK_CODE = r"""
import sys, json, time
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import iter_distributions
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import venv_site_dirs
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import reference, scan
venv, mode, expected = sys.argv[1], sys.argv[2], sys.argv[3] or None
def work():
    dists, _ = iter_distributions(venv_site_dirs(venv))
    if mode == "inventory":
        return json.dumps([d.as_dict() for d in dists])
    ref, _w = reference(dists, expected)
    cache = None
    if mode == "cached":
        from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._evcache import EvidenceCache
        cache = EvidenceCache.open(sys.argv[4], venv)
    out = json.dumps(scan(dists, ref["cuda_major"], True, cache)[0])
    if cache is not None:
        cache.close()
    return out
work()
start = time.perf_counter()
work()
print((time.perf_counter() - start) * 1000)
"""


def build_venv(path, packages):
    from cuda_fixtures import SEED_ADDED, SEED_BASE, build_seed_wheels, install, make_venv
    from wheelmaker import build_shared_object, build_wheel

    uv = shutil.which("uv")
    work = tempfile.mkdtemp(prefix="bench-work-")
    wheels = os.path.join(work, "wheels")
    build_seed_wheels(wheels, os.path.join(work, "elf"))
    so = build_shared_object(os.path.join(work, "gen"), "_ext.so", ["libm.so.6"])
    extra = []
    for i in range(max(0, packages - len(SEED_BASE) - len(SEED_ADDED))):
        name = "bench-pkg-%03d" % i
        mod = name.replace("-", "_")
        files = {"%s/__init__.py" % mod: "VERSION = %d\n" % i}
        for j in range(20):
            files["%s/sub/m%02d.py" % (mod, j)] = "X = %d\n" % j
        if i % 10 == 0:
            files["%s/_ext.so" % mod] = so
        build_wheel(wheels, name, "1.%d.0" % i, files)
        extra.append("%s==1.%d.0" % (name, i))
    make_venv(path, uv)
    install(uv, path, wheels, ["%s==%s" % p for p in SEED_BASE] + extra)
    install(uv, path, wheels, ["%s==%s" % p for p in SEED_ADDED])
    shutil.rmtree(work)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--venv")
    ap.add_argument("--packages", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--expected-cuda", default="")
    ap.add_argument("--json", help="write raw timings here")
    args = ap.parse_args()

    venv = args.venv or os.path.join(ROOT, "build", "bench", "venv-%d" % args.packages)
    if not args.venv and not os.path.exists(os.path.join(venv, "bin", "python")):
        print("building a %d-package venv at %s ..." % (args.packages, venv), file=sys.stderr)
        build_venv(venv, args.packages)
    py = os.path.join(venv, "bin", "python")
    me = sys.executable  # the controller's Python runs the collection's code, as on a target
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(ROOT, ".ansible", "collections"), env.get("PYTHONPATH")) if p)
    # Byte-code is cached, as on any host where the collection is installed; the first
    # (untimed) run of each command below writes it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    module_args = os.path.join(tempfile.mkdtemp(), "args.json")
    with open(module_args, "w") as f:
        json.dump({"ANSIBLE_MODULE_ARGS": {"venv": venv}}, f)
    modpath = os.path.join(ROOT, "plugins", "modules", "pip_inventory.py")
    # The evidence cache is root's (venv/_evcache.py): run as root, the cached rows read an
    # unchanged venv from a directory of their own, filled by the untimed first run below.
    if os.geteuid() != 0:
        sys.exit("run as root: the evidence cache is used only by root")
    cache_dir = tempfile.mkdtemp(prefix="bench-evidence-")

    commands = {
        "python start-up only (-c pass), for reference": [me, "-c", "pass"],
        "uv pip list": [shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv"), "pip", "list", "--format", "json", "--python", py],
        "pip list": [me, "-m", "pip", "--python", py, "list", "--format", "json", "--disable-pip-version-check"],
        "inventory (collection code)": [me, "-c", SCAN_CODE, venv, "inventory", args.expected_cuda],
        "contamination scan (collection code)": [me, "-c", SCAN_CODE, venv, "scan", args.expected_cuda],
        "contamination scan, cached (unchanged venv), fresh process": [me, "-c", SCAN_CODE, venv, "cached", args.expected_cuda, cache_dir],
        "pip_inventory module (with AnsibleModule)": [me, modpath, module_args],
    }
    work = {
        "inventory, the work alone (inside one warm process)": [me, "-c", WORK_CODE, venv, "inventory", args.expected_cuda],
        "contamination scan, the work alone (inside one warm process)": [me, "-c", WORK_CODE, venv, "scan", args.expected_cuda],
        "contamination scan, cached (unchanged venv), the work alone": [me, "-c", WORK_CODE, venv, "cached", args.expected_cuda, cache_dir],
    }
    counts = {}
    for label, argv in commands.items():
        if label.startswith("python start-up"):
            counts[label] = None
            continue
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            sys.exit("%s failed: %s" % (label, out.stderr[-800:]))
        try:
            data = json.loads(out.stdout)
            counts[label] = len(data["packages"]) if isinstance(data, dict) else len(data)
        except ValueError:
            counts[label] = None
    # What a file changed within the last two seconds says is not kept (a racy entry): a venv
    # just built is read once more after that, and what the cache gives must be the scan itself.
    time.sleep(2.5)
    outs = [subprocess.run(commands[label], env=env, capture_output=True, text=True, check=True).stdout
            for label in ("contamination scan (collection code)", "contamination scan, cached (unchanged venv), fresh process")]
    if outs[0] != outs[1]:
        sys.exit("the cached scan differs from the scan")
    times = {label: [] for label in list(commands) + list(work)}
    for _round in range(args.rounds):
        for label, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            times[label].append((time.perf_counter() - start) * 1000)
        for label, argv in work.items():
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
            times[label].append(float(out.stdout))
    base = statistics.median(times["uv pip list"])
    print("venv: %s" % venv)
    print("machine: %s, %s CPUs, Python %s" % (platform.machine(), os.cpu_count(), platform.python_version()))
    print("rounds: %d (interleaved); median wall time per process\n" % args.rounds)
    print("| command | packages seen | median ms | ratio to uv pip list |")
    print("| --- | ---: | ---: | ---: |")
    for label in times:
        med = statistics.median(times[label])
        print("| %s | %s | %.1f | %.2fx |" % (label, counts.get(label, ""), med, med / base))
    shutil.rmtree(cache_dir)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"venv": venv, "counts": counts, "times_ms": times}, f, indent=1)


if __name__ == "__main__":
    main()
