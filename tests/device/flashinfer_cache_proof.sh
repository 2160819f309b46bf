#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Real-GPU proof of issue 46: FlashInfer's JIT workspace, built for real on the GPU, found, kept and
# cleared by gpufleet.hygiene.torch_cache (docs/torch_cache.md, the FlashInfer rules).
#
#   OUT=/some/dir bash tests/device/flashinfer_cache_proof.sh
#
# Run from the repository root on a machine with an NVIDIA GPU, the CUDA toolkit's nvcc, a host
# C++ compiler and ninja, whose python3 holds torch (CUDA), with ansible-core importable (ansible
# on PATH) and ANSIBLE_COLLECTIONS_PATH naming a directory that holds
# ansible_collections/gpufleet/hygiene. Set-up, once: as in leftover_default_proof.sh's header
# (docs/validation/h200.md, "Set-up, once"; ansible-core from the wheels in .whl/).
#
# What FlashInfer needs travels in .whl/flashinfer/ (installed by this script into its own venv,
# never into the set-up's /tmp/site), made on a machine with the package index by:
#
#   P='--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
#      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
#      --platform manylinux1_x86_64'
#   python3 -m pip download --no-deps $P -d .whl/flashinfer flashinfer-python==0.7.0.post1
#   python3 -m pip download --no-deps $P -d .whl/flashinfer flashinfer-python==0.6.11.post1
#   python3 -m pip download --no-deps $P -d .whl/flashinfer apache-tvm-ffi==0.1.15.post2
#   python3 -m pip download --no-deps $P -d .whl/flashinfer typing-extensions==4.15.0
#
#   flashinfer_python-0.7.0.post1-py3-none-any.whl     33,659,854 B  sha256 c7adf826568d...  the release tried first
#   flashinfer_python-0.6.11.post1-py3-none-any.whl    13,708,974 B  sha256 52c6dbd1262f...  the seed's, tried when 0.7.0.post1 cannot
#   apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl
#                                                       3,312,304 B  sha256 059eed9bfc94...  imported by flashinfer.jit (both releases accept it)
#   typing_extensions-4.15.0-py3-none-any.whl              44,614 B  sha256 f0fa19c68457...  installed only when the image's is older than 4.13 (tvm_ffi needs get_annotations)
#
# Which release: the newest whose wheel fits the machine's ~55 MiB carry beside ansible-core:
# 0.7.4 (101 MB), 0.7.2.post1 (62 MB) and 0.7.1 (67 MB) do not; 0.7.0.post1 (34 MB) does. Its
# Requires-Dist lists apache-tvm-ffi, cuda-python, cuda-tile, einops, nccl-extensions, nccl4py, ninja,
# numpy, nvidia-cudnn-frontend, nvidia-cutlass-dsl, nvidia-ml-py, packaging, requests, tabulate, torch,
# tqdm. Read in its source (every module `import flashinfer` reaches, module-level imports only):
# `import flashinfer` needs torch, tvm_ffi, pynvml (nvidia-ml-py), jinja2, filelock, numpy, packaging,
# requests, tqdm - apache-tvm-ffi is the one the image lacks. The others are imported only behind
# availability checks (`if CUDNN_AVAILABLE:`, `if _CUTE_DSL_AVAILABLE:`, try/except ImportError),
# so they are left out: cutlass (nvidia-cutlass-dsl 4.8.1, whose nvidia-cutlass-dsl-libs-cu12 alone
# is 92 MB), cudnn (nvidia-cudnn-frontend 1.32.0, 11.6 MB, itself requiring nvidia-cutlass-dsl[cu13]),
# cuda.tile (cuda-tile 1.7.0, 0.4 MB), nccl4py (0.6.0, 3.7 MB) and nccl-extensions (0.1.0, 22.6 MB);
# cuda-python's cuda.bindings is the image's cuda-bindings. Should the import prove otherwise, the
# step says which module was missing, and the next release is tried.
#
# The op: flashinfer.activation.silu_and_mul (bf16, 128 x 2*4096), the smallest kernel that goes
# through FlashInfer's JIT: gen_act_and_mul_module("silu") renders one .cu file into
# <workspace>/generated and builds it with ninja and nvcc into <workspace>/cached_ops/silu_and_mul/
# silu_and_mul.so (loaded through tvm_ffi). No prebuilt cubin (those are FlashInfer's trtllm-gen
# kernels, downloaded into <root>/cubins) and no CuTe DSL path (RMSNorm goes to the CuTe DSL when
# nvidia-cutlass-dsl is there, FLASHINFER_USE_CUDA_NORM=1 forces its JIT module). FlashInfer builds
# with JIT whenever no flashinfer-jit-cache (AOT) package is installed; none is.
#
# Steps (W=/tmp/gpufleet-flashinfer; every path this script touches is under W or $OUT):
#   1. a venv over the image's torch (a .pth naming torch's site-packages, as seed_incident_e2e.sh
#      does) with apache-tvm-ffi and flashinfer-python installed from the wheels (pip --no-index
#      --no-deps --target <venv site-packages>); FLASHINFER_WORKSPACE_BASE=W/fi-base, HOME=W/home,
#      TMPDIR=W/tmp for every FlashInfer process and as the module's `environment`.
#   2. torch_cache state=fresh on the empty root records the venv's fingerprint; `import flashinfer`;
#      the op on the GPU, cold: FlashInfer JIT-builds silu_and_mul (timed), the result checked
#      against torch's.
#   3. state=present finds the workspace at <base>/.cache/flashinfer (<version>/<archs>/cached_ops
#      in it) with a size and entries, fingerprinted with the installed FlashInfer's version;
#      state=fresh keeps it while nothing changed; the op in a new process loads it (no rebuild).
#   4. the recorded fingerprint's flashinfer changed (as if 0.6.11.post1 had built it; 0.6.0 when
#      that is the release installed): state=present says stale; state=fresh in check mode predicts
#      the clear and removes nothing; state=fresh clears it: no .so left, the root kept, the new
#      fingerprint recorded. The op again: FlashInfer rebuilds (the .so is back); state=fresh then
#      changes nothing.
#   5. the purge analogue of the unit tests: flashinfer-python uninstalled from the venv (pip):
#      state=present says stale (flashinfer none), state=fresh clears the workspace.
# Should 0.7.0.post1 not import or not build, 0.6.11.post1 is tried the same way. Should neither
# build, the summary says why (the command and its error) and steps 3-5 run on a workspace laid
# out as that release lays it out, every such step labelled SIMULATED (NOT A REAL BUILD), and the
# real-build checks fail.
# Output: $OUT/flashinfer_cache.md, $OUT/flashinfer_cache.json, $OUT/flashinfer_cache-raw/ (every
# module run's and op run's output, log.txt). Exit status: 0 only when every required check
# passed, 1 otherwise, 2 when the machine is not fit (no ansible). Every process it started (the
# op's processes, their ninja and nvcc) is gone on exit, and W removed.
#
# Knobs: PYTHON (python3), ANSIBLE (ansible), FLASHINFER_PROOF_WHEELS (.whl/flashinfer),
# FLASHINFER_PROOF_VERSIONS (the releases to try, in order; default: every flashinfer_python wheel
# there, newest first), FLASHINFER_PROOF_BUDGET (330: seconds after which no other release is tried).

set -u -o pipefail

NAME=flashinfer_cache
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
BUDGET=${FLASHINFER_PROOF_BUDGET:-330}
PY=${PYTHON:-$(command -v python3)}
ANSIBLE=${ANSIBLE:-ansible}
REPO=$(pwd)
WHEELS=${FLASHINFER_PROOF_WHEELS:-$REPO/.whl/flashinfer}
W=/tmp/gpufleet-flashinfer
VENV=$W/venv
BASE=$W/fi-base
ROOT=$BASE/.cache/flashinfer
HOMEDIR=$W/home
TMPD=$W/tmp
MODULE_TIMEOUT=300
export PROOF_OUT=$OUT PROOF_NAME=$NAME PROOF_W=$W PROOF_ROOT=$ROOT
export ANSIBLE_FORCE_COLOR=0 ANSIBLE_NOCOLOR=1 ANSIBLE_CALLBACK_RESULT_FORMAT=json

[ -n "$PY" ] || { echo "python3 not found" >&2; exit 2; }
[ -f "$REPO/plugins/modules/torch_cache.py" ] || { echo "run this from the repository root" >&2; exit 2; }
rm -rf "$W"
mkdir -p "$W" || exit 2

# --------------------------------------------------------------------------- helpers (python)

cat >"$W/op.py" <<'PYEOF'
"""FlashInfer's silu_and_mul through its JIT on the GPU, in a process of its own; the last line
it prints is `PROOF-RESULT <json>`.   python op.py import|run
import: torch and flashinfer imported, FlashInfer's paths (nothing written by this script);
run: the JIT module's spec, the op on the GPU (building it when it is not built), timed, checked
against torch's."""
import json
import os
import sys
import time
import traceback

mode = sys.argv[1]
res = {"ok": False, "mode": mode, "stage": "import torch", "pid": os.getpid(), "python": sys.version.split()[0]}
t0 = time.perf_counter()
try:
    import torch
    res.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
    res["stage"] = "import flashinfer"
    t = time.perf_counter()
    import flashinfer
    from flashinfer.jit import env as jit_env
    res["import_flashinfer_s"] = round(time.perf_counter() - t, 3)
    res.update(version=flashinfer.__version__, file=flashinfer.__file__,
               cache_dir=str(jit_env.FLASHINFER_CACHE_DIR), workspace=str(jit_env.FLASHINFER_WORKSPACE_DIR),
               jit_dir=str(jit_env.FLASHINFER_JIT_DIR), gen_dir=str(jit_env.FLASHINFER_GEN_SRC_DIR),
               cubin_dir=str(getattr(jit_env, "FLASHINFER_CUBIN_DIR", "")))
    import tvm_ffi
    res["tvm_ffi"] = getattr(tvm_ffi, "__version__", "?")
    if mode == "run":
        res["stage"] = "the JIT module's spec"
        from flashinfer.jit.activation import gen_act_and_mul_module
        spec = gen_act_and_mul_module("silu")  # renders generated/silu_and_mul.cu
        lib = spec.get_library_path()
        res.update(module=spec.name, is_aot=bool(getattr(spec, "is_aot", False)), library=str(lib),
                   existed_before=lib.exists(), mtime_before=lib.stat().st_mtime if lib.exists() else None)
        res["stage"] = "CUDA"
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        dev = torch.device("cuda")
        res.update(device=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)))
        d = 4096
        x = torch.randn(128, 2 * d, device=dev, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        res["stage"] = "flashinfer.activation.silu_and_mul (JIT build and load, then run)"
        t = time.perf_counter()
        out = flashinfer.activation.silu_and_mul(x)
        torch.cuda.synchronize()
        res["first_call_s"] = round(time.perf_counter() - t, 3)
        t = time.perf_counter()
        for _ in range(20):
            flashinfer.activation.silu_and_mul(x)
        torch.cuda.synchronize()
        res["steady_ms"] = round((time.perf_counter() - t) / 20 * 1000, 4)
        ref = torch.nn.functional.silu(x[:, :d].float()) * x[:, d:].float()
        res["max_abs_err"] = float((out.float() - ref).abs().max())
        res.update(library_exists=lib.exists(), library_size=lib.stat().st_size if lib.exists() else None,
                   library_mtime=lib.stat().st_mtime if lib.exists() else None)
        with open("/proc/self/maps") as f:
            res["mapped"] = os.path.realpath(str(lib)) in f.read()
        if res["max_abs_err"] > 0.1:
            raise RuntimeError("silu_and_mul differs from torch's by %g" % res["max_abs_err"])
    res["ok"] = True
except BaseException as exc:  # said in the JSON, for the script to report
    text = "%s: %s" % (type(exc).__name__, exc)  # a failed build: ninja's output, the nvcc command in it
    res["error"] = text if len(text) <= 20000 else text[:5000] + "\n[...]\n" + text[-15000:]
    res["traceback"] = traceback.format_exc()[-6000:]
res["total_s"] = round(time.perf_counter() - t0, 3)
print("\nPROOF-RESULT " + json.dumps(res), flush=True)
PYEOF

cat >"$W/tool.py" <<'PYEOF'
"""Records, reads and judges flashinfer_cache_proof.sh's steps: module runs, op runs, facts, checks."""
import json
import os
import sys

OUT, NAME, W, ROOT = (os.environ[k] for k in ("PROOF_OUT", "PROOF_NAME", "PROOF_W", "PROOF_ROOT"))
STATE = os.path.join(OUT, NAME + ".json")
MARKER = ".gpufleet-hygiene-fingerprint.json"


def load():
    if os.path.exists(STATE):
        with open(STATE) as f:
            return json.load(f)
    return {"name": NAME, "facts": {}, "steps": [], "ops": {}, "checks": [], "attempts": [], "passed": False}


def save(d):
    with open(STATE + ".tmp", "w") as f:
        json.dump(d, f, indent=2, sort_keys=True)
    os.replace(STATE + ".tmp", STATE)


def parse_adhoc(text):
    """An ad hoc run's result (ANSIBLE_CALLBACK_RESULT_FORMAT=json), as torch_cache_proof.sh reads it."""
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
    result["_status"] = status
    if status.startswith(("FAILED", "UNREACHABLE")):
        result["failed"] = True
    return result


def op_result(text):
    for line in reversed(text.splitlines()):
        if line.startswith("PROOF-RESULT "):
            try:
                return json.loads(line[len("PROOF-RESULT "):])
            except ValueError:
                break
    return {"ok": False, "error": "no result line: %s" % text.strip()[-2000:]}


def files():
    """The workspace as it is on disk (FlashInfer's downloaded cubins/ left out, as the module does)."""
    out = {"exists": os.path.isdir(ROOT), "files": 0, "so": [], "bytes": 0}
    for top, dirs, names in os.walk(ROOT):
        if top == ROOT and "cubins" in dirs:
            dirs.remove("cubins")
        for n in names:
            if top == ROOT and n == MARKER:
                continue
            p = os.path.join(top, n)
            out["files"] += 1
            out["bytes"] += os.lstat(p).st_size
            if n.endswith(".so"):
                out["so"].append(os.path.relpath(p, ROOT))
    try:
        with open(os.path.join(ROOT, MARKER)) as f:
            out["marker"] = json.load(f).get("fingerprint")
    except (OSError, ValueError):
        out["marker"] = None
    return out


def caches(r):
    return {c["name"]: c for c in (r or {}).get("caches", [])}


def env(d):
    steps = {s["name"]: s["result"] for s in d["steps"]}
    return {"S": steps, "C": {k: caches(v) for k, v in steps.items()}, "O": d["ops"], "F": d["facts"], "os": os,
            "FS": {s["name"]: s["files"] for s in d["steps"]}}


cmd, args = sys.argv[1], sys.argv[2:]
d = load()
if cmd == "get":
    try:
        print(eval(args[0], env(d)))  # noqa: S307 - the checks written in this script, never input read from a host
    except Exception as exc:  # a missing key reads as empty
        sys.stderr.write("get %s: %s\n" % (args[0], exc))
    sys.exit(0)
if cmd == "step":  # step NAME RC SECONDS OUTFILE [LABEL]
    with open(args[3], errors="replace") as f:
        r = parse_adhoc(f.read())
    d["steps"] = [s for s in d["steps"] if s["name"] != args[0]]
    d["steps"].append({"name": args[0], "rc": int(args[1]), "seconds": round(float(args[2]), 3), "result": r,
                       "label": args[4] if len(args) > 4 else "", "files": files()})
elif cmd == "op":  # op NAME RC SECONDS OUTFILE [LABEL]
    with open(args[3], errors="replace") as f:
        r = op_result(f.read())
    r.update(rc=int(args[1]), process_s=round(float(args[2]), 3), label=args[4] if len(args) > 4 else "", files=files())
    d["ops"][args[0]] = r
elif cmd == "fact":
    try:
        d["facts"][args[0]] = json.loads(args[1])
    except ValueError:
        d["facts"][args[0]] = args[1]
elif cmd == "files":  # files KEY: the workspace on disk now
    d["facts"][args[0]] = files()
elif cmd == "attempt":  # attempt VERSION OUTCOME WHY
    d["attempts"].append({"version": args[0], "outcome": args[1], "why": args[2][-20000:]})
elif cmd == "marker":  # marker FLASHINFER_VERSION: the recorded fingerprint's flashinfer, changed
    path = os.path.join(ROOT, MARKER)
    with open(path) as f:
        data = json.load(f)
    d["facts"]["marker_before_edit"] = data.get("fingerprint")
    data["fingerprint"]["flashinfer"] = args[0]
    with open(path + ".tmp", "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    os.replace(path + ".tmp", path)
elif cmd == "layout":  # layout VERSION ARCHS: the workspace as that release lays it out (SIMULATED)
    ws = os.path.join(ROOT, args[0], args[1])
    tree = {
        "flashinfer_jit.log": b"SIMULATED by flashinfer_cache_proof.sh (not a real build): "
                              b"flashinfer.jit: Finished building silu_and_mul\n",
        "cached_ops/silu_and_mul/build.ninja": b"ninja_required_version = 1.3\n",
        "cached_ops/silu_and_mul/.ninja_log": b"# ninja log v6\n",
        "cached_ops/silu_and_mul/silu_and_mul.cuda.o": b"\x7fELF" + b"\0" * 120,
        "cached_ops/silu_and_mul/silu_and_mul.so": b"\x7fELF" + b"\0" * 200,
        "cached_ops/tmp/silu_and_mul.lock": b"",
        "generated/silu_and_mul.cu": b"// SIMULATED by flashinfer_cache_proof.sh\n",
    }
    for rel, data in tree.items():
        path = os.path.join(ws, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
elif cmd in ("check", "info"):  # check NAME EXPR
    name, expr = args[0], args[1]
    try:
        ok, err = bool(eval(expr, env(d))), None  # noqa: S307 - the checks written in this script, never input read from a host
    except Exception as exc:  # a missing step or key is a failed check, said so
        ok, err = False, "%s: %s" % (type(exc).__name__, exc)
    d["checks"].append({"name": name, "required": cmd == "check", "ok": ok, "expr": expr, "error": err})
    print("%s %s%s%s" % ("PASS" if ok else "FAIL", name, "" if cmd == "check" else " (informational)",
                         " (%s)" % err if err else ""))
elif cmd == "summary":
    f = d["facts"]
    req = [c for c in d["checks"] if c["required"]]
    failed = [c for c in req if not c["ok"]] or ([{"name": "no check ran"}] if not req else [])
    d["passed"] = not failed and not f.get("unfit")
    real = f.get("mode") == "real"
    L = ["# FlashInfer's JIT workspace and torch_cache on a real GPU (issue 46)", ""]
    if not real:
        L += ["**SIMULATED: NOT A REAL BUILD.** No FlashInfer release built its JIT module on this machine (see "
              "*Why no real build* below); the cache steps ran on a workspace laid out as flashinfer-python %s lays "
              "it out (`%s/<archs>/cached_ops/silu_and_mul/...`), written by this script." % (
                  f.get("flashinfer_version", "?"), f.get("flashinfer_version", "?")), ""]
    L += ["Produced by `tests/device/flashinfer_cache_proof.sh` on %s." % f.get("date", "?"), "",
          "| | |", "|---|---|"]
    for k in ("gpu", "driver", "python", "torch", "nvcc", "nvcc_toolkit", "cuda_home", "cxx", "ninja", "ansible", "flashinfer_version",
              "tvm_ffi", "workspace", "link_workaround", "venv_fingerprint", "tvm_ffi_cache", "uninstall", "elapsed_s"):
        L.append("| %s | %s |" % (k, str(f.get(k, "-")).replace("|", "/").replace("\n", " ")))
    if f.get("unfit"):
        L += ["", "**The machine is not fit for this proof**: %s" % f["unfit"]]
    if d["attempts"]:
        L += ["", "## Releases tried", "", "| release | outcome | why |", "|---|---|---|"]
        for a in d["attempts"]:
            L.append("| %s | %s | %s |" % (a["version"], a["outcome"], a["why"].replace("|", "/").replace("\n", " ")[-1500:]))
    if not real and f.get("why_no_build"):
        why = str(f["why_no_build"])
        L += ["", "## Why no real build", "", "```", why if len(why) <= 9000 else why[:3000] + "\n[...]\n" + why[-6000:], "```",
              "", "The whole output: %s-raw/op_cold-<release>.out; the build's own commands: %s-raw/build-<release>.ninja."
              % (NAME, NAME)]
    L += ["", "## FlashInfer runs (a new process each)", "",
          "| run | workspace state before | rc | built before | first call incl. build (s) | process (s) | steady (ms) | max abs err | .so after |",
          "|---|---|---|---|---|---|---|---|---|"]
    before = {"import": "-", "cold": "recorded, empty", "cold_retry": "after the failed build", "warm": "built",
              "rebuilt": "cleared by state=fresh"}
    for k, o in sorted(d["ops"].items(), key=lambda kv: list(before).index(kv[0]) if kv[0] in before else 99):
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            k, before.get(k, "-"), o.get("rc"), o.get("existed_before", "-"), o.get("first_call_s", "-"),
            o.get("process_s"), o.get("steady_ms", "-"), o.get("max_abs_err", "-"), len((o.get("files") or {}).get("so", []))))
        if not o.get("ok"):
            L.append("| | error: %s | | | | | | | |" % str(o.get("error", "?")).replace("|", "/").replace("\n", " ")[:800])
    L += ["", "## torch_cache runs (caches: flashinfer, tvm_ffi)", "",
          "| step | rc | changed | flashinfer: action, entries, bytes, stale, recorded flashinfer | removed | tvm_ffi: action, entries | .so on disk | s |",
          "|---|---|---|---|---|---|---|---|"]
    for s in d["steps"]:
        r = s["result"] or {}
        cs = caches(r)
        fi, tv = cs.get("flashinfer", {}), cs.get("tvm_ffi", {})
        L.append("| %s%s | %s | %s | %s, %s, %s, %s, %s | %s | %s, %s | %s | %s |" % (
            s["name"], " (%s)" % s["label"] if s["label"] else "", s["rc"],
            r.get("changed", "failed" if r.get("failed") else "-"), fi.get("action", "-"), fi.get("entries", "-"),
            fi.get("size", "-"), fi.get("stale", "-"), (fi.get("fingerprint") or {}).get("flashinfer", "-"),
            fi.get("removed", "-"), tv.get("action", "-"), tv.get("entries", "-"), len(s["files"]["so"]), s["seconds"]))
        if r.get("failed"):
            L.append("| | | msg: %s | | | | | |" % str(r.get("msg", "")).replace("|", "/")[:400])
    L += ["", "## Checks", ""]
    for c in d["checks"]:
        L.append("- %s %s%s%s" % ("PASS" if c["ok"] else "FAIL", c["name"], "" if c["required"] else " (informational)",
                                  " (%s)" % c["error"] if c["error"] else ""))
    L += ["", "Result: **%s** (%d of %d required checks passed)%s." % (
        "PASS" if d["passed"] else "FAIL", sum(1 for c in req if c["ok"]), len(req),
        "" if real else "; SIMULATED workspace, NOT A REAL BUILD")]
    with open(os.path.join(OUT, NAME + ".md"), "w") as fh:
        fh.write("\n".join(L) + "\n")
    save(d)
    sys.exit(0 if d["passed"] else 1)
save(d)
PYEOF

tool() { "$PY" "$W/tool.py" "$@"; }
now() { date +%s.%N; }
elapsed() { "$PY" -c 'import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 3))' "$1" "$2"; }
check() { tool check "$1" "$2" | tee -a "$LOG"; }
info() { tool info "$1" "$2" | tee -a "$LOG"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }

# Every process of this run: the op's python, and the ninja and nvcc it starts (their command
# lines name W). Killed by PID, after checking that its command line still names W.
# shellcheck disable=SC2329  # run by the EXIT trap below
cleanup() {
  set +e
  local pids pid
  for sig in TERM KILL; do
    pids=$("$PY" - "$W" <<'PYEOF'
import os, sys
w = sys.argv[1] + "/"
me = os.getpid()
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) == me:
        continue
    try:
        with open("/proc/%s/cmdline" % p, "rb") as f:
            if w.encode() in f.read():
                print(p)
    except OSError:
        pass
PYEOF
)
    for pid in $pids; do kill "-$sig" "$pid" 2>/dev/null; done
    [ -n "$pids" ] && sleep 2
  done
  rm -rf "$W"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

unfit() {
  log "NOT FIT: $*"
  tool fact unfit "$*"
  tool summary >/dev/null
  exit 2
}

# mod NAME STATE [LABEL] [ansible options]: the torch_cache module through ansible, recorded.
mod() {
  local name=$1 state=$2 label=${3:-} t0 t1 rc
  shift 3
  log "module: $name state=$state $*"
  t0=$(now)
  timeout "$MODULE_TIMEOUT" "$ANSIBLE" localhost -i localhost, -c local -e "ansible_python_interpreter=$PY" \
    -m gpufleet.hygiene.torch_cache \
    -a "{\"state\": \"$state\", \"venv\": \"$VENV\", \"caches\": [\"flashinfer\", \"tvm_ffi\"], \"environment\": $ENV_JSON}" "$@" \
    >"$RAW/$name-$V.out" 2>"$RAW/$name-$V.err"
  rc=$?
  t1=$(now)
  tool step "$name" "$rc" "$(elapsed "$t0" "$t1")" "$RAW/$name-$V.out" "$label"
  log "  rc=$rc changed=$(tool get "S['$name'] and S['$name'].get('changed')") flashinfer=$(tool get "C['$name']['flashinfer'].get('action'), C['$name']['flashinfer'].get('entries')")"
}

# op NAME MODE TIMEOUT: the op in a new process of the venv's interpreter, recorded.
op() {
  local name=$1 mode=$2 secs=$3 t0 t1 rc
  log "op: $name ($mode)"
  t0=$(now)
  timeout --kill-after=10 "$secs" env -u PYTHONPATH "${OP_ENV[@]}" "$VENV/bin/python" "$W/op.py" "$mode" \
    >"$RAW/op_$name-$V.out" 2>&1 </dev/null
  rc=$?
  t1=$(now)
  tool op "$name" "$rc" "$(elapsed "$t0" "$t1")" "$RAW/op_$name-$V.out"
  log "  rc=$rc ok=$(tool get "O['$name'].get('ok')") $(tool get "O['$name'].get('error', '')" | head -c 300)"
}

# --------------------------------------------------------------------------- the machine

tool fact date "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
tool fact python "$("$PY" -V 2>&1)"
command -v "$ANSIBLE" >/dev/null 2>&1 || unfit "$ANSIBLE is not on PATH (set-up: see this script's header)"
tool fact ansible "$("$ANSIBLE" --version 2>/dev/null | head -n 1)"
if timeout 60 nvidia-smi >"$RAW/nvidia-smi.txt" 2>&1; then
  tool fact gpu "$(timeout 60 nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)"
  tool fact driver "$(timeout 60 nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
else
  tool fact gpu "none: nvidia-smi fails ($(tail -n 1 "$RAW/nvidia-smi.txt"))"
fi
TORCH_SITE=$(env -u PYTHONPATH "$PY" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>"$RAW/torch.err")
tool fact torch "$(env -u PYTHONPATH "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -n 1)"

# The CUDA toolkit FlashInfer builds with: nvcc from PATH as FlashInfer finds it (`which nvcc`),
# else CUDA_HOME; when neither has one, the first of /usr/local/cuda and the cu13 wheels beside
# torch that does is given as CUDA_HOME (what FlashInfer's get_cuda_path() reads first).
OP_ENV=("HOME=$HOMEDIR" "TMPDIR=$TMPD" "FLASHINFER_WORKSPACE_BASE=$BASE")
NVCC=$(command -v nvcc || true)
if [ -n "$NVCC" ]; then
  tool fact cuda_home "$(dirname "$(dirname "$NVCC")") (nvcc on PATH)"
elif [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  NVCC=$CUDA_HOME/bin/nvcc
  tool fact cuda_home "$CUDA_HOME (CUDA_HOME)"
else
  for c in /usr/local/cuda/bin/nvcc ${TORCH_SITE:+"$TORCH_SITE/nvidia/cu13/bin/nvcc" "$TORCH_SITE/nvidia/cuda_nvcc/bin/nvcc"}; do
    [ -x "$c" ] && { NVCC=$c; break; }
  done
  if [ -n "$NVCC" ]; then
    OP_ENV+=("CUDA_HOME=$(dirname "$(dirname "$NVCC")")")
    tool fact cuda_home "$(dirname "$(dirname "$NVCC")") (set as CUDA_HOME by this script: no nvcc on PATH)"
  else
    tool fact cuda_home "none found (PATH, CUDA_HOME, /usr/local/cuda, torch's nvidia/cu13)"
  fi
fi
tool fact nvcc "${NVCC:-none}: $([ -n "$NVCC" ] && "$NVCC" --version 2>&1 | tail -n 2 | tr '\n' ' ')"
# The toolkit nvcc itself runs from (nvcc on PATH may be a wrapper script elsewhere).
NVCC_TOP=
if [ -n "$NVCC" ]; then
  NVCC_TOP=$("$NVCC" --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1)
  [ -n "$NVCC_TOP" ] && NVCC_TOP=$(readlink -f "$NVCC_TOP")
fi
tool fact nvcc_toolkit "${NVCC_TOP:-unknown}"
tool fact cxx "$(command -v "${CXX:-c++}" || echo none) $("${CXX:-c++}" --version 2>/dev/null | head -n 1)"
if ! command -v ninja >/dev/null 2>&1; then
  NINJA_DIR=$(env -u PYTHONPATH "$PY" -c 'import ninja, os; print(ninja.BIN_DIR)' 2>/dev/null || true)
  [ -n "$NINJA_DIR" ] && [ -x "$NINJA_DIR/ninja" ] && OP_ENV+=("PATH=$NINJA_DIR:$PATH")
fi
tool fact ninja "$(PATH=${NINJA_DIR:-}:$PATH command -v ninja || echo none) $(PATH=${NINJA_DIR:-}:$PATH ninja --version 2>/dev/null)"
ENV_JSON=$("$PY" -c 'import json, sys; print(json.dumps(dict(a.split("=", 1) for a in sys.argv[1:])))' "${OP_ENV[@]:0:3}")

# --------------------------------------------------------------------------- the releases to try

if [ -n "${FLASHINFER_PROOF_VERSIONS:-}" ]; then
  read -r -a VERSIONS <<<"$FLASHINFER_PROOF_VERSIONS"
else
  mapfile -t VERSIONS < <("$PY" - "$WHEELS" <<'PYEOF'
import glob, os, re, sys
def key(v):
    return [int(x) if x.isdigit() else -1 for x in re.split(r"[.]|post", v) if x != ""]
found = [re.match(r"flashinfer_python-(.+?)-py3", os.path.basename(p)).group(1)
         for p in glob.glob(os.path.join(sys.argv[1], "flashinfer_python-*.whl"))]
for v in sorted(found, key=key, reverse=True):
    print(v)
PYEOF
)
fi
[ "${#VERSIONS[@]}" -gt 0 ] || unfit "no flashinfer_python wheel in $WHEELS (see this script's header)"
TVM_WHEEL=$(compgen -G "$WHEELS/apache_tvm_ffi-*.whl" | head -n 1)
TE_WHEEL=$(compgen -G "$WHEELS/typing_extensions-*.whl" | head -n 1)
log "releases to try: ${VERSIONS[*]}"

SITE=
setup_venv() {  # setup_venv VERSION: a fresh venv over the image's torch, with tvm-ffi and that FlashInfer
  local v=$1 wheel=$WHEELS/flashinfer_python-$1-py3-none-any.whl te
  rm -rf "$VENV" "$BASE" "$HOMEDIR" "$TMPD"
  mkdir -p "$BASE" "$HOMEDIR" "$TMPD"
  timeout 120 "$PY" -m venv --without-pip "$VENV" || return 1
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  [ -n "$TORCH_SITE" ] && echo "$TORCH_SITE" >"$SITE/_image_torch.pth"
  local wheels=("$wheel")
  [ -n "$TVM_WHEEL" ] && wheels=("$TVM_WHEEL" "$wheel")
  te=$(env -u PYTHONPATH "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("typing_extensions"))' 2>/dev/null)
  tool fact "typing_extensions_image" "${te:-none}"
  if [ -n "$TE_WHEEL" ] && ! "$PY" -c 'import sys; v = [int(x) for x in sys.argv[1].split(".")[:2]]; sys.exit(0 if v >= [4, 13] else 1)' "${te:-0}" 2>/dev/null; then
    wheels+=("$TE_WHEEL")
  fi
  log "installing into $SITE: ${wheels[*]##*/}"
  if ! timeout 300 env -u PYTHONPATH "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --disable-pip-version-check --target "$SITE" "${wheels[@]}" >"$RAW/install-$v.log" 2>&1; then
    log "  one pip run failed ($(tail -n 1 "$RAW/install-$v.log")): each wheel on its own"
    for w in "${wheels[@]}"; do
      timeout 300 env -u PYTHONPATH "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --disable-pip-version-check --target "$SITE" --upgrade "$w" >>"$RAW/install-$v.log" 2>&1 \
        || log "  $(basename "$w"): $(tail -n 1 "$RAW/install-$v.log")"
    done
  fi
  ls -d "$SITE"/flashinfer_python-"$v".dist-info >/dev/null 2>&1
}

link_workaround() {  # for "cannot find -lcudart" / "-lcuda": unversioned links in W/ldlinks
  local err=$1 made=
  mkdir -p "$W/ldlinks"
  if grep -q -- "cannot find -lcudart" <<<"$err"; then
    local ch=${CUDA_HOME:-$(dirname "$(dirname "${NVCC:-/x/x}")")}
    for c in "$ch"/lib64/libcudart.so* "$ch"/lib/libcudart.so* "$ch"/targets/x86_64-linux/lib/libcudart.so* \
             "${NVCC_TOP:-/x}"/lib64/libcudart.so* "${NVCC_TOP:-/x}"/targets/x86_64-linux/lib/libcudart.so* \
             "$TORCH_SITE"/nvidia/cu13/lib/libcudart.so.* "$TORCH_SITE"/nvidia/cuda_runtime/lib/libcudart.so.*; do
      [ -e "$c" ] && { ln -sfn "$c" "$W/ldlinks/libcudart.so"; made="$made libcudart.so -> $c;"; break; }
    done
  fi
  if grep -q -- "cannot find -lcuda\b" <<<"$err" || grep -q -- "cannot find -lcuda:" <<<"$err"; then
    for c in $(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 /{print $NF}') /usr/lib/x86_64-linux-gnu/libcuda.so.1 \
             /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib64/libcuda.so.1 \
             "${NVCC_TOP:-/x}"/lib64/stubs/libcuda.so "${NVCC_TOP:-/x}"/targets/x86_64-linux/lib/stubs/libcuda.so; do
      [ -e "$c" ] && { ln -sfn "$c" "$W/ldlinks/libcuda.so"; made="$made libcuda.so -> $c;"; break; }
    done
  fi
  echo "$made"
}

# --------------------------------------------------------------------------- 1-2. install, record, import, build

MODE=
V=
for v in "${VERSIONS[@]}"; do
  if [ -n "$V" ] && [ "$(left)" -lt 200 ]; then
    tool attempt "$v" "not tried" "only $(left) s left of the $BUDGET s budget"
    continue
  fi
  V=$v
  log "=== flashinfer-python $v"
  if ! setup_venv "$v"; then
    tool attempt "$v" "not installed" "$(tail -n 5 "$RAW/install-$v.log" 2>/dev/null)"
    continue
  fi
  mod 01_fresh_record fresh "" --diff
  op import import 120
  if [ "$(tool get "O['import'].get('ok')")" != True ]; then
    tool attempt "$v" "import failed" "$(tool get "O['import'].get('error')")"
    tool fact why_no_build "flashinfer-python $v: $(tool get "O['import'].get('stage')"): $(tool get "O['import'].get('traceback') or O['import'].get('error')")"
    continue
  fi
  op cold run 200
  if [ "$(tool get "O['cold'].get('ok')")" != True ]; then
    ERR=$(tool get "O['cold'].get('error')")
    MADE=$(link_workaround "$ERR")
    if [ -n "$MADE" ]; then
      log "  the link failed; again with FLASHINFER_EXTRA_LDFLAGS=-L$W/ldlinks ($MADE)"
      tool fact link_workaround "FLASHINFER_EXTRA_LDFLAGS=-L$W/ldlinks:$MADE (the first build: $(head -c 300 <<<"$ERR"))"
      OP_ENV+=("FLASHINFER_EXTRA_LDFLAGS=-L$W/ldlinks")
      op cold_retry run 150
      [ "$(tool get "O['cold_retry'].get('ok')")" = True ] && tool fact cold_op cold_retry
    fi
  else
    tool fact cold_op cold
  fi
  COLD=$(tool get "F.get('cold_op', '')")
  if [ -n "$COLD" ]; then
    MODE=real
    tool attempt "$v" "built" "silu_and_mul built and run on the GPU in $(tool get "O['$COLD'].get('first_call_s')") s"
    break
  fi
  for b in "$ROOT/$v"/*/cached_ops/silu_and_mul/build.ninja; do [ -f "$b" ] && cp "$b" "$RAW/build-$v.ninja"; done
  tool attempt "$v" "build failed" "$(tool get "O['cold'].get('error')")"
  tool fact why_no_build "flashinfer-python $v: the op: $(tool get "O['cold'].get('stage')"): $(tool get "O['cold'].get('error')")"
done
tool fact mode "${MODE:-simulated}"
tool fact flashinfer_version "$V"

if [ "$MODE" != real ]; then
  # The last release tried, as it lays its workspace out; its archs from what FlashInfer said
  # (the import) or from the GPU's compute capability (sm_90 -> 90a, as FlashInfer names it).
  log "=== SIMULATED: NOT A REAL BUILD (flashinfer-python $V laid out by this script)"
  [ -d "$SITE/flashinfer_python-$V.dist-info" ] || setup_venv "$V"
  [ -n "$(tool get "S.get('01_fresh_record')")" ] || mod 01_fresh_record fresh "" --diff
  ARCHS=$(tool get "os.path.basename(O['import']['workspace']) if O.get('import', {}).get('workspace') else ''")
  if [ -z "$ARCHS" ]; then
    CAP=$(timeout 60 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
    ARCHS=${CAP:-90}
    case "$ARCHS" in 9[0-9]|10[0-9]|11[0-9]|12[0-9]) ARCHS=${ARCHS}a ;; esac
  fi
  tool layout "$V" "$ARCHS"
  tool fact workspace "$ROOT/$V/$ARCHS (SIMULATED)"
else
  tool fact workspace "$(tool get "O['$COLD']['workspace']")"
  tool fact tvm_ffi "$(tool get "O['$COLD'].get('tvm_ffi')")"
fi
LBL=$([ "$MODE" = real ] && echo "" || echo "SIMULATED")

check "1. flashinfer-python $V is installed in the venv over the image's torch" "os.path.isdir('$SITE/flashinfer_python-$V.dist-info')"
check "2. import flashinfer works in the venv (torch $(tool get "O.get('import', {}).get('torch', '?')"), without cutlass-dsl, cudnn-frontend, cuda-tile)" \
  "O['import']['ok'] and O['import']['version'] == '$V'"
check "2. the first state=fresh recorded the venv's fingerprint, FlashInfer $V in it, on the empty root" \
  "C['01_fresh_record']['flashinfer']['action'] == 'record' and S['01_fresh_record']['fingerprint']['flashinfer'] == '$V'"
tool fact venv_fingerprint "$(tool get "S['01_fresh_record'].get('fingerprint')")"
check "2. a real JIT build: silu_and_mul built by FlashInfer and run on the GPU, its result torch's (NOT A REAL BUILD when this fails)" \
  "F['mode'] == 'real' and O[F['cold_op']]['ok'] and not O[F['cold_op']]['existed_before'] and O[F['cold_op']]['library_exists']"
check "2. the op went through FlashInfer's JIT (no AOT package, its .so under cached_ops, mapped by the process)" \
  "F['mode'] == 'real' and O[F['cold_op']]['is_aot'] is False and O[F['cold_op']]['library'].startswith(O[F['cold_op']]['jit_dir'] + '/') and O[F['cold_op']]['mapped']"
check "2. FlashInfer's workspace is <FLASHINFER_WORKSPACE_BASE>/.cache/flashinfer/<version>/<archs>" \
  "F['mode'] == 'real' and O[F['cold_op']]['cache_dir'] == '$ROOT' and os.path.dirname(O[F['cold_op']]['workspace']) == '$ROOT/$V' and O[F['cold_op']]['jit_dir'] == O[F['cold_op']]['workspace'] + '/cached_ops'"

# --------------------------------------------------------------------------- 3. found, kept

mod 02_present present "$LBL"
check "3. present finds the workspace at the expected root, placed by FLASHINFER_WORKSPACE_BASE" \
  "C['02_present']['flashinfer']['path'] == '$ROOT' and 'FLASHINFER_WORKSPACE_BASE' in C['02_present']['flashinfer']['source'] and C['02_present']['flashinfer']['exists']"
check "3. the workspace has a size and entries" "C['02_present']['flashinfer']['entries'] > 0 and C['02_present']['flashinfer']['size'] > 0"
check "3. it is fingerprinted with the installed FlashInfer's version, not stale" \
  "C['02_present']['flashinfer']['fingerprint']['flashinfer'] == '$V' and S['02_present']['fingerprint']['flashinfer'] == '$V' and C['02_present']['flashinfer']['stale'] is False"
check "3. the version FlashInfer named its workspace by is the one fingerprinted" \
  "F['mode'] == 'real' and O[F['cold_op']]['version'] == C['02_present']['flashinfer']['fingerprint']['flashinfer']"
mod 03_fresh_unchanged fresh "$LBL"
check "3. fresh keeps the workspace while nothing changed" \
  "S['03_fresh_unchanged']['changed'] is False and C['03_fresh_unchanged']['flashinfer']['action'] == 'none' and C['03_fresh_unchanged']['flashinfer']['entries'] == C['02_present']['flashinfer']['entries'] and FS['03_fresh_unchanged']['so']"
if [ "$MODE" = real ]; then
  op warm run 90
fi
check "3. the op in a new process loads the built module (no rebuild: the .so is unchanged)" \
  "F['mode'] == 'real' and O['warm']['ok'] and O['warm']['existed_before'] and O['warm']['library_mtime'] == O['warm']['mtime_before'] == O[F['cold_op']]['library_mtime']"
info "3. the warm first call is faster than the cold one" "O['warm']['first_call_s'] < O[F['cold_op']]['first_call_s']"

# --------------------------------------------------------------------------- 4. another FlashInfer recorded: cleared, rebuilt

OTHER=0.6.11.post1
[ "$V" = "$OTHER" ] && OTHER=0.6.0
tool marker "$OTHER"
log "the recorded fingerprint's flashinfer: $V -> $OTHER"
mod 04_present_stale present "$LBL"
check "4. with another FlashInfer recorded, present says stale" \
  "C['04_present_stale']['flashinfer']['fingerprint']['flashinfer'] == '$OTHER' and C['04_present_stale']['flashinfer']['stale'] is True and S['04_present_stale']['changed'] is False"
mod 05_fresh_check fresh "$LBL" --check --diff
check "4. fresh in check mode predicts the clear and removes nothing" \
  "S['05_fresh_check']['changed'] and C['05_fresh_check']['flashinfer']['action'] == 'clear_and_record' and FS['05_fresh_check']['so'] == FS['04_present_stale']['so'] and FS['05_fresh_check']['files'] == FS['04_present_stale']['files']"
mod 06_fresh_clears fresh "$LBL" --diff
check "4. fresh clears the workspace" \
  "S['06_fresh_clears']['changed'] and C['06_fresh_clears']['flashinfer']['action'] == 'clear_and_record' and C['06_fresh_clears']['flashinfer']['removed'] > 0"
check "4. no .so is left, the root directory is kept" \
  "FS['06_fresh_clears']['exists'] and not FS['06_fresh_clears']['so'] and FS['06_fresh_clears']['files'] == 0"
check "4. the record names the installed FlashInfer again" "FS['06_fresh_clears']['marker']['flashinfer'] == '$V'"
if [ "$MODE" = real ]; then
  op rebuilt run 200
else
  tool layout "$V" "$ARCHS"  # SIMULATED: the module as a rebuild would put it back
fi
mod 07_present_rebuilt present "$LBL"
check "4. the op again: FlashInfer rebuilds the module (the .so is back)" \
  "F['mode'] == 'real' and O['rebuilt']['ok'] and not O['rebuilt']['existed_before'] and O['rebuilt']['library_exists'] and FS['07_present_rebuilt']['so']"
check "4. present finds the rebuilt workspace fresh" \
  "C['07_present_rebuilt']['flashinfer']['entries'] > 0 and C['07_present_rebuilt']['flashinfer']['stale'] is False and FS['07_present_rebuilt']['so']"
mod 08_fresh_idempotent fresh "$LBL"
check "4. fresh then changes nothing" "S['08_fresh_idempotent']['changed'] is False and FS['08_fresh_idempotent']['so']"

# --------------------------------------------------------------------------- 5. the purge analogue

log "purge analogue: flashinfer-python uninstalled from the venv"
if timeout 120 env -u PYTHONPATH "$PY" -m pip --python "$VENV/bin/python" uninstall -y flashinfer-python >"$RAW/uninstall.log" 2>&1; then
  tool fact uninstall "pip --python <venv> uninstall -y flashinfer-python"
elif timeout 120 env -u PYTHONPATH "$VENV/bin/python" -m pip uninstall -y flashinfer-python >>"$RAW/uninstall.log" 2>&1; then
  tool fact uninstall "<venv>/bin/python -m pip uninstall -y flashinfer-python (the image's pip, through the .pth)"
else
  mkdir -p "$W/aside" && mv "$SITE/flashinfer_python-$V.dist-info" "$W/aside/"
  tool fact uninstall "pip could not uninstall it ($(tail -n 1 "$RAW/uninstall.log")): its dist-info moved out of the venv"
fi
mod 09_present_purged present "$LBL"
check "5. with FlashInfer gone from the venv, present says stale (flashinfer none)" \
  "S['09_present_purged']['fingerprint']['flashinfer'] is None and C['09_present_purged']['flashinfer']['stale'] is True"
mod 10_fresh_purged fresh "$LBL" --diff
check "5. fresh clears the workspace: no .so left, the root kept" \
  "C['10_fresh_purged']['flashinfer']['action'] == 'clear_and_record' and C['10_fresh_purged']['flashinfer']['removed'] > 0 and not FS['10_fresh_purged']['so'] and FS['10_fresh_purged']['exists']"
tool fact tvm_ffi_cache "$(tool get "'%s entries after the first build (tvm_ffi builds its torch addon there when torch lacks __dlpack_c_exchange_api__)' % C['02_present']['tvm_ffi'].get('entries')")"

tool fact elapsed_s "$(($(date +%s) - T0))"
tool summary
rc=$?
log "summary: $OUT/$NAME.md (exit $rc)"
cat "$OUT/$NAME.md"
exit "$rc"
