#!/usr/bin/env bash
# The seed incident on a real GPU box, end to end, with this collection's playbooks.
#
#   OUT=/results CONTAMINANT_WHEEL=/wheels/nvidia_cuda_runtime_cu12-12.8.90-*.whl \
#     bash tests/device/seed_incident_e2e.sh
#
# From the repository root, on a machine with an NVIDIA GPU, CUDA and PyTorch (python3 holds
# torch), with ansible-core importable and ANSIBLE_COLLECTIONS_PATH naming a directory that
# holds ansible_collections/gpufleet/hygiene. Steps: a clean baseline run of a real
# torch.compile training loop; a venv over the real torch plus one real wheel of the other
# CUDA major; a stale, slow copy of the loop holding tens of GiB and appending its slow
# readings to the job's log (as the seed's contaminated run did); preflight (must fail on
# both); remediate (kills, purges, makes caches fresh, relaunches, gates throughput): the
# gate must pass the healthy relaunch though the log starts with the stale run's slow
# readings; preflight again once the relaunched run ends (must pass); an injected slowdown
# relaunched onto that same log, now ending in good readings, that the gate must fail.
set -uo pipefail
: "${OUT:?set OUT}" "${CONTAMINANT_WHEEL:?set CONTAMINANT_WHEEL}"
py=$(command -v python3)
repo=$(pwd)
W=/tmp/gpufleet-e2e
rm -rf "$W"; mkdir -p "$W" "$OUT"
export ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1
say() { printf '\n=== %s\n' "$*" | tee -a "$OUT/e2e.log"; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -d ' '; }

say "0. clean baseline run (the image's torch, nothing added)"
"$py" tests/device/train_loop.py --steps 200 > "$W/baseline.log" 2>&1
tail -3 "$W/baseline.log" | tee -a "$OUT/e2e.log"
baseline=$("$py" - "$W/baseline.log" <<'PY'
import re, statistics, sys
vals = [float(m) for m in re.findall(r"(\d+) tokens/s", open(sys.argv[1]).read())][2:]
print(int(statistics.median(vals)))
PY
)
echo "baseline tokens/s (median after 2 warm-up readings): $baseline" | tee -a "$OUT/e2e.log"

say "1. venv over the real torch (a .pth naming its site-packages) plus a real CUDA 12 wheel"
"$py" -m venv --without-pip "$W/venv"
torch_site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" > "$(echo "$W"/venv/lib/python3*/site-packages)/_image_torch.pth"
uv pip install -q --python "$W/venv/bin/python" --no-index --no-deps "$CONTAMINANT_WHEEL" 2>&1 | tail -1
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
            command: [$W/venv/bin/python, $repo/tests/device/train_loop.py, --steps, "400"]
            workdir: $W
            method: setsid
            log: $W/train.log
            patterns: ['train_loop\.py']
            env: {TORCHINDUCTOR_CACHE_DIR: $W/inductor, TRITON_CACHE_DIR: $W/triton}
            ready_regex: compiled in
            baseline_tokens_per_s: $baseline
INV
ansible localhost -c local -e "ansible_python_interpreter=$py" -m gpufleet.hygiene.pip_inventory -a "venv=$W/venv" -t "$OUT/inv-before" > /dev/null

say "2. a stale, slow copy of the loop left running, holding GPU memory, filling the compile cache and the job's log"
# Its output goes to the job's log, as the seed's contaminated run's did; the per-step delay
# stands for the contamination's slowdown. Nothing empties the log afterwards: the relaunched
# runs append to it, and the gate must judge only what each of them wrote.
TORCHINDUCTOR_CACHE_DIR=$W/inductor TRITON_CACHE_DIR=$W/triton setsid "$W/venv/bin/python" tests/device/train_loop.py --forever --reserve-gib 40 --sleep "${STALE_SLEEP:-0.05}" >> "$W/train.log" 2>&1 < /dev/null &
for _ in $(seq 1 300); do [ "$(gpu_used)" -gt 40000 ] && [ "$(grep -c "tokens/s" "$W/train.log")" -ge 6 ] && break; sleep 1; done
readings() { "$py" - "$W/train.log" "$1" <<'PY'
import re, sys
vals = [int(m) for m in re.findall(r"(\d+) tokens/s", open(sys.argv[1]).read())]
print("%s: the job log holds %d readings: %s" % (sys.argv[2], len(vals), vals))
PY
}
readings "stale run" | tee -a "$OUT/e2e.log"
echo "GPU memory used with the stale loop: $(gpu_used) MiB" | tee -a "$OUT/e2e.log"

say "3. preflight (must fail: stale holder, CUDA 12 wheel, stale cache)"
t=$(ms); ansible-playbook -i "$W/inventory.yml" playbooks/preflight.yml > "$OUT/preflight-1.log" 2>&1; rc=$?
echo "preflight rc=$rc in $(( $(ms) - t )) ms" | tee -a "$OUT/e2e.log"
grep -A12 "TASK \[Fleet summary" "$OUT/preflight-1.log" | grep -E "^ +- |ready" | tee -a "$OUT/e2e.log"
grep -E "is not ready|PLAY RECAP" -A1 "$OUT/preflight-1.log" | grep -vE "^(Origin|--)" | tee -a "$OUT/e2e.log"

say "4. remediate"
t=$(ms); ansible-playbook -i "$W/inventory.yml" playbooks/remediate.yml -v > "$OUT/remediate.log" 2>&1; rc=$?
echo "remediate rc=$rc in $(( $(ms) - t )) ms" | tee -a "$OUT/e2e.log"
grep -E "drain_seconds|terminate_seconds|\"removed\"|median|floor|passed|read_from|changed:|fatal" "$OUT/remediate.log" | head -40 | tee -a "$OUT/e2e.log"
echo "expected: remediate rc=0, the gate passed on the relaunched run's readings only (read_from: launch)" | tee -a "$OUT/e2e.log"
readings "after the healthy relaunch" | tee -a "$OUT/e2e.log"
grep -E "PLAY RECAP" -A2 "$OUT/remediate.log" | tee -a "$OUT/e2e.log"
tail -4 "$W/train.log" | tee -a "$OUT/e2e.log"

say "5. torch still runs in the venv; what changed in it"
"$W/venv/bin/python" -c 'import torch; x = torch.randn(2048, 2048, device="cuda"); print("torch", torch.__version__, "cuda", torch.version.cuda, "matmul ok", bool(torch.isfinite(x @ x).all()))' 2>&1 | tee -a "$OUT/e2e.log"
ansible localhost -c local -e "ansible_python_interpreter=$py" -m gpufleet.hygiene.pip_inventory -a "venv=$W/venv verify_files=true" -t "$OUT/inv-after" > /dev/null
"$py" - "$OUT" <<'PY' | tee -a "$OUT/e2e.log"
import json, os, sys
b = json.load(open(os.path.join(sys.argv[1], "inv-before", "localhost")))
a = json.load(open(os.path.join(sys.argv[1], "inv-after", "localhost")))
bp = {p["name"]: p["version"] for p in b["packages"]}
ap = {p["name"]: p["version"] for p in a["packages"]}
print("packages before %d after %d; gone %s; added %s; other versions changed %s; integrity ok %s" % (
    len(bp), len(ap), sorted(set(bp) - set(ap)), sorted(set(ap) - set(bp)),
    sorted(k for k in ap if k in bp and ap[k] != bp[k]), a["integrity"]["ok"]))
PY

say "6. preflight again once the relaunched run has finished (must pass)"
for _ in $(seq 1 300); do pgrep -f '[t]rain_loop[.]py' > /dev/null || break; sleep 1; done
t=$(ms); ansible-playbook -i "$W/inventory.yml" playbooks/preflight.yml > "$OUT/preflight-2.log" 2>&1; rc=$?
echo "preflight rc=$rc in $(( $(ms) - t )) ms" | tee -a "$OUT/e2e.log"
grep -A12 "TASK \[Fleet summary" "$OUT/preflight-2.log" | grep -E "^ +- |ready" | tee -a "$OUT/e2e.log"
grep -E "is not ready|PLAY RECAP" -A1 "$OUT/preflight-2.log" | grep -vE "^(Origin|--)" | tee -a "$OUT/e2e.log"

say "7. an injected slowdown (sleep per step) appended to the log of good readings: the throughput gate must fail it"
t=$(ms); ansible-playbook -i "$W/inventory.yml" tests/device/relaunch_slow.yml > "$OUT/slow.log" 2>&1; rc=$?
echo "slow relaunch rc=$rc in $(( $(ms) - t )) ms" | tee -a "$OUT/e2e.log"
grep -E "below the floor|fatal" "$OUT/slow.log" | head -5 | tee -a "$OUT/e2e.log"
echo "expected: slow relaunch rc!=0, the gate failing below the floor though the log ends in good readings" | tee -a "$OUT/e2e.log"
readings "after the slow relaunch" | tee -a "$OUT/e2e.log"
pkill -f '[t]rain_loop[.]py'; sleep 2
echo "GPU memory used at the end: $(gpu_used) MiB" | tee -a "$OUT/e2e.log"
cp "$W/inventory.yml" "$OUT/inventory.yml"
