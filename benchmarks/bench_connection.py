# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Side-by-side cost of reaching Proxmox containers: three ways, one simulated fleet.

Usage (as root, after tests/sim/setup-host.sh):

    .venv/bin/python benchmarks/bench_connection.py [--nodes 2] [--containers 4]
        [--counts 2,4] [--rounds 5] [--peer-wheel PATH]

It brings up its own fleet (state /var/tmp/gpufleet-sim-bench, inventory under
build/bench-connection/, port 2622, so it never meets another fleet on the machine) and
brings it down at the end, also on failure. On it, interleaved round by round:

  A  a four-task playbook (command `true`, stat, slurp, copy of a small file; no facts)
     over gpufleet.hygiene.pct, pipelining on (its default);
  B  the same playbook over community.proxmox's proxmox_pct_remote connection (paramiko,
     `pct exec <vmid> -- ...`), taken from the `ansible` package's wheel and extracted
     into build/bench-peer/collections; ansible-core stays the repository's;
  C  the seeds' raw one-liners: one `ssh node 'pct exec <vmid> -- ...'` per container and
     task, a fresh ssh connection each, containers in parallel.

Each is run on the first N containers of every node for each N in --counts, so the report
gives the per-container marginal cost as well as the medians and the ratios to A.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import time
import uuid

from _fleetbench import BIN, PEER_COLLECTIONS, ROOT, Fleet, ansible_env, ensure_peer, log

STATE = "/var/tmp/gpufleet-sim-bench"
PORT = 2622
WORK = os.path.join(ROOT, "build", "bench-connection")

STAT_PATH = "/etc/passwd"
COPY_DEST = "/tmp/gpufleet-bench-copy.txt"

PLAYBOOK = """\
- name: Four tasks through the connection under test
  hosts: bench
  gather_facts: false
  tasks:
    - name: Run true
      ansible.builtin.command: "true"
      changed_when: false
    - name: Stat a file
      ansible.builtin.stat:
        path: {stat}
    - name: Slurp a small file
      ansible.builtin.slurp:
        src: {stat}
    - name: Copy a small file
      ansible.builtin.copy:
        src: "{{{{ bench_src }}}}"
        dest: {dest}
        mode: "0644"
""".format(stat=STAT_PATH, dest=COPY_DEST)


def write_inventories(nodes, count):
    """Inventory for A (the fleet's own variables) and for B (the peer's), first `count` per node."""
    a_hosts, b_hosts = {}, {}
    for hosts in nodes:
        for h in hosts[:count]:
            a_hosts[h["name"]] = {k: v for k, v in h.items() if k.startswith("ansible_")}
            b_hosts[h["name"]] = {
                "ansible_connection": "community.proxmox.proxmox_pct_remote",
                "ansible_host": h["ansible_pct_node_host"],
                "ansible_port": h["ansible_pct_node_port"],
                "ansible_user": h["ansible_pct_node_user"],
                "ansible_private_key_file": h["ansible_pct_private_key_file"],
                "proxmox_vmid": h["ansible_pct_vmid"],
                "ansible_python_interpreter": h["ansible_python_interpreter"],
            }
    paths = {}
    for key, hosts in (("A", a_hosts), ("B", b_hosts)):
        paths[key] = os.path.join(WORK, "inventory-%s-%d.yml" % (key, count))
        with open(paths[key], "w") as f:
            json.dump({"all": {"children": {"bench": {"hosts": hosts}}}}, f, indent=2)
    return paths, [h for hosts in nodes for h in hosts[:count]]


def run_playbook(inventory, forks, env, src, logfile):
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", inventory, "-f", str(forks),
            "-e", "bench_src=" + src, os.path.join(WORK, "four_tasks.yml")]
    t0 = time.perf_counter()
    out = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         check=False)
    wall = time.perf_counter() - t0
    with open(logfile, "a") as f:
        f.write("$ %s\n%s\n" % (shlex.join(argv), out.stdout))
    if out.returncode != 0:
        raise RuntimeError("ansible-playbook failed (rc %d), log %s:\n%s" % (out.returncode, logfile, out.stdout[-3000:]))
    return wall


def one_liners(hosts, src, workers):
    """The seeds' way: a fresh ssh to the node per container and task, `pct exec` there."""
    def ssh(h, remote, stdin=None):
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ControlMaster=no", "-o", "ControlPath=none",
                "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + h["ansible_pct_known_hosts_file"],
                "-o", "IdentitiesOnly=yes", "-i", h["ansible_pct_private_key_file"],
                "-p", str(h["ansible_pct_node_port"]), "root@" + h["ansible_pct_node_host"], remote]
        out = subprocess.run(argv, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
        if out.returncode != 0:
            raise RuntimeError("%s: %s: %s" % (h["name"], remote, out.stderr.decode(errors="replace")))
        return out.stdout

    def container(h):
        pct = "pct exec %d -- " % h["ansible_pct_vmid"]
        ssh(h, pct + "true")
        ssh(h, pct + "stat " + STAT_PATH)
        ssh(h, pct + "cat " + STAT_PATH)
        with open(src, "rb") as f:
            ssh(h, pct + "sh -c 'cat > %s'" % COPY_DEST, stdin=f)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(container, hosts))
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--containers", type=int, default=4, help="containers per node in the fleet")
    ap.add_argument("--counts", default="2,4", help="containers per node to measure at (comma separated)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--configs", default="A,B,C")
    ap.add_argument("--peer-wheel", help="a downloaded ansible 12.x wheel to take community.proxmox from")
    args = ap.parse_args()
    counts = sorted({int(c) for c in args.counts.split(",")})
    if counts[-1] > args.containers or counts[0] < 1:
        ap.error("--counts must lie within 1..--containers")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if os.geteuid() != 0:
        raise SystemExit("bench: needs root (the simulated fleet does)")

    peer_version = ensure_peer(args.peer_wheel)["community.proxmox"] if "B" in configs else None
    os.makedirs(WORK, exist_ok=True)
    inventory_dir = os.path.join(WORK, "inventory")
    home = os.path.join(WORK, "home")
    logfile = os.path.join(WORK, "playbooks.log")
    open(logfile, "w").close()
    with open(os.path.join(WORK, "four_tasks.yml"), "w") as f:
        f.write(PLAYBOOK)
    fleet = Fleet(STATE, inventory_dir, PORT)

    results = {(c, n): [] for c in configs for n in counts}
    t_up = time.perf_counter()
    try:
        fleet.up(args.nodes, args.containers)
        log("fleet up in %.1f s" % (time.perf_counter() - t_up))
        nodes = fleet.nodes()
        os.makedirs(os.path.join(home, ".ssh"), mode=0o700, exist_ok=True)
        os.makedirs(os.path.join(home, "tmp"), exist_ok=True)
        shutil.copy(nodes[0][0]["ansible_pct_known_hosts_file"], os.path.join(home, ".ssh", "known_hosts"))
        env = ansible_env(home, [PEER_COLLECTIONS])
        plans = {n: write_inventories(nodes, n) for n in counts}
        forks = args.nodes * counts[-1]
        src = os.path.join(WORK, "copy-src.txt")
        # One warm-up of each (imports, page cache), not counted.
        order = [(c, n) for n in counts for c in configs]
        for r in range(args.rounds + 1):
            rot = order[r % len(order):] + order[:r % len(order)]
            for c, n in rot:
                with open(src, "w") as f:
                    f.write("round %d %s %s\n" % (r, c, uuid.uuid4()) * 16)  # new content: copy really copies
                inventories, hosts = plans[n]
                if c == "A":
                    fleet.close_masters()
                    wall = run_playbook(inventories["A"], forks, env, src, logfile)
                elif c == "B":
                    wall = run_playbook(inventories["B"], forks, env, src, logfile)
                else:
                    wall = one_liners(hosts, src, forks)
                if r:
                    results[(c, n)].append(wall)
                log("round %d %s %d containers: %.2f s" % (r, c, len(hosts), wall))
        fleet.close_masters()
    finally:
        t_down = time.perf_counter()
        fleet.down()
        log("fleet down in %.1f s" % (time.perf_counter() - t_down))

    names = {
        "A": "A gpufleet.hygiene.pct (pipelining on)",
        "B": "B community.proxmox proxmox_pct_remote %s" % (peer_version or ""),
        "C": "C seeds' one-liners (fresh ssh + pct exec per task)",
    }
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\n%s, Python %s, %d CPUs, %d nodes, %d rounds (medians of wall time of the whole run)\n" % (
        platform.machine(), platform.python_version(), os.cpu_count(), args.nodes, args.rounds))
    head = "| configuration | " + " | ".join("%d containers" % (args.nodes * n) for n in counts)
    head += " | ratio to A | per extra container |"
    print(head)
    print("| --- |" + " ---: |" * (len(counts) + 2))
    lo, hi = counts[0], counts[-1]
    for c in configs:
        cells = ["%.2f s" % med[(c, n)] for n in counts]
        ratio = " / ".join("%.2fx" % (med[(c, n)] / med[("A", n)]) for n in counts) if "A" in configs else ""
        marginal = ""
        if hi > lo:
            marginal = "%.0f ms" % (1000 * (med[(c, hi)] - med[(c, lo)]) / (args.nodes * (hi - lo)))
        print("| %s | %s | %s | %s |" % (names[c], " | ".join(cells), ratio, marginal))
    print("\nall runs (s): " + json.dumps({"%s@%d" % k: [round(x, 3) for x in v] for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
