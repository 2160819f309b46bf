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
#   GPUFLEET_REPORT_DIR     report directory (default build/report); the incident's earlier phases
#                           (preflight's report, remediate's outcome) go to its incident/ directory and
#                           are on the hygiene report's page, phase by phase
#   GPUFLEET_MAIN_LOGS      playbook logs (default build/main-job/logs)
#   GPUFLEET_MAIN_VERBOSE=1 also print every playbook's whole output (by default each run's output
#                           goes to its log, and the screen gets what it found and did)
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

mkdir -p "$LOGS"
# quietly CMD...: run it with its output in $LOGS/setup.log; on failure show its end and stop.
quietly() {
  "$@" >>"$LOGS/setup.log" 2>&1 || { tail -n 30 "$LOGS/setup.log" >&2; echo "main-job: failed: $* (all of it in $LOGS/setup.log)" >&2; exit 1; }
}

say "host packages, then the demo fleet (output in $LOGS/setup.log)"
: >"$LOGS/setup.log"
quietly bash tests/sim/setup-host.sh

if [ -e "$GPUFLEET_SIM_STATE" ]; then
  echo "    a fleet is still up at $GPUFLEET_SIM_STATE (KEEP_FLEET=1 earlier?): bringing it down"
  quietly "$FLEET" down
fi

cleanup() {
  rc=$?
  if [ "${KEEP_FLEET:-0}" = 1 ]; then
    echo "main-job: KEEP_FLEET=1: the fleet stays up (inventory $INV); bring it down with:" >&2
    echo "  GPUFLEET_SIM_STATE=$GPUFLEET_SIM_STATE GPUFLEET_SIM_INVENTORY=$GPUFLEET_SIM_INVENTORY tests/sim/fleet down" >&2
  else
    "$FLEET" down >>"$LOGS/setup.log" 2>&1 || { echo "main-job: bringing the fleet down failed (see $LOGS/setup.log)" >&2; rc=1; }
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "    $NODES Proxmox VE nodes x $CONTAINERS LXC containers (simulated, real LXC and sshd), unprivileged on: ${UNPRIVILEGED:-none};"
echo "    the seed incident: one venv with CUDA-13 wheels in a cu128 torch, one stale run holding the GPU at 64% of"
echo "    its pace, one compile cache built for another torch; the other containers healthy"
t=$SECONDS
quietly "$FLEET" up --scenario incident --nodes "$NODES" --containers "$CONTAINERS" --port "$PORT" --unprivileged "$UNPRIVILEGED"
step_times+=("fleet up: $((SECONDS - t)) s")

# playbook NAME WHAT FILE [ARGS...]: run it, keep its output in $LOGS/NAME.log (on the screen too
# with GPUFLEET_MAIN_VERBOSE=1), never stop here.
playbook() {
  local name=$1 what=$2 file=$3
  shift 3
  local t=$SECONDS rc=0
  say "$what"
  echo "    ansible-playbook $file $* > $LOGS/$name.log"
  if [ "${GPUFLEET_MAIN_VERBOSE:-0}" = 1 ]; then
    "$PLAYBOOK" -i "$INV" "$file" "$@" 2>&1 | tee "$LOGS/$name.log" || rc=$?
  else
    "$PLAYBOOK" -i "$INV" "$file" "$@" >"$LOGS/$name.log" 2>&1 || rc=$?
  fi
  echo "$rc" >"$LOGS/$name.rc"
  step_times+=("$name: $((SECONDS - t)) s")
}

# expect NAME MODE: check the run's exit status and recap against the fleet's plan.
#   fail-bad  exactly the incident's bad containers failed, each on its own check
#   all-ok    no host failed or was unreachable
expect() {
  python3 - "$GPUFLEET_SIM_STATE/fleet.json" "$LOGS/$1.log" "$(cat "$LOGS/$1.rc")" "$2" <<'EOF'
import json, re, sys, textwrap

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
# What the run said, in its own words: the fleet summary (preflight), the outcome table (remediate).
if "TASK [Fleet summary, one line per container]" in text:
    # The summary's lines as the YAML result shows them (a line wrapped, quoted): each whole again.
    items = []
    for line in summary.split("msg:", 1)[-1].splitlines():
        if line.startswith("    - "):
            items.append(line[6:])
        elif line.startswith("      ") and items:
            items[-1] += " " + line.strip()
    for item in items:
        if item[:1] in "'\"" and item[-1:] == item[:1]:
            item = item[1:-1].replace("''", "'") if item[0] == "'" else json.loads(item)
        # A ready container in a few words; what is wrong with one that is not, all of it.
        item = item.split(";", 1)[0] if " - ready" in item else item
        print(textwrap.fill(item, width=110, initial_indent="    ", subsequent_indent="        "))
if "OUTCOME:" in text:
    block = text[text.rindex("OUTCOME:"):].splitlines()
    print("    " + block[0])
    for line in block[1:]:
        if not line.startswith("  "):
            break
        print("    " + line)
if problems:
    print("main-job: EXPECTATION FAILED (%s, %s):\n  %s" % (log, mode, "\n  ".join(problems)))
    sys.exit(1)
print("    %s" % ("as planned: it failed exactly the broken containers, %s, each for its own fault" % ", ".join(failed)
                  if mode == "fail-bad" else "as planned: it repaired exactly the broken containers and changed no healthy one"
                  if mode == "repair-bad" else "as planned: every container passed"))
EOF
}

INCIDENT="$REPORT_DIR/incident"
mkdir -p "$INCIDENT"
playbook preflight-1 "1/4 preflight: is every container ready for a run?" playbooks/preflight.yml \
  -e "gpufleet_report_dir=$INCIDENT/preflight" -e "gpufleet_report_title='Preflight before the repair'"
expect preflight-1 fail-bad

# The outcome callback writes what remediate did, for the report's incident page.
GPUFLEET_OUTCOME_FILE="$INCIDENT/remediate.outcome.json" \
  playbook remediate "2/4 remediate: repair what preflight found, relaunch the jobs" playbooks/remediate.yml
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
        print("    %s: the job log starts with the stale run's %d slow readings (12800 tokens/s, 64%% of "
              "the baseline); the gate passed the relaunch on its own %d readings (20000 tokens/s)" % (ct["name"], stale, len(fresh)))
EOF

playbook preflight-2 "3/4 preflight again: ready now, the relaunched jobs running?" playbooks/preflight.yml \
  -e gpufleet_allow_running_job=true
expect preflight-2 all-ok

# The report's directory and the incident's phases (preflight's report, remediate's outcome).
python3 -c 'import json, sys; print(json.dumps({"gpufleet_report_dir": sys.argv[1], "gpufleet_report_phases": [
    {"label": "preflight found", "path": sys.argv[2] + "/preflight"},
    {"label": "remediate did", "path": sys.argv[2] + "/remediate.outcome.json"}]}, indent=2))' "$REPORT_DIR" "$INCIDENT" \
  >"$LOGS/hygiene-vars.json"
playbook hygiene "4/4 hygiene: the scheduled check, and the report of the incident" playbooks/hygiene.yml \
  -e "@$LOGS/hygiene-vars.json"
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
phases = [p["label"] for p in data.get("phases", [])]
if phases != ["preflight found", "remediate did"]:
    sys.exit("main-job: EXPECTATION FAILED: report.json's phases are %s, expected preflight's and remediate's" % phases)
print("    report: %d of %d containers ready; its page shows the incident phase by phase (%s, then now)"
      % (len(ready), len(names), ", ".join(phases)))
EOF

times=$(printf '%s, ' "${step_times[@]}")
say "done in $((SECONDS - t_start)) s (${times%, })"
echo "    every expectation met: preflight found the three broken containers, remediate repaired exactly those"
echo "    and relaunched their jobs, and every container is ready now."
echo "    The report (open it in a browser): $REPORT_DIR/report.html"
echo "    Beside it: report.json, report.junit.xml, gpufleet_hygiene.prom; playbook logs in $LOGS"
