# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Processes that hold GPUs, read from /proc.

- Node vantage: a holder's host PID maps to its LXC container through /proc/<pid>/cgroup
  (``.../lxc/<vmid>/...`` as Proxmox VE writes it, or ``lxc.payload.<vmid>``) and to its
  PID inside the container through ``NSpid:`` in /proc/<pid>/status.
- Container vantage: holders are the processes with an open handle on a device file
  matching the patterns (``/dev/nvidia*``) in /proc/*/fd.
- Which processes a scope chooses is proc/_scope.py's; find_processes() applies a Scope here.
- Termination is proc/_terminate.py's, on the start times read here.
- Protection (protection()): the init of any PID namespace (PID 1 of the node, ``NSpid`` ending
  in 1 for a container's), kernel threads (told by the PF_KTHREAD flag, not by their PID: in a
  container's namespace PID 2 is an ordinary process), this process and its ancestors are never
  signalled; a scope that matches them says so.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import current_view, getpwuid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._cgroup import vmid_of_cgroup

PROC = "/proc"
DEFAULT_DEVICE_PATTERNS = ("/dev/nvidia*",)

_MINOR_RE = re.compile(r"nvidia(\d+)$")
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


def proc_file(path):
    """The bytes of a /proc file: on a container read from its node, from the node's /proc as the
    container would see it (view/_view), never from the container's own procfs."""
    return _read(path, binary=True)


def _read(path, binary=False):
    """A /proc file's bytes (or text). A container read from its node: from the node's /proc,
    as the container would see it (view/_view), never from the container's own procfs."""
    view = current_view()
    if view is not None:
        data = view.read_proc(path)
        if data is None:  # not a /proc path: no process fact of the container's
            raise FileNotFoundError(errno.ENOENT, "not a /proc file", path)
    else:
        with open(path, "rb") as f:
            data = f.read()
    # A process names itself (prctl PR_SET_NAME) with any bytes: its stat line must still be
    # read, or that process would look gone and be neither listed nor stopped.
    return data if binary else data.decode("utf-8", "replace")


# --------------------------------------------------------------------------- one process


def parse_stat(text):
    """(comm, state, ppid, start_time) from /proc/<pid>/stat; comm may hold spaces and ')'."""
    left = text.index("(")
    right = text.rindex(")")
    comm = text[left + 1:right]
    rest = text[right + 2:].split()
    # rest[0] is field 3 (state); field 22 (starttime, clock ticks since boot) is rest[19].
    return comm, rest[0], int(rest[1]), int(rest[19])


def read_stat(pid, proc=PROC):
    """parse_stat() of a live PID, or None when it is gone."""
    try:
        return parse_stat(_read("%s/%d/stat" % (proc, pid)))
    except (IOError, OSError, ValueError, IndexError):
        return None


def start_time(pid, proc=PROC):
    st = read_stat(pid, proc)
    return None if st is None else st[3]


def process_start(started):
    """When a process started, in seconds since the epoch, from its start time (clock ticks since
    boot, field 22 of /proc/<pid>/stat) and the boot-time clock the kernel counts it on, in any
    container. The boot's wall time is rounded to the second: two reads agree on it."""
    try:
        booted = round(time.time() - time.clock_gettime(time.CLOCK_BOOTTIME))
        return int(booted + started / os.sysconf("SC_CLK_TCK"))
    except (AttributeError, OSError, ValueError, TypeError):
        return None


def is_alive(pid, started, proc=PROC):
    """The process chosen at ``started`` still exists (not a zombie, not a reused PID)."""
    st = read_stat(pid, proc)
    return st is not None and st[1] not in ("Z", "X") and st[3] == started


def parse_status(text):
    """(real uid, NSpid list) from /proc/<pid>/status."""
    uid, nspid = None, []
    for line in text.splitlines():
        fields = line.split()
        if line.startswith("Uid:") and len(fields) > 1 and fields[1].isascii() and fields[1].isdigit():
            uid = int(fields[1])
        elif line.startswith("NSpid:") and all(x.isascii() and x.isdigit() for x in fields[1:]):
            nspid = [int(x) for x in fields[1:]]
    return uid, nspid


_USER_NAMES = {}


def user_name(uid):
    if uid is None:
        return None
    if current_view() is not None:  # the container's user of that uid, from its /etc/passwd (not this host's cache)
        try:
            return getpwuid(uid).pw_name
        except KeyError:
            return str(uid)
    if uid not in _USER_NAMES:
        try:
            _USER_NAMES[uid] = getpwuid(uid).pw_name
        except KeyError:
            _USER_NAMES[uid] = str(uid)
    return _USER_NAMES[uid]


def stat_flags(text):
    """The kernel's per-task flags (field 9 of /proc/<pid>/stat), or None when unreadable."""
    try:
        return int(text[text.rindex(")") + 2:].split()[6])
    except (ValueError, IndexError):
        return None


def is_kernel_thread(flags, cmdline, ppid):
    """A kernel thread, by what it is: the PF_KTHREAD flag; where the flags cannot be read, no
    command line and kthreadd (PID 2 with no parent) or its child. Not by number: inside a
    container's PID namespace PID 2 and its children are ordinary processes."""
    if flags is not None:
        return bool(flags & PF_KTHREAD)
    return not cmdline and ppid in (0, 2)


def describe(pid, proc=PROC):
    """What /proc says about a PID: a dict, or None when it is gone."""
    try:
        text = _read("%s/%d/stat" % (proc, pid))
        comm, state, ppid, started = parse_stat(text)
    except (IOError, OSError, ValueError, IndexError):
        return None
    if state in ("Z", "X"):
        return None
    info = {"pid": pid, "ppid": ppid, "start_time": started, "comm": comm, "uid": None, "user": None,
            "cmdline": "", "container_pid": None, "vmid": None, "state": state}
    with contextlib.suppress(IOError, OSError):
        argv = _read("%s/%d/cmdline" % (proc, pid), binary=True).split(b"\0")
        info["cmdline"] = " ".join(a.decode("utf-8", "replace") for a in argv if a)
    info["kthread"] = is_kernel_thread(stat_flags(text), info["cmdline"], ppid)
    try:
        uid, nspid = parse_status(_read("%s/%d/status" % (proc, pid)))
        info["uid"], info["user"] = uid, user_name(uid)
        if nspid:
            info["container_pid"] = nspid[-1]
    except (IOError, OSError, ValueError):
        pass
    with contextlib.suppress(IOError, OSError):
        info["vmid"] = vmid_of_cgroup(_read("%s/%d/cgroup" % (proc, pid)))
    return info


def wchan(pid, proc=PROC):
    """The kernel function a sleeping process waits in (/proc/<pid>/wchan), or None."""
    try:
        text = _read("%s/%d/wchan" % (proc, pid)).strip()
    except (IOError, OSError):
        return None
    return text if text and text != "0" else None


def stuck_text(pid, proc=PROC):
    """'state D (uninterruptible sleep, in <wchan>)' for a process stuck in the kernel, else ''."""
    st = read_stat(pid, proc)
    if st is None or st[1] != "D":
        return ""
    where = wchan(pid, proc)
    return "state D (uninterruptible sleep%s)" % (", in %s" % where if where else "")


# What to do about a process that SIGKILL does not end (said by every module that kills).
STUCK_ADVICE = (
    "A process in state D waits inside the kernel and cannot be killed until that call returns, usually "
    "on a GPU driver in trouble or on storage (a hung NFS or FUSE mount); the GPU memory it holds is "
    "freed only when it exits. Look at /proc/<pid>/stack and the node's kernel log (dmesg, Xid errors); "
    "if it never exits, reset the GPU or reboot the node, then run again")


def ancestors(pid=None, proc=PROC):
    """This process and every ancestor up to PID 1 (the PIDs a module must never signal)."""
    pid = os.getpid() if pid is None else pid
    seen = set()
    while pid and pid not in seen:
        seen.add(pid)
        st = read_stat(pid, proc)
        if st is None:
            break
        pid = st[2]
    return seen


def _listdir(path):
    view = current_view()
    names = view.listdir(path) if view is not None else None
    return _root.listdir(path) if names is None else names


def _readlink(path):
    view = current_view()
    target = view.readlink(path) if view is not None else None
    return _root.readlink(path) if target is None else target


def all_pids(proc=PROC):
    return [int(e) for e in _listdir(proc) if e.isdigit()]


_FOUND_KEYS = ("pid", "ppid", "user", "comm", "cmdline", "start_time")


def protection(info, own=()):
    """Why a process must never be signalled, whatever the scope, or None.

    ``info``: describe()'s dict (``pid``, ``container_pid``, ``kthread``); ``own``: this
    process and its ancestors (ancestors()). The one rule every module that kills applies."""
    if info.get("pid") == 1 or info.get("container_pid") == 1:
        where = "the node's" if info.get("pid") == 1 else "its container's"
        return ("PID 1 (NSpid ends in 1): the init of %s PID namespace, which takes the namespace down with it; "
                "never signalled" % where)
    if info.get("kthread"):
        return "a kernel thread (PF_KTHREAD): never signalled"
    if info.get("pid") in own:
        return "this module's own process or one of its ancestors"
    return None


def _entry(info, **extra):
    return dict(((k, info.get(k)) for k in _FOUND_KEYS), started_at=process_start(info.get("start_time")), **extra)


def find_processes(scope, proc=PROC, with_descendants=False, protected=None):
    """The processes that match a Scope, less those protection() refuses.

    Kernel threads are never looked at. A match that protection() refuses is appended to
    ``protected`` (when a list is given) with its ``reason``. With ``with_descendants``, the
    descendants of every match are in it too (as long as they pass the scope's users), each
    naming the matching ancestor it came from in ``descendant_of``; the walk does not go below
    a namespace's init (another container is not a job's worker)."""
    own = ancestors(proc=proc)
    refused = [] if protected is None else protected
    found = []
    # Every criterion must match: a scope that lists PIDs need not read the others.
    for pid in sorted(scope.pids) if scope.pids else sorted(all_pids(proc)):
        info = describe(pid, proc)
        if info is None or info["kthread"]:
            continue  # gone, a zombie, or a kernel thread
        ok, _reason = scope.matches(info)
        if not ok:
            continue
        why = protection(info, own)
        if why:
            refused.append(_entry(info, reason=why))
        else:
            found.append(_entry(info, descendant_of=None))
    if with_descendants and found:
        found.extend(_descendants_of(found, scope, own, refused, proc))
    return found


def _descendants_of(found, scope, own, refused, proc):
    extra, infos = [], {}

    def info_of(pid):
        if pid not in infos:
            infos[pid] = describe(pid, proc)
        return infos[pid]

    def prune(pid):  # a namespace's init: neither it nor its namespace is the job's
        info = info_of(pid)
        return info is not None and info["container_pid"] == 1

    for pid, root in walk_descendants([f["pid"] for f in found], proc, skip=own, prune=prune):
        info = info_of(pid)
        if info is None or info["kthread"]:
            continue
        if scope.users and not scope.user_matches(info):
            continue
        why = protection(info, own)
        if why:
            refused.append(_entry(info, reason=why, descendant_of=root))
        else:
            extra.append(_entry(info, descendant_of=root))
    return sorted(extra, key=lambda f: f["pid"])


def children_map(proc=PROC):
    kids = {}
    for pid in all_pids(proc):
        st = read_stat(pid, proc)
        if st is not None:
            kids.setdefault(st[2], []).append(pid)
    return kids


def walk_descendants(roots, proc=PROC, skip=(), prune=None):
    """``(pid, root)`` for every descendant of ``roots``: each under the first root whose tree
    reaches it; a root, or a PID in ``skip``, is neither given nor walked below; a PID for which
    ``prune(pid)`` is true is given but not walked below."""
    kids = children_map(proc)
    seen = set(roots) | set(skip)
    for root in roots:
        todo = list(kids.get(root, []))
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            if prune is None or not prune(pid):
                todo.extend(kids.get(pid, []))
            yield pid, root


def descendants(roots, proc=PROC):
    """``roots`` and every descendant of theirs."""
    return set(roots) | set(pid for pid, _root in walk_descendants(roots, proc))


# --------------------------------------------------------------------------- container vantage


def device_minor(path):
    m = _MINOR_RE.search(os.path.basename(path))
    return int(m.group(1)) if m else None


_DENIED = (errno.EACCES, errno.EPERM)


def open_files(proc=PROC, exclude=(), cwd=False, maps=False):
    """``(pid, paths, denied)`` for every process but those in ``exclude``: the files its
    descriptors name, with ``cwd`` its working directory, with ``maps`` the files it has mapped
    (" (deleted)" left off); ``denied`` when some of them could not be read (another user's
    process, without privilege). Raises OSError when ``proc`` itself cannot be listed."""
    for pid in all_pids(proc):
        if pid in exclude:
            continue
        base = "%s/%d" % (proc, pid)
        paths, denied = [], False
        if cwd:
            try:
                paths.append(_readlink(base + "/cwd"))
            except OSError as exc:
                denied = exc.errno in _DENIED
        try:
            fds = _listdir(base + "/fd")
        except OSError as exc:
            fds = []
            denied = denied or exc.errno in _DENIED
        for fd in fds:
            with contextlib.suppress(OSError):  # closed since the listing
                paths.append(_readlink("%s/fd/%s" % (base, fd)))
        if maps:
            try:
                for line in _read(base + "/maps", binary=True).splitlines(True):
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[5].startswith(b"/"):
                        paths.append(fields[5].rstrip(b"\n").decode("utf-8", "replace"))
            except OSError as exc:
                denied = denied or exc.errno in _DENIED
        yield pid, [path.removesuffix(" (deleted)") for path in paths], denied


def holds_device(pid, patterns=DEFAULT_DEVICE_PATTERNS, proc=PROC):
    """Whether the process has a file matching ``patterns`` open (a GPU's device file); None when
    its descriptors cannot be read."""
    base = "%s/%d/fd" % (proc, pid)
    try:
        fds = _listdir(base)
    except OSError:
        return None
    for fd in fds:
        with contextlib.suppress(OSError):  # closed since the listing
            if any(fnmatch.fnmatchcase(_readlink("%s/%s" % (base, fd)), pat) for pat in patterns):
                return True
    return False


def scan_device_holders(patterns=DEFAULT_DEVICE_PATTERNS, proc=PROC, exclude=()):
    """{pid: sorted device paths} for processes with an open fd on a matching path; and the
    number of processes whose fds could not be read (another user's, without privilege)."""
    holders, unreadable = {}, 0
    for pid, paths, denied in open_files(proc, exclude):
        unreadable += denied
        found = set(path for path in paths if any(fnmatch.fnmatchcase(path, pat) for pat in patterns))
        if found:
            holders[pid] = sorted(found)
    return holders, unreadable


def driver_minor_uuids(proc=PROC):
    """{device minor: GPU UUID} from /proc/driver/nvidia/gpus/*/information, where present."""
    out = {}
    base = os.path.join(proc, "driver", "nvidia", "gpus")
    try:
        entries = _listdir(base)
    except OSError:
        return out
    for entry in entries:
        try:
            text = _read(os.path.join(base, entry, "information"))
        except (IOError, OSError):
            continue
        minor = uuid = None
        for line in text.splitlines():
            key, _sep, value = line.partition(":")
            key = key.strip()
            if key == "Device Minor":
                with contextlib.suppress(ValueError):
                    minor = int(value.strip())
            elif key == "GPU UUID":
                uuid = value.strip()
        if minor is not None and uuid:
            out[minor] = uuid
    return out


# --------------------------------------------------------------------------- vantage


def detect_vantage(root="/"):
    """'container' when this runs inside a container (LXC, systemd-nspawn, Docker, Podman), else 'node'."""
    for marker in ("run/systemd/container", ".dockerenv", "run/.containerenv"):
        if _root.exists(os.path.join(root, marker)):
            return "container"
    try:
        env = _read(os.path.join(root, "proc", "1", "environ"), binary=True)
        if any(v.startswith(b"container=") for v in env.split(b"\0")):
            return "container"
    except (IOError, OSError):
        pass
    return "node"
