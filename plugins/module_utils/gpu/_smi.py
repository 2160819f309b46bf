# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Running nvidia-smi and reading its values: one bounded runner (a GPU in trouble can make
nvidia-smi hang), its documented exit codes mapped to clear messages, and the value readers every
nvidia-smi output needs (placeholders such as [N/A], numbers with units, yes/no flags).

The --query-gpu CSV reads (_query) and the -q -x read (_xml) run nvidia-smi through here.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError

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


# --------------------------------------------------------------------------- values


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


def number(text):
    """The leading integer of a value ("80 %", "4"), None for a placeholder."""
    if text is None or is_unavailable(text):
        return None
    m = re.match(r"^\s*(-?\d+)", text)
    return int(m.group(1)) if m else None


def flag(text):
    """A yes/no value (Yes, Enabled, Active, 1) as a bool, None for a placeholder."""
    if text is None or is_unavailable(text):
        return None
    return text.strip().lower() in ("yes", "enabled", "active", "1", "true")
