# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Xid events from the kernel log, and what the common codes mean and ask for.

The driver writes, as the whole message of a kernel log record (open-gpu-kernel-modules'
format strings; older drivers leave out ``PCI:``)::

    NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text
    NVRM: Xid (PCI:0000:3b:00): 48, text                          (no process known)
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01): 94, pid=..., text         (MIG: a GPU instance)
    NVRM: Xid (PCI:0000:3b:00 GPU-I:01 GPU-CI:00): 13, pid=..., text (MIG: and a compute instance)

Only such a message counts: the pattern is anchored at the start of the message (after the
kernel's own prefix: the /dev/kmsg record header, or dmesg's timestamp), so a line that merely
holds that text (a path another kernel message quotes, a user's own line) is no event. From
/dev/kmsg only records of the kernel facility (0) count: a process that writes to /dev/kmsg
gets the user facility whatever it asks; dmesg is asked for the kernel facility only. The log
is read from /dev/kmsg (non-blocking, each record once; the device checked to be the kernel's)
or, where that cannot be opened, from ``dmesg --time-format iso --facility kern``. Events older
than the read's bound (``since``: by default the last 24 hours) are left out. A log that cannot
be read (dmesg_restrict, an unprivileged container) is a finding of its own, never a failure of
the whole read.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import datetime
import errno
import os
import re
import stat
import subprocess
import time

# code: (severity, meaning, action), after NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors).
# "fail" marks a GPU that should not take a new job before the action; "warn" is most often the
# application's own fault and asks to look, not to act on the GPU.
XID_CODES = {
    13: ("warn", ("Graphics Engine Exception: a kernel faulted (often the application: out-of-range access, illegal "
                  "instruction)"), "restart the application; if it recurs on this GPU only, run diagnostics (dcgmi diag)"),
    31: ("warn", "GPU memory page fault (MMU fault): the application accessed an invalid address",
         "restart the application; if it recurs across applications, reset the GPU and run diagnostics"),
    43: ("warn", "GPU stopped processing: the application hit a fault and its channel was reset; the GPU stays usable",
         "restart the application"),
    45: ("warn", "Preemptive cleanup: the driver ended the channels of a process, after another error or a kill",
         "look at the Xid logged before it; alone it needs no action"),
    48: ("fail", "Double Bit ECC Error (DBE): uncorrectable memory error",
         "drain the GPU and reset it; if it recurs or row remapping fails, RMA"),
    63: ("fail", "ECC page retirement or row remapping recorded: a row is marked for remapping",
         "drain and reset the GPU to apply the remapping (no RMA yet)"),
    64: ("fail", "ECC page retirement or row remapping recording failure",
         "drain the GPU and RMA it (the memory can no longer be repaired in the field)"),
    74: ("fail", "NVLink error: a link between GPUs reported a fault",
         "drain and reset the GPU (all GPUs of the NVLink domain if needed); if it recurs, check the links and RMA"),
    79: ("fail", "GPU has fallen off the bus: it no longer answers on PCIe",
         "drain the node and reboot (power-cycle) it; if it recurs, check PCIe, power and cooling, then RMA"),
    92: ("warn", "High single-bit ECC error rate", "watch the ECC counters; reset the GPU at the next drain, RMA if it persists"),
    94: ("fail", "Contained ECC error: uncorrectable, limited to the application that touched the memory",
         "restart the affected application; reset the GPU at the next drain to remap the row"),
    95: ("fail", "Uncontained ECC error: every application on the GPU is affected",
         "drain the GPU and reset it; if it recurs, RMA"),
    119: ("fail", "GSP RPC timeout: the GPU System Processor did not answer the driver",
          "drain and reset the GPU; if it recurs, reboot the node and update the driver, then contact support"),
}
UNKNOWN_XID = ("warn", "Xid not in this collection's table", "look it up in NVIDIA's Xid catalog")

# The message's start: anchored (re.match), the PCI address as the driver prints it (%04x:%02x:%02x,
# a longer domain on hosts with many PCI segments), then the MIG instance parts when there are.
XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?:\.[0-7])?"
                      r"(?: GPU-I:(?P<gi>\d{1,3}))?(?: GPU-CI:(?P<ci>\d{1,3}))?\): (?P<code>\d{1,5}),[ ]?(?P<rest>.*)\Z",
                      re.DOTALL)
# What may precede the message in a dmesg line: the printk caller id (CONFIG_PRINTK_CALLER).
_CALLER = re.compile(r"\[\s*[TC]\d+\] ")
KERNEL_FACILITY = 0
# Xid events are read from this long ago unless told otherwise (gpu_health's since, node_readiness's xid_since).
DEFAULT_SINCE_SECONDS = 86400
_PID = re.compile(r"pid=(\d+|'<unknown>')")
_NAME = re.compile(r"name=([^,]*)")
KMSG = "/dev/kmsg"
KMSG_DEVICE = (1, 11)  # the kernel's /dev/kmsg: character device 1:11


def pci_key(bus_id):
    """A comparable key of a PCI address: ``0000:00:06``, ``00000000:00:06.0`` -> (0, 0, 6); ``00:06``
    (no domain) is domain 0. Anything else (more parts, not hexadecimal) is no address: None."""
    text = (bus_id or "").strip().lower()
    text = text.split(".")[0]
    parts = text.split(":")
    if len(parts) < 3:
        parts = ["0"] + parts
    if len(parts) != 3:
        return None
    try:
        return tuple(int(p, 16) for p in parts)
    except ValueError:
        return None


def explain(code):
    severity, meaning, action = XID_CODES.get(code, UNKNOWN_XID)
    return {"severity": severity, "meaning": meaning, "action": action}


def parse_line(text, when=None):
    """One Xid event of a kernel log message (the text after the kernel's prefix), or None."""
    m = XID_LINE.match(text)
    if not m:
        return None
    code = int(m.group("code"))
    rest = m.group("rest").strip()
    pid = _PID.search(rest)
    name = _NAME.search(rest)
    event = {"pci": m.group("pci").lower(), "xid": code, "time": when,
             "pid": int(pid.group(1)) if pid and pid.group(1).isdigit() else None,
             "process": name.group(1).strip() if name else None, "text": rest}
    if m.group("gi") is not None:
        event["gpu_instance"] = int(m.group("gi"))
    if m.group("ci") is not None:
        event["compute_instance"] = int(m.group("ci"))
    event.update(explain(code))
    return event


def parse_dmesg(text, since=None):
    """Xid events of ``dmesg --time-format iso`` output at or after ``since`` (aware datetime).
    A line without dmesg's timestamp (not a record's start) is no event; with ``since`` given,
    neither is one whose time cannot be read."""
    events = []
    for line in text.splitlines():
        stamp, _sep, rest = line.partition(" ")
        when = _iso(stamp)
        if when is None or (since is not None and when < since):
            continue
        caller = _CALLER.match(rest)
        event = parse_line(rest[caller.end():] if caller else rest, when.isoformat())
        if event:
            events.append(event)
    return events


def _iso(stamp):
    # dmesg writes 2026-12-01T14:03:20,123456+00:00 (a comma before the fraction).
    try:
        return datetime.datetime.fromisoformat(stamp.replace(",", "."))
    except ValueError:
        return None


def parse_kmsg(records, boot, since=None):
    """Xid events of /dev/kmsg records (``prio,seq,usec,flags[,...];text``) of the kernel facility;
    boot is the epoch second of boot. With ``since``, a record without a time is left out too."""
    events = []
    for record in records:
        head, _sep, text = record.partition(";")
        fields = head.split(",")
        if not fields[0].isdigit() or int(fields[0]) >> 3 != KERNEL_FACILITY:
            continue  # a line a process wrote to /dev/kmsg (user facility and above), or no record
        when = None
        if len(fields) >= 3 and fields[2].isdigit():
            when = datetime.datetime.fromtimestamp(boot + int(fields[2]) / 1e6, datetime.timezone.utc)
        if since is not None and (when is None or when < since):
            continue
        event = parse_line(text.split("\n")[0], when.replace(microsecond=0).isoformat() if when else None)
        if event:
            events.append(event)
    return events


def read_kmsg(path=KMSG, limit=200000, device=KMSG_DEVICE):
    """Every record in the ring buffer now, without waiting for new ones. Raises OSError, also for
    a file that is not the character device ``device`` (None: any regular file, for tests)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    records = []
    try:
        st = os.fstat(fd)
        if device is None and stat.S_ISREG(st.st_mode):
            pass
        elif not stat.S_ISCHR(st.st_mode) or (os.major(st.st_rdev), os.minor(st.st_rdev)) != device:
            # A file put in its place (a container's /dev is its root's) is not the kernel's log.
            raise OSError(errno.EPERM, "not the kernel's log device (char 1:11)")
        while len(records) < limit:
            try:
                chunk = os.read(fd, 8192)
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    break  # the end of the buffer
                if exc.errno == errno.EPIPE:
                    continue  # a record was overwritten while read: the next one follows
                raise
            if not chunk:
                break
            records.append(chunk.decode("utf-8", "replace"))
    finally:
        os.close(fd)
    return records


def boot_time(proc="/proc"):
    with open(os.path.join(proc, "uptime")) as f:
        return time.time() - float(f.read().split()[0])


def run_dmesg(dmesg, timeout):
    proc = subprocess.run([dmesg, "--time-format", "iso", "--facility", "kern", "--nopager"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=timeout, env=dict(os.environ, LC_ALL="C", LANG="C"), check=False)
    return proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace")


def read_xid_events(since=None, dmesg=None, timeout=15, kmsg=KMSG, proc="/proc", run=run_dmesg, kmsg_device=KMSG_DEVICE):
    """(events, problem): the Xid events since ``since``; problem is None, or why the log could not be read."""
    try:
        return parse_kmsg(read_kmsg(kmsg, device=kmsg_device), boot_time(proc), since), None
    except OSError as exc:
        first = "%s: %s" % (kmsg, exc.strerror or exc)
    if not dmesg:
        return [], first + "; dmesg is not installed"
    try:
        rc, out, err = run(dmesg, timeout)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], "%s; dmesg: %s" % (first, exc)
    if rc != 0:
        return [], "%s; dmesg (rc=%s): %s" % (first, rc, " ".join(err.split())[:200])
    return parse_dmesg(out, since), None


def parse_since(value, now=None, default=DEFAULT_SINCE_SECONDS):
    """``since`` as an aware datetime: ISO 8601, seconds before now, or None for ``boot`` (the
    whole buffer); unset (None or empty), ``default`` seconds before now (None: the whole buffer)."""
    if value in (None, ""):
        if default is None:
            return None
        value = default
    if value == "boot":
        return None
    text = str(value).strip()
    if re.match(r"^\d+(\.\d+)?$", text):
        now = now or datetime.datetime.now(datetime.timezone.utc)
        return now - datetime.timedelta(seconds=float(text))
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    when = datetime.datetime.fromisoformat(text)  # ValueError: the caller words it
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)
