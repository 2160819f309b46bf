#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Proof of gpufleet.hygiene.gpu_state on a machine with a real NVIDIA GPU (made for one H200).
#
# Run from the repository root, with ansible-core importable, ANSIBLE_COLLECTIONS_PATH naming a
# directory that holds ansible_collections/gpufleet/hygiene, python3 with torch (CUDA), and
# nvidia-smi on PATH:
#
#     OUT=/some/dir bash tests/device/gpu_state_proof.sh
#
# It starts a real CUDA process holding GPU_PROOF_GIB GiB (torch.empty + fill, then sleep), shows
# that gpu_state reports its PID and memory, lists it in check mode without signalling it, ensures
# idle with a scope matching only that process (SIGTERM, grace, SIGKILL), measures the drain time
# (the module's figures and an independent nvidia-smi watcher's), checks that a second run changes
# nothing, and times the module against the bare nvidia-smi calls it replaces, GPU_PROOF_REPS times
# each (medians, ratios). Writes $OUT/gpu_state_proof.md and $OUT/gpu_state_proof.json (+ $OUT/raw/).
# Exit status 0 only when every check passed. The CUDA process is always killed on exit.
#
# Knobs: GPU_PROOF_GIB (40), GPU_PROOF_GPU (0, nvidia-smi index), GPU_PROOF_REPS (7), PYTHON
# (python3), ANSIBLE (ansible), GPU_PROOF_MODULE_ARGS (JSON merged into every module call, e.g.
# '{"vantage": "node"}').
# Test-only: GPU_STATE_PROOF_STANDIN=<state dir> replaces the CUDA process with the GPU stand-in's
# training process (tests/standins/train_dflash.py), to test this script on a machine without a
# GPU; put the stand-in nvidia-smi first on PATH then. Its figures prove nothing about GPUs.

set -u -o pipefail

: "${OUT:?set OUT to the directory the results go to}"
GIB="${GPU_PROOF_GIB:-40}"
GPU="${GPU_PROOF_GPU:-0}"
REPS="${GPU_PROOF_REPS:-7}"
PY="${PYTHON:-python3}"
ANSIBLE="${ANSIBLE:-ansible}"
STANDIN="${GPU_STATE_PROOF_STANDIN:-}"
MARKER="gpu_state_proof_holder"

mkdir -p "$OUT/raw" || exit 2
LOG="$OUT/raw/proof.log"
: >"$LOG"
WORK="$(mktemp -d)" || exit 2
HOLDER_PID=""
WATCH_PID=""

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }

stop_pid() {  # stop_pid PID: TERM, up to 5 s, then KILL; only the PID this script started
    local pid="$1"
    [ -n "$pid" ] || return 0
    kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 0
}

cleanup() {
    stop_pid "$WATCH_PID"
    stop_pid "$HOLDER_PID"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT TERM

for tool in nvidia-smi timeout "$PY" "$ANSIBLE"; do
    command -v "$tool" >/dev/null 2>&1 || { log "missing on PATH: $tool"; exit 2; }
done
[ -n "${ANSIBLE_COLLECTIONS_PATH:-}" ] || { log "ANSIBLE_COLLECTIONS_PATH is not set"; exit 2; }
[ -f tests/device/gpu_state_proof.sh ] || { log "run this from the repository root"; exit 2; }

# ---------------------------------------------------------------------------- the helper (python3)
cat >"$WORK/helper.py" <<'PYEOF'
import json, os, statistics, subprocess, sys, time

OUT = os.environ["OUT"]
RAW = os.path.join(OUT, "raw")
GPU = os.environ["PROOF_GPU"]
REPS = int(os.environ["PROOF_REPS"])
ANSIBLE = os.environ["PROOF_ANSIBLE"]
EXTRA = json.loads(os.environ.get("GPU_PROOF_MODULE_ARGS") or "{}")
GPU_FIELDS = "index,uuid,name,memory.used,memory.total,utilization.gpu"
APP_FIELDS = "gpu_uuid,pid,used_memory,process_name"
FMT = "--format=csv,noheader,nounits"


def save(name, data):
    with open(os.path.join(RAW, name + ".json"), "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)


def load(name):
    with open(os.path.join(RAW, name + ".json")) as f:
        return json.load(f)


def smi(*args, timeout=30):
    return subprocess.run(["nvidia-smi"] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          timeout=timeout, check=False)


def gpu_used_mib():
    r = smi("--query-gpu=memory.used", FMT, "-i", GPU, timeout=15)
    return int(r.stdout.decode().split()[0]) if r.returncode == 0 else None


def ansible(name, args, check=False, timeout=600):
    """Run the module through `ansible localhost -c local`; save and return (rc, result, seconds)."""
    margs = dict(args)
    margs.update(EXTRA)
    argv = [ANSIBLE, "localhost", "-c", "local", "-m", "gpufleet.hygiene.gpu_state", "-a", json.dumps(margs)]
    if check:
        argv.append("--check")
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="minimal", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_DEPRECATION_WARNINGS="0", ANSIBLE_NOCOLOR="1")
    started = time.monotonic()
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, timeout=timeout,
                           check=False)
        rc, out, err = p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        rc, out, err = 124, "", "ansible timed out after %ss" % timeout
    seconds = time.monotonic() - started
    result = None
    at = out.find("=> {")
    if at >= 0:
        try:
            result = json.JSONDecoder().raw_decode(out[at + 3:])[0]
        except ValueError:
            result = None
    save(name, {"argv": argv, "rc": rc, "seconds": seconds, "result": result, "stdout": out[-4000:],
                "stderr": err[-4000:]})
    return rc, result, seconds


def cmd_query(name, pid, mib, threshold):
    """The module reports the holder's PID and memory on the GPU."""
    rc, res, sec = ansible(name, {"gpus": [GPU], "threshold_mib": threshold})
    checks = []
    ok = rc == 0 and res is not None and not res.get("failed")
    checks.append(("%s: module ran" % name, ok, "rc=%s %s" % (rc, (res or {}).get("msg", ""))))
    if ok:
        g = res["gpus"][0]
        procs = dict((p["pid"], p) for p in g["processes"])
        checks.append(("%s: holder PID %s listed on GPU %s" % (name, pid, GPU), int(pid) in procs,
                       "processes: %s" % sorted(procs)))
        checks.append(("%s: GPU memory used >= 95%% of %s MiB" % (name, mib),
                       (g["memory_used_mib"] or 0) >= 0.95 * int(mib), "memory_used_mib=%s" % g["memory_used_mib"]))
        used = procs.get(int(pid), {}).get("used_memory_mib")
        checks.append(("%s: per-process memory reported (or null where the vantage cannot know)" % name,
                       used is None or used >= 0.95 * int(mib), "used_memory_mib=%s vantage=%s backend=%s"
                       % (used, res["vantage"], res["backend"])))
        checks.append(("%s: GPU not idle" % name, res["idle"] is False, ""))
    print(json.dumps(checks))


def cmd_check_mode(pid, threshold):
    rc, res, _s = ansible("idle_check_mode", {"state": "idle", "gpus": [GPU], "threshold_mib": threshold,
                                               "scope": {"cmdline": [os.environ["PROOF_MARKER"]]}}, check=True)
    ok = rc == 0 and res is not None
    pids = [t["pid"] for t in (res or {}).get("terminated", [])]
    alive = os.path.exists("/proc/%s" % pid)
    print(json.dumps([
        ("check mode: would signal exactly the holder", ok and pids == [int(pid)], "terminated pids=%s" % pids),
        ("check mode: changed=true, holder still alive", ok and res.get("changed") is True and alive,
         "changed=%s alive=%s" % ((res or {}).get("changed"), alive)),
    ]))


def holder_gone(pid):
    try:
        return not os.listdir("/proc/%s/fd" % pid)  # a zombie has no open files
    except OSError:
        return True


def cmd_watch(pid, threshold, stop_file):
    """Independent drain watcher: when did the holder vanish, when did nvidia-smi show memory freed."""
    samples, t_gone, t_freed = [], None, None
    deadline = time.time() + 600
    while time.time() < deadline and not os.path.exists(stop_file):
        now = time.time()
        gone = holder_gone(pid)
        used = gpu_used_mib()
        samples.append((round(now, 4), gone, used))
        if gone and t_gone is None:
            t_gone = now
        if gone and used is not None and used <= threshold:
            t_freed = now
            break
        time.sleep(0.05)
    save("drain_watch", {"t_gone": t_gone, "t_freed": t_freed, "threshold_mib": threshold, "samples": samples})


def cmd_idle(pid, threshold):
    t0 = time.time()
    rc, res, sec = ansible("idle", {"state": "idle", "gpus": [GPU], "threshold_mib": threshold,
                                    "scope": {"cmdline": [os.environ["PROOF_MARKER"]]},
                                    "grace_period": 30, "timeout": 180, "poll_interval": 0.05})
    ok = rc == 0 and res is not None and not res.get("failed")
    term = (res or {}).get("terminated", [])
    save("idle_times", {"t_ansible_start": t0, "ansible_seconds": sec})
    print(json.dumps([
        ("idle: module succeeded, GPU idle", ok and res.get("idle") is True, "rc=%s %s" % (rc, (res or {}).get("msg", ""))),
        ("idle: signalled exactly the holder", [t["pid"] for t in term] == [int(pid)],
         "terminated=%s" % [(t["pid"], t["signals"], t["outcome"]) for t in term]),
        ("idle: holder process is gone", holder_gone(pid), ""),
        ("idle: drain_seconds reported", ok and isinstance(res.get("drain_seconds"), (int, float)),
         "drain_seconds=%s terminate_seconds=%s" % ((res or {}).get("drain_seconds"), (res or {}).get("terminate_seconds"))),
    ]))


def cmd_again(threshold):
    rc, res, _s = ansible("idle_again", {"state": "idle", "gpus": [GPU], "threshold_mib": threshold,
                                         "scope": {"cmdline": [os.environ["PROOF_MARKER"]]}})
    print(json.dumps([("second idle run: changed=false (idempotent)",
                       rc == 0 and res is not None and res.get("changed") is False and res.get("idle") is True,
                       "rc=%s changed=%s" % (rc, (res or {}).get("changed")))]))


def med(xs):
    return round(statistics.median(xs), 4) if xs else None


def cmd_bench():
    """The module against the bare nvidia-smi calls it replaces, in the same run."""
    sys.path[:0] = [p for p in os.environ["ANSIBLE_COLLECTIONS_PATH"].split(":") if p]
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _query
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state import GpuState
    vantage = EXTRA.get("vantage", "auto")
    patterns = EXTRA.get("device_patterns")
    t = {"bare_query_gpu": [], "bare_query_apps": [], "bare_pair": [], "module_inprocess_nvidia_smi": [],
         "module_inprocess_nvml": [], "module_ansible": [], "module_query_seconds": []}
    for _i in range(REPS):
        a = time.monotonic()
        r1 = smi("--query-gpu=" + GPU_FIELDS, FMT)
        b = time.monotonic()
        r2 = smi("--query-compute-apps=" + APP_FIELDS, FMT)
        c = time.monotonic()
        assert r1.returncode == 0 and r2.returncode == 0, (r1, r2)
        t["bare_query_gpu"].append(b - a)
        t["bare_query_apps"].append(c - b)
        t["bare_pair"].append(c - a)
    for _i in range(REPS):
        s = GpuState(backend="nvidia-smi", nvidia_smi="nvidia-smi", vantage=vantage, device_patterns=patterns)
        a = time.monotonic()
        s.snapshot()
        t["module_inprocess_nvidia_smi"].append(time.monotonic() - a)
    nvml = _query.import_pynvml()
    if nvml is not None:
        for _i in range(REPS):
            s = GpuState(backend="nvml", vantage=vantage, device_patterns=patterns)
            a = time.monotonic()
            try:
                s.snapshot()
            except _query.GpuError as exc:
                t["nvml_error"] = str(exc)
                break
            t["module_inprocess_nvml"].append(time.monotonic() - a)
    for i in range(REPS):
        rc, res, sec = ansible("bench_ansible_%d" % i, {"gpus": [GPU], "backend": "nvidia-smi"})
        if rc == 0 and res:
            t["module_ansible"].append(sec)
            t["module_query_seconds"].append(res["query_seconds"])
    summary = dict((k + "_median", med(v)) for k, v in t.items() if isinstance(v, list))
    bare = summary["bare_pair_median"]
    for k in ("module_inprocess_nvidia_smi", "module_inprocess_nvml", "module_ansible", "module_query_seconds"):
        m = summary[k + "_median"]
        summary[k + "_over_bare"] = round(m / bare, 3) if (m is not None and bare) else None
    summary["reps"] = REPS
    summary["pynvml_importable"] = nvml is not None
    save("timing", {"samples": t, "summary": summary})
    print(json.dumps([("timing: measured %d repetitions" % REPS, bool(t["module_ansible"]) and bool(t["bare_pair"]),
                       json.dumps(summary))]))


def cmd_report(checks_file, holder_info):
    holder_info = json.loads(holder_info)
    with open(checks_file) as f:
        checks = [json.loads(line) for line in f if line.strip()]
    flat = [c for group in checks for c in group]
    env = load("env")
    timing = load("timing")["summary"] if os.path.exists(os.path.join(RAW, "timing.json")) else {}
    idle = (load("idle").get("result") or {}) if os.path.exists(os.path.join(RAW, "idle.json")) else {}
    watch = load("drain_watch") if os.path.exists(os.path.join(RAW, "drain_watch.json")) else {}
    lag = None
    if watch.get("t_gone") and watch.get("t_freed"):
        lag = round(watch["t_freed"] - watch["t_gone"], 3)
    passed = all(c[1] for c in flat)
    data = {"passed": passed, "checks": [{"name": n, "ok": ok, "detail": d} for n, ok, d in flat], "env": env,
            "holder": holder_info, "timing": timing,
            "drain": {"module_drain_seconds": idle.get("drain_seconds"),
                      "module_terminate_seconds": idle.get("terminate_seconds"),
                      "watcher_gone_to_freed_seconds": lag,
                      "outcome": [(t["pid"], t["signals"], t["outcome"]) for t in idle.get("terminated", [])],
                      "vantage": idle.get("vantage"), "backend": idle.get("backend")}}
    with open(os.path.join(OUT, "gpu_state_proof.json"), "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    L = ["# gpu_state on a real GPU: proof run", ""]
    if env.get("standin"):
        L += ["**STAND-IN RUN (no GPU): these figures test the script, they prove nothing about GPUs.**", ""]
    L += ["Result: **%s** (%d/%d checks)" % ("PASS" if passed else "FAIL", sum(1 for c in flat if c[1]), len(flat)), "",
          "## Machine", "", "```"] + ["%s: %s" % (k, env[k]) for k in sorted(env)] + ["```", "",
          "## Holder", "", "%s of %s GiB, PID %s, command line marked `%s`." % (
              "The training STAND-IN's claim" if env.get("standin") else
              "A real CUDA process (`torch.empty`, filled, then sleeping)",
              holder_info.get("gib"), holder_info.get("pid"), os.environ["PROOF_MARKER"]), "",
          "## Checks", "", "| check | ok | detail |", "|---|---|---|"]
    for n, ok, d in flat:
        L.append("| %s | %s | %s |" % (n, "yes" if ok else "**NO**", str(d).replace("|", "/")[:300]))
    d = data["drain"]
    L += ["", "## Drain", "",
          "| figure | seconds |", "|---|---|",
          "| module: first SIGTERM until the holder was gone (`terminate_seconds`) | %s |" % d["module_terminate_seconds"],
          "| module: first SIGTERM until GPU %s read idle (`drain_seconds`) | %s |" % (GPU, d["module_drain_seconds"]),
          "| independent watcher: holder gone until nvidia-smi showed the memory freed | %s |" % d["watcher_gone_to_freed_seconds"],
          "", "Signals and outcome: `%s`; vantage `%s`, backend `%s`." % (d["outcome"], d["vantage"], d["backend"]), "",
          "## Cost: the module against bare nvidia-smi (medians of %s)" % timing.get("reps"), "",
          "| what | median s | / bare pair |", "|---|---|---|"]
    rows = [("bare `nvidia-smi --query-gpu=...`", "bare_query_gpu", None),
            ("bare `nvidia-smi --query-compute-apps=...`", "bare_query_apps", None),
            ("bare pair, one after the other (what the module replaces)", "bare_pair", None),
            ("module logic in-process, nvidia-smi backend (both queries concurrently + /proc)",
             "module_inprocess_nvidia_smi", "module_inprocess_nvidia_smi_over_bare"),
            ("module logic in-process, NVML backend", "module_inprocess_nvml", "module_inprocess_nvml_over_bare"),
            ("module's own `query_seconds` inside an ansible run", "module_query_seconds", "module_query_seconds_over_bare"),
            ("`ansible localhost -m gpufleet.hygiene.gpu_state`, end to end", "module_ansible", "module_ansible_over_bare")]
    for label, key, ratio in rows:
        L.append("| %s | %s | %s |" % (label, timing.get(key + "_median"), timing.get(ratio) if ratio else ""))
    L += ["", "Raw results: `raw/*.json` (every module result, the watcher's samples, every timing sample).", ""]
    with open(os.path.join(OUT, "gpu_state_proof.md"), "w") as f:
        f.write("\n".join(L))
    print("PASS" if passed else "FAIL")


if __name__ == "__main__":
    cmd = sys.argv[1]
    args = [int(a) if a.isdigit() else a for a in sys.argv[2:]]
    if cmd == "env":
        r = smi("--query-gpu=index,name,driver_version,memory.total,memory.used", "--format=csv,noheader")
        env = {"nvidia_smi_gpus": r.stdout.decode().strip(), "python": sys.version.split()[0],
               "standin": bool(os.environ.get("GPU_STATE_PROOF_STANDIN")), "gpu_index": GPU,
               "kernel": os.uname().release}
        try:
            v = subprocess.run([ANSIBLE, "--version"], stdout=subprocess.PIPE, timeout=60, check=False)
            env["ansible"] = v.stdout.decode().splitlines()[0]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            env["ansible"] = None
        env["torch"] = os.environ.get("PROOF_TORCH", "")
        save("env", env)
        print(gpu_used_mib())
    elif cmd == "used":
        print(gpu_used_mib())
    else:
        globals()["cmd_" + cmd.replace("-", "_")](*args)
PYEOF

export OUT PROOF_GPU="$GPU" PROOF_REPS="$REPS" PROOF_ANSIBLE="$ANSIBLE" PROOF_MARKER="$MARKER"
CHECKS="$WORK/checks.jsonl"
: >"$CHECKS"
helper() { timeout 1800 "$PY" "$WORK/helper.py" "$@"; }

# ---------------------------------------------------------------------------- environment
if [ -z "$STANDIN" ]; then
    PROOF_TORCH="$(timeout 120 "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1)"
    export PROOF_TORCH
    log "torch: $PROOF_TORCH"
fi
BASE_USED="$(helper env)" || { log "nvidia-smi does not answer"; exit 2; }
case "$BASE_USED" in ''|*[!0-9]*) log "cannot read memory.used of GPU $GPU: '$BASE_USED'"; exit 2;; esac
THRESHOLD=$(( BASE_USED + 256 ))
MIB=$(( GIB * 1024 ))
log "GPU $GPU: ${BASE_USED} MiB used before the run; idle threshold ${THRESHOLD} MiB; holder ${GIB} GiB"

# ---------------------------------------------------------------------------- the holder
if [ -z "$STANDIN" ]; then
    cat >"$WORK/$MARKER.py" <<'PYEOF'
import os, sys, time
import torch
gib = float(sys.argv[1])
x = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready %d %d" % (os.getpid(), torch.cuda.memory_reserved() // 2**20), flush=True)
while True:
    time.sleep(3600)
PYEOF
    CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES="$GPU" "$PY" "$WORK/$MARKER.py" "$GIB" \
        >"$WORK/holder.out" 2>"$OUT/raw/holder.stderr" &
    HOLDER_PID=$!
else
    "$PY" tests/standins/train_dflash.py --state "$STANDIN" --gpu "$GPU" --mib "$MIB" --tag "$MARKER" \
        >"$WORK/holder.out" 2>"$OUT/raw/holder.stderr" &
    HOLDER_PID=$!
fi
log "holder started, PID $HOLDER_PID"
READY=""
for _ in $(seq 1 1800); do
    if grep -q '^ready' "$WORK/holder.out" 2>/dev/null; then READY=1; break; fi
    kill -0 "$HOLDER_PID" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$READY" ]; then
    log "the holder did not become ready within 180 s; its stderr:"
    tail -20 "$OUT/raw/holder.stderr" | tee -a "$LOG" >&2
    exit 1
fi
log "holder ready: $(head -1 "$WORK/holder.out"); nvidia-smi shows $(helper used) MiB used on GPU $GPU"
HOLDER_INFO="{\"pid\": $HOLDER_PID, \"gib\": $GIB, \"ready\": \"$(head -1 "$WORK/holder.out")\"}"

# ---------------------------------------------------------------------------- the module
log "query: does gpu_state report the holder?"
helper query query "$HOLDER_PID" "$MIB" "$THRESHOLD" >>"$CHECKS" || log "query step failed"
log "timing: bare nvidia-smi against the module, $REPS repetitions each"
helper bench >>"$CHECKS" || log "bench step failed"
log "check mode: would it signal exactly the holder?"
helper check_mode "$HOLDER_PID" "$THRESHOLD" >>"$CHECKS" || log "check mode step failed"
log "idle: terminate the holder and wait for drain (watcher running)"
rm -f "$WORK/watch.stop"
helper watch "$HOLDER_PID" "$THRESHOLD" "$WORK/watch.stop" &
WATCH_PID=$!
helper idle "$HOLDER_PID" "$THRESHOLD" >>"$CHECKS" || log "idle step failed"
for _ in $(seq 1 100); do kill -0 "$WATCH_PID" 2>/dev/null || break; sleep 0.1; done
touch "$WORK/watch.stop"
wait "$WATCH_PID" 2>/dev/null
WATCH_PID=""
kill -0 "$HOLDER_PID" 2>/dev/null || wait "$HOLDER_PID" 2>/dev/null  # reap it once it is gone
log "idempotency: a second idle run"
helper again "$THRESHOLD" >>"$CHECKS" || log "second idle step failed"

RESULT="$(helper report "$CHECKS" "$HOLDER_INFO")" || RESULT="FAIL (report)"
log "result: $RESULT; summary in $OUT/gpu_state_proof.md"
[ "$RESULT" = "PASS" ]
