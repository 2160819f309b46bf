# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One GPU reading (GpuState.snapshot, nvidia-smi backend) at the node and the container vantage,
with the GPUs idle and then held by a real CUDA process (torch, 1 GiB), on a real NVIDIA GPU;
beside them the bare nvidia-smi queries. Medians of REPS (9) readings, printed as JSON.

    ANSIBLE_COLLECTIONS_PATH=<dir holding ansible_collections/gpufleet/hygiene> python3 tests/device/gpu_read_cost.py

The container vantage asks nvidia-smi's process list only when a GPU's device file is held,
beside the GPU query; the node vantage always asks both.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import time

# Run as a script: the collection is imported from ANSIBLE_COLLECTIONS_PATH.
sys.path[:0] = [p for p in os.environ["ANSIBLE_COLLECTIONS_PATH"].split(":") if p]
_query = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query")
GpuState = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state").GpuState

REPS = int(os.environ.get("REPS", "9"))
HOLD = ("import torch, time; x = torch.empty(1 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
        "torch.cuda.synchronize(); print('ready', flush=True); time.sleep(600)")


def median_of(fn):
    seconds, last = [], None
    for _i in range(REPS):
        started = time.monotonic()
        last = fn()
        seconds.append(time.monotonic() - started)
    return round(statistics.median(seconds), 4), last


def bare(argv):
    return subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)


def main():
    out = {}
    holder = None
    try:
        for state in ("idle", "held"):
            if state == "held":
                holder = subprocess.Popen([sys.executable, "-c", HOLD], stdout=subprocess.PIPE, text=True)
                if holder.stdout.readline().strip() != "ready":
                    sys.exit("the CUDA holder did not start")
            out["%s: bare --query-gpu" % state] = median_of(lambda: bare(_query.query_gpu_argv("nvidia-smi")))[0]
            out["%s: bare --query-compute-apps" % state] = median_of(lambda: bare(_query.query_apps_argv("nvidia-smi")))[0]
            for vantage in ("node", "container"):
                sec, snap = median_of(lambda v=vantage: GpuState(backend="nvidia-smi", nvidia_smi="nvidia-smi", vantage=v).snapshot())
                holders = [(p["pid"], p["used_memory_mib"]) for g in snap["gpus"] for p in g["processes"]]
                out["%s: reading at the %s vantage" % (state, vantage)] = sec
                out["%s: holders seen at the %s vantage (pid, MiB)" % (state, vantage)] = holders
        out["holder pid"] = holder.pid
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
