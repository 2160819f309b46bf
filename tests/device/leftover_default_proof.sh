#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Real-GPU proof of issue 42, "leftovers by default": on a GPU box read as a plain host
# (ansible_connection: local, as seed_incident_e2e.sh makes its inventory) whose inventory names
# NO job users (gpufleet_job without users), a worker the job left behind - a process running the
# venv's own interpreter as root, double-forked so that its parent is init, holding real GPU
# memory, its command line matching none of the job's patterns - is found and named by preflight,
# stopped by remediate beside the running job (which keeps its PID), and a second remediate
# changes nothing. Another user's process of the same interpreter, holding GPU memory with init
# as its parent too, is never named one.
#
#   OUT=/some/dir bash tests/device/leftover_default_proof.sh
#
# Run from the repository root, as root, on a machine with an NVIDIA GPU whose python3 holds
# torch (CUDA), with ansible-core importable (ansible and ansible-playbook on PATH) and
# ANSIBLE_COLLECTIONS_PATH naming a directory that holds ansible_collections/gpufleet/hygiene.
# Set-up, once (docs/validation/h200.md, "Set-up, once"; the machine has no package index, so
# ansible-core travels as wheels in .whl/ at the repository root):
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#     --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH LANG=C.UTF-8
#   mkdir -p .ansible/collections/ansible_collections/gpufleet
#   ln -sfn ../../../.. .ansible/collections/ansible_collections/gpufleet/hygiene
#   export ANSIBLE_COLLECTIONS_PATH=$PWD/.ansible/collections
#
# .whl/ (top level; its flashinfer/ folder is tests/device/flashinfer_cache_proof.sh's), made on a
# machine with the package index by:
#
#   P='--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
#      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
#      --platform manylinux1_x86_64'
#   python3 -m pip download --no-deps $P -d .whl ansible-core==2.19.14   # the controller and its modules
#   python3 -m pip download --no-deps $P -d .whl resolvelib==1.2.1       # an ansible-core requirement
#   python3 -m pip download --no-deps $P -d .whl PyYAML==6.0.3           # an ansible-core requirement
#
#   ansible_core-2.19.14-py3-none-any.whl                     2,426,850 B  sha256 d518d0e96fa7...
#   resolvelib-1.2.1-py3-none-any.whl                            18,737 B  sha256 fb06b66c8da0...
#   pyyaml-6.0.3-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl
#                                                               807,870 B  sha256 ba1cc08a7ccd...
#
# ansible-core's other requirements are the image's own (jinja2 and MarkupSafe come with torch,
# packaging is there); cryptography is not needed (ansible-core imports it only for vault).
#
# Steps, each recorded (W=/tmp/gpufleet-leftover; every path this script touches is under W or $OUT):
#   0. a venv over the image's torch (a .pth naming torch's site-packages, as seed_incident_e2e.sh
#      does); an inventory with one host, gpu-box (ansible_connection: local), whose gpufleet_job
#      runs tests/device/train_loop.py --forever from the venv's interpreter, detached (setsid), as
#      root, with NO users; its caches under W, their fingerprint recorded first (torch_cache
#      state=fresh) so that caches_fresh passes while the job compiles into them.
#      The job's environment sets TORCHINDUCTOR_COMPILE_THREADS=1: Inductor then compiles in the
#      job's own process, and the job's only GPU holder is the job itself (step 6 looks at the
#      default, whose compile workers are processes of their own).
#   1. the job is gone, its worker left behind (the seed's case, where the new default matters:
#      no job process, no job user, so root is a leftover owner only as the user the job is
#      launched as, and only for holders running the venv's interpreter): L1, root, the venv's
#      python, double-forked, 4 GiB; O1, another user (nobody), the same interpreter, 2 GiB, parent
#      init; R1, root, the image's python3 (another interpreter), 1 GiB, parent init.
#      preflight (-e gpufleet_allow_running_job=true, as every preflight here) must fail naming L1 -
#      and only L1 - under [job_live] as "GPU holder(s) left by a job that is gone (parent is
#      init)". O1 and R1 are then stopped by this script.
#   2. remediate: stops L1 (its PID gone, its memory freed) and, the host repaired, relaunches the
#      job through the relaunch role (setsid). Should it not start the job, the script starts it
#      the way the relaunch role does (setsid --fork env ... sh -c 'cd "$0" && exec "$@" ...').
#   3. the job alone: preflight -e gpufleet_allow_running_job=true passes.
#   4. beside the running job: L2 (root, the venv's python, 4 GiB, parent init) and O2 (nobody,
#      2 GiB, parent init). preflight -e gpufleet_allow_running_job=true fails naming L2 and not O2
#      under [job_live]; O2 is then stopped by this script (no repair stops another user's process).
#   5. remediate stops L2 (PID gone, its memory freed per nvidia-smi) and leaves the job running
#      (same PID, same start time); a second remediate reports changed=0 for gpu-box, the job still
#      the same.
#   Every remediate runs with -e kill_drain_timeout=45 (the kill role's drain wait, 120 s by
#   default): a drain takes well under a second on a healthy H200, and a failing run stays short.
#   6. (informational, when time is left) the job as torch.compile runs it by default, with its
#      compile workers: which of its processes hold the GPU, what preflight with
#      gpufleet_allow_running_job says of them (none may be named a leftover: required), and what
#      remediate --check would decide for that job (keep it, or stop and relaunch it).
# Output: $OUT/leftover_default.md, $OUT/leftover_default.json, $OUT/leftover_default-raw/ (every
# playbook run's output, the holders' and the job's logs, nvidia-smi readings, log.txt).
# Exit status: 0 only when every required check passed, 1 otherwise, 2 when the machine is not fit
# (no torch on the GPU, no ansible-playbook, not root). Every process it started (the holders, the
# job the playbooks or this script launched, their children) is killed on exit, and W removed.
#
# Knobs: PYTHON (python3), ANSIBLE (ansible), ANSIBLE_PLAYBOOK (ansible-playbook), LEFTOVER_PROOF_GIB
# (4: the root leftovers' GiB), LEFTOVER_PROOF_BUDGET (330: seconds after which step 6 is skipped).
# Test-only: LEFTOVER_PROOF_STANDIN=<state dir of tests/standins/nvidia_smi.py> replaces the GPU by
# the GPU STAND-IN (put its nvidia-smi first on PATH): the holders claim stand-in memory, the job
# is tests/standins/train_dflash.py (tagged train_loop.py), the venv's torch a metadata-only
# stand-in. To test this script on a machine without a GPU; such a run proves nothing about GPUs.

set -u -o pipefail

NAME=leftover_default
if [ -z "${OUT:-}" ]; then
  echo "OUT must name an output directory" >&2
  exit 2
fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/$NAME-raw
rm -rf "$RAW" "$OUT/$NAME.json" "$OUT/$NAME.md"
mkdir -p "$RAW" || exit 2
LOG=$RAW/log.txt
: >"$LOG"
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }

T0=$(date +%s)
BUDGET=${LEFTOVER_PROOF_BUDGET:-330}
PY=${PYTHON:-$(command -v python3)}
ANSIBLE=${ANSIBLE:-ansible}
ANSIBLE_PLAYBOOK=${ANSIBLE_PLAYBOOK:-ansible-playbook}
GIB=${LEFTOVER_PROOF_GIB:-4}
STANDIN=${LEFTOVER_PROOF_STANDIN:-}
REPO=$(pwd)
W=/tmp/gpufleet-leftover
VENV=$W/venv
PATTERN='train_loop[.]py'  # no backslash: it goes into YAML as it is
HOLD_MAX=900               # a holder never outlives 15 minutes, whatever happens to this script
# The kill role waits up to 120 s for the GPUs to drain before it fails; a healthy H200 drains in
# well under a second (docs/validation/h200.md), so 45 s keeps a failing run within the time budget.
DRAIN=kill_drain_timeout=45
export ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1 ANSIBLE_CALLBACK_RESULT_FORMAT=json
export PROOF_OUT=$OUT PROOF_NAME=$NAME PROOF_W=$W PROOF_VENV=$VENV PROOF_REPO=$REPO

[ -n "$PY" ] || { echo "python3 not found" >&2; exit 2; }
[ -f "$REPO/playbooks/remediate.yml" ] && [ -f "$REPO/tests/device/train_loop.py" ] \
  || { echo "run this from the repository root" >&2; exit 2; }

rm -rf "$W"
mkdir -p "$W/run" "$W/home" "$W/home-other" || exit 2
chmod 755 "$W"
chmod 1777 "$W/run"

# --------------------------------------------------------------------------- helpers (python)

cat >"$W/holder.py" <<'PYEOF'
"""A GPU holder for leftover_default_proof.sh. It double-forks (the first child exits, so the
holder's parent becomes init), then holds GIB GiB on the CUDA device through torch (or, on the
test-only GPU stand-in, a claim on its GPU 0), writes what it is as JSON into OUT and sleeps,
HOLD_MAX seconds at most.    python holder.py OUT GIB HOLD_MAX [STANDIN_STATE]"""
import json
import os
import sys
import time

out, gib, hold_max = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
standin = sys.argv[4] if len(sys.argv) > 4 else ""
child = os.fork()
if child:
    os.waitpid(child, 0)  # the first child forks the holder and exits at once
    sys.exit(0)
os.setsid()
if os.fork():
    os._exit(0)
log = os.open(out + ".log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
os.dup2(log, 1)
os.dup2(log, 2)
first_parent = os.getppid()
deadline = time.time() + 5
while os.getppid() == first_parent and time.time() < deadline:  # until reparented
    time.sleep(0.01)


def start_time(pid):
    with open("/proc/%d/stat" % pid) as f:
        text = f.read()
    return int(text[text.rindex(")") + 2:].split()[19])


info = {"pid": os.getpid(), "uid": os.getuid(), "argv": sys.argv, "executable": sys.executable}
keep = []
try:
    if standin:
        device = os.path.join(standin, "dev", "nvidia0")
        keep.append(os.open(device, os.O_RDWR))
        claim = {"pid": os.getpid(), "start_time": start_time(os.getpid()), "gpu": 0, "mib": int(gib * 1024),
                 "util": 0, "device": os.path.realpath(device), "tag": "holder"}
        tmp = os.path.join(standin, "claims", ".%d.tmp" % os.getpid())
        with open(tmp, "w") as f:
            json.dump(claim, f)
        os.replace(tmp, os.path.join(standin, "claims", "%d.json" % os.getpid()))
    else:
        import torch
        keep.append(torch.empty(int(gib * (1 << 30)), dtype=torch.uint8, device="cuda"))
        keep[-1].fill_(1)
        torch.cuda.synchronize()
        info.update(torch=torch.__version__, device=torch.cuda.get_device_name(0))
    info["ok"] = True
except BaseException as exc:  # said in the JSON, for the script to report
    info.update(ok=False, error="%s: %s" % (type(exc).__name__, exc))
info.update(ppid=os.getppid(), start_time=start_time(os.getpid()))
with open(out + ".tmp", "w") as f:
    json.dump(info, f)
os.replace(out + ".tmp", out)
print(json.dumps(info), flush=True)
if not info["ok"]:
    sys.exit(1)
end = time.time() + hold_max
while time.time() < end:
    time.sleep(2)
PYEOF

cat >"$W/tool.py" <<'PYEOF'
"""Records, reads and judges leftover_default_proof.sh's steps: facts, playbook runs, checks."""
import json
import os
import re
import subprocess
import sys
import time

OUT, NAME, W, VENV, REPO = (os.environ[k] for k in ("PROOF_OUT", "PROOF_NAME", "PROOF_W", "PROOF_VENV", "PROOF_REPO"))
STATE = os.path.join(OUT, NAME + ".json")
HOST = "gpu-box"


def load():
    if os.path.exists(STATE):
        with open(STATE) as f:
            return json.load(f)
    return {"name": NAME, "facts": {}, "plays": {}, "checks": [], "passed": False}


def save(d):
    with open(STATE + ".tmp", "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
    os.replace(STATE + ".tmp", STATE)


def proc(pid):
    """What /proc says of a PID: alive (not a zombie), its parent and that parent's name, uid,
    start time, argv."""
    pid = int(pid)
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except OSError:
        return {"pid": pid, "alive": False}
    rest = text[text.rindex(")") + 2:].split()
    out = {"pid": pid, "state": rest[0], "alive": rest[0] not in ("Z", "X"), "ppid": int(rest[1]),
           "start_time": int(rest[19]), "comm": text[text.index("(") + 1:text.rindex(")")]}
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("Uid:"):
                    out["uid"] = int(line.split()[1])
                if line.startswith("NSpid:"):
                    out["nspid"] = [int(x) for x in line.split()[1:]]
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            out["argv"] = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        with open("/proc/%d/comm" % out["ppid"]) as f:
            out["parent_comm"] = f.read().strip()
    except OSError:
        pass
    return out


def all_pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def children_map():
    kids = {}
    for pid in all_pids():
        info = proc(pid)
        if "ppid" in info:
            kids.setdefault(info["ppid"], []).append(pid)
    return kids


def tree(pid):
    """pid and its descendants."""
    kids, out, todo = children_map(), [], [int(pid)]
    while todo:
        p = todo.pop()
        if p in out:
            continue
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def job_pids():
    """This proof's training job(s): the venv's interpreter running train_loop.py (by its path,
    or by the stand-in's tag), whoever launched them."""
    found = []
    for pid in all_pids():
        info = proc(pid)
        argv = info.get("argv") or []
        if info.get("alive") and argv and argv[0] == os.path.join(VENV, "bin", "python") and any(
                a.endswith("train_loop.py") for a in argv[1:]):
            found.append(pid)
    return found


def holder_pids():
    """Every process running this proof's holder.py (by its path under W), whoever it runs as."""
    script = os.path.join(W, "holder.py")
    return [pid for pid in all_pids() if proc(pid).get("alive") and script in (proc(pid).get("argv") or [])[1:2]]


def gpu_snapshot():
    smi = os.environ.get("NVIDIA_SMI", "nvidia-smi")
    snap = {"at": round(time.time(), 3), "gpus": [], "apps": {}, "error": None}
    try:
        q = subprocess.run([smi, "--query-gpu=index,memory.used,memory.total", "--format=csv,noheader,nounits"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False, text=True)
        for line in q.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3 and parts[0].isdigit():
                snap["gpus"].append({"index": int(parts[0]), "used_mib": int(parts[1]), "total_mib": int(parts[2])})
        a = subprocess.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60, check=False, text=True)
        for line in a.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit():
                snap["apps"][parts[0]] = int(parts[1]) if parts[1].isdigit() else None
        if not snap["gpus"]:
            snap["error"] = q.stdout.strip()[-500:]
    except (OSError, subprocess.SubprocessError) as exc:
        snap["error"] = str(exc)
    snap["used_mib"] = sum(g["used_mib"] for g in snap["gpus"])
    return snap


def json_values(text, key):
    """Every JSON value of ``"key": `` in a callback's output (one line or indented)."""
    out, dec, pat = [], json.JSONDecoder(), '"%s": ' % key
    i = text.find(pat)
    while i >= 0:
        try:
            value, end = dec.raw_decode(text, i + len(pat))
            out.append(value)
        except ValueError:
            end = i + len(pat)
        i = text.find(pat, end)
    return out


def parse_play(text):
    msgs = []
    for v in json_values(text, "msg"):
        msgs.extend(v if isinstance(v, list) else [v])
    msgs = [m for m in msgs if isinstance(m, str)]
    # the collection's stdout callback prints a failed task's message on its fatal line, not as JSON
    msgs += re.findall(r"^fatal: \[%s\]: FAILED! (.*)$" % re.escape(HOST), text, re.M)
    prefix = HOST + " is not ready: "
    problems = next((m[len(prefix):] for m in msgs if m.startswith(prefix)), None)
    segments = {}
    if problems:
        parts = re.split(r"(?:^| \| )\[([a-z_]+(?:, [a-z_]+)*)\] ", problems)
        for names, summary in zip(parts[1::2], parts[2::2]):
            for n in names.split(", "):
                segments[n] = summary
    live = segments.get("job_live", "")
    named = []
    m = re.search(r"GPU holder\(s\) left by a job that is gone \(parent is init\): (.*)", live)
    if m:
        named = [int(p) for p in re.findall(r"\bpid (\d+) ", m.group(1).split("; ")[0] + " ")]
    recap, tasks, current = {}, [], None
    for line in text.splitlines():
        r = re.match(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+skipped=(\d+)"
                     r"\s+rescued=(\d+)\s+ignored=(\d+)", line)
        if r:
            recap[r.group(1)] = dict(zip(("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored"),
                                         (int(x) for x in r.groups()[1:])))
            continue
        t = re.match(r"^TASK \[(.*)\] \**\s*$", line)
        if t:
            current = t.group(1)
            continue
        s = re.match(r"^(ok|changed|fatal|failed|skipping): \[%s\]" % re.escape(HOST), line)
        if s and current:
            tasks.append([current, s.group(1)])
    terminated = []
    for v in json_values(text, "terminated"):
        if isinstance(v, list):
            terminated.extend({"pid": t.get("pid"), "signals": t.get("signals"), "outcome": t.get("outcome")}
                              for t in v if isinstance(t, dict))
    plans = [v for v in json_values(text, "repair__plan") if isinstance(v, dict)]
    return {"problems": problems, "segments": segments, "named_leftovers": named,
            "summary_lines": [m for m in msgs if m.startswith(HOST + " - ") or " ready; not ready: " in m],
            "recap": recap, "host_recap": recap.get(HOST), "tasks": tasks, "terminated": terminated,
            "plan": ({k: plans[-1].get(k) for k in ("repair", "left", "failed", "leftover_pids")} if plans else None)}


def ran(play, fragment, status=None):
    """Whether a task whose name holds ``fragment`` ran for the host (with that status)."""
    return any(fragment in t and (status is None or s == status) for t, s in (play or {}).get("tasks", []))


def role_ran(play, role):
    """Whether any task of the role ``role`` (gpufleet.hygiene.<role>) ran for the host, not skipped."""
    return any(t.startswith("gpufleet.hygiene.%s : " % role) and s != "skipping" for t, s in (play or {}).get("tasks", []))


def judge(expr):
    d = load()
    env = {"F": d["facts"], "P": d["plays"], "ran": ran, "role_ran": role_ran, "proc": proc}
    return eval(expr, env)  # noqa: S307 - the checks written in this script, never input read from a host


cmd, args = sys.argv[1], sys.argv[2:]
if cmd == "proc":
    print(json.dumps(proc(args[0])))
    sys.exit(0)
if cmd == "tree":
    print(" ".join(str(p) for p in tree(args[0])))
    sys.exit(0)
if cmd == "holderpids":
    print(" ".join(str(p) for p in holder_pids()))
    sys.exit(0)
if cmd == "jobpids":
    print(" ".join(str(p) for p in job_pids()))
    sys.exit(0)
if cmd == "get":
    try:
        print(judge(args[0]))
    except Exception as exc:  # a missing fact reads as empty
        print("", end="")
        sys.stderr.write("get %s: %s\n" % (args[0], exc))
    sys.exit(0)
d = load()
if cmd == "fact":  # fact KEY JSON-or-text
    try:
        d["facts"][args[0]] = json.loads(args[1])
    except ValueError:
        d["facts"][args[0]] = args[1]
elif cmd == "factfile":  # factfile KEY FILE (JSON)
    try:
        with open(args[1]) as f:
            d["facts"][args[0]] = json.load(f)
    except (OSError, ValueError) as exc:
        d["facts"][args[0]] = {"ok": False, "error": "%s: %s" % (args[1], exc)}
elif cmd == "procfact":  # procfact KEY PID
    d["facts"][args[0]] = proc(args[1])
elif cmd == "snap":  # snap KEY: nvidia-smi's reading
    d["facts"]["gpu_" + args[0]] = gpu_snapshot()
elif cmd == "play":  # play NAME RC SECONDS LOGFILE
    with open(args[3], errors="replace") as f:
        parsed = parse_play(f.read())
    parsed.update(rc=int(args[1]), seconds=round(float(args[2]), 2), log=os.path.relpath(args[3], OUT))
    d["plays"][args[0]] = parsed
elif cmd == "check":  # check NAME required|informational EXPR
    name, required, expr = args[0], args[1] == "required", args[2]
    env = {"F": d["facts"], "P": d["plays"], "ran": ran, "role_ran": role_ran, "proc": proc}
    try:
        ok, err = bool(eval(expr, env)), None  # noqa: S307 - the checks written in this script, never input read from a host
    except Exception as exc:  # a missing step or key is a failed check, said so
        ok, err = False, "%s: %s" % (type(exc).__name__, exc)
    d["checks"].append({"name": name, "required": required, "ok": ok, "expr": expr, "error": err})
    print("%s %s%s%s" % ("PASS" if ok else "FAIL", name, "" if required else " (informational)",
                         " (%s)" % err if err else ""))
elif cmd == "summary":
    f, p = d["facts"], d["plays"]
    req = [c for c in d["checks"] if c["required"]]
    failed = [c for c in req if not c["ok"]] or ([{"name": "no check ran"}] if not req else [])
    d["passed"] = not failed and not f.get("unfit")
    L = ["# Leftovers by default (issue 42) on a real GPU", ""]
    if f.get("standin"):
        L += ["**STAND-IN RUN**: the GPU was tests/standins/nvidia_smi.py and the job train_dflash.py; "
              "this run tests the script, it proves nothing about GPUs.", ""]
    L += ["Produced by `tests/device/leftover_default_proof.sh` on %s." % f.get("date", "?"), "",
          "| | |", "|---|---|"]
    for k in ("gpu", "driver", "python", "torch", "ansible", "pid1", "other_user", "job_env", "elapsed_s"):
        L.append("| %s | %s |" % (k, str(f.get(k, "?")).replace("|", "/")))
    if f.get("unfit"):
        L += ["", "**The machine is not fit for this proof**: %s" % f["unfit"]]
    L += ["", "## The GPU holders", "",
          "| holder | what | pid | uid | parent (pid, name) | interpreter | MiB per nvidia-smi | after |",
          "|---|---|---|---|---|---|---|---|"]
    what = {"L1": "root, the venv's python, the job gone", "O1": "another user, the venv's python",
            "R1": "root, the image's python3", "L2": "root, the venv's python, beside the job",
            "O2": "another user, the venv's python, beside the job"}
    for key in ("L1", "O1", "R1", "L2", "O2"):
        h = f.get("holder_" + key) or {}
        pr = f.get("proc_" + key) or {}
        snap = f.get("gpu_holders_" + key[-1]) or {}
        L.append("| %s | %s | %s | %s | %s, %s | %s | %s | %s |" % (
            key, what[key], h.get("pid", "-"), h.get("uid", "-"), pr.get("ppid", h.get("ppid", "-")),
            pr.get("parent_comm", "-"), ((pr.get("argv") or h.get("argv") or ["-"])[0]),
            (snap.get("apps") or {}).get(str(h.get("pid")), "-"), f.get("fate_" + key, "-")))
    L += ["", "The job: pid %s (%s), before and after the remediates: %s." % (
        f.get("job_pid", "-"), f.get("job_launched_by", "?"), f.get("job_pids_seen", "-")), ""]
    L += ["## Playbook runs", "", "| run | rc | s | gpu-box recap | [job_live] / summary |", "|---|---|---|---|---|"]
    for name, run in p.items():
        rec = run.get("host_recap") or {}
        seg = run.get("segments", {}).get("job_live") or "; ".join(run.get("summary_lines") or [])
        if name.startswith("remediate"):
            seg = "plan: %s; stopped: %s" % (
                "-" if not run.get("plan") else "repair=%s, left=%s, failed=%s" % (
                    run["plan"].get("repair"), run["plan"].get("left"), run["plan"].get("failed")),
                ", ".join("pid %s (%s, %s)" % (t["pid"], "+".join(t.get("signals") or []), t.get("outcome"))
                          for t in run.get("terminated") or []) or "nothing")
        L.append("| %s | %s | %s | %s | %s |" % (name, run["rc"], run["seconds"],
                                                 ", ".join("%s=%s" % kv for kv in rec.items()) or "-",
                                                 seg.replace("|", "/")[:600]))
    if f.get("probe"):
        L += ["", "## Step 6: the job with torch.compile's default compile workers", "",
              "```", json.dumps(f["probe"], indent=1, sort_keys=True)[:4000], "```"]
    L += ["", "## Checks", ""]
    for c in d["checks"]:
        L.append("- %s %s%s%s" % ("PASS" if c["ok"] else "FAIL", c["name"], "" if c["required"] else " (informational)",
                                  " (%s)" % c["error"] if c["error"] else ""))
    L += ["", "Result: **%s** (%d of %d required checks passed)." % (
        "PASS" if d["passed"] else "FAIL", sum(1 for c in req if c["ok"]), len(req))]
    with open(os.path.join(OUT, NAME + ".md"), "w") as fh:
        fh.write("\n".join(L) + "\n")
    save(d)
    sys.exit(0 if d["passed"] else 1)
save(d)
PYEOF

tool() { "$PY" "$W/tool.py" "$@"; }
now() { date +%s.%N; }
elapsed() { "$PY" -c 'import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 3))' "$1" "$2"; }
check() { tool check "$1" required "$2" | tee -a "$LOG"; }
info() { tool check "$1" informational "$2" | tee -a "$LOG"; }

# ------------------------------------------------------------------- the processes it started

STARTED=$W/started  # "pid start_time" of every process this script started or had started
: >"$STARTED"
note_started() { local st; st=$(tool get "proc($1).get('start_time', '')"); [ -n "$st" ] && echo "$1 $st" >>"$STARTED"; }

alive_as_started() {  # alive_as_started PID START: the same process still runs (not a zombie)
  [ "$(tool get "proc($1).get('alive') and proc($1).get('start_time') == $2")" = True ]
}

stop_pid() {  # stop_pid PID: TERM, up to 10 s, then KILL; a zombie counts as gone
  local pid=$1 st
  st=$(tool get "proc($pid).get('start_time', '')")
  [ -n "$st" ] || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 1 50); do alive_as_started "$pid" "$st" || return 0; sleep 0.2; done
  alive_as_started "$pid" "$st" && kill -KILL "$pid" 2>/dev/null
  sleep 0.5
  return 0
}

stop_job() {  # the proof's training job(s) and their children (compile workers)
  local pids p
  pids=$(tool jobpids)
  for p in $pids; do
    for c in $(tool tree "$p"); do note_started "$c"; done
    kill -TERM "$p" 2>/dev/null
  done
  for _ in $(seq 1 75); do [ -z "$(tool jobpids)" ] && break; sleep 0.2; done
  for p in $(tool jobpids); do kill -KILL "$p" 2>/dev/null; done
  return 0
}

CREATED_USER=
# shellcheck disable=SC2329  # run by the EXIT trap below
cleanup() {
  set +e
  stop_job
  for pid in $(tool holderpids); do note_started "$pid"; done  # one that never said its PID too
  while read -r pid st; do
    if alive_as_started "$pid" "$st"; then kill -TERM "$pid" 2>/dev/null; fi
  done <"$STARTED"
  sleep 2
  while read -r pid st; do
    if alive_as_started "$pid" "$st"; then kill -KILL "$pid" 2>/dev/null; fi
  done <"$STARTED"
  for f in "$W"/run/*.log "$W"/train*.log; do [ -f "$f" ] && cp "$f" "$RAW/" 2>/dev/null; done
  if [ -n "$CREATED_USER" ]; then userdel "$CREATED_USER" 2>/dev/null; fi
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

unfit() {  # unfit WHY: the machine cannot run the proof
  log "NOT FIT: $*"
  tool fact unfit "$*"
  tool summary >/dev/null
  exit 2
}

# start_holder KEY AS INTERPRETER GIB: a holder double-forked as root (AS=root) or as the other user
start_holder() {
  local key=$1 as=$2 interp=$3 gib=$4 out=$W/run/$1.json pid
  local cmd=(env -u PYTHONPATH "HOME=$W/home" "$interp" "$W/holder.py" "$out" "$gib" "$HOLD_MAX")
  [ -n "$STANDIN" ] && cmd+=("$STANDIN")
  if [ "$as" = other ]; then
    cmd=("${AS_OTHER[@]}" env -u PYTHONPATH "HOME=$W/home-other" "$interp" "$W/holder.py" "$out" "$gib" "$HOLD_MAX")
    [ -n "$STANDIN" ] && cmd+=("$STANDIN")
  fi
  log "holder $key: ${cmd[*]}"
  "${cmd[@]}" >>"$RAW/holder_$key.launch" 2>&1 </dev/null
  echo "$?" >"$W/run/$key.rc"  # the first parent's status: 0 once the holder is forked
}

wait_holder() {  # wait_holder KEY: its JSON, recorded; its PID noted
  local key=$1 out=$W/run/$1.json pid
  if [ "$(cat "$W/run/$key.rc" 2>/dev/null)" = 0 ]; then
    for _ in $(seq 1 180); do [ -s "$out" ] && break; sleep 0.5; done
  fi
  [ -s "$out" ] || "$PY" -c 'import json, sys; print(json.dumps({"ok": False, "error": sys.argv[1]}))' \
    "did not become ready: $(tail -q -n 2 "$RAW/holder_$key.launch" "$out.log" 2>/dev/null | tr '\n' ' ')" >"$out"
  tool factfile "holder_$key" "$out"
  pid=$(tool get "F['holder_$key'].get('pid', '')")
  if [ -n "$pid" ]; then
    note_started "$pid"
    tool procfact "proc_$key" "$pid"
  fi
  log "holder $key: $(cat "$out" 2>/dev/null || echo 'did not become ready'; tail -n 3 "$out.log" 2>/dev/null)"
}

gone_and_freed() {  # gone_and_freed KEY SNAP_BEFORE: wait until the holder is gone, nvidia-smi no longer
  # lists it, and (with a SNAP_BEFORE) GPU memory used dropped by at least 3/4 of what it held
  local key=$1 before=${2:-} pid mib cond
  pid=$(tool get "F['holder_$key']['pid']")
  cond="not proc($pid).get('alive') and str($pid) not in F['gpu_after_$key']['apps']"
  if [ -n "$before" ]; then
    mib=$(tool get "int(F['gpu_$before']['apps'].get(str($pid)) or F['holder_${key}_mib'])")
    cond="$cond and F['gpu_$before']['used_mib'] - F['gpu_after_$key']['used_mib'] >= 0.75 * $mib"
  fi
  for _ in $(seq 1 60); do
    tool snap "after_$key"
    [ "$(tool get "$cond")" = True ] && return 0
    sleep 0.5
  done
  return 1
}

stop_holder() {  # stop_holder KEY: a holder this script stops itself, until nvidia-smi no longer lists it
  local key=$1 pid
  pid=$(tool get "F['holder_$key'].get('pid', '')")
  [ -n "$pid" ] || return 0
  stop_pid "$pid"
  for _ in $(seq 1 40); do
    tool snap "stopped_$key"
    [ "$(tool get "str($pid) not in F['gpu_stopped_$key']['apps']")" = True ] && break
    sleep 0.5
  done
  tool fact "fate_$key" "stopped by this script"
}

play() {  # play NAME PLAYBOOK [ARGS...]: ansible-playbook on the proof's inventory, recorded
  local name=$1 pb=$2 t0 t1 rc
  shift 2
  log "playbook: $name: $pb $*"
  t0=$(now)
  timeout 300 "$ANSIBLE_PLAYBOOK" -i "$W/inventory.yml" "$pb" "$@" >"$RAW/$name.log" 2>&1
  rc=$?
  t1=$(now)
  tool play "$name" "$rc" "$(elapsed "$t0" "$t1")" "$RAW/$name.log"
  log "  rc=$rc in $(elapsed "$t0" "$t1") s; recap: $(grep -E "^$HOST_RE +:" "$RAW/$name.log" | tr -s ' ')"
  log "  not ready: $(tool get "P['$name']['problems']")"
}
HOST_RE=gpu-box

wait_log() {  # wait_log REGEX FROM_BYTE SECONDS: the job's log has the regex after byte FROM
  local regex=$1 from=$2 secs=$3
  for _ in $(seq 1 $((secs * 2))); do
    tail -c +"$((from + 1))" "$W/train.log" 2>/dev/null | grep -qE "$regex" && return 0
    sleep 0.5
  done
  return 1
}
log_size() { stat -c %s "$W/train.log" 2>/dev/null || echo 0; }

launch_like_relaunch() {  # launch_like_relaunch [ENV PAIRS...]: the job as the relaunch role's setsid launch starts it
  log "launching the job as the relaunch role does (setsid --fork)"
  # shellcheck disable=SC2016  # $0 and $@ are the inner sh's, as in roles/relaunch/tasks/launch.yml
  setsid --fork env "$@" "GPUFLEET_LOG=$W/train.log" sh -c 'cd "$0" && exec "$@" >>"$GPUFLEET_LOG" 2>&1 </dev/null' \
    "$W" "${JOB_CMD[@]}" >>"$RAW/launch.log" 2>&1 </dev/null
}

# --------------------------------------------------------------------------- the machine

tool fact date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
tool fact standin "$([ -n "$STANDIN" ] && echo true || echo false)"
tool fact python "$("$PY" -V 2>&1)"
tool fact pid1 "$(cat /proc/1/comm 2>/dev/null)"
[ "$(id -u)" = 0 ] || unfit "not root: the job runs as root and another user's process is started with setpriv"
command -v "$ANSIBLE_PLAYBOOK" >/dev/null 2>&1 || unfit "$ANSIBLE_PLAYBOOK is not on PATH (set-up: see this script's header)"
command -v "$ANSIBLE" >/dev/null 2>&1 || unfit "$ANSIBLE is not on PATH"
command -v setsid >/dev/null 2>&1 || unfit "setsid (util-linux) is not there"
tool fact ansible "$("$ANSIBLE" --version 2>/dev/null | head -n 1)"
if ! timeout 60 nvidia-smi >"$RAW/nvidia-smi.txt" 2>&1; then unfit "nvidia-smi fails: $(tail -n 2 "$RAW/nvidia-smi.txt")"; fi
tool fact gpu "$(timeout 60 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
tool fact driver "$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"

# The other user: nobody, else one made for this run (removed on exit).
OTHER=nobody
if ! id -u "$OTHER" >/dev/null 2>&1; then
  OTHER=gpufleet-other
  if ! id -u "$OTHER" >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin "$OTHER" || unfit "no user nobody, and useradd failed"
    CREATED_USER=$OTHER
  fi
fi
OTHER_UID=$(id -u "$OTHER")
OTHER_GID=$(id -g "$OTHER")
if command -v setpriv >/dev/null 2>&1; then
  AS_OTHER=(setpriv "--reuid=$OTHER_UID" "--regid=$OTHER_GID" --clear-groups)
elif command -v runuser >/dev/null 2>&1; then
  AS_OTHER=(runuser -u "$OTHER" --)
else
  unfit "neither setpriv nor runuser to start a process as $OTHER"
fi
chown "$OTHER_UID:$OTHER_GID" "$W/home-other"
tool fact other_user "$OTHER (uid $OTHER_UID)"

# The venv over the image's torch: a .pth naming torch's site-packages (seed_incident_e2e.sh).
timeout 120 "$PY" -m venv --without-pip "$VENV" || unfit "cannot create $VENV"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -z "$STANDIN" ]; then
  if ! timeout 300 env -u PYTHONPATH "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)' \
      >"$RAW/torch-check.txt" 2>&1; then
    unfit "python3 cannot import torch, or torch sees no GPU: $(tail -n 2 "$RAW/torch-check.txt")"
  fi
  TORCH_SITE=$(env -u PYTHONPATH "$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  echo "$TORCH_SITE" >"$SITE/_image_torch.pth"
  tool fact torch "$(env -u PYTHONPATH "$VENV/bin/python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
  JOB_CMD=("$VENV/bin/python" "$REPO/tests/device/train_loop.py" --forever)
else
  # Test-only: a metadata-only torch (what venv_clean and the caches' fingerprint read), the
  # stand-in's device files open to the other user, the training stand-in as the job.
  mkdir -p "$SITE/torch" "$SITE/torch-2.11.0.dist-info"
  printf "__version__ = '2.11.0+cu130'\ncuda = '13.0'\n" >"$SITE/torch/version.py"
  printf 'Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n' >"$SITE/torch-2.11.0.dist-info/METADATA"
  printf 'torch/version.py,,\ntorch-2.11.0.dist-info/METADATA,,\ntorch-2.11.0.dist-info/RECORD,,\n' >"$SITE/torch-2.11.0.dist-info/RECORD"
  chmod 1777 "$STANDIN/claims"
  chmod 666 "$STANDIN"/dev/nvidia*
  tool fact torch "stand-in (metadata only)"
  JOB_CMD=("$VENV/bin/python" "$REPO/tests/standins/train_dflash.py" --state "$STANDIN" --gpu 0 --mib 20480
           --log-throughput 950000 --log-every 0.5 --compile-seconds 2 --tag train_loop.py)
fi
log "venv $VENV over $(cat "$SITE/_image_torch.pth" 2>/dev/null || echo 'a stand-in torch')"

# The job's environment: its caches under W, its compile in its own process (see the header).
JOB_ENV_PAIRS=("HOME=$W/home" "TORCHINDUCTOR_CACHE_DIR=$W/inductor" "TRITON_CACHE_DIR=$W/triton" "TORCHINDUCTOR_COMPILE_THREADS=1")
tool fact job_env "${JOB_ENV_PAIRS[*]}"
CMD_YAML=$("$PY" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${JOB_CMD[@]}")
{
  echo "all:"
  echo "  children:"
  echo "    pve_containers:"
  echo "      hosts:"
  echo "        gpu-box:"
  echo "          ansible_connection: local"
  echo "          ansible_python_interpreter: $PY"
  echo "          gpufleet_venv: $VENV"
  echo "          gpufleet_lock_path: $W/remediate.lock"
  [ -n "$STANDIN" ] && echo "          gpufleet_gpu_device_patterns: ['$STANDIN/dev/nvidia*']"
  echo "          gpufleet_job:"
  echo "            command: $CMD_YAML"
  echo "            workdir: $W"
  echo "            method: setsid"
  echo "            log: $W/train.log"
  echo "            patterns: ['$PATTERN']"
  echo "            env: {HOME: $W/home, TORCHINDUCTOR_CACHE_DIR: $W/inductor, TRITON_CACHE_DIR: $W/triton, TORCHINDUCTOR_COMPILE_THREADS: '1'}"
  echo "            ready_regex: compiled in"
} >"$W/inventory.yml"
cp "$W/inventory.yml" "$RAW/inventory.yml"

# The caches' fingerprint, recorded before anything compiles into them (docs/torch_cache.md:
# "Run it in the preflight before the first launch"): the job's compiles then keep them fresh.
ENV_JSON=$("$PY" -c 'import json, sys; print(json.dumps(dict(a.split("=", 1) for a in sys.argv[1:])))' "${JOB_ENV_PAIRS[@]:0:3}")
timeout 300 "$ANSIBLE" localhost -i localhost, -c local -e "ansible_python_interpreter=$PY" -m gpufleet.hygiene.torch_cache \
  -a "{\"state\": \"fresh\", \"venv\": \"$VENV\", \"environment\": $ENV_JSON}" >"$RAW/caches-fresh.log" 2>&1
tool fact caches_fresh_rc "$?"
check "0. the job's caches' fingerprint is recorded before the job runs (torch_cache state=fresh)" "F['caches_fresh_rc'] == 0"

# --------------------------------------------------------------------------- 1. the job is gone, its worker left behind

log "1. no job running; L1 (root, the venv's python), O1 ($OTHER, the venv's python), R1 (root, the image's python3)"
tool snap idle
start_holder L1 root "$VENV/bin/python" "$GIB"
start_holder O1 other "$VENV/bin/python" 2
start_holder R1 root "$PY" 1
wait_holder L1; wait_holder O1; wait_holder R1
tool fact holder_L1_mib "$((GIB * 1024))"
tool snap holders_1
for k in L1 O1 R1; do
  check "1. $k holds GPU memory, double-forked: its parent is init (PID 1)" \
    "F['holder_$k'].get('ok') and F['proc_$k']['ppid'] == 1 and F['proc_$k']['alive']"
done
check "1. L1 runs as root from the venv's interpreter, its command line matching none of the job's patterns" \
  "F['proc_L1']['uid'] == 0 and F['proc_L1']['argv'][0] == '$VENV/bin/python' and not any('train_loop' in a for a in F['proc_L1']['argv'])"
check "1. O1 runs as $OTHER from the venv's interpreter" "F['proc_O1']['uid'] == $OTHER_UID and F['proc_O1']['argv'][0] == '$VENV/bin/python'"
info "1. nvidia-smi lists L1, O1 and R1 with their memory" \
  "all(str(F['holder_' + k]['pid']) in F['gpu_holders_1']['apps'] for k in ('L1', 'O1', 'R1'))"

play preflight_1 playbooks/preflight.yml -e gpufleet_allow_running_job=true
check "1. preflight fails" "P['preflight_1']['rc'] != 0 and P['preflight_1']['problems']"
check "1. preflight names L1 under [job_live] as a GPU holder left by a job that is gone (parent is init)" \
  "F['holder_L1']['pid'] in P['preflight_1']['named_leftovers'] and 'GPU holder(s) left by a job that is gone (parent is init): ' in P['preflight_1']['segments']['job_live']"
check "1. preflight does not name O1 (another user's) a leftover" "F['holder_O1']['pid'] not in P['preflight_1']['named_leftovers']"
check "1. preflight does not name R1 (root, another interpreter) a leftover" "F['holder_R1']['pid'] not in P['preflight_1']['named_leftovers']"
check "1. L1 is the only leftover named" "P['preflight_1']['named_leftovers'] == [F['holder_L1']['pid']]"

log "stopping O1 and R1 (no repair stops them: they are not the job's)"
for k in O1 R1; do stop_holder "$k"; done
tool snap before_remediate_1

# --------------------------------------------------------------------------- 2. remediate: L1 stopped, the job launched

FROM=$(log_size)
play remediate_1 playbooks/remediate.yml -v -e "$DRAIN"
check "2. remediate succeeds" "P['remediate_1']['rc'] == 0"
check "2. remediate stopped L1 by its PID" "F['holder_L1']['pid'] in [t['pid'] for t in P['remediate_1']['terminated']]"
# The job is relaunched in the same run, so the total is no witness here: remediate's own verify
# (after the kill role's drain, before the relaunch) read the GPUs idle, or the run would have failed.
if gone_and_freed L1; then tool fact fate_L1 stopped; else tool fact fate_L1 "still there"; fi
check "2. L1 is gone and nvidia-smi no longer lists it" "F['fate_L1'] == 'stopped'"
check "2. its memory was freed: remediate's verify read the GPUs idle before the relaunch" \
  "ran(P['remediate_1'], 'verify : Fail when not ready', 'ok') and P['remediate_1']['rc'] == 0"
info "2. the relaunch role launched the job (setsid)" "ran(P['remediate_1'], 'Launch detached in a new session (setsid)', 'changed')"
JOB=$(tool jobpids)
if [ -z "$JOB" ]; then
  tool fact job_launched_by "this script, as the relaunch role does (the remediate did not leave it running)"
  FROM=$(log_size)
  launch_like_relaunch "${JOB_ENV_PAIRS[@]}"
  for _ in $(seq 1 60); do JOB=$(tool jobpids); [ -n "$JOB" ] && break; sleep 0.5; done
else
  tool fact job_launched_by "the relaunch role of remediate.yml"
fi
JOB=${JOB%% *}
if [ -z "$JOB" ] || ! wait_log "compiled in" "$FROM" 300; then
  tool fact job_pid "${JOB:-none}"
  check "2. the job runs (compiled, stepping)" "False"
  tail -n 30 "$W/train.log" >>"$LOG" 2>/dev/null
  tool summary >/dev/null
  cat "$OUT/$NAME.md"
  exit 1
fi
wait_log "tokens/s" "$FROM" 120
tool fact job_pid "$JOB"
tool procfact proc_job_1 "$JOB"
check "2. the job runs as root from the venv's interpreter, its parent init (setsid --fork)" \
  "F['proc_job_1']['uid'] == 0 and F['proc_job_1']['argv'][0] == '$VENV/bin/python' and F['proc_job_1']['ppid'] == 1"
tool fact job_tree_1 "[$(tool tree "$JOB" | tr ' ' ',')]"

# --------------------------------------------------------------------------- 3. the job alone

play preflight_2 playbooks/preflight.yml -e gpufleet_allow_running_job=true
check "3. the job alone: preflight with gpufleet_allow_running_job passes" "P['preflight_2']['rc'] == 0"

# --------------------------------------------------------------------------- 4. beside the running job

log "4. beside the job (pid $JOB): L2 (root, the venv's python), O2 ($OTHER, the venv's python)"
start_holder L2 root "$VENV/bin/python" "$GIB"
start_holder O2 other "$VENV/bin/python" 2
wait_holder L2; wait_holder O2
tool fact holder_L2_mib "$((GIB * 1024))"
tool snap holders_2
for k in L2 O2; do
  check "4. $k holds GPU memory, its parent init" "F['holder_$k'].get('ok') and F['proc_$k']['ppid'] == 1 and F['proc_$k']['alive']"
done
check "4. L2's command line matches none of the job's patterns" "not any('train_loop' in a for a in F['proc_L2']['argv'])"
play preflight_3 playbooks/preflight.yml -e gpufleet_allow_running_job=true
check "4. preflight (gpufleet_allow_running_job=true) fails" "P['preflight_3']['rc'] != 0"
check "4. preflight names L2 under [job_live] as a GPU holder left by a job that is gone (parent is init)" \
  "F['holder_L2']['pid'] in P['preflight_3']['named_leftovers'] and 'GPU holder(s) left by a job that is gone (parent is init): ' in P['preflight_3']['segments']['job_live']"
check "4. preflight does not name O2 (another user's, the same interpreter) a leftover" \
  "F['holder_O2']['pid'] not in P['preflight_3']['named_leftovers'] and P['preflight_3']['named_leftovers'] == [F['holder_L2']['pid']]"
check "4. [job_live] says the job runs (its PID)" "'job running (pid %s' % F['job_pid'] in P['preflight_3']['segments']['job_live']"
log "stopping O2 (another user's process: no repair stops it, and remediate's drain would wait on it)"
stop_holder O2
tool snap before_remediate_2

# --------------------------------------------------------------------------- 5. remediate beside the job

play remediate_2 playbooks/remediate.yml -v -e "$DRAIN"
check "5. remediate succeeds" "P['remediate_2']['rc'] == 0"
check "5. remediate stopped L2, and only L2" "[t['pid'] for t in P['remediate_2']['terminated']] == [F['holder_L2']['pid']]"
if gone_and_freed L2 before_remediate_2; then tool fact fate_L2 stopped; else tool fact fate_L2 "still there"; fi
check "5. L2 is gone, nvidia-smi no longer lists it, and the GPU memory used dropped by its share" "F['fate_L2'] == 'stopped'"
tool procfact proc_job_2 "$JOB"
check "5. the job still runs: the same PID and start time" \
  "F['proc_job_2']['alive'] and F['proc_job_2']['start_time'] == F['proc_job_1']['start_time']"
check "5. remediate neither stopped nor relaunched the job (no task of the kill or relaunch role ran)" \
  "not role_ran(P['remediate_2'], 'kill') and not role_ran(P['remediate_2'], 'relaunch') and F['job_pid'] not in [t['pid'] for t in P['remediate_2']['terminated']]"
info "5. remediate's plan: the job left running, healthy" "P['remediate_2']['plan']['left'] == 'running its job, healthy'"
play remediate_3 playbooks/remediate.yml -v -e "$DRAIN"
check "5. a second remediate succeeds with changed=0 for gpu-box" \
  "P['remediate_3']['rc'] == 0 and P['remediate_3']['host_recap']['changed'] == 0"
tool procfact proc_job_3 "$JOB"
check "5. the job still runs after the second remediate: the same PID and start time" \
  "F['proc_job_3']['alive'] and F['proc_job_3']['start_time'] == F['proc_job_1']['start_time']"
tool fact job_pids_seen "$(tool jobpids)"

# --------------------------------------------------------------------------- 6. torch.compile's default workers (informational)

LEFT=$((BUDGET - ($(date +%s) - T0)))
if [ -n "$STANDIN" ]; then
  tool fact probe '{"skipped": "the stand-in job has no compile workers"}'
elif [ "$LEFT" -lt 90 ]; then
  tool fact probe "{\"skipped\": \"only $LEFT s left of the ${BUDGET} s budget\"}"
else
  log "6. the job with torch.compile's default compile workers (TORCHINDUCTOR_COMPILE_THREADS unset)"
  stop_job
  FROM=$(log_size)
  launch_like_relaunch "HOME=$W/home" "TORCHINDUCTOR_CACHE_DIR=$W/inductor" "TRITON_CACHE_DIR=$W/triton"
  J2=
  for _ in $(seq 1 60); do J2=$(tool jobpids); [ -n "$J2" ] && break; sleep 0.5; done
  J2=${J2%% *}
  WAIT=$((LEFT - 45)); [ "$WAIT" -gt 180 ] && WAIT=180
  if [ -n "$J2" ] && wait_log "compiled in" "$FROM" "$WAIT"; then
    wait_log "tokens/s" "$FROM" 60
    sleep 3
    tool snap probe
    tool fact probe_tree "[$(tool tree "$J2" | tr ' ' ',')]"
    play preflight_probe playbooks/preflight.yml -e gpufleet_allow_running_job=true
    play remediate_probe_check playbooks/remediate.yml --check -v -e "$DRAIN"
    "$PY" - "$OUT/$NAME.json" "$J2" >"$W/probe.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
f, p, job = d["facts"], d["plays"], int(sys.argv[2])
tree = f["probe_tree"]
apps = f["gpu_probe"]["apps"]
pre = p["preflight_probe"]
print(json.dumps({
    "job_pid": job, "processes": len(tree),
    "gpu_holders_of_the_job": {pid: apps[pid] for pid in apps if int(pid) in tree},
    "preflight_rc": pre["rc"], "gpu_idle": pre["segments"].get("gpu_idle", "ok"),
    "job_live": pre["segments"].get("job_live", "ok"), "named_leftovers": pre["named_leftovers"],
    "remediate_check_plan": p["remediate_probe_check"]["plan"]}))
PYEOF
    tool factfile probe "$W/probe.json"
    check "6. none of the default job's own processes (compile workers) is named a leftover" \
      "not (set(P['preflight_probe']['named_leftovers']) & set(F['probe_tree']))"
    info "6. the default job alone passes preflight with gpufleet_allow_running_job (its workers are not other holders)" \
      "P['preflight_probe']['rc'] == 0"
    info "6. remediate --check would keep the default job running" \
      "(P['remediate_probe_check']['plan'] or {}).get('left') in (None, 'ready', 'running its job, healthy') and not (P['remediate_probe_check']['plan'] or {}).get('repair')"
  else
    tool fact probe "{\"skipped\": \"the default job did not compile within $WAIT s\"}"
  fi
  stop_job
fi

tool fact elapsed_s "$(($(date +%s) - T0))"
tool summary
rc=$?
log "summary: $OUT/$NAME.md (exit $rc)"
cat "$OUT/$NAME.md"
exit "$rc"
