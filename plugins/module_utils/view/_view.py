# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A running LXC container seen from its Proxmox VE node: the node read's container view.

The node reads its containers in its own process (node_readiness), nothing of a container
executed and nothing of it taken for code. For each running container it finds, in the node's
/proc (scanned once for all of them), the container's processes by the cgroup the node made for
it (view/_cgroup) with their PID inside the container (the last ``NSpid:`` field), its init (the
process whose PID there is 1), and opens:

- ``/proc/<init pid>/root`` once, as a directory handle: the container's root, a fs/_root.Root;
- ``/proc/<host pid>`` of each of its processes, as a directory handle: a handle stays bound to
  its process, so a PID reused meanwhile by another process is never read in its place;
- its ``uid_map`` / ``gid_map``: owners and process users as the container sees them.

``run(view, work, seconds)`` runs a read in a thread of its own that has entered the view's Root
(fs/_root.inside): every path the readers give fs/_root resolves inside the container's root
(openat2 ``RESOLVE_IN_ROOT``), while the thread's own root, the C library and Python stay the
node's. Within it (current() is its view):

- ``/proc/...`` as the readers spell it (proc/_proc) is read from the node's /proc, never the
  container's procfs (its root could mount anything there): ``/proc/<pid>/…`` through that
  process's handle, its PIDs, user and group ids turned into the container's; listing ``/proc``
  lists the container's processes; ``/proc/self`` is no process of the container's; the rest
  (``/proc/driver/...``) is the node kernel's, the same the container would see;
- users and homes come from the container's ``/etc/passwd`` parsed as bytes (view/_accounts);
- an audit hook refuses to start any program or to load any library (ctypes): nothing of the
  container can run in the node's process, whatever a reader asks.

The read has a deadline: a container that makes its read slow, blocking or huge is left behind
(its thread a daemon, its handles kept open for it) and that container alone gets a failed record.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import threading

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_text
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import current_view, parse_passwd
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._cgroup import cgroup_root, classify, monitor_of

_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_PROC_PATH = re.compile(r"^/proc(?:/+(.*))?$")
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]+$")
OVERFLOW_ID = 65534  # what the kernel shows for an id without a mapping (/proc/sys/kernel/overflowuid)
PROC_CAP = 16 << 20  # a /proc file of one process: maps runs to a few MiB at the very most
_HOOKED = []
_REFUSED = frozenset(("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork",
                      "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "os.startfile"))


class ViewError(GpufleetError):
    """A container that cannot be read from the node: ``msg`` says why and what to do."""


# --------------------------------------------------------------------------- id maps


def parse_id_map(text):
    """``[(inside, outside, count)]`` of a /proc/<pid>/uid_map or gid_map text."""
    out = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isascii() and f.isdigit() for f in fields):
            out.append(tuple(int(f) for f in fields))
    return out


def inside_id(id_map, outside):
    """The id a container sees for the node's id ``outside`` (its ``lxc.idmap``); the overflow id
    (65534, "nobody") for one it has no mapping for, as the kernel shows it there."""
    if outside is None:
        return None
    for inside, first, count in id_map:
        if first <= outside < first + count:
            return inside + outside - first
    return OVERFLOW_ID


def _nspid(text):
    for line in text.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            if fields and all(f.isascii() and f.isdigit() for f in fields):
                return [int(f) for f in fields]
    return []


def _ppid(text):
    """The PPid of a /proc/<pid>/status text (the node's PID of the parent), or None."""
    for line in text.splitlines():
        if line.startswith("PPid:"):
            value = line[5:].strip()
            return int(value) if value.isascii() and value.isdigit() else None
    return None


def _read_at(name, dir_fd, cap=1 << 20):
    fd = os.open(name, _FILE, dir_fd=dir_fd)
    try:
        parts, total = [], 0
        while total <= cap:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            parts.append(chunk)
            total += len(chunk)
        return b"".join(parts)[:cap + 1]  # a byte past the cap tells the caller it was cut
    finally:
        os.close(fd)


def _gone(path):
    return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)


# --------------------------------------------------------------------------- the view


class ContainerView(object):
    """A running container seen from its node: ``vmid``, ``init`` (its init's node PID), ``root_fd``
    (its root, a directory handle) and ``root`` (a fs/_root.Root of it), ``pids`` ({PID in the
    container: handle of /proc/<node PID>}), ``node_pids`` ({node PID: PID in the container}),
    ``uid_map`` and ``gid_map``; ``proc``: the node's /proc. close() closes every handle."""

    def __init__(self, vmid, init, root_fd, pids, node_pids, uid_map, gid_map, cgroup_root_path, proc="/proc"):
        self.vmid = vmid
        self.init = init
        self.root_fd = root_fd
        self.root = _root.Root(root_fd, self)
        self.pids = pids
        self.node_pids = node_pids
        self.uid_map = uid_map
        self.gid_map = gid_map
        self.cgroup_root = cgroup_root_path
        self.proc = proc
        self.problems = []
        self.abandoned = False  # a read left behind at its deadline still uses the handles
        self._accounts = None
        self._lock = threading.Lock()

    def close(self):
        if self.abandoned:
            return
        for fd in list(self.pids.values()) + [self.root_fd]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.pids = {}

    def processes(self):
        """``[(PID in the container, handle of its /proc/<node PID>)]``, for a per-process reader."""
        return sorted(self.pids.items())

    # ------------------------------------------------------------------ ids and users

    def uid(self, node_uid):
        return inside_id(self.uid_map, node_uid)

    def gid(self, node_gid):
        return inside_id(self.gid_map, node_gid)

    def accounts(self):
        """The container's /etc/passwd, read once through its root (no link followed at the end,
        bounded, parsed as bytes); [] when it cannot be read, with a problem noted."""
        with self._lock:
            if self._accounts is None:
                with _root.inside(self.root):
                    text = read_text("/etc/passwd", "passwd", self.problems, what="the container's /etc/passwd")
                self._accounts = parse_passwd(text or "")
            return self._accounts

    # ------------------------------------------------------------------ its /proc, from the node's

    def _split(self, path):
        """``(directory handle, rest)`` of a /proc path, read from the node: a process's handle for
        ``/proc/<container PID>/rest``, the node's /proc for the kernel's own files; None for a
        path outside /proc. FileNotFoundError for a PID the container does not have, /proc/self
        (no process of the container's: the reader is the node's) and a ``..``."""
        m = _PROC_PATH.match(path) if isinstance(path, str) else None
        if not m:
            return None
        parts = [p for p in (m.group(1) or "").split("/") if p and p != "."]
        if any(p == ".." or not _NAME.match(p) for p in parts) or (parts and parts[0] in ("self", "thread-self")):
            raise _gone(path)
        if parts and parts[0].isdigit():
            fd = self.pids.get(int(parts[0]))
            if fd is None:
                raise _gone(path)
            return fd, "/".join(parts[1:]) or "."
        return None, "/".join([self.proc.rstrip("/")] + parts)

    def read_proc(self, path):
        """The bytes of a /proc file as the container would read it (its PIDs, ids and cgroups),
        from the node's /proc; None when ``path`` is outside /proc."""
        where = self._split(path)
        if where is None:
            return None
        fd, rest = where
        if fd is None:
            return _read_at(rest, None, PROC_CAP)
        data = _read_at(rest, fd, PROC_CAP)
        if rest == "stat":
            return self._stat(data)
        if rest == "status":
            return self._status(data)
        if rest == "cgroup":
            return self._cgroup(data)
        return data

    def listdir(self, path):
        """Names in a /proc directory (the container's PIDs for /proc itself), or None outside /proc."""
        if isinstance(path, str) and path.rstrip("/") == "/proc":
            return [str(pid) for pid in sorted(self.pids)]
        where = self._split(path)
        if where is None:
            return None
        fd, rest = where
        sub = os.open(rest, _DIR | os.O_NOFOLLOW, dir_fd=fd)
        try:
            return os.listdir(sub)
        finally:
            os.close(sub)

    def readlink(self, path):
        """A link of /proc/<pid>/ (fd/N, cwd, exe): the kernel names its target from the
        container's own root (its mount namespace's), as the container would see it; None
        outside /proc."""
        where = self._split(path)
        if where is None:
            return None
        if where[0] is None:
            raise _gone(path)  # the node's /proc links (mounts, net) lead to the node's own process
        return os.readlink(where[1], dir_fd=where[0])

    def _pid(self, node_pid):
        return self.node_pids.get(node_pid, 0)  # a parent outside the container shows as 0 there

    def _stat(self, data):
        text = data.decode("utf-8", "surrogateescape")
        right = text.rfind(")")
        if right < 0:
            return data
        rest = text[right + 2:].split(" ")
        if len(rest) > 3 and rest[1].isdigit():
            rest[1] = str(self._pid(int(rest[1])))  # field 4, the parent
            if rest[2].lstrip("-").isdigit():
                rest[2] = str(self._pid(int(rest[2])))  # field 5, the process group
            if rest[3].lstrip("-").isdigit():
                rest[3] = str(self._pid(int(rest[3])))  # field 6, the session
        before = text[:text.index(" ")] if " " in text else text
        head = str(self._pid(int(before))) if before.isascii() and before.isdigit() else before
        return (head + text[len(before):right + 2] + " ".join(rest)).encode("utf-8", "surrogateescape")

    def _status(self, data):
        out = []
        for line in data.decode("utf-8", "surrogateescape").split("\n"):
            key, sep, value = line.partition(":")
            fields = value.split()
            shown = line
            if sep and key in ("Uid", "Gid") and all(f.isascii() and f.isdigit() for f in fields):
                to = self.uid if key == "Uid" else self.gid
                shown = "%s:\t%s" % (key, "\t".join(str(to(int(f))) for f in fields))
            elif sep and key in ("Pid", "PPid", "Tgid", "TracerPid") and fields and fields[0].isascii() and fields[0].isdigit():
                pid = int(fields[0])
                shown = "%s:\t%d" % (key, 0 if pid == 0 else self._pid(pid))
            elif sep and key in ("NSpid", "NStgid", "NSpgid", "NSsid") and fields:
                shown = "%s:\t%s" % (key, fields[-1])
            out.append(shown)
        return "\n".join(out).encode("utf-8", "surrogateescape")

    def _cgroup(self, data):
        """The cgroup paths below the container's cgroup root, as its cgroup namespace shows them."""
        root = self.cgroup_root
        out = []
        for line in data.decode("utf-8", "surrogateescape").split("\n"):
            head, sep, path = line.rpartition(":")
            if sep and root and (path == root or path.startswith(root + "/")):
                path = path[len(root):] or "/"
            out.append(head + sep + path if sep else line)
        return "\n".join(out).encode("utf-8", "surrogateescape")


def current():
    """The view of the container this thread reads, or None (the host read as itself)."""
    return current_view()


# --------------------------------------------------------------------------- finding the views


class NoProcess(str):
    """Why open_views() has no view of a container that has no process at all in the node's
    /proc: it is stopped, or the node has no such container (proxmox/_node tells which)."""

    __slots__ = ()


def open_views(vmids, proc="/proc", lxc_paths=None):
    """``({vmid: ContainerView}, {vmid: why not})`` for the containers ``vmids`` of this node,
    from one scan of the node's /proc. A container without an init in /proc is not running; one
    without any process there (stopped, or not on this node) has a NoProcess reason.
    ``lxc_paths`` ({vmid: LXC path}) tells a container apart from one of the same name run from
    another LXC path on the host (by its monitor, ``[lxc monitor] <path> <name>``, the parent of
    the container's init: LXC picks the monitor's cgroup and the container's apart, each the
    first name free, so after a failed start has left one behind their suffixes differ)."""
    wanted = set(vmids)
    groups = {}  # (vmid, cgroup name): {container pid: (node pid, fd, cgroup text)}
    inits = {}  # (vmid, cgroup name): [node PID of each process that is PID 1 of it]
    parents = {}  # (vmid, cgroup name): [the node PID of each of those inits' parent]
    monitors = {}  # (LXC path, container name): cgroup name
    monitor_pids = {}  # node PID of a monitor: (LXC path, container name)
    proc_fd = os.open(proc, _DIR)
    try:
        for name in os.listdir(proc_fd):
            if not name.isdigit():
                continue
            try:
                fd = os.open(name, _DIR, dir_fd=proc_fd)
            except OSError:
                continue  # gone since the listing
            keep = False
            try:
                cgroup = _read_at("cgroup", fd).decode("utf-8", "replace")
                found = classify(cgroup)
                if found and found[0] == "monitor":
                    monitor = monitor_of(cgroup, _read_at("cmdline", fd) or b"")
                    if monitor:
                        monitors[monitor[0]] = monitor[1]
                        monitor_pids[int(name)] = monitor[0]
                    continue
                payload = (found[1], found[2]) if found else None
                if payload and payload[0] in wanted:
                    status = _read_at("status", fd).decode("utf-8", "replace")
                    nspid = _nspid(status)
                    # A process in the container's PID namespace, or in one nested in it: its PID in
                    # the container is the one a level below the node's (NSpid's second field).
                    if len(nspid) > 1:
                        if len(nspid) == 2 and nspid[1] == 1:
                            inits.setdefault(payload, []).append(int(name))
                            parents.setdefault(payload, []).append(_ppid(status))
                        procs = groups.setdefault(payload, {})
                        if nspid[1] not in procs:  # else two inits in one cgroup: refused below
                            procs[nspid[1]] = (int(name), fd, cgroup)
                            keep = True
            except OSError:
                pass
            finally:
                if not keep:
                    os.close(fd)
    finally:
        os.close(proc_fd)
    started = {}  # (LXC path, container name): the cgroup name of the init its monitor started
    for (vmid, cname), ppids in parents.items():
        for ppid in ppids:
            if ppid in monitor_pids and monitor_pids[ppid][1] == str(vmid):
                started.setdefault(monitor_pids[ppid], cname)
    found = {}
    missing = {}
    for vmid in wanted:
        names = sorted(n for v, n in groups if v == vmid)
        path = (lxc_paths or {}).get(vmid)
        chosen = None
        if path:
            where = (path.rstrip("/") or "/", str(vmid))
            # The init's parent first; a monitor's own cgroup name only for an init it is not the
            # parent of (both are the same name on a host no failed start has left a cgroup on).
            chosen = started.get(where, monitors.get(where))
            if chosen is None and names:
                # No monitor of that LXC path runs it: stopped, whatever runs under its name elsewhere.
                others = ("the one of that name (cgroup key %s) runs" % names[0] if len(names) == 1 else
                          "the %d of that name (cgroup keys %s) run" % (len(names), ", ".join(names)))
                missing[vmid] = "no LXC monitor of %s runs a container %d on this node; %s from another LXC path" % (
                    where[0], vmid, others)
        elif len(names) > 1:
            missing[vmid] = ("%d containers named %d run on this node from different LXC paths (cgroup keys %s): give "
                             "the container's lxc_path to tell which is meant" % (len(names), vmid, ", ".join(names)))
        elif names:
            chosen = names[0]
        for cname in names:
            procs = groups[(vmid, cname)]
            if cname == chosen and len(inits.get((vmid, cname), ())) <= 1:
                found[vmid] = procs
                continue
            if cname == chosen:
                pids = sorted(inits[(vmid, cname)])
                missing[vmid] = ("%d containers with vmid %d run on this node (init PIDs %s): not read from the node, "
                                 "whose processes are whose cannot be told apart; a Proxmox VE node runs one container "
                                 "of each vmid" % (len(pids), vmid, ", ".join(str(p) for p in pids)))
            for _pid, fd, _cg in procs.values():
                os.close(fd)
    views = {}
    for vmid in wanted:
        if vmid in missing:
            continue
        procs = found.get(vmid, {})
        if 1 not in procs:
            for _pid, fd, _cg in procs.values():
                os.close(fd)
            why = "no init process of container %d in the node's /proc" % vmid
            # Not one process: stopped, or no such container here; only the node's PVE config tells which.
            missing[vmid] = NoProcess(why) if not procs else why
            continue
        init, init_fd, cgroup = procs[1]
        try:
            root_fd = os.open("root", _DIR, dir_fd=init_fd)  # the magic link, followed on purpose: the container's root
            uid_map = parse_id_map(_read_at("uid_map", init_fd).decode("ascii", "replace"))
            gid_map = parse_id_map(_read_at("gid_map", init_fd).decode("ascii", "replace"))
        except OSError as exc:
            for _pid, fd, _cg in procs.values():
                os.close(fd)
            missing[vmid] = "the root of container %d (/proc/%d/root) cannot be opened: %s" % (vmid, init, exc.strerror or exc)
            continue
        views[vmid] = ContainerView(vmid, init, root_fd, dict((c, v[1]) for c, v in procs.items()),
                                    dict((v[0], c) for c, v in procs.items()), uid_map, gid_map, cgroup_root(cgroup, vmid), proc)
    return views, missing


# --------------------------------------------------------------------------- reading


class Late(ViewError):
    """A read of a container that did not finish by its deadline: left behind, unread."""


def _audit(event, args):
    if event in _REFUSED and _root.current() is not None:
        view = current()
        raise PermissionError(errno.EPERM, "the node read of container %s runs nothing and loads nothing: %s %s refused"
                              % (getattr(view, "vmid", "?"), event, str(args[0])[:200] if args else ""))


def prepare():
    """Once a process, before any view is read: the audit hook, and the C library's calls that
    fs/_root makes (loaded now, from the node, since a view's thread loads nothing)."""
    if _HOOKED:
        return
    _root.calls()
    _HOOKED.append(True)
    sys.addaudithook(_audit)


def run(view, work, seconds):
    """``work()`` run in a new thread inside the view (see the module's docstring); its value,
    or the exception it raised. Raises Late when it has not finished after ``seconds``: the
    thread is left to end on its own (a daemon), the view's handles kept open for it."""
    prepare()
    out = {}

    def body():
        try:
            with _root.inside(view.root):
                out["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=body, name="container-%s" % view.vmid, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        view.abandoned = True
        raise Late("reading container %s from its node did not finish within %ss: a file or a process of the container "
                   "does not answer (a stalled file system, a process stuck in the kernel); its read was left behind, "
                   "the other containers are read as usual" % (view.vmid, seconds))
    if "error" in out:
        raise out["error"]
    return out["value"]
