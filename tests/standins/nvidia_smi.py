# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""STAND-IN for nvidia-smi, for tests on machines without an NVIDIA GPU. Not NVIDIA's tool.

It answers the interface the collection uses, in nvidia-smi's formats:

    --query-gpu=FIELD[,FIELD...]            any supported field list, in the order asked
    --query-compute-apps=FIELD[,FIELD...]
    --query-remapped-rows=FIELD[,FIELD...]  gpu_uuid, remapped_rows.{pending,failure,correctable,uncorrectable}
    --format=csv[,noheader][,nounits]       header line and units as nvidia-smi prints them
    -i/--id=INDEX|UUID[,...]                restrict the answer to some GPUs
    -L / --list-gpus                        one line per GPU
    -q [-x]                                 the full report, as text or XML

It answers only the fields real nvidia-smi knows (the tables below); any other field fails as
nvidia-smi fails on it: ``Field "x" is not a valid field to query.`` on stdout, exit status 2.
And with nvidia-smi's exit codes (2 bad field or option, 6 no devices, 9 driver not loaded,
12 NVML missing, 15 GPU fallen off the bus) when a fault is configured.

``-q -x`` and ``-q`` mirror a real NVIDIA H200's report (driver 580, DTD nvsmi_device_v13):
tests/fixtures/h200/ holds that machine's own output (its README says how it was recorded).
The stand-in takes the fixture as its template, element names, nesting and every field it does
not model kept as the H200 printed them, and fills in each GPU's state: identity (uuid,
minor_number, PCI bus id), memory and utilization, persistence mode, ECC counts, retired
pages, row remapping, clock event reasons, PCIe link, MIG mode and MIG devices, processes.
Fields of --query-gpu beyond memory and identity (names as ``nvidia-smi --help-query-gpu``
lists them, values as it prints them: "[N/A]", "Enabled"/"Disabled", "Active"/"Not Active",
clock event reason masks as 16-digit hex such as 0x0000000000000008):

    ecc.mode.current/pending, ecc.errors.{corrected,uncorrected}.{volatile,aggregate}.total,
    retired_pages.single_bit_ecc.count (.sbe), retired_pages.double_bit.count (.dbe),
    retired_pages.pending, clocks_event_reasons.{supported,active,gpu_idle,
    applications_clocks_setting,sw_power_cap,hw_slowdown,hw_thermal_slowdown,
    hw_power_brake_slowdown,sw_thermal_slowdown,sync_boost} (and their older names
    clocks_throttle_reasons.*, answered under the new header), pcie.link.gen.{current,
    gpucurrent,max,gpumax,hostmax}, pcie.link.width.{current,max}, persistence_mode,
    driver_version, mig.mode.{current,pending}

Its GPUs and their memory come from a state directory named by $GPU_STANDIN_STATE:

    config.json    {"gpus": [{"name", "memory_total_mib", "uuid", "base_used_mib",
                              "utilization_pct", "bus_id", "minor"}, ...],
                    "release_delay": seconds memory stays used after its holder died,
                    "never_drain": [indexes whose memory is never released],
                    "fault": null | "hang" | "exit:<rc>",  "hang_seconds": 3600,
                    "fault_message": text printed with exit:<rc> (default: nvidia-smi's own),
                    "no_process_message": print "No running processes found" when none,
                    "driver_version", "cuda_version": what the report names (the H200's),
                    "health_file": the injected health state (below), optional,
                    "fixture_dir": where the H200 fixture is (default: h200/ beside this
                                   file, else tests/fixtures/h200/),
                    "containers": [{"vmid", "state", "root"}] (a node's stand-in only)}
    dev/nvidia<N>  files standing for the device nodes (or bind-mounts of them)
    claims/<pid>.json, claims/<pid>-<n>.json  written by the training stand-in
                   (train_dflash.py): pid, start_time, gpu, mib, util, device, and on a MIG
                   GPU gpu_instance_id / compute_instance_id

A claim counts, and its process is listed, only while that PID is alive (same start time,
not a zombie) AND holds an open handle on the claim's device file, as seen in /proc/<pid>/fd.
When it stops counting, its memory stays used for release_delay seconds (from when the
stand-in first notices), as a real driver frees memory a moment after a process exits.

A node's stand-in (the simulated fleet's node, whose GPUs its containers share) lists
"containers": the claims of each container's own stand-in state count on the node too, under
their host PIDs (found by their PID inside the container and the container's root), so that
the node sees every holder of every GPU with host PIDs, as a real node does. It keeps its own
record of when a container's claim stopped counting (node-released.json) and never writes
into a container.

The health file (JSON, one per node; the containers' stand-ins read the same file) maps a GPU
UUID to its injected state; anything left out is healthy, as the H200 fixture reads:

    {"GPU-...": {"persistence_mode": false,
                 "ecc": {"volatile": {"dram_uncorrectable": 2}, "aggregate": {...}},
                 "retired_pages": {"single_bit": 0, "double_bit": 1, "pending": true},
                 "remapped_rows": {"uncorrectable": 1, "pending": true, "failure": false},
                 "memory_faults": {"unrepairable_memory": true, "sram_threshold_exceeded": true,
                                   "channel_repair_pending": true, "tpc_repair_pending": true,
                                   "sram_sources": {"l2": 2, "sm": 1},
                                   "row_remapper_histogram": {"max": 3070, "none": 2}},
                 "clocks_event_reasons": ["hw_slowdown", "hw_thermal_slowdown"],
                 "pcie": {"gen": 4, "width": 8},
                 "mig": {"instances": [{"gpu_instance_id": 1, "compute_instance_id": 0,
                                        "memory_total_mib": 16128, "multiprocessor_count": 16}]}}}

ECC keys are the H200's element names (sram_correctable, sram_uncorrectable_parity,
sram_uncorrectable_secded, dram_correctable, dram_uncorrectable). "mig" turns MIG mode on
("instances": [] is MIG on without instances); "retired_pages" left out reads "N/A", as on
Hopper. Xid events are not here: they are kernel log lines (the simulated fleet writes them to
the node's kernel log, tests/sim/fleet's docstring).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import sys
import time
import xml.etree.ElementTree as ET
import zlib

STATE_ENV = "GPU_STANDIN_STATE"
HERE = os.path.dirname(os.path.abspath(__file__))

GPU_FIELDS = {
    # field: (header, unit)
    "index": ("index", None),
    "count": ("count", None),
    "uuid": ("uuid", None),
    "gpu_uuid": ("uuid", None),
    "name": ("name", None),
    "gpu_name": ("name", None),
    "pci.bus_id": ("pci.bus_id", None),
    "gpu_bus_id": ("pci.bus_id", None),
    "driver_version": ("driver_version", None),
    "memory.used": ("memory.used [MiB]", "MiB"),
    "memory.total": ("memory.total [MiB]", "MiB"),
    "memory.free": ("memory.free [MiB]", "MiB"),
    "utilization.gpu": ("utilization.gpu [%]", "%"),
    "utilization.memory": ("utilization.memory [%]", "%"),
    "temperature.gpu": ("temperature.gpu", None),
    "power.draw": ("power.draw [W]", "W"),
    "persistence_mode": ("persistence_mode", None),
    "ecc.mode.current": ("ecc.mode.current", None),
    "ecc.mode.pending": ("ecc.mode.pending", None),
    "mig.mode.current": ("mig.mode.current", None),
    "mig.mode.pending": ("mig.mode.pending", None),
    "retired_pages.pending": ("retired_pages.pending", None),
    "pcie.link.gen.current": ("pcie.link.gen.current", None),
    "pcie.link.gen.gpucurrent": ("pcie.link.gen.gpucurrent", None),
    "pcie.link.gen.max": ("pcie.link.gen.max", None),
    "pcie.link.gen.gpumax": ("pcie.link.gen.gpumax", None),
    "pcie.link.gen.hostmax": ("pcie.link.gen.hostmax", None),
    "pcie.link.width.current": ("pcie.link.width.current", None),
    "pcie.link.width.max": ("pcie.link.width.max", None),
}
for _kind in ("corrected", "uncorrected"):
    for _where in ("volatile", "aggregate"):
        _f = "ecc.errors.%s.%s.total" % (_kind, _where)
        GPU_FIELDS[_f] = (_f, None)
for _alias, _f in (("sbe", "single_bit_ecc.count"), ("dbe", "double_bit.count")):
    GPU_FIELDS["retired_pages." + _f] = ("retired_pages." + _f, None)
    GPU_FIELDS["retired_pages." + _alias] = ("retired_pages." + _f, None)

# Clock event reasons: the name, the NVML bit (nvmlClocksEventReason*), the H200 XML element.
EVENT_REASONS = (
    ("gpu_idle", 0x1, "clocks_event_reason_gpu_idle"),
    ("applications_clocks_setting", 0x2, "clocks_event_reason_applications_clocks_setting"),
    ("sw_power_cap", 0x4, "clocks_event_reason_sw_power_cap"),
    ("hw_slowdown", 0x8, "clocks_event_reason_hw_slowdown"),
    ("sync_boost", 0x10, "clocks_event_reason_sync_boost"),
    ("sw_thermal_slowdown", 0x20, "clocks_event_reason_sw_thermal_slowdown"),
    ("hw_thermal_slowdown", 0x40, "clocks_event_reason_hw_thermal_slowdown"),
    ("hw_power_brake_slowdown", 0x80, "clocks_event_reason_hw_power_brake_slowdown"),
    ("display_clocks_setting", 0x100, "clocks_event_reason_display_clocks_setting"),
)
# The older names (drivers before 535 spoke of throttling) answer under the new header.
for _prefix in ("clocks_event_reasons.", "clocks_throttle_reasons."):
    for _f in ("supported", "active") + tuple(r[0] for r in EVENT_REASONS if r[0] != "display_clocks_setting"):
        GPU_FIELDS[_prefix + _f] = ("clocks_event_reasons." + _f, None)

ECC_KEYS = ("sram_correctable", "sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_correctable",
            "dram_uncorrectable")

APP_FIELDS = {
    "gpu_uuid": ("gpu_uuid", None),
    "gpu_name": ("gpu_name", None),
    "gpu_bus_id": ("gpu_bus_id", None),
    "gpu_serial": ("gpu_serial", None),
    "pid": ("pid", None),
    "process_name": ("process_name", None),
    "name": ("process_name", None),
    "used_memory": ("used_gpu_memory [MiB]", "MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", "MiB"),
}

FAULT_MESSAGES = {
    6: "No devices were found",
    9: "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
       "the latest NVIDIA driver is installed and running.",
    12: "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
        "NVIDIA Display Driver is properly installed and present in your system.\nPlease also try adding "
        "directory that contains libnvidia-ml.so to your system PATH.",
    # As nvidia-smi prints it when a GPU has fallen off the bus (Xid 79): the bus id is the
    # first configured GPU's; "fault_message" in config.json replaces the whole text.
    15: "Unable to determine the device handle for GPU{bus_id}: Unknown Error\n"
        "Unable to determine the device handle for GPU{bus_id}: GPU is lost.  Reboot the system "
        "to recover this GPU",
}

# The H200 fixture's driver (tests/fixtures/h200/README.md).
DRIVER_VERSION = "580.159.04"
CUDA_VERSION = "13.0"
XML_HEADER = '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n'


def fail(msg, rc):
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()
    sys.exit(rc)


def load_config(state):
    try:
        with open(os.path.join(state, "config.json")) as f:
            return json.load(f)
    except (IOError, OSError, ValueError) as exc:
        fail("nvidia-smi stand-in: cannot read %s/config.json: %s" % (state, exc), 255)


def load_health(config):
    """{uuid: injected state} from the config's health_file; {} when there is none."""
    path = config.get("health_file")
    if not path:
        return {}
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}
    except (IOError, OSError, ValueError) as exc:
        fail("nvidia-smi stand-in: cannot read health file %s: %s" % (path, exc), 255)


def gpu_defaults(index, gpu):
    g = dict(gpu)
    g.setdefault("name", "NVIDIA H200")
    g.setdefault("memory_total_mib", 143771)
    g.setdefault("uuid", "GPU-00000000-0000-4000-8000-%012d" % index)
    g.setdefault("base_used_mib", 0)
    g.setdefault("utilization_pct", 0)
    g.setdefault("bus_id", "00000000:%02X:00.0" % (0x18 + index))
    g.setdefault("minor", index)
    g["index"] = index
    return g


def stat_fields(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except (IOError, OSError):
        return None
    rest = text[text.rindex(")") + 2:].split()
    return rest[0], int(rest[19])  # state, starttime


def holds(pid, device):
    """pid has an open fd on device (compared after resolving links)."""
    want = os.path.realpath(device)
    fd_dir = "/proc/%d/fd" % pid
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(os.path.join(fd_dir, fd)) == want:
                return True
        except OSError:
            continue
    return False


def process_name(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode("utf-8", "replace")
    except (IOError, OSError):
        argv0 = ""
    return argv0 or "[Not Found]"


def write_json(path, data):
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def claim_files(cdir):
    try:
        names = sorted(os.listdir(cdir))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(cdir, name)
        try:
            with open(path) as f:
                out.append((path, json.load(f)))
        except (IOError, OSError, ValueError):
            continue
    return out


def alive(pid, claim):
    st = stat_fields(pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == claim.get("start_time")


def read_claims(state, config, now):
    """(live claims, lingering claims) after applying liveness and release_delay."""
    live, lingering = [], []
    delay = float(config.get("release_delay", 0.5))
    never = set(config.get("never_drain", []))
    for path, claim in claim_files(os.path.join(state, "claims")):
        if alive(int(claim["pid"]), claim) and "dead_since" not in claim and holds(int(claim["pid"]), claim["device"]):
            live.append(claim)
            continue
        if "dead_since" not in claim:
            claim["dead_since"] = now
            with contextlib.suppress(IOError, OSError):
                write_json(path, claim)
        if claim["gpu"] in never or now - float(claim["dead_since"]) < delay:
            lingering.append(claim)
        else:
            with contextlib.suppress(OSError):
                os.remove(path)
    return live, lingering


def host_pids(roots):
    """{(container root's (st_dev, st_ino), PID inside the container): host PID} for the
    processes of the given containers, from the node's /proc."""
    want = set(roots)
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            st = os.stat("/proc/%s/root" % entry)
            if (st.st_dev, st.st_ino) not in want:
                continue
            with open("/proc/%s/status" % entry) as f:
                nspid = next((line.split()[1:] for line in f if line.startswith("NSpid:")), [])
        except (OSError, ValueError):
            continue
        if nspid:
            out[((st.st_dev, st.st_ino), int(nspid[-1]))] = int(entry)
    return out


def container_claims(config, gpus, now):
    """On a node: its containers' claims, under their host PIDs and the node's GPU indexes,
    as (live, lingering). When a claim stopped counting is kept in node-released.json."""
    live, lingering = [], []
    containers = config.get("containers") or []
    if not containers:
        return live, lingering
    by_uuid = dict((g["uuid"], g["index"]) for g in gpus)
    roots, found = {}, []
    for ct in containers:
        with contextlib.suppress(OSError):
            st = os.stat(ct["root"])
            roots[ct["vmid"]] = (st.st_dev, st.st_ino)
        try:
            with open(os.path.join(ct["state"], "config.json")) as f:
                ct_gpus = json.load(f).get("gpus", [])
        except (IOError, OSError, ValueError):
            continue
        for _path, claim in claim_files(os.path.join(ct["state"], "claims")):
            if 0 <= claim.get("gpu", -1) < len(ct_gpus) and ct_gpus[claim["gpu"]].get("uuid") in by_uuid:
                found.append((ct["vmid"], by_uuid[ct_gpus[claim["gpu"]]["uuid"]], claim))
    if not found:
        return live, lingering
    pids = host_pids(roots.values())
    ledger_path = os.path.join(STATE, "node-released.json")
    try:
        with open(ledger_path) as f:
            ledger = json.load(f)
    except (IOError, OSError, ValueError):
        ledger = {}
    delay = float(config.get("release_delay", 0.5))
    kept = {}
    for vmid, index, claim in found:
        key = "%s:%s:%s:%s" % (vmid, claim["pid"], claim.get("start_time"), claim["gpu"])
        pid = pids.get((roots.get(vmid), int(claim["pid"])))
        mine = dict(claim, gpu=index, pid=pid if pid is not None else claim["pid"], vmid=vmid)
        if pid is not None and key not in ledger and "dead_since" not in claim and alive(pid, claim) \
                and holds(pid, claim["device"]):
            live.append(mine)
            continue
        kept[key] = ledger.get(key, now)
        if now - float(kept[key]) < delay:
            lingering.append(mine)
    if kept != ledger:
        with contextlib.suppress(IOError, OSError):
            write_json(ledger_path, kept)
    return live, lingering


def gpu_table(config, now, health=None):
    gpus = [gpu_defaults(i, g) for i, g in enumerate(config.get("gpus", []))]
    live, lingering = read_claims(STATE, config, now)
    more_live, more_lingering = container_claims(config, gpus, now)
    live, lingering = live + more_live, lingering + more_lingering
    health = health or {}
    for g in gpus:
        mine = [c for c in live if c["gpu"] == g["index"]]
        held = mine + [c for c in lingering if c["gpu"] == g["index"]]
        used = g["base_used_mib"] + sum(int(c["mib"]) for c in held)
        g["memory_used_mib"] = min(used, g["memory_total_mib"])
        g["utilization_pct"] = min(100, g["utilization_pct"] + sum(int(c.get("util", 0)) for c in mine))
        g["apps"] = list(mine)
        g["health"] = health.get(g["uuid"], {})
        mig = g["health"].get("mig")
        g["mig"] = None if mig is None else [dict(inst, index=n, memory_used_mib=sum(
            int(c["mib"]) for c in held if c.get("gpu_instance_id") == inst["gpu_instance_id"]))
            for n, inst in enumerate(mig.get("instances", []))]
    return gpus


def render(value, unit, units):
    if value is None:
        return "[N/A]"
    if isinstance(value, bool):
        value = "Enabled" if value else "Disabled"
    if unit and units:
        return "%s %s" % (value, unit)
    return str(value)


# ---------------------------------------------------------------------------- health


def ecc_counts(g, where):
    counts = dict.fromkeys(ECC_KEYS, 0)
    counts.update(g["health"].get("ecc", {}).get(where, {}))
    return counts


def active_reasons(g):
    """The clock event reasons in force: the injected ones, and gpu_idle while nothing runs."""
    active = set(g["health"].get("clocks_event_reasons", []))
    if not g["apps"] and not g["utilization_pct"]:
        active.add("gpu_idle")
    return active


def reason_mask(names):
    return "0x%016X" % sum(bit for name, bit, _el in EVENT_REASONS if name in names)


def pcie(g, key, default):
    return g["health"].get("pcie", {}).get(key, default)


def retired(g, key):
    """A retired-pages count or pending flag; None ("N/A") unless injected, as on Hopper."""
    return g["health"].get("retired_pages", {}).get(key)


def yes_no(flag):
    return None if flag is None else ("Yes" if flag else "No")


def health_value(g, field):
    h = g["health"]
    if field.startswith("ecc.errors."):
        _e, _r, kind, where, _t = field.split(".")
        counts = ecc_counts(g, where)
        keys = [k for k in ECC_KEYS if ("uncorrectable" in k) == (kind == "uncorrected")]
        return sum(int(counts[k]) for k in keys)
    if field.startswith(("clocks_event_reasons.", "clocks_throttle_reasons.")):
        name = field.split(".", 1)[1]
        if name == "supported":
            return reason_mask([r[0] for r in EVENT_REASONS])
        if name == "active":
            return reason_mask(active_reasons(g))
        return "Active" if name in active_reasons(g) else "Not Active"
    return {
        "persistence_mode": h.get("persistence_mode", True),
        "ecc.mode.current": True, "ecc.mode.pending": True,
        "mig.mode.current": g["mig"] is not None, "mig.mode.pending": g["mig"] is not None,
        "retired_pages.pending": yes_no(retired(g, "pending")),
        "retired_pages.single_bit_ecc.count": retired(g, "single_bit"), "retired_pages.sbe": retired(g, "single_bit"),
        "retired_pages.double_bit.count": retired(g, "double_bit"), "retired_pages.dbe": retired(g, "double_bit"),
        "pcie.link.gen.current": pcie(g, "gen", 5), "pcie.link.gen.gpucurrent": pcie(g, "gen", 5),
        "pcie.link.gen.max": pcie(g, "gen_max", 5), "pcie.link.gen.gpumax": pcie(g, "gen_max", 5),
        "pcie.link.gen.hostmax": None,
        "pcie.link.width.current": pcie(g, "width", 16), "pcie.link.width.max": pcie(g, "width_max", 16),
    }[field]


def gpu_value(g, field, count, config):
    basic = {
        "index": g["index"], "count": count, "uuid": g["uuid"], "gpu_uuid": g["uuid"], "name": g["name"],
        "gpu_name": g["name"], "pci.bus_id": g["bus_id"], "gpu_bus_id": g["bus_id"],
        "driver_version": config.get("driver_version", DRIVER_VERSION), "memory.used": g["memory_used_mib"],
        "memory.total": g["memory_total_mib"], "memory.free": g["memory_total_mib"] - g["memory_used_mib"],
        "utilization.gpu": g["utilization_pct"], "utilization.memory": g.get("utilization_memory_pct"),
        "temperature.gpu": g.get("temperature_c", 31), "power.draw": g.get("power_w"),
    }
    return basic[field] if field in basic else health_value(g, field)


def app_value(g, claim, field):
    return {
        "gpu_uuid": g["uuid"], "gpu_name": g["name"], "gpu_bus_id": g["bus_id"], "gpu_serial": None,
        "pid": claim["pid"], "process_name": process_name(int(claim["pid"])),
        "name": process_name(int(claim["pid"])), "used_memory": claim["mib"], "used_gpu_memory": claim["mib"],
    }[field]


# ---------------------------------------------------------------------------- -q -x / -q


def fixture_file(config, name):
    for d in (config.get("fixture_dir"), os.path.join(HERE, "h200"), os.path.join(HERE, "..", "fixtures", "h200")):
        if d and os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    fail("nvidia-smi stand-in: the H200 fixture %s was not found (fixture_dir in config.json)" % name, 255)


def _set(el, path, value):
    node = el.find(path)
    if node is None:
        raise KeyError("the H200 fixture has no %s" % path)
    node.text = value


def _mib(n):
    return "%d MiB" % n


def _sub(parent, tag, text=None):
    el = ET.SubElement(parent, tag)
    el.text = text
    return el


def bus_parts(bus_id):
    """("0000", "18", "00", "0") from "00000000:18:00.0": domain, bus, device, function."""
    domain, bus, rest = bus_id.split(":")
    device, function = rest.split(".")
    return domain[-4:], bus, device, function


def fill_gpu(el, g, serial):
    """One <gpu> element (a copy of the H200's) with this GPU's state."""
    h = g["health"]
    el.set("id", g["bus_id"])
    _set(el, "product_name", g["name"])
    _set(el, "persistence_mode", render(h.get("persistence_mode", True), None, False))
    mig = "Enabled" if g["mig"] is not None else "Disabled"
    _set(el, "mig_mode/current_mig", mig)
    _set(el, "mig_mode/pending_mig", mig)
    devices = el.find("mig_devices")
    if g["mig"]:
        devices.text = None
        for inst in g["mig"]:
            d = _sub(devices, "mig_device")
            for tag in ("index", "gpu_instance_id", "compute_instance_id"):
                _sub(d, tag, str(inst[tag]))
            shared = _sub(_sub(d, "device_attributes"), "shared")
            for tag, value in (("multiprocessor_count", inst.get("multiprocessor_count", 16)), ("copy_engine_count", 1),
                               ("encoder_count", 0), ("decoder_count", 1), ("ofa_count", 0), ("jpg_count", 1)):
                _sub(shared, tag, str(value))
            total = int(inst.get("memory_total_mib", 16128))
            fb = _sub(d, "fb_memory_usage")
            for tag, value in (("total", total), ("reserved", 0), ("used", inst["memory_used_mib"]),
                               ("free", total - inst["memory_used_mib"])):
                _sub(fb, tag, _mib(value))
            bar1 = _sub(d, "bar1_memory_usage")
            for tag, value in (("total", 32767), ("used", 0), ("free", 32767)):
                _sub(bar1, tag, _mib(value))
    _set(el, "serial", serial)
    _set(el, "uuid", g["uuid"])
    _set(el, "minor_number", str(g["minor"]))
    domain, bus, device, _function = bus_parts(g["bus_id"])
    _set(el, "pci/pci_bus", bus)
    _set(el, "pci/pci_device", device)
    _set(el, "pci/pci_domain", domain)
    _set(el, "pci/pci_bus_id", g["bus_id"])
    link = "pci/pci_gpu_link_info/"
    _set(el, link + "pcie_gen/max_link_gen", str(pcie(g, "gen_max", 5)))
    _set(el, link + "pcie_gen/current_link_gen", str(pcie(g, "gen", 5)))
    _set(el, link + "pcie_gen/device_current_link_gen", str(pcie(g, "gen", 5)))
    _set(el, link + "pcie_gen/max_device_link_gen", str(pcie(g, "gen_max", 5)))
    _set(el, link + "link_widths/max_link_width", "%dx" % pcie(g, "width_max", 16))
    _set(el, link + "link_widths/current_link_width", "%dx" % pcie(g, "width", 16))
    active = active_reasons(g)
    for name, _bit, tag in EVENT_REASONS:
        _set(el, "clocks_event_reasons/" + tag, "Active" if name in active else "Not Active")
    # The H200 reports 616 MiB reserved and 143156 free of 143771: the MiB are rounded apart.
    _set(el, "fb_memory_usage/total", _mib(g["memory_total_mib"]))
    _set(el, "fb_memory_usage/used", _mib(g["memory_used_mib"]))
    _set(el, "fb_memory_usage/free", _mib(max(0, g["memory_total_mib"] - 615 - g["memory_used_mib"])))
    _set(el, "utilization/gpu_util", "%d %%" % g["utilization_pct"])
    _set(el, "utilization/memory_util", "%d %%" % (g.get("utilization_memory_pct") or 0))
    for where in ("volatile", "aggregate"):
        for key, value in ecc_counts(g, where).items():
            _set(el, "ecc_errors/%s/%s" % (where, key), str(value))
    for key, tag in (("single_bit", "multiple_single_bit_retirement"), ("double_bit", "double_bit_retirement")):
        _set(el, "retired_pages/%s/retired_count" % tag, "N/A" if retired(g, key) is None else str(retired(g, key)))
    _set(el, "retired_pages/pending_retirement", yes_no(retired(g, "pending")) or "N/A")
    rows = h.get("remapped_rows", {})
    _set(el, "remapped_rows/remapped_row_corr", str(rows.get("correctable", 0)))
    _set(el, "remapped_rows/remapped_row_unc", str(rows.get("uncorrectable", 0)))
    _set(el, "remapped_rows/remapped_row_pending", yes_no(rows.get("pending", False)))
    _set(el, "remapped_rows/remapped_row_failure", yes_no(rows.get("failure", False)))
    faults = h.get("memory_faults", {})
    for key, path in (("sram_threshold_exceeded", "ecc_errors/aggregate/sram_threshold_exceeded"),
                      ("unrepairable_memory", "ecc_errors/unrepairable_memory"),
                      ("channel_repair_pending", "ecc_errors/channel_repair_pending"),
                      ("tpc_repair_pending", "ecc_errors/tpc_repair_pending")):
        _set(el, path, yes_no(faults.get(key, False)))
    for source, count in faults.get("sram_sources", {}).items():
        _set(el, "ecc_errors/aggregate_uncorrectable_sram_sources/sram_" + source, str(count))
    # The H200's 3072 banks, all with every spare row, unless the histogram says otherwise.
    for name, banks in dict({"max": 3072}, **faults.get("row_remapper_histogram", {})).items():
        _set(el, "remapped_rows/row_remapper_histogram/row_remapper_histogram_" + name, "%d bank(s)" % banks)
    procs = el.find("processes")
    for c in sorted(g["apps"], key=lambda c: c["pid"]):
        info = _sub(procs, "process_info")
        _sub(info, "gpu_instance_id", str(c["gpu_instance_id"]) if "gpu_instance_id" in c else "N/A")
        _sub(info, "compute_instance_id", str(c.get("compute_instance_id", 0)) if "gpu_instance_id" in c else "N/A")
        _sub(info, "pid", str(c["pid"]))
        _sub(info, "type", "C")
        _sub(info, "process_name", process_name(int(c["pid"])))
        _sub(info, "used_memory", _mib(int(c["mib"])))


def serial_of(g):
    """A board serial number of the H200's 13 digits, one per UUID."""
    return "%013d" % (zlib.crc32(g["uuid"].encode()) * 1000 % 10 ** 13)


def xml_report(gpus, config, now):
    root = ET.parse(fixture_file(config, "nvidia-smi-q-x.xml")).getroot()
    template = root.find("gpu")
    for el in root.findall("gpu"):
        root.remove(el)
    root.find("timestamp").text = time.strftime("%a %b %e %H:%M:%S %Y", time.localtime(now))
    root.find("driver_version").text = config.get("driver_version", DRIVER_VERSION)
    root.find("cuda_version").text = config.get("cuda_version", CUDA_VERSION)
    root.find("attached_gpus").text = str(len(gpus))
    for g in gpus:
        el = copy.deepcopy(template)
        fill_gpu(el, g, serial_of(g))
        root.append(el)
    ET.indent(root, space="\t")
    return XML_HEADER + ET.tostring(root, encoding="unicode") + "\n"


def text_line(depth, label, value=None):
    key = "    " * depth + label
    return key if value is None else "%-55s: %s" % (key, value)


def text_report(xml_text):
    """``-q``: the H200's text report as template, each value the one -q -x gives for this GPU
    (the text labels map to XML paths one to one, in the same order, under each GPU)."""
    return XML_TEXT.render(ET.fromstring(xml_text.split("\n", 2)[2]))


class _TextTemplate(object):
    """The H200 text report, cut into lines, with the XML path each value line reads."""

    # Text label path (under "GPU <bus id>") -> XML path, for the values the stand-in models.
    PATHS = {
        ("Product Name",): "product_name", ("Persistence Mode",): "persistence_mode",
        ("MIG Mode", "Current"): "mig_mode/current_mig", ("MIG Mode", "Pending"): "mig_mode/pending_mig",
        ("Serial Number",): "serial", ("GPU UUID",): "uuid", ("Minor Number",): "minor_number",
        ("PCI", "Bus Id"): "pci/pci_bus_id",
        ("PCI", "GPU Link Info", "PCIe Generation", "Max"): "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
        ("PCI", "GPU Link Info", "PCIe Generation", "Current"): "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
        ("PCI", "GPU Link Info", "PCIe Generation", "Device Current"): "pci/pci_gpu_link_info/pcie_gen/device_current_link_gen",
        ("PCI", "GPU Link Info", "PCIe Generation", "Device Max"): "pci/pci_gpu_link_info/pcie_gen/max_device_link_gen",
        ("PCI", "GPU Link Info", "Link Width", "Max"): "pci/pci_gpu_link_info/link_widths/max_link_width",
        ("PCI", "GPU Link Info", "Link Width", "Current"): "pci/pci_gpu_link_info/link_widths/current_link_width",
        ("Clocks Event Reasons", "Idle"): "clocks_event_reasons/clocks_event_reason_gpu_idle",
        ("Clocks Event Reasons", "Applications Clocks Setting"):
            "clocks_event_reasons/clocks_event_reason_applications_clocks_setting",
        ("Clocks Event Reasons", "SW Power Cap"): "clocks_event_reasons/clocks_event_reason_sw_power_cap",
        ("Clocks Event Reasons", "HW Slowdown"): "clocks_event_reasons/clocks_event_reason_hw_slowdown",
        ("Clocks Event Reasons", "HW Slowdown", "HW Thermal Slowdown"):
            "clocks_event_reasons/clocks_event_reason_hw_thermal_slowdown",
        ("Clocks Event Reasons", "HW Slowdown", "HW Power Brake Slowdown"):
            "clocks_event_reasons/clocks_event_reason_hw_power_brake_slowdown",
        ("Clocks Event Reasons", "Sync Boost"): "clocks_event_reasons/clocks_event_reason_sync_boost",
        ("Clocks Event Reasons", "SW Thermal Slowdown"): "clocks_event_reasons/clocks_event_reason_sw_thermal_slowdown",
        ("Clocks Event Reasons", "Display Clock Setting"):
            "clocks_event_reasons/clocks_event_reason_display_clocks_setting",
        ("FB Memory Usage", "Total"): "fb_memory_usage/total", ("FB Memory Usage", "Used"): "fb_memory_usage/used",
        ("FB Memory Usage", "Free"): "fb_memory_usage/free",
        ("Utilization", "GPU"): "utilization/gpu_util", ("Utilization", "Memory"): "utilization/memory_util",
        ("Retired Pages", "Single Bit ECC"): "retired_pages/multiple_single_bit_retirement/retired_count",
        ("Retired Pages", "Double Bit ECC"): "retired_pages/double_bit_retirement/retired_count",
        ("Retired Pages", "Pending Page Blacklist"): "retired_pages/pending_retirement",
        ("Remapped Rows", "Correctable Error"): "remapped_rows/remapped_row_corr",
        ("Remapped Rows", "Uncorrectable Error"): "remapped_rows/remapped_row_unc",
        ("Remapped Rows", "Pending"): "remapped_rows/remapped_row_pending",
        ("Remapped Rows", "Remapping Failure Occurred"): "remapped_rows/remapped_row_failure",
    }
    for _where, _label in (("volatile", "Volatile"), ("aggregate", "Aggregate")):
        for _key, _text in (("sram_correctable", "SRAM Correctable"), ("sram_uncorrectable_parity", "SRAM Uncorrectable Parity"),
                            ("sram_uncorrectable_secded", "SRAM Uncorrectable SEC-DED"),
                            ("dram_correctable", "DRAM Correctable"), ("dram_uncorrectable", "DRAM Uncorrectable")):
            PATHS[("ECC Errors", _label, _text)] = "ecc_errors/%s/%s" % (_where, _key)
    TOP = {"Timestamp": "timestamp", "Driver Version": "driver_version", "CUDA Version": "cuda_version",
           "Attached GPUs": "attached_gpus"}

    def __init__(self):
        self.lines = None

    def load(self, path):
        """[(depth, label, value or None, label path, the line as printed)] of the fixture."""
        if self.lines is not None:
            return
        self.lines, stack = [], []
        with open(path) as f:
            for raw in f.read().split("\n"):
                body = raw.lstrip(" ")
                depth = (len(raw) - len(body)) // 4
                label, sep, value = body.partition(":")
                if not sep or raw.startswith("GPU "):
                    label, value = body.rstrip(), None
                else:
                    label, value = label.rstrip(), value.removeprefix(" ")
                del stack[max(depth - 1, 0):]
                if depth:
                    stack.append(label)
                self.lines.append((depth, label, value, tuple(stack), raw))

    def render(self, root):
        out = []
        gpu_at = next(n for n, line in enumerate(self.lines) if line[1].startswith("GPU ") and line[0] == 0)
        for depth, label, value, _path, raw in self.lines[:gpu_at]:
            tag = self.TOP.get(label)
            out.append(text_line(depth, label, root.find(tag).text) if tag and value is not None else raw)
        for gpu in root.findall("gpu"):
            out.append("GPU " + gpu.get("id"))
            for depth, label, _value, path, raw in self.lines[gpu_at + 1:]:
                if not label:
                    continue
                if path == ("Processes",):
                    out.extend(self.processes(gpu))
                    continue
                tag = self.PATHS.get(path)
                out.append(text_line(depth, label, gpu.find(tag).text) if tag else raw)
                if path == ("MIG Mode", "Pending"):
                    out.extend(self.mig_devices(gpu))
        return "\n".join(out) + "\n\n"

    @staticmethod
    def processes(gpu):
        infos = gpu.findall("processes/process_info")
        if not infos:
            return [text_line(1, "Processes", "None")]
        out = [text_line(1, "Processes")]
        for p in infos:
            out += [text_line(2, "GPU instance ID", p.find("gpu_instance_id").text),
                    text_line(2, "Compute instance ID", p.find("compute_instance_id").text),
                    text_line(2, "Process ID", p.find("pid").text),
                    text_line(3, "Type", p.find("type").text),
                    text_line(3, "Name", p.find("process_name").text),
                    text_line(3, "Used GPU Memory", p.find("used_memory").text)]
        return out

    @staticmethod
    def mig_devices(gpu):
        devices = gpu.findall("mig_devices/mig_device")
        if not devices:
            return []
        out = [text_line(1, "MIG Devices")]
        for d in devices:
            out += [text_line(2, "MIG Device"),
                    text_line(3, "Index", d.find("index").text),
                    text_line(3, "GPU Instance ID", d.find("gpu_instance_id").text),
                    text_line(3, "Compute Instance ID", d.find("compute_instance_id").text),
                    text_line(3, "FB Memory Usage")]
            out += [text_line(4, tag.title(), d.find("fb_memory_usage/" + tag).text) for tag in ("total", "reserved", "used", "free")]
        return out


XML_TEXT = _TextTemplate()


def parse_args(argv):
    opts = {"query_gpu": None, "query_apps": None, "query_remapped": None, "format": None, "ids": None, "list": False, "q": False, "xml": False}
    it = iter(argv)
    for arg in it:
        key, sep, value = arg.partition("=")
        if key == "--query-gpu":
            opts["query_gpu"] = value
        elif key == "--query-compute-apps":
            opts["query_apps"] = value
        elif key == "--query-remapped-rows":
            opts["query_remapped"] = value
        elif key == "--format":
            opts["format"] = value
        elif key in ("-i", "--id"):
            opts["ids"] = value if sep else next(it, "")
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        elif arg in ("-q", "--query"):
            opts["q"] = True
        elif arg in ("-x", "--xml-format"):
            opts["xml"] = True
        elif arg in ("-qx", "-xq"):
            opts["q"] = opts["xml"] = True
        else:
            fail('Invalid combination of input arguments. Please run \'nvidia-smi -h\' for help.\n'
                 '(stand-in: unknown argument %r)' % arg, 2)
    if opts["xml"] and not opts["q"]:
        fail("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)
    return opts


# --query-remapped-rows, as 580.159.04 answers it on an H200: "No, No, 0, 0" after the UUID.
REMAPPED_FIELDS = ("gpu_uuid", "gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure",
                   "remapped_rows.correctable", "remapped_rows.uncorrectable")


def remapped_value(g, field):
    rows = g["health"].get("remapped_rows", {})
    if field == "gpu_uuid":
        return g["uuid"]
    if field == "gpu_bus_id":
        return g["bus_id"]
    key = field.split(".", 1)[1]
    if key in ("pending", "failure"):
        return "Yes" if rows.get(key) else "No"
    return str(rows.get(key, 0))


def check_fields(spec, table):
    """The fields asked, each one nvidia-smi knows. On the first it does not, nvidia-smi prints
    ``Field "<name>" is not a valid field to query.`` and a blank line on stdout, nothing on
    stderr, no rows, and exits 2 ("a supplied argument or flag is invalid")."""
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for f in fields:
        if f not in table:
            fail('Field "%s" is not a valid field to query.\n' % f, 2)
    if not fields:
        fail("No fields were given to query.", 2)
    return fields


def main(argv):
    opts = parse_args(argv)
    config = load_config(STATE)
    fault = config.get("fault")
    if fault == "hang":
        time.sleep(float(config.get("hang_seconds", 3600)))
    elif fault and str(fault).startswith("exit:"):
        rc = int(str(fault).split(":", 1)[1])
        gpus = config.get("gpus") or [{}]
        bus_id = gpu_defaults(0, gpus[0])["bus_id"]
        domain, _sep, rest = bus_id.partition(":")
        bus_id = "%s:%s" % (domain[-4:], rest)  # this message prints a 4-digit PCI domain
        fail(config.get("fault_message") or FAULT_MESSAGES.get(rc, "stand-in fault").format(bus_id=bus_id), rc)
    now = time.time()
    gpus = gpu_table(config, now, load_health(config))
    if not gpus:
        fail(FAULT_MESSAGES[6], 6)
    if opts["ids"]:
        wanted = [i.strip() for i in opts["ids"].split(",")]
        gpus = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
        if not gpus:
            fail("No devices were found", 6)
    out = []
    if opts["q"]:
        report = xml_report(gpus, config, now)
        if not opts["xml"]:
            XML_TEXT.load(fixture_file(config, "nvidia-smi-q.txt"))
            report = text_report(report)
        sys.stdout.write(report)
        return 0
    if opts["list"]:
        for g in gpus:
            out.append("GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]))
    elif opts["query_remapped"] is not None:
        if opts["format"] is None:
            fail("The --format argument is required together with a --query option.", 2)
        fields = check_fields(opts["query_remapped"], REMAPPED_FIELDS)
        if "noheader" not in opts["format"]:
            out.append(", ".join(fields))
        for g in gpus:
            out.append(", ".join(remapped_value(g, f) for f in fields))
    elif opts["query_gpu"] is not None or opts["query_apps"] is not None:
        if opts["format"] is None:
            fail("The --format argument is required together with a --query option.", 2)
        fmt = [f.strip() for f in opts["format"].split(",")]
        if not fmt or fmt[0] != "csv" or any(f not in ("csv", "noheader", "nounits") for f in fmt):
            fail('"%s" is not a valid format.' % opts["format"], 2)
        header, units = "noheader" not in fmt, "nounits" not in fmt
        if opts["query_gpu"] is not None:
            fields = check_fields(opts["query_gpu"], GPU_FIELDS)
            if header:
                out.append(", ".join(GPU_FIELDS[f][0] for f in fields))
            for g in gpus:
                out.append(", ".join(render(gpu_value(g, f, len(gpus), config), GPU_FIELDS[f][1], units) for f in fields))
        else:
            fields = check_fields(opts["query_apps"], APP_FIELDS)
            if header:
                out.append(", ".join(APP_FIELDS[f][0] for f in fields))
            rows = [(g, c) for g in gpus for c in sorted(g["apps"], key=lambda c: c["pid"])]
            for g, c in rows:
                out.append(", ".join(render(app_value(g, c, f), APP_FIELDS[f][1], units) for f in fields))
            if not rows and config.get("no_process_message"):
                out.append("No running processes found")
    else:
        out.append("+-- nvidia-smi STAND-IN (tests only) --+")
        for g in gpus:
            out.append("| %d  %-20s %6d MiB / %6d MiB  %3d %% |" % (
                g["index"], g["name"], g["memory_used_mib"], g["memory_total_mib"], g["utilization_pct"]))
            for c in g["apps"]:
                out.append("|    pid %-8s %6s MiB  %s" % (c["pid"], c["mib"], process_name(int(c["pid"]))))
    sys.stdout.write("".join(line + "\n" for line in out))
    return 0


STATE = os.environ.get(STATE_ENV, "")

if __name__ == "__main__":
    if not STATE:
        fail("nvidia-smi stand-in: set %s to its state directory" % STATE_ENV, 255)
    sys.exit(main(sys.argv[1:]))
