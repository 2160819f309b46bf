#!/usr/bin/env bash
# Proof on a real GPU machine: the real torch environment is clean; a real wheel of the
# other CUDA major is found with evidence and removed; torch still runs on the GPU; the
# inventory and scan are timed side by side with uv and pip on the real venv.
#
# Run from the repository root on a machine with NVIDIA GPUs, CUDA and PyTorch:
#   OUT=/some/dir CONTAMINANT_WHEEL=path/to/nvidia_cuda_runtime_cu12-*.whl \
#     bash tests/device/contamination_proof.sh
# Needs ansible-core importable and ANSIBLE_COLLECTIONS_PATH naming a directory that holds
# ansible_collections/gpufleet/hygiene; uv on PATH for the benchmark.
set -uo pipefail
: "${OUT:?set OUT to a directory for the results}"
: "${CONTAMINANT_WHEEL:?set CONTAMINANT_WHEEL to a wheel of the other CUDA major}"
py=$(command -v python3)
real_venv=$("$py" -c 'import sys; print(sys.prefix)')
mkdir -p "$OUT"
log() { printf '\n### %s\n' "$*" | tee -a "$OUT/contamination.log"; }
module() {  # module NAME TREE-DIR "ARGS" [ansible flags such as --check]
  local name=$1 tree=$2 args=$3; shift 3
  ansible localhost -c local -e "ansible_python_interpreter=$py" -m "gpufleet.hygiene.$name" -a "$args" "$@" -t "$OUT/$tree" >>"$OUT/contamination.log" 2>&1
  echo "rc=$?" | tee -a "$OUT/contamination.log"
}

log "machine"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; "$py" -c 'import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'; } | tee -a "$OUT/contamination.log"

log "1. the real torch environment ($real_venv)"
start=$(date +%s%N)
module cuda_contamination scan-real "venv=$real_venv"
echo "wall $(( ($(date +%s%N) - start) / 1000000 )) ms (ansible ad-hoc, one module call)" | tee -a "$OUT/contamination.log"
module pip_inventory inventory-real "venv=$real_venv verify_files=true"

log "2. a venv over the real torch (a .pth naming its site-packages), plus one real CUDA 12 wheel"
rm -rf /tmp/gpufleet-cvenv
# The image's python3 is itself a venv: --system-site-packages would reach the base
# interpreter, not torch. A .pth file makes the image's packages importable, as site.py does.
"$py" -m venv --without-pip /tmp/gpufleet-cvenv
torch_site=$("$py" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" > "$(echo /tmp/gpufleet-cvenv/lib/python3*/site-packages)/_image_torch.pth"
uv pip install -q --python /tmp/gpufleet-cvenv/bin/python --no-index --no-deps "$CONTAMINANT_WHEEL" 2>&1 | tail -2
module pip_inventory inventory-before "venv=/tmp/gpufleet-cvenv verify_files=true"
module cuda_contamination scan-contaminated "venv=/tmp/gpufleet-cvenv"
module cuda_contamination remove-check "venv=/tmp/gpufleet-cvenv remove=true" --check
module cuda_contamination remove "venv=/tmp/gpufleet-cvenv remove=true"
module cuda_contamination remove-again "venv=/tmp/gpufleet-cvenv remove=true"
module pip_inventory inventory-after "venv=/tmp/gpufleet-cvenv verify_files=true"
/tmp/gpufleet-cvenv/bin/python - <<'PY' 2>&1 | tee -a "$OUT/contamination.log"
import torch
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
y = (x @ x).float().sum().item()
print("torch", torch.__version__, "cuda", torch.version.cuda, "runs on", torch.cuda.get_device_name(0), "matmul ok:", y == y)
PY

log "3. benchmark on the real venv"
"$py" benchmarks/bench_inventory.py --venv "$real_venv" --rounds 15 --json "$OUT/bench-real.json" 2>&1 | tee -a "$OUT/contamination.log"
if command -v gcc >/dev/null; then
  log "4. benchmark on the generated 400-package seed venv"
  "$py" benchmarks/bench_inventory.py --packages 400 --rounds 15 --json "$OUT/bench-400.json" 2>&1 | tee -a "$OUT/contamination.log"
fi

"$py" - "$OUT" <<'PY' | tee "$OUT/contamination.md"
import json, os, sys
out = sys.argv[1]
def load(tree):
    path = os.path.join(out, tree, "localhost")
    return json.load(open(path)) if os.path.exists(path) else {"missing": True}
real = load("scan-real")
print("## Real torch environment")
print("reference:", real.get("reference"), "| scanned:", real.get("scanned"), "| clean:", real.get("clean"))
print("contaminants:", [(c["name"], c["version"], c["cuda_major"]) for c in real.get("contaminants", [])])
print("unknown (no CUDA evidence):", len(real.get("unknown", [])), "| clobbered:", len(real.get("clobbered", [])))
inv = load("inventory-real")
print("inventory:", inv.get("count"), "packages; integrity:", {k: v for k, v in inv.get("integrity", {}).items() if k != "packages"},
      [(p["name"], len(p["missing"]), len(p["modified"])) for p in inv.get("integrity", {}).get("packages", [])][:10])
c = load("scan-contaminated")
print("\n## Venv over the real torch plus a real CUDA 12 wheel")
for item in c.get("contaminants", []):
    print("-", item["name"], item["version"], "CUDA", item["cuda_major"], ":", "; ".join(item["evidence"]))
for tree in ("remove-check", "remove", "remove-again"):
    r = load(tree)
    print(tree, "changed:", r.get("changed"), "removed:", [x["name"] for x in r.get("removed", [])], "clean:", r.get("clean"), "failed:", r.get("failed", False))
b, a = load("inventory-before"), load("inventory-after")
bp = {p["name"]: p["version"] for p in b.get("packages", [])}
ap = {p["name"]: p["version"] for p in a.get("packages", [])}
print("packages before:", len(bp), "after:", len(ap), "gone:", sorted(set(bp) - set(ap)), "added:", sorted(set(ap) - set(bp)),
      "changed:", sorted(k for k in ap if k in bp and ap[k] != bp[k]), "integrity after ok:", a.get("integrity", {}).get("ok"))
PY
