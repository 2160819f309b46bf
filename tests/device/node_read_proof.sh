#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Proof of the bootstrap path on a machine with a real NVIDIA GPU (made for one H200): the
# bootstrap that the readiness action starts over the task's connection, and that
# gpufleet.hygiene.node_readiness starts in each container, fed over stdin, reads the real GPU and
# a real CUDA holder exactly as the readiness module does.
#
# Run from the repository root, with ansible-core importable, ANSIBLE_COLLECTIONS_PATH naming a
# directory that holds ansible_collections/gpufleet/hygiene, python3 with torch (CUDA), and
# nvidia-smi on PATH:
#
#     OUT=/some/dir bash tests/device/node_read_proof.sh
#
# The machine has no Proxmox VE: `pct exec` is replaced by a STAND-IN that runs the command on this
# machine (so each "container" is this machine, read by a fresh Python started as the node module
# starts it in a container). It starts a real CUDA process holding NODE_PROOF_GIB GiB, then:
#   1. readiness sent as a module (pipelining off), readiness through its action's bootstrap
#      (pipelining on) and node_readiness (one "container" through the bootstrap, one read
#      in-process) must give the same checks, naming the holder's PID and its memory;
#   2. the same with allow_running_job and the holder as the job: gpu_idle passes;
#   3. timing, NODE_PROOF_REPS rounds interleaved: NODE_PROOF_N readiness calls as N hosts of one
#      ansible-playbook run (forks N, pipelined), sent as modules and through the bootstrap, against one
#      node_readiness run reading N "containers".
# Writes $OUT/node_read_proof.md and $OUT/node_read_proof.json. Exit status 0 only when every check
# passed. The CUDA process is always killed on exit.

set -u -o pipefail

: "${OUT:?set OUT to the directory the results go to}"
GIB="${NODE_PROOF_GIB:-20}"
N="${NODE_PROOF_N:-8}"
REPS="${NODE_PROOF_REPS:-5}"
PY="${PYTHON:-python3}"
MARKER="node_read_proof_holder"

mkdir -p "$OUT" || exit 2
WORK="$(mktemp -d)" || exit 2
HOLDER_PID=""
cleanup() {
    if [ -n "$HOLDER_PID" ] && kill -0 "$HOLDER_PID" 2>/dev/null; then
        kill -TERM "$HOLDER_PID"; sleep 2; kill -KILL "$HOLDER_PID" 2>/dev/null
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

# The pct STAND-IN: `pct exec VMID -- CMD...` runs CMD here (this machine has no Proxmox VE).
cat >"$WORK/pct" <<'EOF'
#!/bin/sh
[ "$1" = exec ] && [ "$3" = -- ] || { echo "usage: pct exec <vmid> -- <command>" >&2; exit 2; }
shift 3
exec "$@"
EOF
chmod +x "$WORK/pct"

"$PY" - "$GIB" "$MARKER" >"$WORK/holder.log" 2>&1 <<'EOF' &
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("holding", flush=True)
time.sleep(3600)
EOF
HOLDER_PID=$!
for _ in $(seq 1 120); do grep -q holding "$WORK/holder.log" && break; sleep 0.5; done
grep -q holding "$WORK/holder.log" || { echo "the CUDA holder did not start: $(cat "$WORK/holder.log")" >&2; exit 1; }

PYTHON_PATH="$(command -v "$PY")"
"$PY" - "$OUT" "$WORK" "$HOLDER_PID" "$PYTHON_PATH" "$N" "$REPS" <<'EOF'
import json, os, re, statistics, subprocess, sys, time

out, work, holder, python, n, reps = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
pct = os.path.join(work, "pct")
failures, report = [], {"holder_pid": holder, "python": python, "n": n, "reps": reps}


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def masked(checks):
    return json.dumps(checks, sort_keys=True) if checks is None else re.sub(r"\b\d+ MiB used", "N MiB used", json.dumps(checks, sort_keys=True))


def mib(checks):
    return [int(m) for m in re.findall(r"\b(\d+) MiB used", json.dumps(checks))]


def module(name, args, bootstrap=False):
    """One ad-hoc call on localhost (local connection). bootstrap: pipelining on and the interpreter
    named, so that readiness's action runs the bootstrap (-vvv shows it ran); else the module is sent."""
    extra = ["-e", "ansible_python_interpreter=" + python, "-vvv"] if bootstrap else []
    res = subprocess.run(["ansible", "localhost", "-m", "gpufleet.hygiene." + name, "-a", json.dumps(args)] + extra,
                         env=dict(os.environ, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1",
                                  ANSIBLE_PIPELINING="1" if bootstrap else "0",
                                  ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false"),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    found = re.search(r"^localhost \| [A-Z]+ => ", res.stdout, re.MULTILINE)
    if not found:
        raise SystemExit("ansible gave no result:\n" + res.stdout)
    if bootstrap:
        check("exec(json.loads(sys.stdin.buffer.readline()))" in res.stdout and "AnsiballZ" not in res.stdout,
              "readiness ran through the bootstrap, the module was not sent")
    return json.JSONDecoder().raw_decode(res.stdout[found.end():])[0]


for allow in (False, True):
    # The holder's command line ends with the marker (its last argument); ansible's own command
    # lines carry the pattern inside JSON, so they never end with it.
    args = {"job_patterns": ["node_read_proof_holder$"] if allow else [], "allow_running_job": allow}
    alone = module("readiness", args)
    boot = module("readiness", args, bootstrap=True)
    node = module("node_readiness", {"containers": [
        {"host": "via-bootstrap", "vmid": 101, "pct_path": pct, "python": python, "args": args},
        {"host": "in-process", "args": args}]})
    tag = "allow_running_job=%s" % allow
    check("failed" not in alone and "failed" not in boot and "failed" not in node, "%s: the three ran" % tag)
    for host in ("readiness-bootstrap", "via-bootstrap", "in-process"):
        got = boot if host == "readiness-bootstrap" else node["containers"][host]
        # Two readings of a busy GPU may differ by a MiB or two of memory.used (the driver's own
        # accounting moves while two nvidia-smi run at once): compare the rest exactly.
        same = masked(got.get("checks")) == masked(alone.get("checks"))
        drift = [abs(a - b) for a, b in zip(mib(got.get("checks")), mib(alone.get("checks")))]
        check(same and all(d <= 2 for d in drift), "%s: %s gives readiness's checks (memory within 2 MiB: %s)" % (tag, host, drift))
        if got.get("checks") != alone.get("checks"):
            report.setdefault("differences", []).append({"case": tag, "host": host, "readiness": alone.get("checks"),
                                                         "node_readiness": got.get("checks") or got})
    gpu = next(c for c in alone["checks"] if c["name"] == "gpu_idle")
    report["gpu_idle_" + str(allow).lower()] = gpu
    if allow:
        check(gpu["ok"] is True and "held by the running job (pid %d)" % holder in gpu["summary"], "%s: the job's own GPU use passes" % tag)
    else:
        holders = [p for g in alone["gpu_state"].get("gpus", []) for p in g["processes"]]
        check(gpu["ok"] is False and ("pid %d " % holder) in gpu["summary"], "%s: gpu_idle fails naming the holder" % tag)
        check(any(p["pid"] == holder and (p["used_memory_mib"] or 0) >= 1024 for p in holders), "%s: the holder's memory is reported" % tag)
        report["summary"] = gpu["summary"]

# Timing: N readiness calls (N hosts, forks N) against one node_readiness run over N "containers".
inv = os.path.join(work, "inv.ini")
with open(inv, "w") as f:
    f.write("[ct]\n" + "".join("ct%d ansible_connection=local ansible_python_interpreter=%s\n" % (i, python) for i in range(n)))
per_host = os.path.join(work, "per_host.yml")
with open(per_host, "w") as f:
    f.write("- hosts: ct\n  gather_facts: false\n  tasks:\n    - gpufleet.hygiene.readiness: {}\n")
per_node = os.path.join(work, "per_node.yml")
with open(per_node, "w") as f:
    f.write("- hosts: ct0\n  gather_facts: false\n  tasks:\n    - gpufleet.hygiene.node_readiness:\n        containers: %s\n"
            % json.dumps([{"host": "ct%d" % i, "vmid": 100 + i, "pct_path": pct, "python": python} for i in range(n)]))
times = {"per_host": [], "per_host_bootstrap": [], "per_node": []}
# All pipelined; the modules are sent when the bootstrap is switched off.
configs = (("per_host", per_host, "false"), ("per_host_bootstrap", per_host, "true"), ("per_node", per_node, "true"))
for r in range(reps + 1):
    for name, pb, bootstrap in configs[r % 3:] + configs[:r % 3]:
        t = time.monotonic()
        res = subprocess.run(["ansible-playbook", "-i", inv, "-f", str(n), pb, "-e", "gpufleet_readiness_bootstrap=" + bootstrap],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
                             env=dict(os.environ, ANSIBLE_PIPELINING="1"))
        took = time.monotonic() - t
        check(res.returncode == 0, "timing round %d %s ran" % (r, name))
        if r:
            times[name].append(round(took, 3))
med = {k: statistics.median(v) for k, v in times.items()}
report.update(times=times, medians=med, ratio=round(med["per_node"] / med["per_host"], 3),
              ratio_bootstrap=round(med["per_host_bootstrap"] / med["per_host"], 3))
report["failures"] = failures
with open(os.path.join(out, "node_read_proof.json"), "w") as f:
    json.dump(report, f, indent=1)
with open(os.path.join(out, "node_read_proof.md"), "w") as f:
    f.write("# The bootstrap path (readiness's action, node_readiness) on a real GPU\n\n")
    f.write("- gpu_idle with a real CUDA holder (pid %d): %s\n" % (holder, report.get("summary")))
    f.write("- readiness sent as a module, readiness through its action's bootstrap and node_readiness (through the bootstrap and "
            "in-process) gave the same checks, with and without allow_running_job "
            "(memory.used within 2 MiB: %s)\n" % json.dumps(report.get("differences", "identical")))
    f.write("- %d readings (median of %d): %d readiness calls (forks %d) sent as modules %.2f s, through the bootstrap %.2f s "
            "(%.2fx), one node_readiness run %.2f s (%.2fx)\n"
            % (n, reps, n, n, med["per_host"], med["per_host_bootstrap"], report["ratio_bootstrap"], med["per_node"], report["ratio"]))
    f.write("- checks failed: %s\n" % (", ".join(failures) or "none"))
print(json.dumps(report["medians"]), "ratio", report["ratio"], "bootstrap", report["ratio_bootstrap"])
sys.exit(1 if failures else 0)
EOF
