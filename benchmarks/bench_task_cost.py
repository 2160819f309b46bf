# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What one task costs the controller per host, with and without the pct connection preloaded.

Usage: .venv/bin/python benchmarks/bench_task_cost.py [--hosts 32] [--tasks 4] [--rounds 5]

A playbook of --tasks trivial tasks (set_fact: no connection is opened, nothing runs on a
target) over --hosts container hosts of a static inventory that name the gpufleet.hygiene.pct
connection, as a fleet's containers do. Each run is ansible-playbook itself, from the
repository (its ansible.cfg: forks, bytecode kept), interleaved round by round with the order
rotating (round 0 not counted):

* preload   - the gpufleet.hygiene.preload callback enabled (as this repository's ansible.cfg has it)
* no-preload - the same ansible.cfg without it: every worker loads the connection plugin itself
* list      - --list-hosts: ansible-playbook's start, the inventory and the playbook parsed, no task

For each: the wall time, the CPU of ansible-playbook's main process and of its workers (its
children), from getrusage in a wrapper around ansible-playbook's own main; medians. The per
host and task figure is (run - list) / (hosts x tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BIN = os.path.dirname(sys.executable)

# ansible-playbook's main under getrusage: its own CPU and that of its (waited-for) workers.
WRAPPER = r"""
import atexit, json, os, resource, runpy, sys
out = sys.argv.pop(1)
def report():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w") as f:
        json.dump({"main": me.ru_utime + me.ru_stime, "workers": kids.ru_utime + kids.ru_stime}, f)
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def write_files(work, hosts, tasks):
    inventory = {"all": {"children": {"pve_containers": {
        "vars": {"ansible_connection": "gpufleet.hygiene.pct", "ansible_pct_node_host": "192.0.2.1", "ansible_pct_node_user": "root"},
        "hosts": {"ct%d" % (100 + i): {"ansible_pct_vmid": 100 + i} for i in range(hosts)}}}}}
    with open(os.path.join(work, "inventory.json"), "w") as f:
        json.dump(inventory, f)
    with open(os.path.join(work, "play.yml"), "w") as f:
        f.write("- hosts: pve_containers\n  gather_facts: false\n  tasks:\n")
        f.writelines("    - name: Task %d\n      ansible.builtin.set_fact:\n        bench_fact_%d: %d\n" % (i, i, i) for i in range(tasks))
    with open(os.path.join(ROOT, "ansible.cfg")) as f:
        lines = f.readlines()
    assert any(line.startswith("callbacks_enabled") and "gpufleet.hygiene.preload" in line for line in lines), \
        "ansible.cfg no longer enables gpufleet.hygiene.preload"
    with open(os.path.join(work, "no-preload.cfg"), "w") as f:
        f.writelines(line for line in lines if not line.startswith("callbacks_enabled"))
    with open(os.path.join(work, "wrapper.py"), "w") as f:
        f.write(WRAPPER)


def run(work, config, hosts):
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.path.join(ROOT, ".ansible", "collections"), ANSIBLE_NOCOLOR="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a controller keeps its bytecode
    argv = [sys.executable, os.path.join(work, "wrapper.py"), os.path.join(work, "usage.json"),
            os.path.join(BIN, "ansible-playbook"), "-i", os.path.join(work, "inventory.json"), "-f", str(hosts),
            os.path.join(work, "play.yml")]
    if config == "no-preload":
        env["ANSIBLE_CONFIG"] = os.path.join(work, "no-preload.cfg")
    if config == "list":
        argv.append("--list-hosts")
    t0 = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or (config != "list" and "failed=0" not in proc.stdout):
        raise RuntimeError("%s: rc %d\n%s" % (config, proc.returncode, proc.stdout[-3000:]))
    with open(os.path.join(work, "usage.json")) as f:
        usage = json.load(f)
    return {"wall": wall, "main": usage["main"], "workers": usage["workers"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    configs = ["preload", "no-preload", "list"]
    with tempfile.TemporaryDirectory(prefix="gpufleet-task-cost-") as work:
        write_files(work, args.hosts, args.tasks)
        got = {c: [] for c in configs}
        for r in range(args.rounds + 1):
            order = configs[r % 3:] + configs[:r % 3]
            for config in order:
                m = run(work, config, args.hosts)
                if r:
                    got[config].append(m)
                print("round %d %-10s wall %.2f s  main %.2f s  workers %.2f s" % (r, config, m["wall"], m["main"], m["workers"]),
                      file=sys.stderr)
    med = {c: {k: statistics.median(m[k] for m in got[c]) for k in ("wall", "main", "workers")} for c in configs}
    n = args.hosts * args.tasks
    print("%s, %d CPUs, Python %s; %d hosts x %d set_fact tasks; %d rounds, medians\n" % (
        platform.machine(), os.cpu_count(), platform.python_version(), args.hosts, args.tasks, args.rounds))
    print("| run | wall | main process CPU | workers' CPU | per host and task: wall, CPU (beyond --list-hosts) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for c in configs:
        row = med[c]
        extra = ""
        if c != "list":
            wall = (row["wall"] - med["list"]["wall"]) / n * 1000
            cpu = (row["main"] + row["workers"] - med["list"]["main"] - med["list"]["workers"]) / n * 1000
            extra = "%.1f ms, %.1f ms" % (wall, cpu)
        print("| %s | %.2f s | %.2f s | %.2f s | %s |" % (c, row["wall"], row["main"], row["workers"], extra))
    print("\nworkers' CPU, preload / no-preload: %.2fx" % (med["preload"]["workers"] / med["no-preload"]["workers"]))


if __name__ == "__main__":
    main()
