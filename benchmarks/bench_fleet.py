# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fleet speed and scale: the preflight against the seeds' one-liners and the peers, one fleet, one run.

Usage (as root, after tests/sim/setup-host.sh):

    .venv/bin/python benchmarks/bench_fleet.py [--sizes 1x1,2x2,4x4,8x4] [--rounds 3]
        [--configs A,A2,B,C,D,P] [--before REF] [--remediate-rounds 3] [--profile]
    .venv/bin/python benchmarks/bench_fleet.py --table RESULTS.json   # the markdown tables again

It brings up one simulated fleet of the largest size (scenario `incident`: torch +cu128 venvs,
one container with the CUDA-13 contamination, one with a stale GPU holder, one with a stale
compile cache, the rest healthy; state /var/tmp/gpufleet-sim-bench-fleet, inventory under
build/bench-fleet/, port 2750, so it never meets another fleet) and measures each size NxM on
the first N nodes and their first M containers. Interleaved in every round (the order rotates
from round to round, so load from anything else on the machine hits all alike; round 0 is a
warm-up and not counted):

  A  the seeds' one-liners, one per container, all in parallel, a fresh ssh each:
     ssh node 'pct exec ID -- bash -c "nvidia-smi --query-gpu=index,memory.used --format=csv,noheader;
     <venv>/bin/uv pip list --python <venv>/bin/python | grep -iE cu13"'
     (the fleet's venvs have no pip: uv is the seeds' other way to list them);
  A2 the same one-liners over one ssh master per node, lxc-attach in the container, in parallel
     (at most sshd's default MaxSessions per master);
  P  pyinfra 3 doing A's work: the nodes its hosts, one server.shell per container;
  T  the transport floor: one ssh handshake per node, `lxc-attach -- true` per container;
  B  playbooks/preflight.yml as shipped (every check: job processes, GPUs and their holders,
     CUDA contamination with evidence, compile caches, the libraries the job maps): the nodes
     the play's hosts, every container read from its node in the node's own process, nothing
     run in it, the node's nvidia-smi once;
  BI B with each container read inside itself, its own Python started by the node
     (gpufleet_node_read=container: the read before the node read);
  BL B without the job_libraries check (gpufleet_job_libraries=false): what reading the
     job's /proc/<pid>/maps costs;
  C  a straightforward playbook of two ansible.builtin.shell tasks doing A's work over
     community.proxmox's proxmox_pct_remote (from the `ansible` 12 wheel, as
     bench_connection.py takes it);
  D  playbooks/preflight.yml under Mitogen (mitogen_linear, its lxc transport via the node:
     mitogen_via=<node>, lxc-attach there), from a tools venv of the benchmark's own;
  B0 (with --before REF) playbooks/preflight.yml of git revision REF, as it was shipped (its
     ansible.cfg), on the largest size only.

B, C, D and B0 start cold (no ssh master left from the previous run). B, C and D get one fork
per container (-f). With --remediate-rounds, after the rounds: remediate.yml repairs the
largest fleet once, then preflight.yml and remediate.yml (both with
gpufleet_allow_running_job=true: the relaunched jobs are the fleet's own) are run alternately
on the clean fleet; remediate must change nothing. With --profile, B (and B0) run once more
with ansible.posix's profile_tasks callback, and once under py-spy (controller side).

Before the rounds it measures one container read's CPU in-process (the work floor). Prints
markdown tables of medians, ratios, distances to the floors and costs per added container;
writes the results (JSON) and the plot.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from _fleetbench import ROOT
from _fleetrun import WORK, measure, plot
from _fleettables import CONFIGS, details, parse_sizes, render, summarize


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1x1,2x2,4x4,8x4", help="NODESxCONTAINERS per node, comma separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS), help="among %s (the transport floor T always runs)" % ",".join(CONFIGS))
    ap.add_argument("--read-samples", type=int, default=8, help="containers the work floor's read CPU is measured in")
    ap.add_argument("--before", metavar="REF", help="also run preflight.yml of this git revision (B0), largest size only")
    ap.add_argument("--remediate-rounds", type=int, default=3, help="preflight vs remediate on the clean fleet (0: skip)")
    ap.add_argument("--profile", action="store_true", help="profile_tasks and py-spy runs of B (and B0) at the largest size")
    ap.add_argument("--profile-sizes", default="", help="with --profile: the sizes to profile at (default: the largest)")
    ap.add_argument("--method", default="lxc-attach", choices=["lxc-attach", "pct"], help="the pct connection's method for B")
    ap.add_argument("--port", type=int, default=2750)
    ap.add_argument("--run-timeout", type=int, default=900, help="seconds before a run is killed and counted as failed")
    ap.add_argument("--up-jobs", type=int, default=4, help="nodes the fleet brings up in parallel")
    ap.add_argument("--state", default="/var/tmp/gpufleet-sim-bench-fleet")
    ap.add_argument("--results", default=os.path.join(WORK, "results.json"))
    ap.add_argument("--plot", default=os.path.join(ROOT, "docs", "img", "fleet-scaling.png"))
    ap.add_argument("--peer-wheel", help="a downloaded ansible 12.x wheel to take community.proxmox and ansible.posix from")
    ap.add_argument("--table", metavar="RESULTS", help="print the markdown tables of a results file and exit")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(render(json.load(f)))
        return 0
    sizes = parse_sizes(args.sizes)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown or args.rounds < 1:
        ap.error("--configs takes %s (got %s); --rounds at least 1" % (", ".join(CONFIGS), ",".join(unknown)))
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (the simulated fleet does)")
    # Stopped by SIGINT or SIGTERM (also when started in the background, where SIGINT is
    # ignored), the fleet still comes down: both raise KeyboardInterrupt through measure's finally.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    command = " ".join([os.path.relpath(sys.executable, ROOT), os.path.relpath(__file__, ROOT)] + sys.argv[1:])
    results, meta, verdicts = measure(args, sizes, configs, command)
    report(summarize(results, meta, sizes, configs, verdicts), args)
    return 0


def report(doc, args):
    """Print the tables and what follows them, write the results document and the plot."""
    print("\n" + render(doc))
    print(details(doc))
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(doc, f, indent=1)
    print("\nresults: %s" % os.path.relpath(args.results, ROOT))
    if args.plot:
        plot(doc, args.plot, doc["meta"]["configs"])


if __name__ == "__main__":
    sys.exit(main())
