#!/usr/bin/env bash
# Proof on a real GPU machine of the job_libraries check: what a running torch job has mapped.
#
#   OUT=/results/job_libraries CONTAMINANT_WHEEL=/wheels/nvidia_cuda_runtime_cu12-12.8.90-*.whl \
#     bash tests/device/job_libraries_proof.sh
#
# From the repository root, on a machine with an NVIDIA GPU and PyTorch in python3 (the image's
# torch, e.g. 2.11.0+cu130), with ansible-core importable, ANSIBLE_COLLECTIONS_PATH naming a
# directory that holds ansible_collections/gpufleet/hygiene, and uv on PATH. Steps:
#   1. a venv over the image's torch (a .pth naming its site-packages); the real training loop
#      (tests/device/train_loop.py, torch.compile) runs in it: job_libraries must pass;
#   2. a real wheel of the other CUDA major installed into the venv, and the same job run with
#      that wheel's libcudart.so.12 loaded (ctypes.CDLL, --dlopen): job_libraries must fail, naming
#      the library's path and its package; preflight must fail on it;
#   3. remediate (stops the job, purges the venv, relaunches the inventory's clean job, whose
#      relaunch judges the libraries the new run maps): the relaunched job must be clean;
#   4. the cost: readiness read in-process with job_libraries on and off, on the running job.
# Results: $OUT/job_libraries.log, $OUT/job_libraries.md and each reading's JSON under $OUT.
set -uo pipefail
: "${OUT:?set OUT to a directory for the results}" "${CONTAMINANT_WHEEL:?set CONTAMINANT_WHEEL to a wheel of the other CUDA major}"
py=$(command -v python3)
repo=$(pwd)
W=/tmp/gpufleet-libs
rm -rf "$W"; mkdir -p "$W" "$OUT"
export ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1
LOG="$OUT/job_libraries.log"
say() { printf '\n=== %s\n' "$*" | tee -a "$LOG"; }
PATTERN='train_loop[.]py'  # no backslash: it goes into JSON and YAML as it is
stop_jobs() { pkill -f '[t]rain_loop[.]py'; for _ in $(seq 1 60); do pgrep -f '[t]rain_loop[.]py' > /dev/null || return 0; sleep 1; done; }
wait_ready() {  # the loop's first step, compiled: its libraries are all loaded by then
  for _ in $(seq 1 300); do grep -q "compiled in" "$W/train.log" 2>/dev/null && return 0; sleep 1; done
  echo "the job did not get past its first step" | tee -a "$LOG"; tail -20 "$W/train.log" | tee -a "$LOG"; return 1
}
read_job() {  # read_job NAME: readiness on the running job, its result under $OUT/NAME
  ansible localhost -c local -e "ansible_python_interpreter=$py" -m gpufleet.hygiene.readiness \
    -a "{\"job_patterns\": [\"$PATTERN\"], \"venv\": \"$W/venv\", \"allow_running_job\": true, \"caches\": false}" \
    -t "$OUT/$1" > /dev/null 2>&1
  "$py" - "$OUT/$1/localhost" "$1" <<'PY' | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
c = next((c for c in r.get("checks", []) if c["name"] == "job_libraries"), None)
libs = r.get("job_libraries", {})
print("%s: job_libraries ok=%s | %s" % (sys.argv[2], c and c["ok"], c and c["summary"]))
for p in libs.get("processes", []):
    print("  pid %s %s maps %d CUDA-side libraries (read in %s s):" % (p["pid"], p["comm"], len(p["libraries"]), libs.get("read_s")))
    for lib in p["libraries"]:
        print("    %-7s CUDA %-4s %-40s %s%s" % (lib["family"], lib["cuda_major"], "%s %s" % (lib["package"], lib["package_version"] or ""),
                                           lib["path"], " (deleted)" if lib["deleted"] else ""))
PY
}

say "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$py" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'; } 2>&1 | tee -a "$LOG"

say "1. the image's torch job in a venv over it: must be clean"
"$py" -m venv --without-pip "$W/venv"
torch_site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" > "$(echo "$W"/venv/lib/python3*/site-packages)/_image_torch.pth"
cat > "$W/inventory.yml" <<INV
all:
  children:
    pve_containers:
      hosts:
        gpu-box:
          ansible_connection: local
          ansible_python_interpreter: $py
          gpufleet_venv: $W/venv
          gpufleet_lock_path: $W/remediate.lock
          gpufleet_job:
            command: [$W/venv/bin/python, $repo/tests/device/train_loop.py, --forever]
            workdir: $W
            method: setsid
            log: $W/train.log
            patterns: ['$PATTERN']
            env: {TORCHINDUCTOR_CACHE_DIR: $W/inductor, TRITON_CACHE_DIR: $W/triton}
            ready_regex: compiled in
INV
TORCHINDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton setsid "$W/venv/bin/python" tests/device/train_loop.py --forever \
  >> "$W/train.log" 2>&1 < /dev/null &
wait_ready
read_job clean
echo "expected: job_libraries ok=True" | tee -a "$LOG"

say "4. cost: readiness read in-process, job_libraries on and off, on this running job"
"$py" tests/device/job_libraries_cost.py --venv "$W/venv" --pattern "$PATTERN" --rounds 15 --json "$OUT/cost.json" 2>&1 | tee -a "$LOG"
stop_jobs

say "2. a real CUDA 12 wheel in the venv, its libcudart.so.12 loaded by the job: must be flagged"
uv pip install -q --python "$W/venv/bin/python" --no-index --no-deps "$CONTAMINANT_WHEEL" 2>&1 | tail -2 | tee -a "$LOG"
cudart12=$(echo "$W"/venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12)
stat -c '%n: %s bytes' "$cudart12" | tee -a "$LOG"
: > "$W/train.log"
TORCHINDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton setsid "$W/venv/bin/python" tests/device/train_loop.py --forever \
  --dlopen "$cudart12" >> "$W/train.log" 2>&1 < /dev/null &
wait_ready
read_job contaminated
echo "expected: job_libraries ok=False naming $cudart12 (nvidia-cuda-runtime-cu12), CUDA 12 against torch's CUDA" | tee -a "$LOG"
ansible-playbook -i "$W/inventory.yml" playbooks/preflight.yml > "$OUT/preflight.log" 2>&1
echo "preflight rc=$? (expected non-zero)" | tee -a "$LOG"
grep -o "job_libraries[^\"]*" "$OUT/preflight.log" | head -3 | tee -a "$LOG"

say "3. remediate: stop, purge, relaunch the inventory's clean job (the relaunch judges what it maps)"
ansible-playbook -i "$W/inventory.yml" playbooks/remediate.yml -v > "$OUT/remediate.log" 2>&1
echo "remediate rc=$? (expected 0)" | tee -a "$LOG"
grep -E "TASK \[gpufleet.hygiene.relaunch : The new run maps only|\"removed\"|fatal" -A1 "$OUT/remediate.log" | head -12 | tee -a "$LOG"
grep -E "PLAY RECAP" -A2 "$OUT/remediate.log" | tee -a "$LOG"
wait_ready
read_job relaunched
echo "expected: job_libraries ok=True, no libcudart.so.12 mapped" | tee -a "$LOG"
stop_jobs

"$py" - "$OUT" "$cudart12" <<'PY' | tee "$OUT/job_libraries.md"
import json, os, sys
out, cudart12 = sys.argv[1], sys.argv[2]
def check(name):
    r = json.load(open(os.path.join(out, name, "localhost")))
    c = next(c for c in r["checks"] if c["name"] == "job_libraries")
    paths = [lib["path"] for p in r["job_libraries"]["processes"] for lib in p["libraries"]]
    return r, c, paths
rows = []
r, c, paths = check("clean")
rows.append(("1. the image's torch job", c["ok"] is True and len(paths) > 0, "%d libraries mapped; %s" % (len(paths), c["summary"])))
r, c, paths = check("contaminated")
hit = [b for b in c["libraries"] if b["path"] == cudart12]
rows.append(("2. with nvidia-cuda-runtime-cu12's libcudart.so.12 loaded", c["ok"] is False and bool(hit)
             and hit[0]["package"] == "nvidia-cuda-runtime-cu12", c["summary"]))
r, c, paths = check("relaunched")
rows.append(("3. after remediate, the relaunched job", c["ok"] is True and cudart12 not in paths and len(paths) > 0, c["summary"]))
cost = json.load(open(os.path.join(out, "cost.json")))
print("| step | passed | what was read |\n|---|---|---|")
for step, ok, text in rows:
    print("| %s | %s | %s |" % (step, "yes" if ok else "**NO**", text.replace("|", "\\|")))
print("\ncost (median of %d in-process readiness reads): on %.4f s, off %.4f s, the maps read itself %.4f s (%.1f%% of a read), "
      "%d process(es), %d libraries" % (cost["rounds"], cost["read_on_s"], cost["read_off_s"], cost["maps_read_s"],
                                        cost["maps_pct_of_read"], cost["processes"], cost["libraries"]))
print("\nall passed:", all(ok for _s, ok, _t in rows))
PY
