#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Proof of the GPU health read (gpufleet.hygiene.gpu_health) on a machine with a real NVIDIA GPU.
# It only reads: no GPU setting (MIG, persistence, ECC, clocks) is changed.
#
# Run from the repository root with python3 (standard library only) and nvidia-smi on PATH:
#
#     OUT=/some/dir bash tests/device/gpu_health_proof.sh
#
# It reads every GPU's health through each source of plugins/module_utils/gpu/_health.py (nvml:
# libnvidia-ml through ctypes; query: nvidia-smi --query-gpu and --query-remapped-rows; xml:
# nvidia-smi -q -x), and compares each field with what nvidia-smi itself prints for it, read
# independently of the parser: the CSV of --query-gpu / --query-remapped-rows, and the elements of
# -q -x found by their paths. nvidia-smi is read before and after the sources; a field matches
# when a source's value equals either reading (a clock event reason or an idle link generation can
# change between reads). The memory fault fields (-q -x only) are compared with the XML's own
# elements. With ansible on PATH the gpu_health module is also run (source=xml) and its GPUs
# compared with the module_utils read.
#
# Writes $OUT/gpu_health_proof.json (every comparison), $OUT/gpu_health_proof.md (a table),
# $OUT/raw/ (nvidia-smi's outputs). Exit status 0 only when every field of every source matched
# and every source read without error.
#
# Knobs: PYTHON (python3), GPU_HEALTH_PROOF_SOURCES ("nvml query xml").
# Test-only: GPU_HEALTH_PROOF_STANDIN=1 leaves out nvml (the nvidia-smi stand-in of tests/standins
# first on PATH has no libnvidia-ml); its figures prove nothing about GPUs.

set -u -o pipefail

: "${OUT:?set OUT to the directory the results go to}"
PY="${PYTHON:-python3}"
SOURCES="${GPU_HEALTH_PROOF_SOURCES:-nvml query xml}"
[ -n "${GPU_HEALTH_PROOF_STANDIN:-}" ] && SOURCES="${SOURCES//nvml/}"

mkdir -p "$OUT/raw" || exit 2
[ -f tests/device/gpu_health_proof.sh ] || { echo "run this from the repository root" >&2; exit 2; }
for tool in nvidia-smi "$PY"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "missing on PATH: $tool" >&2; exit 2; }
done
WORK="$(mktemp -d)" || exit 2
trap 'rm -rf "$WORK"' EXIT
# The collection as python imports it: ansible_collections/gpufleet/hygiene -> this checkout.
mkdir -p "$WORK/ansible_collections/gpufleet" && ln -s "$PWD" "$WORK/ansible_collections/gpufleet/hygiene" || exit 2

COLLECTIONS="$WORK" SOURCES="$SOURCES" OUT="$OUT" "$PY" - <<'PYEOF'
import json, os, shutil, subprocess, sys, time
import xml.etree.ElementTree as ET

sys.path.insert(0, os.environ["COLLECTIONS"])
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _health, _reading  # noqa: E402 - after sys.path names the checkout

OUT = os.environ["OUT"]
SMI = shutil.which("nvidia-smi")
QUERY = ("uuid", "name", "pci.bus_id", "driver_version", "persistence_mode", "ecc.errors.uncorrected.volatile.total",
         "ecc.errors.uncorrected.aggregate.total", "pcie.link.gen.current", "pcie.link.gen.max", "pcie.link.width.current",
         "pcie.link.width.max", "mig.mode.current", "mig.mode.pending", "clocks_event_reasons.active")
REMAPPED = ("gpu_uuid", "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
            "remapped_rows.failure")
FAULTS = {"sram_threshold_exceeded": "ecc_errors/aggregate/sram_threshold_exceeded",
          "unrepairable_memory": "ecc_errors/unrepairable_memory",
          "channel_repair_pending": "ecc_errors/channel_repair_pending",
          "tpc_repair_pending": "ecc_errors/tpc_repair_pending"}


def run(argv, name):
    res = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    with open(os.path.join(OUT, "raw", name), "w") as f:
        f.write(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit("%s exited %d: %s" % (" ".join(argv), res.returncode, (res.stdout + res.stderr).strip()))
    return res.stdout


def na(text):
    text = text.strip()
    return None if text.startswith("[") or text in ("N/A", "") else text


def flag(text):
    text = na(text or "")
    return None if text is None else text in ("Enabled", "Yes", "Active")


def number(text):
    text = na(text or "")
    return None if text is None else int(text.split()[0])


def reference(tag):
    """What nvidia-smi prints, by GPU UUID, in the read's own terms."""
    rows = {}
    for line in run([SMI, "--query-gpu=" + ",".join(QUERY), "--format=csv,noheader,nounits"], "query-%s.csv" % tag).splitlines():
        v = dict(zip(QUERY, [c.strip() for c in line.split(",")]))
        mask = na(v["clocks_event_reasons.active"])
        rows[v["uuid"]] = {
            "name": v["name"], "pci": v["pci.bus_id"].upper(), "driver": v["driver_version"],
            "persistence_mode": flag(v["persistence_mode"]),
            "ecc.volatile_uncorrected": number(v["ecc.errors.uncorrected.volatile.total"]),
            "ecc.aggregate_uncorrected": number(v["ecc.errors.uncorrected.aggregate.total"]),
            "pcie.gen": number(v["pcie.link.gen.current"]), "pcie.max_gen": number(v["pcie.link.gen.max"]),
            "pcie.width": number(v["pcie.link.width.current"]), "pcie.max_width": number(v["pcie.link.width.max"]),
            "mig.current": flag(v["mig.mode.current"]), "mig.pending": flag(v["mig.mode.pending"]),
            "throttle": None if mask is None else sorted(n for bit, n in _reading.THROTTLE_BITS if int(mask, 16) & bit)}
    for line in run([SMI, "--query-remapped-rows=" + ",".join(REMAPPED), "--format=csv,noheader,nounits"],
                    "remapped-%s.csv" % tag).splitlines():
        v = dict(zip(REMAPPED, [c.strip() for c in line.split(",")]))
        if v["gpu_uuid"] in rows:
            rows[v["gpu_uuid"]].update({"remapped_rows.correctable": number(v["remapped_rows.correctable"]),
                                        "remapped_rows.uncorrectable": number(v["remapped_rows.uncorrectable"]),
                                        "remapped_rows.pending": flag(v["remapped_rows.pending"]),
                                        "remapped_rows.failed": flag(v["remapped_rows.failure"])})
    root = ET.fromstring(run([SMI, "-q", "-x"], "q-x-%s.xml" % tag))
    for el in root.findall("gpu"):
        row = rows.get((el.findtext("uuid") or "").strip())
        if row is None:
            continue
        for key, path in FAULTS.items():
            row["memory_faults." + key] = flag(el.findtext(path))
        src = el.find("ecc_errors/aggregate_uncorrectable_sram_sources")
        row["memory_faults.sram_uncorrectable_sources"] = None if src is None else dict(
            (child.tag[len("sram_"):], number(child.text)) for child in src)
        hist = el.find("remapped_rows/row_remapper_histogram")
        row["memory_faults.row_remapper_histogram"] = None if hist is None else dict(
            (child.tag[len("row_remapper_histogram_"):], number(child.text)) for child in hist)
    return rows


def reading(gpu, driver):
    out = {"name": gpu["name"], "pci": (gpu["pci"] or "").upper() or None, "driver": driver,
           "persistence_mode": gpu["persistence_mode"],
           "ecc.volatile_uncorrected": gpu["ecc"]["volatile_uncorrected"],
           "ecc.aggregate_uncorrected": gpu["ecc"]["aggregate_uncorrected"],
           "mig.current": gpu["mig"]["current"], "mig.pending": gpu["mig"]["pending"],
           "throttle": None if gpu["throttle"] is None else sorted(gpu["throttle"])}
    for key in ("gen", "max_gen", "width", "max_width"):
        out["pcie." + key] = gpu["pcie"][key]
    for key in ("correctable", "uncorrectable", "pending", "failed"):
        out["remapped_rows." + key] = gpu["remapped_rows"][key]
    for key, value in (gpu.get("memory_faults") or {}).items():
        out["memory_faults." + key] = value
    return out


before = reference("before")
results = {"nvidia_smi": SMI, "sources": {}, "gpus": sorted(before), "ok": True}
for source in os.environ["SOURCES"].split():
    started = time.monotonic()
    health = _health.read_health(source=source, nvidia_smi=SMI, timeout=60)
    entry = {"seconds": round(time.monotonic() - started, 3), "error": health["error"], "source": health["source"],
             "healthy": health["healthy"], "findings": [f["code"] for g in health["gpus"] for f in g["findings"]]
             + [f["code"] for f in health["findings"]], "fields": [], "ok": health["error"] is None}
    results["sources"][source] = entry
    seen = set()
    for gpu in health["gpus"]:
        seen.add(gpu["uuid"])
        got = reading(gpu, health["driver"]["version"])
        for field, value in sorted(got.items()):
            if source != "xml" and field.startswith("memory_faults."):
                continue  # read by -q -x only (docs/gpu_health.md)
            entry["fields"].append({"gpu": gpu["uuid"], "field": field, "source_value": value,
                                    "nvidia_smi": before.get(gpu["uuid"], {}).get(field, "<absent>")})
    if seen != set(before):
        entry["ok"] = False
        entry["gpu_mismatch"] = {"read": sorted(seen), "nvidia_smi": sorted(before)}
after = reference("after")
for source, entry in results["sources"].items():
    for f in entry["fields"]:
        f["nvidia_smi_after"] = after.get(f["gpu"], {}).get(f["field"], "<absent>")
        f["match"] = f["source_value"] in (f["nvidia_smi"], f["nvidia_smi_after"])
        entry["ok"] = entry["ok"] and f["match"]
    entry["ok"] = entry["ok"] and bool(entry["fields"])
    results["ok"] = results["ok"] and entry["ok"]

if shutil.which("ansible") and "xml" in os.environ["SOURCES"].split():
    res = subprocess.run(["ansible", "localhost", "-c", "local", "-o", "-m", "gpufleet.hygiene.gpu_health", "-a", "source=xml"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300, check=False,
                         env=dict(os.environ, ANSIBLE_COLLECTIONS_PATH=os.environ["COLLECTIONS"]))
    with open(os.path.join(OUT, "raw", "module-xml.txt"), "w") as f:
        f.write(res.stdout + res.stderr)
    try:
        module = json.loads(res.stdout.split("=>", 1)[1])
        xml_read = _health.read_health(source="xml", nvidia_smi=SMI, timeout=60)
        same = [reading(g, module["driver"]["version"]) for g in module["gpus"]] == [
            reading(g, xml_read["driver"]["version"]) for g in xml_read["gpus"]]
    except (IndexError, ValueError, KeyError) as exc:
        same = "module output not read: %s" % exc
    results["module_xml_same_as_module_utils"] = same
    results["ok"] = results["ok"] and same is True

with open(os.path.join(OUT, "gpu_health_proof.json"), "w") as f:
    json.dump(results, f, indent=1, sort_keys=True)
lines = ["# gpu_health against nvidia-smi", "", "nvidia-smi: `%s`; GPUs: %s" % (SMI, ", ".join(results["gpus"])), "",
         "| source | read in s | error | fields compared | mismatches |", "| --- | --- | --- | --- | --- |"]
for source, entry in results["sources"].items():
    bad = ["%s %s: read %r, nvidia-smi %r / %r" % (f["gpu"][-8:], f["field"], f["source_value"], f["nvidia_smi"],
                                                    f["nvidia_smi_after"]) for f in entry["fields"] if not f["match"]]
    lines.append("| %s | %s | %s | %d | %s |" % (source, entry["seconds"], entry["error"] or "", len(entry["fields"]),
                                                  "; ".join(bad) or "none"))
if "module_xml_same_as_module_utils" in results:
    lines += ["", "gpu_health module (source=xml) same GPUs as the module_utils read: %s" % results["module_xml_same_as_module_utils"]]
lines += ["", "Result: %s" % ("every field matched" if results["ok"] else "MISMATCH (see gpu_health_proof.json)"), ""]
with open(os.path.join(OUT, "gpu_health_proof.md"), "w") as f:
    f.write("\n".join(lines))
print("\n".join(lines))
sys.exit(0 if results["ok"] else 1)
PYEOF
