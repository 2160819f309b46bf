#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# The main job, end to end, on a local simulated fleet reproducing the seed incident
# (tests/sim/fleet up --scenario incident: one container with the CUDA-13 contamination,
# one with a stale training process holding GPU memory, one with a stale compile cache,
# the rest healthy):
#
#   1. preflight  must fail on exactly the three bad containers, each for its own check
#   2. remediate  kill, purge, verify, relaunch where needed; must succeed everywhere,
#                 changing every broken container and no healthy one. The stale run had
#                 appended its slow readings (64% of the baseline) to the job's log, as the
#                 seed's did: the relaunched job's log starts with them, and the throughput
#                 gate passes the healthy relaunch on what it wrote itself
#   3. preflight  again (the relaunched job's own GPU use allowed): must pass everywhere
#   4. hygiene    writes the report (JSON, JUnit, Prometheus, HTML); every host ready
#
# Exits non-zero when any expectation fails. The fleet is brought down at the end, also on
# failure, unless KEEP_FLEET=1. Needs root (LXC, sshd). Settings (environment):
#   GPUFLEET_SIM_STATE      fleet state (default /var/tmp/gpufleet-sim-main)
#   GPUFLEET_SIM_INVENTORY  where the fleet's inventory goes (default build/main-job/inventory)
#   GPUFLEET_MAIN_PORT      sshd port of the fleet's nodes (default 2522)
#   GPUFLEET_MAIN_NODES / GPUFLEET_MAIN_CONTAINERS (default 2 / 3)
#   GPUFLEET_MAIN_UNPRIVILEGED  nodes whose containers are unprivileged, as Proxmox VE makes them by
#                           default (root mapped to 100000; the incident's bad containers go there
#                           first, their venv, stale run and cache trainer's): default pve2; empty
#                           for a fleet of privileged containers only
#   GPUFLEET_REPORT_DIR     report directory (default build/report)
#   GPUFLEET_MAIN_LOGS      playbook logs (default build/main-job/logs)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
export GPUFLEET_SIM_STATE=${GPUFLEET_SIM_STATE:-/var/tmp/gpufleet-sim-main}
export GPUFLEET_SIM_INVENTORY=${GPUFLEET_SIM_INVENTORY:-$REPO/build/main-job/inventory}
PORT=${GPUFLEET_MAIN_PORT:-2522}
NODES=${GPUFLEET_MAIN_NODES:-2}
CONTAINERS=${GPUFLEET_MAIN_CONTAINERS:-3}
UNPRIVILEGED=${GPUFLEET_MAIN_UNPRIVILEGED-pve2}
REPORT_DIR=$(realpath -m "${GPUFLEET_REPORT_DIR:-$REPO/build/report}")
LOGS=$(realpath -m "${GPUFLEET_MAIN_LOGS:-$REPO/build/main-job/logs}")
INV=$GPUFLEET_SIM_INVENTORY/fleet.yml
PLAYBOOK="$REPO/.venv/bin/ansible-playbook"
FLEET="$REPO/tests/sim/fleet"
export ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0

say() { printf '\n==> %s\n' "$*"; }
t_start=$SECONDS
step_times=()

if [ "$(id -u)" -ne 0 ]; then
  echo "main-job: needs root (privileged LXC containers, sshd per node)" >&2
  exit 1
fi

say "host packages (tests/sim/setup-host.sh)"
bash tests/sim/setup-host.sh

if [ -e "$GPUFLEET_SIM_STATE" ]; then
  say "a fleet is still up at $GPUFLEET_SIM_STATE (KEEP_FLEET=1 earlier?): bringing it down"
  "$FLEET" down
fi

cleanup() {
  rc=$?
  if [ "${KEEP_FLEET:-0}" = 1 ]; then
    echo "main-job: KEEP_FLEET=1: the fleet stays up (inventory $INV); bring it down with:" >&2
    echo "  GPUFLEET_SIM_STATE=$GPUFLEET_SIM_STATE GPUFLEET_SIM_INVENTORY=$GPUFLEET_SIM_INVENTORY tests/sim/fleet down" >&2
  else
    "$FLEET" down || rc=1
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "bring up the demo fleet: $NODES nodes x $CONTAINERS containers, scenario incident, unprivileged: ${UNPRIVILEGED:-none}"
t=$SECONDS
"$FLEET" up --scenario incident --nodes "$NODES" --containers "$CONTAINERS" --port "$PORT" --unprivileged "$UNPRIVILEGED"
step_times+=("fleet up: $((SECONDS - t)) s")

mkdir -p "$LOGS"

# playbook NAME FILE [ARGS...]: run it, keep its output in $LOGS/NAME.log, never stop here.
playbook() {
  local name=$1 file=$2
  shift 2
  local t=$SECONDS rc=0
  say "$name: ansible-playbook $file $*"
  "$PLAYBOOK" -i "$INV" "$file" "$@" 2>&1 | tee "$LOGS/$name.log" || rc=$?
  echo "$rc" >"$LOGS/$name.rc"
  step_times+=("$name: $((SECONDS - t)) s")
}

# expect NAME MODE: check the run's exit status and recap against the fleet's plan.
#   fail-bad  exactly the incident's bad containers failed, each on its own check
#   all-ok    no host failed or was unreachable
expect() {
  python3 - "$GPUFLEET_SIM_STATE/fleet.json" "$LOGS/$1.log" "$(cat "$LOGS/$1.rc")" "$2" <<'EOF'
import json, re, sys

fleet_json, log, rc, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
fleet = json.load(open(fleet_json))
roles = {ct["name"]: ct.get("incident", "healthy") for n in fleet["nodes"] for ct in n["containers"]}
# The stale run holds the GPUs and runs at 64% of its baseline: the job the inventory describes does not.
check_of = {"contaminated": {"venv_clean"}, "stale_holder": {"gpu_idle", "job_live"}, "stale_cache": {"caches_fresh"}}
text = open(log).read()
recap = {}
for m in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", text.split("PLAY RECAP")[-1], re.M):
    recap[m.group(1)] = {"ok": int(m.group(2)), "changed": int(m.group(3)), "unreachable": int(m.group(4)), "failed": int(m.group(5))}
problems = []
# With the nodes as the read's hosts (the default when the run has them) a ready container runs
# no task at all (only those not ready run their verdict); with the containers as the hosts, each
# runs its read, and those not ready their verdict too.
by_node = "Read the containers' processes, GPUs, venvs, packages and caches on the node" in text
missing = sorted(set(roles) - set(recap))
if by_node:
    missing = [h for h in missing if mode == "fail-bad" and roles[h] != "healthy"]
if missing:
    problems.append("not in the recap: %s" % ", ".join(missing))
unreachable = sorted(h for h, r in recap.items() if r["unreachable"])
if unreachable:
    problems.append("unreachable: %s" % ", ".join(unreachable))
failed = sorted(h for h, r in recap.items() if r["failed"])
if "TASK [Fleet summary, one line per container]" in text:
    # preflight: the summary has one line per container with its verdict, and only the containers
    # that are not ready ran a second task (the verdict), in the play that fails them.
    summary = text.split("TASK [Fleet summary, one line per container]", 1)[1].split("PLAY [", 1)[0]
    said = dict(re.findall(r"^\s+- '?([\w.-]+) - (ready|NOT READY)", summary, re.M))
    want = {h: "ready" if (mode != "fail-bad" or r == "healthy") else "NOT READY" for h, r in roles.items()}
    if said != want:
        problems.append("the fleet summary says %s, expected %s" % (said, want))
    count = "%d of %d ready" % (list(want.values()).count("ready"), len(want))
    if count not in summary:
        problems.append("the fleet summary does not say %r" % count)
    read_tasks = 0 if by_node else 1
    for host, r in recap.items():
        tasks = read_tasks + (0 if want.get(host) == "ready" else 1)
        if host in want and r["ok"] + r["failed"] != tasks:
            problems.append("%s ran %d task(s), expected %d" % (host, r["ok"] + r["failed"], tasks))

if mode == "fail-bad":
    bad = sorted(h for h, r in roles.items() if r != "healthy")
    if rc == 0:
        problems.append("the playbook passed (rc 0); it must fail on %s" % ", ".join(bad))
    if failed != bad:
        problems.append("failed hosts %s, expected exactly %s" % (failed, bad))
    for host in bad:
        want = check_of[roles[host]]
        found = re.findall(r"%s is not ready: (.*)" % re.escape(host), text)
        named = set(re.findall(r"\[(\w+)\]", " ".join(found)))
        if named != want:
            problems.append("%s (%s) failed on %s, expected exactly %s" % (host, roles[host], sorted(named), sorted(want)))
else:
    if rc != 0:
        problems.append("the playbook exited %d" % rc)
    if failed:
        problems.append("failed hosts: %s" % ", ".join(failed))
    if mode == "repair-bad":
        # A repair that changed nothing on a broken host, or anything on a healthy one, is wrong.
        for host, role in sorted(roles.items()):
            changed = recap.get(host, {}).get("changed", 0)
            if role != "healthy" and not changed:
                problems.append("%s (%s) was not repaired: nothing changed on it" % (host, role))
            if role == "healthy" and changed:
                problems.append("%s is healthy but %d task(s) changed it" % (host, changed))
if problems:
    print("main-job: EXPECTATION FAILED (%s, %s):\n  %s" % (log, mode, "\n  ".join(problems)))
    sys.exit(1)
print("main-job: as expected (%s): %s" % (mode, "failed exactly " + ", ".join(failed) if mode == "fail-bad" else
      "repaired exactly the broken hosts" if mode == "repair-bad" else "every host passed"))
EOF
}

playbook preflight-1 playbooks/preflight.yml
expect preflight-1 fail-bad

playbook remediate playbooks/remediate.yml
expect remediate repair-bad

# The stale holder's job log: the stale run's slow readings first, then the relaunched run's.
python3 - "$GPUFLEET_SIM_STATE" <<'EOF'
import json, os, re, sys

state = sys.argv[1]
fleet = json.load(open(os.path.join(state, "fleet.json")))
for node in fleet["nodes"]:
    for ct in node["containers"]:
        if ct.get("incident") != "stale_holder":
            continue
        log = os.path.join(state, "nodes", node["name"], "lxc", str(ct["vmid"]), "rootfs", "var", "log", "gpufleet-train.log")
        rates = [float(r) for r in re.findall(r"([\d.]+) tokens/s", open(log).read())]
        stale = next((i for i, r in enumerate(rates) if r != 12800), len(rates))
        fresh = rates[stale:]
        if stale < 5 or len(fresh) < 5 or set(fresh) != {20000.0}:
            sys.exit("main-job: EXPECTATION FAILED: %s's job log should hold the stale run's slow readings, then "
                     "only the relaunched run's 20000 tokens/s; it holds %s" % (ct["name"], rates))
        print("main-job: %s: the job log starts with the stale run's %d slow readings (12800 tokens/s, 64%% of "
              "the baseline); the gate passed the relaunch on its own %d readings (20000 tokens/s)" % (ct["name"], stale, len(fresh)))
EOF

playbook preflight-2 playbooks/preflight.yml -e gpufleet_allow_running_job=true
expect preflight-2 all-ok

playbook hygiene playbooks/hygiene.yml -e "gpufleet_report_dir=$REPORT_DIR"
expect hygiene all-ok

python3 - "$REPORT_DIR" "$GPUFLEET_SIM_STATE/fleet.json" <<'EOF'
import json, os, sys

report, fleet_json = sys.argv[1], sys.argv[2]
names = sorted(ct["name"] for n in json.load(open(fleet_json))["nodes"] for ct in n["containers"])
for f in ("report.html", "report.json"):
    if not os.path.getsize(os.path.join(report, f)):
        sys.exit("main-job: EXPECTATION FAILED: %s/%s is empty" % (report, f))
data = json.load(open(os.path.join(report, "report.json")))
hosts = data.get("hosts", data) if isinstance(data, dict) else data
ready = sorted(h["host"] for h in hosts if h.get("ready"))
if ready != names:
    sys.exit("main-job: EXPECTATION FAILED: report.json says ready %s, expected %s" % (ready, names))
print("main-job: report.json: %d of %d hosts ready" % (len(ready), len(names)))
EOF

say "summary"
printf '  %s\n' "${step_times[@]}"
echo "  total: $((SECONDS - t_start)) s"
echo "main-job: every expectation met. HTML report: $REPORT_DIR/report.html (all files in $REPORT_DIR; playbook logs in $LOGS)"
