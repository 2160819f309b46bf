# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The work floor's probe, run in a container: the CPU one readiness read costs, in-process.

    python3 _readcpu.py COLLECTIONS_ROOT OPTIONS_JSON ROUNDS

Imports the collection's module_utils from COLLECTIONS_ROOT (stdlib only, as on a target), runs
the read the preflight's readiness module runs (the same options) ROUNDS times after one warm-up,
and prints JSON: per read, the process's own CPU (every thread), its children's CPU (nvidia-smi)
and the wall time. No interpreter start, no transport, no module payload: the read's work alone.
"""

import json
import resource
import shutil
import statistics
import subprocess
import sys
import time


def children():
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def main(root, options, rounds):
    sys.path.insert(0, root)
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import ARGUMENT_SPEC
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._readiness import read

    p = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    p.update(options)

    def run(argv, **_kw):
        out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False)
        return out.returncode, out.stdout, out.stderr

    samples = []
    for i in range(rounds + 1):
        c0, k0, w0 = time.process_time(), children(), time.perf_counter()
        result = read(p, run, shutil.which)
        c1, k1, w1 = time.process_time(), children(), time.perf_counter()
        if i:
            samples.append({"self_s": c1 - c0, "children_s": k1 - k0, "wall_s": w1 - w0})
    failed = sorted(name for name, value in result.items() if isinstance(value, dict) and value.get("failed"))
    print(json.dumps({
        "self_s": statistics.median(s["self_s"] for s in samples),
        "children_s": statistics.median(s["children_s"] for s in samples),
        "wall_s": statistics.median(s["wall_s"] for s in samples),
        "rounds": rounds, "ready": result["ready"], "failed_reads": failed,
    }))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]))
