# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Helpers to set up the GPU STAND-IN (nvidia_smi.py + train_dflash.py) in tests, and to
inject GPU health states (the stand-in's health file, the node's kernel log) into it.

    state = make_state(tmp_path / "gpu", gpus=2, release_delay=0.3)
    smi = install_nvidia_smi(tmp_path / "bin", state)     # an executable named nvidia-smi
    with Trainers(state) as t:
        proc = t.start(gpu=0, mib=40960)                   # a real process holding a "GPU"
    set_health(path, uuid, ecc={"volatile": {"dram_uncorrectable": 2}})
    append_xid(kernel_log, "00000000:1B:00.0", 48)

Standard library only: the simulated fleet (tests/sim/fleet) imports it too.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
EMULATOR = os.path.join(HERE, "nvidia_smi.py")
TRAINER = os.path.join(HERE, "train_dflash.py")
STATE_ENV = "GPU_STANDIN_STATE"


def make_state(path, gpus=1, names=None, total_mib=143771, release_delay=0.3, never_drain=(), fault=None,
               **extra):
    """Create a stand-in state directory with ``gpus`` GPUs and their device files."""
    path = str(path)
    os.makedirs(os.path.join(path, "dev"), exist_ok=True)
    os.makedirs(os.path.join(path, "claims"), exist_ok=True)
    table = []
    for i in range(gpus):
        table.append({"name": (names or ["NVIDIA H200"] * gpus)[i], "memory_total_mib": total_mib,
                      "uuid": "GPU-5d3c1f7e-8a8b-4c6e-9f0e-%012d" % i})
        with open(os.path.join(path, "dev", "nvidia%d" % i), "w"):
            pass
    for name in ("nvidiactl", "nvidia-uvm"):
        with open(os.path.join(path, "dev", name), "w"):
            pass
    config = {"gpus": table, "release_delay": release_delay, "never_drain": list(never_drain), "fault": fault}
    config.update(extra)
    write_config(path, config)
    return path


def read_config(state):
    with open(os.path.join(str(state), "config.json")) as f:
        return json.load(f)


def write_config(state, config):
    tmp = os.path.join(str(state), "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(config, f)
    os.replace(tmp, os.path.join(str(state), "config.json"))


def configure(state, **changes):
    config = read_config(state)
    config.update(changes)
    write_config(state, config)


def install_nvidia_smi(bin_dir, state, python=None):
    """Write an executable ``nvidia-smi`` in bin_dir that runs the stand-in on ``state``."""
    bin_dir = str(bin_dir)
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "nvidia-smi")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n# nvidia-smi STAND-IN for tests (see %s)\n" % EMULATOR)
        f.write(": \"${%s:=%s}\"\nexport %s\n" % (STATE_ENV, str(state), STATE_ENV))
        f.write("exec %s %s \"$@\"\n" % (shlex.quote(python or sys.executable), shlex.quote(EMULATOR)))
    os.chmod(path, 0o755)
    return path


def device(state, gpu):
    return os.path.join(str(state), "dev", "nvidia%d" % gpu)


class Trainers(object):
    """Starts training stand-ins and always kills and reaps them on exit."""

    def __init__(self, state):
        self.state = str(state)
        self.procs = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.cleanup()

    def start(self, gpu=0, mib=1024, ignore_sigterm=False, term_delay=0.0, tag="", device_path=None,
              timeout=10.0, dlopen=(), python=None):
        argv = [python or sys.executable, TRAINER, "--state", self.state, "--gpu", str(gpu), "--mib", str(mib),
                "--term-delay", str(term_delay)]
        if dlopen:
            argv += ["--dlopen", ",".join(dlopen)]
        if ignore_sigterm:
            argv.append("--ignore-sigterm")
        if tag:
            argv += ["--tag", tag]
        if device_path:
            argv += ["--device", str(device_path)]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        self.procs.append(proc)
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or proc.poll() is not None:
                raise RuntimeError("training stand-in did not become ready: %r (rc=%s)" % (line, proc.poll()))
            ready, _w, _x = select.select([proc.stdout], [], [], left)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 256)
                if not chunk:
                    continue
                line += chunk
        assert line.startswith(b"ready %d" % proc.pid), line
        return proc

    def cleanup(self):
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            if proc.stdout:
                proc.stdout.close()
        self.procs = []


def wait_exit(proc, timeout=5.0):
    """Reap a child; return its exit status, or None when still running after timeout."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


# ---------------------------------------------------------------------------- health


def read_health(path):
    """The health file's {uuid: state}; {} when it does not exist."""
    try:
        with open(str(path)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def set_health(path, uuid, **state):
    """Inject state (nvidia_smi.py's health keys: ecc, clocks_event_reasons, pcie, mig, ...) into
    the GPU uuid's entry of the health file, atomically (readers never see half a file); a key
    given None is removed (healthy again)."""
    health = read_health(path)
    entry = health.setdefault(uuid, {})
    for key, value in state.items():
        if value is None:
            entry.pop(key, None)
        else:
            entry[key] = value
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(health, f, indent=1, sort_keys=True)
    os.replace(tmp, str(path))
    return health


# What the driver prints for the Xid codes injected most (NVIDIA's Xid catalogue wording).
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f2a_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
    63: "Row remapping event: Unrecoverable error",
    74: "NVLink: fatal error detected on link 4(0x10000, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
}


def xid_line(bus_id, code, when=None, pid=None, name=None, text=None):
    """One kernel log line of an Xid event as ``dmesg --time-format iso`` prints it:
    ``2026-12-01T14:03:20,123456+00:00 NVRM: Xid (PCI:0000:1b:00): 48, pid=..., name=..., <text>``.
    bus_id is nvidia-smi's (00000000:1B:00.0); the driver names it domain:bus:device, lower case."""
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    when = when or datetime.datetime.now(datetime.timezone.utc)
    stamp = when.strftime("%Y-%m-%dT%H:%M:%S,%f") + when.strftime("%z")[:3] + ":" + when.strftime("%z")[3:]
    who = "pid=%s, name=%s" % (pid if pid is not None else "'<unknown>'", name or "<unknown>")
    return "%s NVRM: Xid (PCI:%s:%s:%s): %d, %s, %s" % (
        stamp, domain[-4:].lower(), bus.lower(), device.lower(), code, who, text or XID_TEXT.get(code, "Xid event"))


def append_xid(kernel_log, bus_id, code, **kw):
    """Append an Xid line (xid_line()) to a kernel log file; returns the line."""
    line = xid_line(bus_id, code, **kw)
    with open(str(kernel_log), "a") as f:
        f.write(line + "\n")
    return line
