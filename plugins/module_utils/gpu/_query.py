# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""GPU state from nvidia-smi's query interface (argv, runner, CSV parsing) or from NVML.

One place builds every nvidia-smi argv so it can be unit-tested without a GPU. The runner
bounds every call with a timeout (a GPU in trouble can make nvidia-smi hang) and maps
nvidia-smi's documented exit codes to clear messages. NVML (``import pynvml``, from the
nvidia-ml-py distribution) is used only when it is importable; it is never required.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError

QUERY_GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
# process_name is free text (paths with spaces or commas): it must stay LAST.
QUERY_APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
CSV_FORMAT = "--format=csv,noheader,nounits"

# nvidia-smi(1), RETURN VALUE.
EXIT_CODES = {
    2: ("usage", "nvidia-smi rejected its arguments (an invalid field or option)"),
    3: ("unsupported", "the requested operation is not available on the target device"),
    4: ("permission", "nvidia-smi lacks the permission to perform the query"),
    6: ("no_devices", "nvidia-smi found no NVIDIA GPU (No devices were found)"),
    8: ("power", "the external power cables of a GPU are not attached"),
    9: ("driver", ("the NVIDIA driver is not loaded (nvidia-smi exit code 9); load the kernel module "
                   "(modprobe nvidia) or reinstall the driver")),
    10: ("interrupt", "the NVIDIA kernel module detected an interrupt issue with a GPU"),
    12: ("nvml", ("the NVML shared library libnvidia-ml.so was not found (nvidia-smi exit code 12); "
                  "the driver's user-space libraries are missing or do not match")),
    13: ("nvml", "the installed NVML does not implement a function nvidia-smi needs"),
    14: ("inforom", "the infoROM of a GPU is corrupted"),
    15: ("bus", ("a GPU has fallen off the bus or is otherwise inaccessible (nvidia-smi exit code 15; "
                 "the node's kernel log typically shows Xid 79); the node needs a GPU reset or a reboot, nothing in "
                 "the container can fix it")),
    255: ("failed", "nvidia-smi failed with an internal or driver error"),
}

# Kinds of failure a host without a (working) GPU produces; require_gpu=false tolerates them.
NO_GPU_KINDS = ("missing", "no_devices", "driver", "nvml")

NO_PROCESSES = "no running processes found"


class GpuError(GpufleetError):
    """A failure to read GPU state; ``kind`` says which (see EXIT_CODES, NO_GPU_KINDS). It is
    returned with the failure as ``error_kind``, beside ``rc`` and ``gpu_available: false``."""

    def __init__(self, msg, kind="failed", rc=None, partial=None):
        if partial is None:
            partial = {"gpu_available": False, "error_kind": kind, "rc": rc}
        super(GpuError, self).__init__(msg, partial)
        self.kind = kind
        self.rc = rc


class GpuParseError(GpuError):
    def __init__(self, msg):
        super(GpuParseError, self).__init__(msg, kind="parse")


# --------------------------------------------------------------------------- argv


def query_gpu_argv(nvidia_smi, fields=QUERY_GPU_FIELDS):
    return [nvidia_smi, "--query-gpu=" + ",".join(fields), CSV_FORMAT]


def query_apps_argv(nvidia_smi, fields=QUERY_APP_FIELDS):
    return [nvidia_smi, "--query-compute-apps=" + ",".join(fields), CSV_FORMAT]


# --------------------------------------------------------------------------- runner


class Pending(object):
    """A started command; ``wait()`` returns its stdout or raises GpuError."""

    def __init__(self, argv, timeout):
        self.argv = list(argv)
        self.timeout = timeout
        self.started = time.monotonic()
        env = dict(os.environ, LC_ALL="C", LANG="C")
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            kind = "missing" if isinstance(exc, FileNotFoundError) else "failed"
            raise GpuError("cannot run %s: %s" % (self.argv[0], exc.strerror or exc), kind=kind) from exc

    def discount(self, seconds):
        """Time spent elsewhere while it ran: not counted against its timeout, nor in its seconds."""
        self.started += seconds

    def wait(self):
        remaining = max(0.0, self.timeout - (time.monotonic() - self.started))
        try:
            out, err = self.proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired as exc:
            self._kill()
            raise GpuError(
                "%s did not answer within %ss (command_timeout) and was killed. A hung nvidia-smi usually "
                "means a GPU or the driver is in trouble: check the node's kernel log (dmesg) for Xid errors, "
                "then reset the GPU or reboot the node. If the GPUs are only slow to answer, raise "
                "command_timeout (gpufleet_nvidia_smi_timeout for the roles and playbooks)"
                % (" ".join(self.argv), self.timeout),
                kind="timeout") from exc
        self.seconds = time.monotonic() - self.started
        out = out.decode("utf-8", "replace")
        err = err.decode("utf-8", "replace")
        if self.proc.returncode != 0:
            raise exit_error(self.argv, self.proc.returncode, out, err)
        return out

    def _kill(self):
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        try:
            # A process stuck in the driver (state D) may not die at once: do not wait forever.
            self.proc.communicate(timeout=2)
        except subprocess.TimeoutExpired:
            for stream in (self.proc.stdout, self.proc.stderr):
                with contextlib.suppress(OSError):
                    stream.close()


def exit_error(argv, rc, out, err):
    kind, what = EXIT_CODES.get(rc, ("failed", "nvidia-smi failed"))
    detail = " ".join((err.strip() or out.strip()).split())
    if len(detail) > 400:
        detail = detail[:400] + "..."
    msg = "%s (rc=%s): %s" % (what, rc, " ".join(argv))
    if detail:
        msg += ": " + detail
    return GpuError(msg, kind=kind, rc=rc)


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


# --------------------------------------------------------------------------- parsing


def is_unavailable(value):
    """nvidia-smi's placeholders: [N/A], [Not Supported], [Unknown Error], [GPU is lost], ..."""
    v = value.strip()
    return not v or v.upper() in ("N/A", "NA") or (v.startswith("[") and v.endswith("]"))


def to_int(value, field, line):
    if is_unavailable(value):
        return None
    v = value.strip()
    for unit in ("MiB", "%", "W", "C"):
        if v.endswith(unit):
            v = v[:-len(unit)].strip()
            break
    try:
        return int(float(v))
    except ValueError as exc:
        raise GpuParseError("nvidia-smi returned %r for %s in line %r" % (value, field, line)) from exc


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


def parse_apps(text):
    apps = []
    for line, (gpu_uuid, pid, used, name) in _rows(text, QUERY_APP_FIELDS, 3):
        p = to_int(pid, "pid", line)
        if p is None:
            continue  # a process nvidia-smi cannot name is no one we can act on
        apps.append({
            "gpu_uuid": gpu_uuid,
            "pid": p,
            "used_memory_mib": to_int(used, "used_memory", line),
            "name": None if is_unavailable(name) else name,
        })
    return apps


# --------------------------------------------------------------------------- NVML


def import_pynvml():
    try:
        import pynvml  # pylint: disable=import-error
    except Exception:  # noqa: BLE001  ImportError, or a broken install: NVML is optional
        return None
    return pynvml


def _text(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _nvml_kind(pynvml, exc):
    for attr, kind in (("NVMLError_DriverNotLoaded", "driver"), ("NVMLError_LibraryNotFound", "nvml"),
                       ("NVMLError_GpuIsLost", "bus"), ("NVMLError_FunctionNotFound", "nvml")):
        cls = getattr(pynvml, attr, None)
        if cls is not None and isinstance(exc, cls):
            return kind
    return "failed"


def _nvml_memory(pynvml, handle, error):
    """(used, total) bytes as nvidia-smi reports them.

    NVML's first memory API counts what the driver reserves for itself as used (about
    600 MiB on an idle H200, where nvidia-smi shows 0 MiB), so a drained GPU would never
    look idle. The v2 API reports that reservation apart; use it wherever it exists.
    """
    version = getattr(pynvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return int(mem.used), int(mem.total)
        except (error, TypeError):
            pass  # an older driver or binding: fall back to the first API
    mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
    return int(mem.used), int(mem.total)


def nvml_query(pynvml):
    """The same data as run_queries + parse_*, read through NVML. Returns (gpus, apps, seconds)."""
    started = time.monotonic()
    error = getattr(pynvml, "NVMLError", Exception)
    try:
        pynvml.nvmlInit()
    except error as exc:
        raise GpuError("NVML initialisation failed: %s" % exc, kind=_nvml_kind(pynvml, exc)) from exc
    try:
        gpus, apps = [], []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            used, total = _nvml_memory(pynvml, handle, error)
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except error:
                util = None
            gpus.append({
                "index": index, "uuid": uuid, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                "memory_used_mib": used // 1048576, "memory_total_mib": total // 1048576,
                "utilization_pct": util,
            })
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except error:
                procs = []
            for p in procs:
                used = getattr(p, "usedGpuMemory", None)
                try:
                    name = _text(pynvml.nvmlSystemGetProcessName(p.pid))
                except error:
                    name = None
                apps.append({"gpu_uuid": uuid, "pid": int(p.pid),
                             "used_memory_mib": None if used is None else int(used) // 1048576, "name": name})
    except error as exc:
        raise GpuError("NVML query failed: %s" % exc, kind=_nvml_kind(pynvml, exc)) from exc
    finally:
        with contextlib.suppress(error):
            pynvml.nvmlShutdown()
    return gpus, apps, time.monotonic() - started


# --------------------------------------------------------------------------- one reading


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
