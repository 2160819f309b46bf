# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node read alone, git revision against git revision, on one simulated node: same run.

Usage (as root):

    .venv/bin/python benchmarks/bench_node_read.py --revs 5e78869,HEAD [--containers 16] [--rounds 9]

Each revision is extracted (git archive) with a collections path of its own. One simulated node
(scenario `incident`, its containers each with a venv, a GPU and, for one, a stale run) is
brought up once; every round runs `gpufleet.hygiene.node_readiness read_from=node` over all its
containers once per revision, in an order that alternates from round to round, with the same
options (those the verify role gives: the venv, the job's patterns and log, the caches, the
node's nvidia-smi). Reported per revision: the median of the module's own time for the read
(``read.seconds``: from the scan of /proc to the last container's record, what the node read
itself costs) and of the whole `ansible` call's wall time, and their ratios to the first
revision. The records are compared too: every revision must find the same containers not ready.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

import simfleet  # noqa: E402 - tests/lib, after the path above


def extract(rev, top):
    """The repository at ``rev`` as a collections path of its own: its directory."""
    src = os.path.join(top, rev, "src")
    os.makedirs(src)
    archive = os.path.join(top, rev, "src.tar")
    subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", "-o", archive, rev], check=True)
    with tarfile.open(archive) as t:
        t.extractall(src)
    coll = os.path.join(top, rev, "collections", "ansible_collections", "gpufleet")
    os.makedirs(coll)
    os.symlink(src, os.path.join(coll, "hygiene"))
    return os.path.join(top, rev, "collections")


def read(env, inventory, node, collections, args):
    """One node_readiness run: (module seconds, wall seconds, {host: ready})."""
    env = dict(env, ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1")
    started = time.monotonic()
    res = subprocess.run([os.path.join(ROOT, ".venv", "bin", "ansible"), "-i", inventory, node, "-m",
                          "gpufleet.hygiene.node_readiness", "-a", json.dumps(args)], cwd=ROOT, env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, check=False)
    wall = time.monotonic() - started
    if " | SUCCESS => " not in res.stdout:
        raise SystemExit("node_readiness failed:\n%s" % res.stdout[-3000:])
    out = json.loads(res.stdout.split(" => ", 1)[1])
    return out["read"]["seconds"], wall, dict((h, r.get("ready")) for h, r in out["containers"].items())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--revs", default="5e78869,HEAD", help="git revisions, comma separated; the first is the reference")
    ap.add_argument("--containers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--port", default="2994")
    ap.add_argument("--state", default="/var/tmp/gpufleet-sim-bench-node-read")
    args = ap.parse_args()
    revs = [r.strip() for r in args.revs.split(",") if r.strip()]
    top = tempfile.mkdtemp(prefix="gpufleet-bench-node-read-")
    try:
        paths = dict((rev, extract(rev, top)) for rev in revs)
        inventory = os.path.join(top, "inventory")
        with simfleet.running(args.state, nodes=1, containers=args.containers, scenario="incident", inventory=inventory,
                              port=args.port) as (info, env):
            with open(os.path.join(inventory, "fleet.yml")) as f:
                hostvars = json.loads(f.read().split("\n", 1)[1])
            node = info["nodes"][0]
            lxc = simfleet.lxcpath(args.state, node["name"])
            group = hostvars["all"]["children"]["pve_containers"]["children"]
            entries = []
            for ct in node["containers"]:
                hv = next(g["hosts"][ct["name"]] for g in group.values() if ct["name"] in g["hosts"])
                job = hv["gpufleet_job"]
                entries.append({"host": ct["name"], "vmid": ct["vmid"], "method": "lxc-attach", "lxc_path": lxc,
                                "args": {"venv": "/opt/venv", "caches": True, "evidence_cache": False, "job_patterns": job["patterns"],
                                         "job_log": job["log"], "job_baseline_tokens_per_s": job["baseline_tokens_per_s"],
                                         "nvidia_smi": hv["gpufleet_nvidia_smi"]}})
            nodes = hostvars["all"]["children"]["pve_nodes"]["hosts"]
            module_args = {"containers": entries, "read_from": "node", "gpu_read": "node",
                           "nvidia_smi": nodes[node["name"]]["gpufleet_nvidia_smi"]}
            times = dict((rev, {"module": [], "wall": []}) for rev in revs)
            verdicts = {}
            for rev in revs:  # a warm-up each, untimed
                read(env, os.path.join(inventory, "fleet.yml"), node["name"], paths[rev], module_args)
            for n in range(args.rounds):
                order = revs if n % 2 == 0 else list(reversed(revs))
                for rev in order:
                    module, wall, ready = read(env, os.path.join(inventory, "fleet.yml"), node["name"], paths[rev], module_args)
                    times[rev]["module"].append(module)
                    times[rev]["wall"].append(wall)
                    verdicts[rev] = sorted(h for h, r in ready.items() if not r)
                    print("bench: round %d %-10s read %.3f s, call %.2f s" % (n, rev, module, wall), flush=True)
    finally:
        shutil.rmtree(top, ignore_errors=True)
    ref = revs[0]
    med = dict((rev, (statistics.median(t["module"]), statistics.median(t["wall"]))) for rev, t in times.items())
    print("\n| revision | node read (module) | the ansible call | read / %s | call / %s | not ready |" % (ref, ref))
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for rev in revs:
        ratios = (med[rev][0] / med[ref][0], med[rev][1] / med[ref][1])
        print("| %s | %.3f s | %.2f s | %.2fx | %.2fx | %s |" % ((rev,) + tuple(med[rev]) + ratios + (", ".join(verdicts[rev]),)))
    if len(set(tuple(v) for v in verdicts.values())) != 1:
        raise SystemExit("bench: the revisions found different containers not ready: %s" % verdicts)


if __name__ == "__main__":
    main()
