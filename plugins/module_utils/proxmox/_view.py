# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A running LXC container seen from its Proxmox VE node: the node read's container view.

The node reads its containers in its own process (node_readiness), nothing of a container
executed. For each running container it finds, in the node's /proc (scanned once for all of
them), the container's processes by their cgroup (``…/lxc/<vmid>/…``) with their PID inside
the container (the last ``NSpid:`` field), its init (the process whose PID there is 1), and
opens:

- ``/proc/<init pid>/root`` once, as a directory handle: the container's root;
- ``/proc/<host pid>`` of each of its processes, as a directory handle: a handle stays bound to
  its process, so a PID reused meanwhile by another process is never read in its place;
- its ``uid_map`` / ``gid_map``: owners and process users as the container sees them (an
  unprivileged container maps its root to 100000 or so on the node).

A ContainerView holds them. ``entered(view)`` runs a read in a thread of its own whose root is
the container's: the thread stops sharing its file-system context with the process
(``unshare(CLONE_FS)``) and changes its root to the handle (``fchdir``, ``chroot(".")``), so
that every path the existing readers open - absolute paths, absolute symbolic links, ``..`` -
resolves inside the container's root and never reaches the node's own files (what
``openat2``'s ``RESOLVE_IN_ROOT`` does for one path, here for every path of the read). The
threads such a thread starts share its root. Other threads of the node read keep the node's.

Within an entered thread (current() is its view):

- ``/proc/<pid>/…`` as the readers spell it (proc/_proc) names the container's PID, and is read
  from the node's /proc through that process's handle, its PIDs, user and group ids turned into
  the container's (a container cannot fake what the node's kernel says of its processes);
  listing ``/proc`` lists the container's processes;
- users and homes come from the container's ``/etc/passwd`` read as a file (getpwnam, getpwuid,
  getpwall here): the C library's account lookup is never asked, since it would load the NSS
  modules the container's nsswitch.conf names;
- an audit hook refuses to start any program, to load any library (ctypes) and to import any
  module not loaded yet: nothing of the container can run in the node's process.

A per-process reader (the CUDA libraries a job maps, say) takes ``view.processes()``: the
container's PIDs with their handles in the node's /proc, and ``view.root_fd``.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import re
import sys
import threading

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_text

CLONE_FS = 0x00000200
_DIR = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_PID_PATH = re.compile(r"^/proc/+([0-9]+)(/.*)?$")
_VMID_RES = (
    re.compile(r"/lxc/(\d+)(?:/|$)"),
    re.compile(r"(?:^|/)lxc\.payload\.(\d+)(?:/|$)"),
    re.compile(r"(?:^|/)lxc\.payload/(\d+)(?:/|$)"),
)
OVERFLOW_ID = 65534  # what the kernel shows for an id without a mapping (/proc/sys/kernel/overflowuid)
PASSWD_CAP = 16 << 20

# The container views entered now, by (st_dev, st_ino) of their root: the kernel's own notion of
# a thread's root says which view that thread (and every thread it started) reads through.
_VIEWS = {}
_LOCK = threading.Lock()
_HOOKED = []
_REFUSED = frozenset(("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork",
                      "os.forkpty", "pty.spawn", "ctypes.dlopen", "ctypes.dlsym", "import", "os.startfile"))


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


def vmid_of_cgroup(text):
    """The container (vmid) a process belongs to by its /proc/<pid>/cgroup text; its monitor
    (``lxc.monitor``) runs on the node and belongs to none. None for the node's own processes."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "lxc.monitor" in path:
            continue
        for rx in _VMID_RES:
            m = rx.search(path)
            if m:
                return int(m.group(1))
    return None


# The container's own cgroup: LXC names it after the container (lxc.payload.100, or
# lxc.payload/100 and Proxmox VE's /lxc/100 with a cgroup directory configured), with "-1",
# "-2", ... when a container of that name already runs from another LXC path on the host
# (lxc.payload.100-1). Its key: the separator and that name (".100-1", "/100"), which its
# monitor's cgroup (lxc.monitor.100-1, lxc.monitor/100) carries too.
_PAYLOAD_RES = (
    re.compile(r"(?:^|/)lxc\.payload([./])(\d+)(-\d+)?(?:/|$)"),
    re.compile(r"/lxc(/)(\d+)()(?:/|$)"),
)
_MONITOR_RE = re.compile(r"(?:^|/)lxc\.monitor([./]\d+(?:-\d+)?)(?:/|$)")


def payload_of_cgroup(text):
    """``(vmid, cgroup key)`` of a container's process by its cgroup text (``(100, ".100-1")``), or None."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "lxc.monitor" in path:
            return None
        for rx in _PAYLOAD_RES:
            m = rx.search(path)
            if m:
                return int(m.group(2)), m.group(1) + m.group(2) + (m.group(3) or "")
    return None


def monitor_of(cgroup, cmdline):
    """``((LXC path, container name), cgroup key)`` of an LXC monitor process
    (``[lxc monitor] <lxcpath> <name>``), or None."""
    m = _MONITOR_RE.search(cgroup)
    parts = cmdline.split(b"\0")[0].decode("utf-8", "replace").split(" ")
    if not m or len(parts) != 4 or parts[:2] != ["[lxc", "monitor]"]:
        return None
    return (parts[2].rstrip("/") or "/", parts[3]), m.group(1)


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
        return b"".join(parts)[:cap]
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the view


class Account(tuple):
    """One line of a container's /etc/passwd, as pwd.struct_passwd spells its fields."""

    __slots__ = ()
    _FIELDS = ("pw_name", "pw_passwd", "pw_uid", "pw_gid", "pw_gecos", "pw_dir", "pw_shell")

    def __getattr__(self, name):
        try:
            return self[self._FIELDS.index(name)]
        except ValueError:
            raise AttributeError(name) from None


def parse_passwd(text):
    """Accounts of a passwd file's text; lines that are not name:x:uid:gid:gecos:home:shell skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) != 7 or not fields[0] or line.startswith(("#", "+", "-")):
            continue
        if not (fields[2].isascii() and fields[2].isdigit() and fields[3].isascii() and fields[3].isdigit()):
            continue
        out.append(Account((fields[0], fields[1], int(fields[2]), int(fields[3]), fields[4], fields[5], fields[6])))
    return out


class ContainerView(object):
    """A running container seen from its node: ``vmid``, ``init`` (its init's node PID), ``root_fd``
    (its root, a directory handle), ``pids`` ({PID in the container: handle of /proc/<node PID>}),
    ``node_pids`` ({node PID: PID in the container}), ``uid_map`` and ``gid_map``. close() closes
    every handle."""

    def __init__(self, vmid, init, root_fd, pids, node_pids, uid_map, gid_map, cgroup_root):
        self.vmid = vmid
        self.init = init
        self.root_fd = root_fd
        self.pids = pids
        self.node_pids = node_pids
        self.uid_map = uid_map
        self.gid_map = gid_map
        self.cgroup_root = cgroup_root
        self.problems = []
        self._accounts = None
        st = os.fstat(root_fd)
        self.key = (st.st_dev, st.st_ino)

    def close(self):
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
        bounded); [] when it cannot be read, with a problem noted."""
        if self._accounts is None:
            text = read_text("/etc/passwd", "passwd", self.problems, what="the container's /etc/passwd")
            self._accounts = parse_passwd(text or "")
        return self._accounts

    def getpwnam(self, name):
        for account in self.accounts():
            if account.pw_name == name:
                return account
        raise KeyError("getpwnam(): name not found: %r" % (name,))

    def getpwuid(self, uid):
        for account in self.accounts():
            if account.pw_uid == uid:
                return account
        raise KeyError("getpwuid(): uid not found: %r" % (uid,))

    # ------------------------------------------------------------------ its /proc, from the node's

    def _split(self, path):
        """``(handle of /proc/<node PID>, rest)`` for ``/proc/<container PID>/rest``; None for a
        path that is no process's; FileNotFoundError for a PID the container does not have."""
        m = _PID_PATH.match(path)
        if not m:
            return None
        fd = self.pids.get(int(m.group(1)))
        if fd is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        return fd, (m.group(2) or "/").lstrip("/") or "."

    def read_proc(self, path):
        """The bytes of ``/proc/<container PID>/…`` as the container would read them, or None when
        ``path`` is no process's file (the caller reads it through the root as any file)."""
        where = self._split(path)
        if where is None:
            return None
        fd, rest = where
        data = _read_at(rest, fd, 16 << 20)
        if rest == "stat":
            return self._stat(data)
        if rest == "status":
            return self._status(data)
        if rest == "cgroup":
            return self._cgroup(data)
        return data

    def listdir(self, path):
        if path.rstrip("/") == "/proc":
            return [str(pid) for pid in sorted(self.pids)]
        where = self._split(path)
        if where is None:
            return None
        fd, rest = where
        sub = os.open(rest, _DIR, dir_fd=fd)
        try:
            return os.listdir(sub)
        finally:
            os.close(sub)

    def readlink(self, path):
        """A link of /proc/<pid>/ (fd/N, cwd, exe): the kernel names its target from this thread's
        root, the container's, as the container would see it."""
        where = self._split(path)
        if where is None:
            return None
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
        before = text[:text.index(" ")]
        head = str(self._pid(int(before))) if before.isdigit() else before
        return (head + text[len(before):right + 2] + " ".join(rest)).encode("utf-8", "surrogateescape")

    def _status(self, data):
        out = []
        for line in data.decode("utf-8", "surrogateescape").split("\n"):
            key, sep, value = line.partition(":")
            fields = value.split()
            shown = line
            if sep and key in ("Uid", "Gid") and all(f.isdigit() for f in fields):
                to = self.uid if key == "Uid" else self.gid
                shown = "%s:\t%s" % (key, "\t".join(str(to(int(f))) for f in fields))
            elif sep and key in ("Pid", "PPid", "Tgid", "TracerPid") and fields and fields[0].isdigit():
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


# --------------------------------------------------------------------------- finding the views


def _cgroup_root(text, vmid):
    """The container's cgroup (``…/lxc/<vmid>`` and its ``ns`` below, as Proxmox VE makes it)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = re.search(r"^(.*?/lxc/%d(?:/ns)?|.*?lxc\.payload[./]%d(?:-\d+)?)(?:/|$)" % (vmid, vmid), path)
        if m:
            return m.group(1)
    return None


def open_views(vmids, proc="/proc", lxc_paths=None):
    """``({vmid: ContainerView}, {vmid: why not})`` for the containers ``vmids`` of this node,
    from one scan of the node's /proc. A container without an init in /proc is not running.
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
                if "lxc.monitor" in cgroup:
                    found = monitor_of(cgroup, _read_at("cmdline", fd) or b"")
                    if found:
                        monitors[found[0]] = found[1]
                        monitor_pids[int(name)] = found[0]
                    continue
                payload = payload_of_cgroup(cgroup)
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
            missing[vmid] = "no init process of container %d in the node's /proc" % vmid
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
                                    dict((v[0], c) for c, v in procs.items()), uid_map, gid_map, _cgroup_root(cgroup, vmid))
    return views, missing


# --------------------------------------------------------------------------- entering


def current():
    """The view of the container this thread's root is, or None (the node's own root)."""
    if not _VIEWS:
        return None
    try:
        st = os.stat("/")
    except OSError:
        return None
    return _VIEWS.get((st.st_dev, st.st_ino))


def _audit(event, args):
    if event in _REFUSED and _VIEWS:
        view = current()
        if view is not None:
            raise PermissionError(errno.EPERM, "the node read of container %s runs nothing and loads nothing: %s %s refused"
                                  % (view.vmid, event, str(args[0])[:200] if args else ""))


def prepare():
    """Once a process, before any view is entered: the audit hook, and what the C library and
    the readers would otherwise load lazily - loaded now, from the node."""
    if _HOOKED:
        return
    import csv  # noqa: F401 - loaded before the audit hook refuses imports in a container thread
    import ctypes
    import ctypes.util  # noqa: F401 - loaded before the audit hook refuses imports in a container thread
    import fnmatch  # noqa: F401 - loaded before the audit hook refuses imports in a container thread
    import hashlib  # noqa: F401 - loaded before the audit hook refuses imports in a container thread
    import json  # noqa: F401 - loaded before the audit hook refuses imports in a container thread
    import time

    from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tree
    libc = ctypes.CDLL(None, use_errno=True)
    with contextlib.suppress(OSError):
        ctypes.CDLL("libgcc_s.so.1")  # a thread's unwinding loads it: from the node, now
    time.localtime()  # the C library's time zone, from the node's /etc/localtime
    _tree._openat2_call()
    "".encode("idna")
    "".encode("latin-1").decode("utf-8", "replace")
    _HOOKED.append(libc)
    sys.addaudithook(_audit)


def _enter(view):
    libc = _HOOKED[0]
    if libc.unshare(CLONE_FS) != 0:
        err = __import__("ctypes").get_errno()
        raise OSError(err, "unshare(CLONE_FS): %s" % os.strerror(err))
    os.fchdir(view.root_fd)
    os.chroot(".")
    os.chdir("/")


def run_in(view, work):
    """``work()`` run in a new thread whose root is the container's (see the module's docstring);
    its value, or the exception it raised."""
    prepare()
    with _LOCK:
        _VIEWS[view.key] = view
    out = {}

    def body():
        try:
            _enter(view)
            out["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            out["error"] = exc

    thread = threading.Thread(target=body, name="container-%s" % view.vmid, daemon=True)
    thread.start()
    thread.join()
    # The view stays known: a reader the read's deadline left behind in that thread still reads
    # through it (never through the node's own account lookup or its /proc).
    if "error" in out:
        raise out["error"]
    return out["value"]


# --------------------------------------------------------------------------- accounts


def seen_uid(uid):
    """A file owner's uid (stat's st_uid) as this thread's container sees it: an unprivileged
    container's root (100000 on the node, say) is 0 in its view's thread; unchanged elsewhere."""
    view = current()
    return uid if view is None else view.uid(uid)


def getpwnam(name):
    """pwd.getpwnam(), from the container's /etc/passwd in a view's thread."""
    view = current()
    if view is not None:
        return view.getpwnam(name)
    return pwd.getpwnam(name)


def getpwuid(uid):
    view = current()
    if view is not None:
        return view.getpwuid(uid)
    return pwd.getpwuid(uid)


def getpwall():
    view = current()
    if view is not None:
        return list(view.accounts())
    return pwd.getpwall()
