# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU state and health from nvidia-smi's query interface: the argv of every --query-* call (one
place, unit-tested without a GPU), the calls run side by side, and their CSV parsed.

Two reads: the state read (GPUs, memory, compute processes; the gpu_state module), through NVML
when pynvml is importable (_nvml) else these queries, and the cheap health read (--query-gpu with
the health fields and --query-remapped-rows, when NVML cannot be loaded), parsed into the
reading of _reading. nvidia-smi runs through _smi.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import sys
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._nvml import import_pynvml, nvml_query
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._reading import new_gpu, note, throttle_names
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._smi import (
    CSV_FORMAT,
    GpuError,
    GpuParseError,
    Pending,
    flag,
    is_unavailable,
    number,
    to_int,
)

QUERY_GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
# process_name is free text (paths with spaces or commas): it must stay LAST.
QUERY_APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")

NO_PROCESSES = "no running processes found"

# nvidia-smi --query-gpu fields of the cheap health read, in order; pci.bus_id ties Xid events to a GPU.
HEALTH_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version", "persistence_mode",
                 "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
                 "clocks_event_reasons.active", "pcie.link.gen.current", "pcie.link.gen.max",
                 "pcie.link.width.current", "pcie.link.width.max", "mig.mode.current", "mig.mode.pending")
# Drivers before clocks_event_reasons (R535) name the same bitmask so.
LEGACY_FIELDS = tuple("clocks_throttle_reasons.active" if f == "clocks_event_reasons.active" else f for f in HEALTH_FIELDS)
REMAPPED_FIELDS = ("gpu_uuid", "remapped_rows.pending", "remapped_rows.failure", "remapped_rows.correctable",
                   "remapped_rows.uncorrectable")


# --------------------------------------------------------------------------- argv


def query_gpu_argv(nvidia_smi, fields=QUERY_GPU_FIELDS):
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), CSV_FORMAT]


def query_apps_argv(nvidia_smi, fields=QUERY_APP_FIELDS):
    return [nvidia_smi, "--query-compute-apps=" + ",".join(fields), CSV_FORMAT]


def health_argv(nvidia_smi, fields=HEALTH_FIELDS):
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), CSV_FORMAT]


def remapped_argv(nvidia_smi):
    return [nvidia_smi, "--query-remapped-rows=" + ",".join(REMAPPED_FIELDS), CSV_FORMAT]


# --------------------------------------------------------------------------- runs


def run_queries(nvidia_smi, timeout, apps=True):
    """Run the GPU and compute-apps queries concurrently; return (gpu_text, apps_text, seconds).
    apps may be a function, called once the GPU query has started with the set of that
    nvidia-smi's PID (a scan of open device files must leave it out): the compute-apps query
    runs only if it returns true (else apps_text is None), still beside the GPU query. The time
    the function takes counts neither against command_timeout nor in seconds."""
    started = time.monotonic()
    gpu_cmd = Pending(query_gpu_argv(nvidia_smi), timeout)
    decided = 0.0
    try:
        if callable(apps):
            apps = apps({gpu_cmd.proc.pid})
            decided = time.monotonic() - started
            gpu_cmd.discount(decided)
        apps_cmd = Pending(query_apps_argv(nvidia_smi), timeout) if apps else None
    except BaseException:
        gpu_cmd._kill()
        raise
    if apps_cmd is None:
        return gpu_cmd.wait(), None, time.monotonic() - started - decided
    try:
        gpu_text = gpu_cmd.wait()
    except GpuError:
        apps_cmd._kill()
        raise
    apps_text = apps_cmd.wait()
    return gpu_text, apps_text, time.monotonic() - started - decided


def run_health(nvidia_smi, timeout):
    """The cheap read: --query-gpu and --query-remapped-rows at once. Returns (gpu_text, remapped_text)."""
    remapped = Pending(remapped_argv(nvidia_smi), timeout)
    try:
        try:
            gpu_text = Pending(health_argv(nvidia_smi), timeout).wait()
        except GpuError as exc:
            if exc.kind != "usage" or "clocks_event_reasons" not in str(exc):
                raise
            gpu_text = Pending(health_argv(nvidia_smi, LEGACY_FIELDS), timeout).wait()
    except BaseException:
        remapped._kill()
        raise
    try:
        return gpu_text, remapped.wait()
    except GpuError:
        return gpu_text, None  # a GPU without row remapping (before Ampere) or a driver without the query


# --------------------------------------------------------------------------- parsing


def split_row(line, nfields, free):
    """Split one CSV row into nfields values; the free-text field ``free`` absorbs extra commas."""
    parts = line.split(",")
    if len(parts) < nfields:
        raise GpuParseError("nvidia-smi returned %d fields where %d were asked, in line %r"
                            % (len(parts), nfields, line))
    if len(parts) > nfields:
        tail = nfields - free - 1
        end = len(parts) - tail
        parts = parts[:free] + [",".join(parts[free:end])] + parts[end:]
    return [p.strip() for p in parts]


def _rows(text, fields, free):
    header_start = fields[0]
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.lower().startswith(NO_PROCESSES):
            continue
        if line.split(",")[0].strip().split(" ")[0] == header_start:
            continue  # a header line, should one be there
        yield line, split_row(line, len(fields), free)


def parse_gpus(text):
    gpus = []
    for line, (index, uuid, name, used, total, util) in _rows(text, QUERY_GPU_FIELDS, 2):
        idx = to_int(index, "index", line)
        if idx is None:
            raise GpuParseError("nvidia-smi returned no index in line %r" % line)
        gpus.append({
            "index": idx,
            "uuid": None if is_unavailable(uuid) else uuid,
            "name": None if is_unavailable(name) else name,
            "memory_used_mib": to_int(used, "memory.used", line),
            "memory_total_mib": to_int(total, "memory.total", line),
            "utilization_pct": to_int(util, "utilization.gpu", line),
        })
    return gpus


def _app_row(line):
    """The four fields of a compute-app row, or None for a line that starts no row (the rest of
    the name before it: a process names itself with any bytes, newlines included)."""
    parts = line.split(",")
    if len(parts) < len(QUERY_APP_FIELDS) or not parts[0].strip().startswith(("GPU-", "MIG-")):
        return None
    pid = parts[1].strip()
    if not (pid.isascii() and pid.isdigit()) and not is_unavailable(pid):
        return None
    return split_row(line, len(QUERY_APP_FIELDS), 3)


def parse_apps(text):
    """The compute apps nvidia-smi lists. A line that starts no row continues the name of the row
    before it (a process name holding a newline); one before any row is skipped: a malformed
    line is its own problem, never the whole reading's."""
    apps = []
    last = None
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line.lower().startswith(NO_PROCESSES):
            continue
        row = _app_row(line)
        if row is None:
            if last is not None and last["name"] is not None:
                last["name"] += "\n" + raw.rstrip("\r")
            continue
        gpu_uuid, pid, used, name = row
        last = None
        if is_unavailable(pid):
            continue  # a process nvidia-smi cannot name is no one we can act on
        try:
            used_mib = to_int(used, "used_memory", line)
        except GpuParseError:
            used_mib = None  # still a holder of the GPU, its memory unknown
        last = {"gpu_uuid": gpu_uuid, "pid": int(pid), "used_memory_mib": used_mib, "name": None if is_unavailable(name) else name}
        apps.append(last)
    return apps


def parse_health(text, remapped_text=None):
    """(driver_version, gpus) of the cheap query (HEALTH_FIELDS), with --query-remapped-rows where it answered."""
    gpus, driver = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        v = split_row(line.strip(), len(HEALTH_FIELDS), 2)
        gpu = new_gpu(number(v[0]))
        if gpu["index"] is None:
            raise ValueError("nvidia-smi returned no index in line %r" % line)
        gpu.update(uuid=v[1], name=v[2], pci=v[3])
        driver = driver or v[4]
        for field, value in zip(HEALTH_FIELDS[5:], v[5:]):
            note(gpu, field, value)
        gpu["persistence_mode"] = flag(v[5])
        gpu["ecc"].update(volatile_uncorrected=number(v[6]), aggregate_uncorrected=number(v[7]))
        gpu["retired_pages"]["pending"] = flag(v[8])
        if not is_unavailable(v[9]):
            try:
                bits = int(v[9], 16)
            except ValueError:
                bits = None
            gpu["throttle"] = None if bits is None else throttle_names(bits)
        gpu["pcie"] = {"gen": number(v[10]), "max_gen": number(v[11]), "width": number(v[12]), "max_width": number(v[13])}
        gpu["mig"].update(current=flag(v[14]), pending=flag(v[15]))
        gpus.append(gpu)
    by_uuid = dict((g["uuid"], g) for g in gpus)
    for line in (remapped_text or "").splitlines():
        v = [p.strip() for p in line.split(",")]
        gpu = by_uuid.get(v[0]) if len(v) == len(REMAPPED_FIELDS) else None
        if gpu is not None and not is_unavailable(v[1]):
            gpu["remapped_rows"] = {"pending": flag(v[1]), "failed": flag(v[2]), "correctable": number(v[3]),
                                    "uncorrectable": number(v[4])}
    for gpu in gpus:
        if gpu["remapped_rows"]["pending"] is None:
            gpu["not_reported"]["remapped_rows"] = "not answered by --query-remapped-rows"
    return driver, gpus


# --------------------------------------------------------------------------- one state reading


def read_gpus(backend, nvidia_smi, timeout, pynvml=None, apps=True):
    """One reading of every GPU: (gpus, apps, backend_used, seconds).

    backend: "nvidia-smi", "nvml", or "auto" (NVML when importable and it initialises,
    else nvidia-smi). nvidia_smi may be None when it is not installed. apps: whether nvidia-smi
    is asked for its process list too, or a function deciding it while the GPU query runs
    (run_queries); when not asked, apps is None. NVML lists the processes in the same reading
    and returns them whatever apps says.
    """
    if backend in ("auto", "nvml"):
        lib = pynvml if pynvml is not None else import_pynvml()
        if lib is None and backend == "nvml":
            raise GpuError("backend=nvml but the pynvml module (nvidia-ml-py) is not importable by %s"
                           % sys.executable, kind="nvml")
        if lib is not None:
            try:
                gpus, apps, seconds = nvml_query(lib)
                return gpus, apps, "nvml", seconds
            except GpuError:
                if backend == "nvml" or not nvidia_smi:
                    raise
                # auto: let nvidia-smi say what is wrong, with its exit code.
    if not nvidia_smi:
        raise GpuError("nvidia-smi was not found on PATH (a host without an NVIDIA driver?); set "
                       "nvidia_smi to its path, or require_gpu=false to let a host without a GPU pass",
                       kind="missing")
    gpu_text, apps_text, seconds = run_queries(nvidia_smi, timeout, apps=apps)
    return parse_gpus(gpu_text), None if apps_text is None else parse_apps(apps_text), "nvidia-smi", seconds
