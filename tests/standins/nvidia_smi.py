# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""STAND-IN for nvidia-smi, for tests on machines without an NVIDIA GPU. Not NVIDIA's tool.

It answers the query interface the collection uses, in nvidia-smi's formats:

    --query-gpu=FIELD[,FIELD...]            any supported field list, in the order asked
    --query-compute-apps=FIELD[,FIELD...]
    --format=csv[,noheader][,nounits]       header line and units as nvidia-smi prints them
    -i/--id=INDEX|UUID[,...]                restrict --query-gpu to some GPUs
    -L / --list-gpus                        one line per GPU

and with nvidia-smi's exit codes (2 bad field or option, 6 no devices, 9 driver not loaded,
12 NVML missing, 15 GPU fallen off the bus) when a fault is configured.

Its GPUs and their memory come from a state directory named by $GPU_STANDIN_STATE:

    config.json    {"gpus": [{"name", "memory_total_mib", "uuid", "base_used_mib",
                              "utilization_pct", "bus_id"}, ...],
                    "release_delay": seconds memory stays used after its holder died,
                    "never_drain": [indexes whose memory is never released],
                    "fault": null | "hang" | "exit:<rc>",  "hang_seconds": 3600,
                    "fault_message": text printed with exit:<rc> (default: nvidia-smi's own),
                    "no_process_message": print "No running processes found" when none}
    dev/nvidia<N>  files standing for the device nodes (or bind-mounts of them)
    claims/<pid>.json  written by the training stand-in (train_dflash.py): pid, start_time,
                   gpu, mib, util, device

A claim counts, and its process is listed, only while that PID is alive (same start time,
not a zombie) AND holds an open handle on the claim's device file, as seen in /proc/<pid>/fd.
When it stops counting, its memory stays used for release_delay seconds (from when the
stand-in first notices), as a real driver frees memory a moment after a process exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

STATE_ENV = "GPU_STANDIN_STATE"

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
}

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

DRIVER_VERSION = "570.00-standin"


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


def gpu_defaults(index, gpu):
    g = dict(gpu)
    g.setdefault("name", "NVIDIA H200")
    g.setdefault("memory_total_mib", 143771)
    g.setdefault("uuid", "GPU-00000000-0000-4000-8000-%012d" % index)
    g.setdefault("base_used_mib", 0)
    g.setdefault("utilization_pct", 0)
    g.setdefault("bus_id", "00000000:%02X:00.0" % (0x18 + index))
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


def read_claims(state, config, now):
    """(live claims, lingering claims) after applying liveness and release_delay."""
    live, lingering = [], []
    cdir = os.path.join(state, "claims")
    try:
        names = sorted(os.listdir(cdir))
    except OSError:
        return live, lingering
    delay = float(config.get("release_delay", 0.5))
    never = set(config.get("never_drain", []))
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(cdir, name)
        try:
            with open(path) as f:
                claim = json.load(f)
        except (IOError, OSError, ValueError):
            continue
        st = stat_fields(int(claim["pid"]))
        alive = st is not None and st[0] not in ("Z", "X") and st[1] == claim.get("start_time")
        if alive and "dead_since" not in claim and holds(int(claim["pid"]), claim["device"]):
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


def gpu_table(config, now):
    gpus = [gpu_defaults(i, g) for i, g in enumerate(config.get("gpus", []))]
    live, lingering = read_claims(STATE, config, now)
    for g in gpus:
        mine = [c for c in live if c["gpu"] == g["index"]]
        used = g["base_used_mib"] + sum(int(c["mib"]) for c in mine + [c for c in lingering if c["gpu"] == g["index"]])
        g["memory_used_mib"] = min(used, g["memory_total_mib"])
        g["utilization_pct"] = min(100, g["utilization_pct"] + sum(int(c.get("util", 0)) for c in mine))
        g["apps"] = list(mine)
    return gpus


def render(value, unit, units):
    if value is None:
        return "[N/A]"
    if isinstance(value, bool):
        value = "Enabled" if value else "Disabled"
    if unit and units:
        return "%s %s" % (value, unit)
    return str(value)


def gpu_value(g, field, count):
    return {
        "index": g["index"], "count": count, "uuid": g["uuid"], "gpu_uuid": g["uuid"], "name": g["name"],
        "gpu_name": g["name"], "pci.bus_id": g["bus_id"], "gpu_bus_id": g["bus_id"],
        "driver_version": DRIVER_VERSION, "memory.used": g["memory_used_mib"],
        "memory.total": g["memory_total_mib"], "memory.free": g["memory_total_mib"] - g["memory_used_mib"],
        "utilization.gpu": g["utilization_pct"], "utilization.memory": g.get("utilization_memory_pct"),
        "temperature.gpu": g.get("temperature_c", 31), "power.draw": g.get("power_w"),
        "persistence_mode": True,
    }[field]


def app_value(g, claim, field):
    return {
        "gpu_uuid": g["uuid"], "gpu_name": g["name"], "gpu_bus_id": g["bus_id"], "gpu_serial": None,
        "pid": claim["pid"], "process_name": process_name(int(claim["pid"])),
        "name": process_name(int(claim["pid"])), "used_memory": claim["mib"], "used_gpu_memory": claim["mib"],
    }[field]


def parse_args(argv):
    opts = {"query_gpu": None, "query_apps": None, "format": None, "ids": None, "list": False}
    it = iter(argv)
    for arg in it:
        key, sep, value = arg.partition("=")
        if key == "--query-gpu":
            opts["query_gpu"] = value
        elif key == "--query-compute-apps":
            opts["query_apps"] = value
        elif key == "--format":
            opts["format"] = value
        elif key in ("-i", "--id"):
            opts["ids"] = value if sep else next(it, "")
        elif arg in ("-L", "--list-gpus"):
            opts["list"] = True
        else:
            fail('Invalid combination of input arguments. Please run \'nvidia-smi -h\' for help.\n'
                 '(stand-in: unknown argument %r)' % arg, 2)
    return opts


def check_fields(spec, table):
    fields = [f.strip() for f in spec.split(",") if f.strip()]
    for f in fields:
        if f not in table:
            fail('Field "%s" is not a valid field to query.\n\n'
                 'Please refer to nvidia-smi -h for the list of valid fields.' % f, 2)
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
    gpus = gpu_table(config, time.time())
    if not gpus:
        fail(FAULT_MESSAGES[6], 6)
    if opts["ids"]:
        wanted = [i.strip() for i in opts["ids"].split(",")]
        gpus = [g for g in gpus if str(g["index"]) in wanted or g["uuid"] in wanted]
        if not gpus:
            fail("No devices were found", 6)
    out = []
    if opts["list"]:
        for g in gpus:
            out.append("GPU %d: %s (UUID: %s)" % (g["index"], g["name"], g["uuid"]))
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
                out.append(", ".join(render(gpu_value(g, f, len(gpus)), GPU_FIELDS[f][1], units) for f in fields))
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
