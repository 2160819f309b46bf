#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Real-GPU proof of gpufleet.hygiene.torch_cache (issue 4), for a machine with an NVIDIA GPU,
# CUDA, and a python3 that holds torch and triton.
#
#   OUT=/some/dir bash tests/device/torch_cache_proof.sh
#
# Run from the repository root, with ansible-core importable and ANSIBLE_COLLECTIONS_PATH
# naming a directory that holds ansible_collections/gpufleet/hygiene (this checkout).
#
# What it does, each step recorded:
#   1. state=fresh on empty private caches: records the venv's fingerprint (nothing to clear).
#   2. a real torch.compile on the GPU fills the private TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR
#      (cold compile, timed).
#   3. state=present reports the caches (size, entries, recorded fingerprint).
#   4. state=fresh while nothing changed: changed=false, every entry kept.
#   5. a compile in a new process with the caches warm (timed).
#   6. a process that holds the compiled kernels: state=absent is refused and names its PID.
#   7. the fingerprint changes: a metadata-only triton dist-info with another version is put into
#      the venv given to the module (the venv is made with --system-site-packages, so its own
#      site-packages are read first and shadow the system triton's metadata). torch and triton
#      themselves, which the compile imports from the system python3, are untouched: this changes
#      what the module reads, which is exactly the input state=fresh decides on.
#   8. state=fresh in check mode reports the clear and changes nothing; then state=fresh clears
#      the caches and records the new fingerprint.
#   9. a compile repopulates the caches (timed, cold again); state=fresh then changes nothing.
# Output: $OUT/summary.md, $OUT/results.json, $OUT/raw/* (every command's output), $OUT/log.txt.
# Exit status: 0 when every required check passed, 1 otherwise, 2 when the machine is not fit.

set -u -o pipefail

if [ -z "${OUT:-}" ]; then
  echo "OUT must name an output directory" >&2
  exit 2
fi
mkdir -p "$OUT/raw" || exit 2
OUT=$(cd "$OUT" && pwd)
RAW=$OUT/raw
LOG=$OUT/log.txt
: >"$LOG"
log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" | tee -a "$LOG" >&2; }

PY=$(command -v python3) || { echo "python3 not found" >&2; exit 2; }
ANSIBLE=${ANSIBLE:-ansible}
command -v "$ANSIBLE" >/dev/null 2>&1 || { echo "the ansible command is not on PATH (set ANSIBLE=...)" >&2; exit 2; }
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-900}
MODULE_TIMEOUT=${MODULE_TIMEOUT:-300}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/torch-cache-proof.XXXXXX") || exit 2
HOLD_PID=
# shellcheck disable=SC2329  # run by the EXIT trap below
cleanup() {
  if [ -n "$HOLD_PID" ]; then kill "$HOLD_PID" 2>/dev/null; wait "$HOLD_PID" 2>/dev/null; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# The training job's private caches: nothing of the account's real caches is touched.
export TORCHINDUCTOR_CACHE_DIR=$WORK/cache/inductor
export TRITON_CACHE_DIR=$WORK/cache/triton
export TORCH_EXTENSIONS_DIR=$WORK/cache/torch_extensions
export CUDA_CACHE_PATH=$WORK/cache/nv
VENV=$WORK/venv
JOB_ENV=$("$PY" -c 'import json, os; print(json.dumps({k: os.environ[k] for k in ("HOME", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "CUDA_CACHE_PATH") if k in os.environ}))')

# --------------------------------------------------------------------------- helpers (python)

cat >"$WORK/compile.py" <<'PYEOF'
"""A real torch.compile on the GPU: 4 pre-norm MLP blocks in bf16; prints timings as JSON."""
import argparse, json, os, time
ap = argparse.ArgumentParser()
ap.add_argument("--hold", type=float, default=0)
ap.add_argument("--ready", default="")
a = ap.parse_args()
t0 = time.perf_counter()
import torch
import triton
t_import = time.perf_counter() - t0
if not torch.cuda.is_available():
    raise SystemExit("torch.cuda.is_available() is False")
dev = torch.device("cuda")
torch.manual_seed(0)

class Block(torch.nn.Module):
    def __init__(self, d=1024):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))

model = torch.nn.Sequential(*[Block() for _ in range(4)]).to(dev, torch.bfloat16).eval()
x = torch.randn(8, 512, 1024, device=dev, dtype=torch.bfloat16)
with torch.no_grad():
    ref = model(x)
torch.cuda.synchronize()
compiled = torch.compile(model)
t = time.perf_counter()
with torch.no_grad():
    out = compiled(x)
torch.cuda.synchronize()
first = time.perf_counter() - t
steady = []
for _ in range(20):
    t = time.perf_counter()
    with torch.no_grad():
        compiled(x)
    torch.cuda.synchronize()
    steady.append(time.perf_counter() - t)
print(json.dumps({
    "first_call_s": round(first, 3),
    "steady_ms_median": round(sorted(steady)[len(steady) // 2] * 1000, 3),
    "import_s": round(t_import, 3),
    "max_abs_err_vs_eager": float((out.float() - ref.float()).abs().max()),
    "torch": torch.__version__, "triton": triton.__version__, "torch_cuda": torch.version.cuda,
    "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
    "pid": os.getpid(),
}), flush=True)
if a.hold:
    if a.ready:
        with open(a.ready, "w") as f:
            f.write(str(os.getpid()))
    time.sleep(a.hold)
PYEOF

cat >"$WORK/tool.py" <<'PYEOF'
"""Parse ansible ad hoc output, record steps and checks, write the summary."""
import json, os, sys

OUT = os.environ["OUT"]
STATE = os.path.join(OUT, "results.json")


def load():
    if os.path.exists(STATE):
        with open(STATE) as f:
            return json.load(f)
    return {"steps": [], "checks": [], "compiles": {}, "machine": {}}


def save(d):
    with open(STATE + ".tmp", "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
    os.replace(STATE + ".tmp", STATE)


def parse_adhoc(text):
    idx = text.find("localhost | ")
    if idx < 0:
        return None
    start = text.find("{", text.find("=>", idx))
    if start < 0:
        return None
    try:
        result = json.JSONDecoder().raw_decode(text[start:])[0]
    except ValueError:
        return None
    status = text[idx + len("localhost | "):text.find("=>", idx)].strip()
    result["_status"] = status  # the callback says FAILED! / UNREACHABLE! here, not in the JSON
    if status.startswith(("FAILED", "UNREACHABLE")):
        result["failed"] = True
    return result


def caches(r):
    return {c["name"]: c for c in (r or {}).get("caches", [])}


cmd = sys.argv[1]
d = load()
if cmd == "step":
    name, rc, secs, out_path = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    with open(out_path, errors="replace") as f:
        r = parse_adhoc(f.read())
    with open(os.path.join(OUT, "raw", name + ".json"), "w") as f:
        json.dump(r, f, indent=2, sort_keys=True)
    d["steps"] = [s for s in d["steps"] if s["name"] != name]
    d["steps"].append({"name": name, "rc": rc, "seconds": round(secs, 3), "result": r})
elif cmd == "compile":
    name, rc, secs, out_path = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
    info = None
    with open(out_path, errors="replace") as f:
        for line in f:
            if line.startswith("{"):
                try:
                    info = json.loads(line)
                except ValueError:
                    pass
    d["compiles"][name] = {"rc": rc, "process_s": round(secs, 3), "info": info}
elif cmd == "machine":
    d["machine"][sys.argv[2]] = sys.argv[3]
elif cmd == "check":
    name, required, expr = sys.argv[2], sys.argv[3] == "required", sys.argv[4]
    steps = {s["name"]: s["result"] for s in d["steps"]}
    env = {"S": steps, "C": {k: caches(v) for k, v in steps.items()}, "P": d["compiles"]}
    try:
        ok = bool(eval(expr, env))
        err = None
    except Exception as exc:  # a missing step or key is a failed check, said so
        ok, err = False, "%s: %s" % (type(exc).__name__, exc)
    d["checks"].append({"name": name, "required": required, "ok": ok, "expr": expr, "error": err})
    print("%s %s%s" % ("PASS" if ok else "FAIL", name, "" if required else " (informational)"))
elif cmd == "get":
    steps = {s["name"]: s["result"] for s in d["steps"]}
    print(eval(sys.argv[2], {"S": steps, "C": {k: caches(v) for k, v in steps.items()}, "P": d["compiles"]}))
    sys.exit(0)
elif cmd == "summary":
    m = d["machine"]
    L = ["# torch_cache on a real GPU", "",
         "Produced by `tests/device/torch_cache_proof.sh` on %s." % m.get("date", "?"), "",
         "| | |", "|---|---|"]
    for k in ("gpu", "driver", "python", "torch", "triton", "torch_cuda", "ansible", "venv_mode", "venv_fingerprint",
              "changed_fingerprint", "holder_pid"):
        L.append("| %s | %s |" % (k, m.get(k, "?")))
    cold = (d["compiles"].get("cold") or {}).get("info") or {}
    L.append("| device seen by torch.compile | %s (sm_%s) |" % (cold.get("device", "?"), "".join(map(str, cold.get("capability", [])))))
    L += ["", "## Compiles (a new process each time)", "",
          "| compile | caches before | first call incl. compile (s) | process wall (s) | steady step (ms) | max abs err vs eager |",
          "|---|---|---|---|---|---|"]
    before = {"cold": "empty", "warm": "filled by cold", "after_clear": "cleared by state=fresh"}
    for k in ("cold", "warm", "after_clear"):
        c = d["compiles"].get(k)
        i = (c or {}).get("info") or {}
        L.append("| %s | %s | %s | %s | %s | %s |" % (k, before[k], i.get("first_call_s", "-"), (c or {}).get("process_s", "-"),
                                                    i.get("steady_ms_median", "-"), i.get("max_abs_err_vs_eager", "-")))
    L += ["", "## Module runs", "",
          "| step | rc | changed | inductor: action, entries, bytes | triton: action, entries, bytes | seconds |",
          "|---|---|---|---|---|---|"]
    for s in d["steps"]:
        r = s["result"] or {}
        cs = caches(r)
        cell = lambda n: ("%s, %s, %s" % (cs[n]["action"], cs[n]["entries"], cs[n]["size"])) if n in cs else "-"
        L.append("| %s | %s | %s | %s | %s | %s |" % (s["name"], s["rc"], r.get("changed", "failed" if r.get("failed") else "-"),
                                                   cell("inductor"), cell("triton"), s["seconds"]))
        if r.get("failed"):
            L.append("| | | msg: %s | | | |" % r.get("msg", "").replace("|", "/")[:300])
    L += ["", "## Checks", ""]
    for c in d["checks"]:
        L.append("- %s %s%s%s" % ("PASS" if c["ok"] else "FAIL", c["name"], "" if c["required"] else " (informational)",
                                  " (%s)" % c["error"] if c["error"] else ""))
    failed = [c for c in d["checks"] if c["required"] and not c["ok"]]
    if not any(c["required"] for c in d["checks"]):
        failed = [{"name": "no check ran"}]
    L += ["", "**%s**: %d of %d required checks passed." % ("PASS" if not failed else "FAIL",
                                                           sum(1 for c in d["checks"] if c["required"] and c["ok"]),
                                                           sum(1 for c in d["checks"] if c["required"]))]
    with open(os.path.join(OUT, "summary.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    sys.exit(1 if failed else 0)
save(d)
PYEOF

tool() { OUT=$OUT "$PY" "$WORK/tool.py" "$@"; }
now() { date +%s.%N; }
elapsed() { "$PY" -c "import sys; print(float(sys.argv[2]) - float(sys.argv[1]))" "$1" "$2"; }

# mod STEP JSON_ARGS [ansible options]: run the module through ansible, record the result.
mod() {
  local name=$1 args=$2 t0 t1 rc
  shift 2
  log "module: $name $args $*"
  t0=$(now)
  ANSIBLE_CALLBACK_RESULT_FORMAT=json ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0 \
    timeout "$MODULE_TIMEOUT" "$ANSIBLE" localhost -i localhost, -c local \
      -e "ansible_python_interpreter=$PY" -m gpufleet.hygiene.torch_cache -a "$args" "$@" \
      >"$RAW/$name.out" 2>"$RAW/$name.err"
  rc=$?
  t1=$(now)
  tool step "$name" "$rc" "$(elapsed "$t0" "$t1")" "$RAW/$name.out"
  log "  rc=$rc ($(tool get "S['$name'] and S['$name'].get('changed')" 2>/dev/null))"
}

# run_compile NAME: a real torch.compile in a new process, timed.
run_compile() {
  local name=$1 t0 t1 rc
  log "compile: $name"
  t0=$(now)
  timeout "$COMPILE_TIMEOUT" "$PY" "$WORK/compile.py" >"$RAW/compile_$name.out" 2>"$RAW/compile_$name.err"
  rc=$?
  t1=$(now)
  tool compile "$name" "$rc" "$(elapsed "$t0" "$t1")" "$RAW/compile_$name.out"
  log "  rc=$rc $(tail -n 1 "$RAW/compile_$name.out" 2>/dev/null | cut -c1-200)"
}

check() { tool check "$1" required "$2" | tee -a "$LOG"; }
info() { tool check "$1" informational "$2" | tee -a "$LOG"; }

# --------------------------------------------------------------------------- the machine

rm -f "$OUT/results.json"
tool machine date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
tool machine python "$("$PY" -V 2>&1)"
if command -v nvidia-smi >/dev/null 2>&1; then
  timeout 60 nvidia-smi >"$RAW/nvidia-smi.txt" 2>&1
  tool machine gpu "$(timeout 60 nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
  tool machine driver "$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
fi
tool machine ansible "$("$ANSIBLE" --version 2>/dev/null | head -n 1)"
if ! timeout 300 "$PY" -c 'import torch, triton, sys; sys.exit(0 if torch.cuda.is_available() else 3)' >"$RAW/preflight.txt" 2>&1; then
  log "python3 cannot import torch and triton, or sees no GPU: see $RAW/preflight.txt"
  tool summary
  exit 2
fi
tool machine torch "$("$PY" -c 'import torch; print(torch.__version__)')"
tool machine torch_cuda "$("$PY" -c 'import torch; print(torch.version.cuda)')"
tool machine triton "$("$PY" -c 'import triton; print(triton.__version__)')"

log "work directory $WORK"
# The venv given to the module must see the torch and triton that python3 imports. When python3
# is not itself a venv, a --system-site-packages venv does (the module then reads the real
# dist-info in place). When python3 is a venv, a venv made from it would see the base
# interpreter instead, so the proof venv gets copies of the real torch and triton metadata
# (their dist-info and torch/version.py, which is all the module reads).
if [ "$("$PY" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')" = 0 ]; then
  VENV_MODE=system-site-packages
  timeout 300 "$PY" -m venv --system-site-packages --without-pip "$VENV" || { log "cannot create $VENV"; exit 2; }
else
  VENV_MODE=metadata-copy
  timeout 300 "$PY" -m venv --without-pip "$VENV" || { log "cannot create $VENV"; exit 2; }
  timeout 300 "$PY" - "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" <<'PYEOF' || { log "cannot copy the torch/triton metadata"; exit 2; }
import importlib.metadata as md, importlib.util, os, shutil, sys
dst = sys.argv[1]
for name in ("torch", "triton"):
    src = str(md.distribution(name)._path)
    shutil.copytree(src, os.path.join(dst, os.path.basename(src)))
torch_dir = importlib.util.find_spec("torch").submodule_search_locations[0]
os.makedirs(os.path.join(dst, "torch"), exist_ok=True)
shutil.copy(os.path.join(torch_dir, "version.py"), os.path.join(dst, "torch", "version.py"))
PYEOF
fi
tool machine venv_mode "$VENV_MODE"
log "proof venv $VENV ($VENV_MODE)"
SELECT='["inductor", "triton", "torch_extensions", "cuda"]'
FRESH="{\"state\": \"fresh\", \"venv\": \"$VENV\", \"caches\": $SELECT, \"environment\": $JOB_ENV}"
PRESENT="{\"state\": \"present\", \"venv\": \"$VENV\", \"caches\": $SELECT, \"environment\": $JOB_ENV}"
ABSENT="{\"state\": \"absent\", \"caches\": $SELECT, \"environment\": $JOB_ENV}"

# --------------------------------------------------------------------------- the proof

mod 01_fresh_record "$FRESH"
check "first fresh records the fingerprint (caches were empty)" \
  "S['01_fresh_record']['changed'] and C['01_fresh_record']['inductor']['action'] == 'record'"
check "the venv's fingerprint names torch, triton and CUDA" \
  "all(S['01_fresh_record']['fingerprint'][k] for k in ('torch', 'triton', 'cuda'))"
tool machine venv_fingerprint "$(tool get "S['01_fresh_record']['fingerprint']")"

run_compile cold
check "cold compile ran on the GPU" "P['cold']['rc'] == 0 and P['cold']['info']['max_abs_err_vs_eager'] < 0.5"
check "the fingerprint matches what the compile imported" \
  "S['01_fresh_record']['fingerprint']['torch'] == P['cold']['info']['torch'] and S['01_fresh_record']['fingerprint']['triton'] == P['cold']['info']['triton']"

mod 02_present "$PRESENT"
check "the compile filled the inductor cache" "C['02_present']['inductor']['entries'] > 0 and C['02_present']['inductor']['size'] > 0"
check "the compile filled the triton cache" "C['02_present']['triton']['entries'] > 0 and C['02_present']['triton']['size'] > 0"
check "present changes nothing and finds the caches fresh" \
  "not S['02_present']['changed'] and C['02_present']['inductor']['stale'] is False and C['02_present']['triton']['stale'] is False"

mod 03_fresh_unchanged "$FRESH"
check "fresh keeps the caches while nothing changed" \
  "S['03_fresh_unchanged']['changed'] is False and all(c['action'] == 'none' for c in S['03_fresh_unchanged']['caches'])"
check "every entry is still there after fresh" \
  "C['03_fresh_unchanged']['inductor']['entries'] == C['02_present']['inductor']['entries'] and C['03_fresh_unchanged']['triton']['entries'] == C['02_present']['triton']['entries']"

run_compile warm
check "warm compile ran" "P['warm']['rc'] == 0"
info "warm compile is faster than cold" "P['warm']['info']['first_call_s'] < P['cold']['info']['first_call_s']"

# A live process holding the compiled kernels: the module must refuse to clear from under it.
rm -f "$WORK/ready"
timeout "$COMPILE_TIMEOUT" "$PY" "$WORK/compile.py" --hold 300 --ready "$WORK/ready" >"$RAW/compile_holder.out" 2>"$RAW/compile_holder.err" &
HOLD_PID=$!
for _i in $(seq 1 "$COMPILE_TIMEOUT"); do
  [ -s "$WORK/ready" ] && break
  kill -0 "$HOLD_PID" 2>/dev/null || break
  sleep 1
done
HELD_PY_PID=$(cat "$WORK/ready" 2>/dev/null || echo none)
# In check mode: should the holder go unseen, nothing is cleared and the rest of the proof stands.
mod 04_absent_while_held "$ABSENT" --check
tool machine holder_pid "$HELD_PY_PID"
info "absent is refused while a process holds the caches, naming its PID" \
  "S['04_absent_while_held'].get('failed') and 'PID $HELD_PY_PID ' in S['04_absent_while_held']['msg']"
check "nothing was cleared by the refused run" \
  "not S['04_absent_while_held'].get('failed') or (C['04_absent_while_held']['inductor']['entries'] == C['02_present']['inductor']['entries'])"
kill "$HOLD_PID" 2>/dev/null
wait "$HOLD_PID" 2>/dev/null
HOLD_PID=

# Change the fingerprint: a metadata-only triton dist-info with another version in the venv.
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
REAL_TRITON=$("$PY" -c 'import triton; print(triton.__version__)')
FAKE_TRITON="${REAL_TRITON%%+*}.post9999"
if [ "$VENV_MODE" = metadata-copy ]; then
  rm -rf "$SITE"/triton-*.dist-info  # the copy made above; the real one is not touched
fi
INFO_DIR="$SITE/triton-$FAKE_TRITON.dist-info"
mkdir -p "$INFO_DIR"
printf 'Metadata-Version: 2.1\nName: triton\nVersion: %s\nSummary: metadata-only stand-in written by torch_cache_proof.sh\n' "$FAKE_TRITON" >"$INFO_DIR/METADATA"
printf 'torch_cache_proof\n' >"$INFO_DIR/INSTALLER"
printf 'triton-%s.dist-info/METADATA,,\ntriton-%s.dist-info/INSTALLER,,\ntriton-%s.dist-info/RECORD,,\n' "$FAKE_TRITON" "$FAKE_TRITON" "$FAKE_TRITON" >"$INFO_DIR/RECORD"
log "fingerprint change: $INFO_DIR (triton $REAL_TRITON -> $FAKE_TRITON in the venv's metadata)"

mod 05_present_stale "$PRESENT"
check "the venv now reports the other triton version" "S['05_present_stale']['fingerprint']['triton'] == '$FAKE_TRITON'"
check "present marks the filled caches stale and changes nothing" \
  "not S['05_present_stale']['changed'] and C['05_present_stale']['inductor']['stale'] is True and C['05_present_stale']['inductor']['entries'] > 0"
tool machine changed_fingerprint "$(tool get "S['05_present_stale']['fingerprint']")"

mod 06_fresh_check_mode "$FRESH" --check --diff
check "check mode predicts the clear" \
  "S['06_fresh_check_mode']['changed'] and C['06_fresh_check_mode']['inductor']['action'] == 'clear_and_record'"
mod 07_present_after_check "$PRESENT"
check "check mode changed nothing" "C['07_present_after_check']['inductor']['entries'] == C['05_present_stale']['inductor']['entries']"

mod 08_fresh_clears "$FRESH" --diff
check "fresh clears the stale caches" \
  "S['08_fresh_clears']['changed'] and C['08_fresh_clears']['inductor']['action'] == 'clear_and_record' and C['08_fresh_clears']['inductor']['removed'] > 0 and C['08_fresh_clears']['triton']['removed'] > 0"
check "fresh records the new fingerprint" "C['08_fresh_clears']['inductor']['fingerprint']['triton'] == '$FAKE_TRITON'"
mod 09_present_cleared "$PRESENT"
check "the caches are empty and the roots kept" \
  "C['09_present_cleared']['inductor']['exists'] and C['09_present_cleared']['inductor']['entries'] == 0 and C['09_present_cleared']['triton']['entries'] == 0"

run_compile after_clear
check "the compile after the clear ran" "P['after_clear']['rc'] == 0"
mod 10_present_repopulated "$PRESENT"
check "the caches are repopulated" \
  "C['10_present_repopulated']['inductor']['entries'] > 0 and C['10_present_repopulated']['triton']['entries'] > 0"
info "the compile after the clear was cold again (slower than warm)" \
  "P['after_clear']['info']['first_call_s'] > P['warm']['info']['first_call_s']"
mod 11_fresh_idempotent "$FRESH"
check "fresh after the repopulation changes nothing" "S['11_fresh_idempotent']['changed'] is False"

tool summary
rc=$?
log "summary: $OUT/summary.md (exit $rc)"
cat "$OUT/summary.md"
exit "$rc"
