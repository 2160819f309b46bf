# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Paths resolved inside a directory handle taken as ``/``: how the node reads a container's files.

A Root holds a directory handle (a running container's root, opened by its node through
``/proc/<init>/root``) and resolves every path given to it below that handle as the kernel
resolves paths for a process whose root it is: an absolute path, an absolute symbolic link and
``..`` at the top all stay inside. One ``openat2`` call does it where the kernel has it
(``RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS``), else a walk of one component at a time from the
handle that reads each link and resolves its text the same way. Nothing changes the root of a
thread or a process (no chroot): the C library and Python keep the node's own files for what they
open implicitly (accounts, locales, modules), and the node's own /proc.

The functions of this module (open, stat, lstat, listdir, readlink, realpath, exists, isdir,
...) are what the readers call instead of os's: in a thread that entered a Root (``inside()``)
they resolve inside it; anywhere else they are os's own. A file of the root on a kernel
pseudo-file system (its /proc, /sys, a debugfs it mounted) is never opened for its content: a
container's procfs is its root's to forge, and the node's facts about processes come from the
node's /proc (view/).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import posixpath
import stat
import threading

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_PATH = getattr(os, "O_PATH", os.O_RDONLY)
_STEP = _PATH | os.O_NOFOLLOW | _CLOEXEC
_SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437}.get(platform.machine())
# openat2(2) calls made for one open while the kernel answers EAGAIN (a rename or mount raced a "..").
EAGAIN_TRIES = 32
RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_BENEATH, RESOLVE_IN_ROOT = 0x02, 0x04, 0x08, 0x10
MAX_LINKS = 40  # the kernel's own limit of links followed in one lookup (ELOOP past it)

# Kernel pseudo-file systems (statfs f_type, linux/magic.h): never read as a container's data.
PSEUDO_FS = {
    0x9FA0: "procfs", 0x62656572: "sysfs", 0x64626720: "debugfs", 0x74726163: "tracefs", 0x73636673: "securityfs",
    0xCAFE4A11: "bpffs", 0x27E0EB: "cgroupfs", 0x63677270: "cgroup2fs", 0x62656570: "configfs", 0xDE5E81E4: "efivarfs",
    0x6165676C: "pstorefs", 0x42494E4D: "binfmt_misc",
}

_state = threading.local()
_CALLS = {}


class Call(object):
    """The C library's syscall() and fstatfs(), loaded once a process (from the node: never in a
    container's view, which loads nothing)."""

    def __init__(self):
        import ctypes  # only here: a host that never reads a container never loads it

        class OpenHow(ctypes.Structure):
            _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

        self.ctypes = ctypes
        self.how = OpenHow
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            self.syscall = libc.syscall
            self.syscall.restype = ctypes.c_long
            self.fstatfs = libc.fstatfs
        except (OSError, AttributeError):
            self.syscall = self.fstatfs = None
        # None: not tried yet; False: the kernel, libc or a seccomp filter refuses it (the walk is used).
        self.openat2 = None if (_SYS_OPENAT2 and self.syscall is not None) else False

    def call(self, dirfd, path, flags, resolve):
        """One openat2(2) call: (descriptor, 0) or (-1, errno)."""
        ctypes = self.ctypes
        how = self.how(flags | _CLOEXEC, 0, resolve)
        fd = self.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_int(dirfd), ctypes.c_char_p(os.fsencode(path)),
                          ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        return (fd, 0) if fd >= 0 else (-1, ctypes.get_errno())

    def open2(self, dirfd, path, flags, resolve):
        """openat2(2): a descriptor, or None where the kernel lacks it; OSError for its refusal.

        With RESOLVE_IN_ROOT the kernel answers EAGAIN when a rename or a mount anywhere on the host
        raced the resolution of a ``..`` (it cannot tell that the ``..`` stayed inside): the call is
        made again, as openat2(2) says, up to EAGAIN_TRIES times."""
        if self.openat2 is False:
            return None
        for _try in range(EAGAIN_TRIES):
            fd, err = self.call(dirfd, path, flags, resolve)
            if err != errno.EAGAIN:
                break
        if fd >= 0:
            self.openat2 = True
            return fd
        if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG) and self.openat2 is None:
            self.openat2 = False  # no openat2 here (an old kernel, or a seccomp filter refuses it)
            return None
        raise OSError(err, os.strerror(err), path)

    def fs_type(self, fd):
        """statfs's f_type of an open descriptor, or None when it cannot be asked."""
        if self.fstatfs is None:
            return None
        buf = (self.ctypes.c_long * 32)()  # struct statfs: f_type is its first field, a long
        return buf[0] & 0xFFFFFFFF if self.fstatfs(fd, buf) == 0 else None


def calls():
    if "c" not in _CALLS:
        _CALLS["c"] = Call()
    return _CALLS["c"]


def _parts(path):
    if not isinstance(path, str) or not path.startswith("/"):
        raise OSError(errno.EINVAL, "not an absolute path", path)
    if "\0" in path:
        raise OSError(errno.EINVAL, "a path cannot hold a NUL byte", path)
    return [c for c in path.split("/") if c and c != "."]


class Root(object):
    """A directory handle taken as ``/`` (see the module's docstring). ``fd`` is the handle;
    ``view``, what the root belongs to (a container's view: the readers of /proc ask it, never
    the root, for a process's facts). A Root does not own the handle: its view closes it."""

    def __init__(self, fd, view=None):
        self.fd = fd
        self.view = view
        self._real = {}

    # ------------------------------------------------------------------ resolution

    def _walk(self, path, follow):
        """``(parent handle, last name or None for the root itself)`` of ``path`` resolved inside
        the root one component at a time (where openat2 is missing): each link read and its text
        resolved from the root (absolute) or from where it is, ``..`` at the top staying there.
        The caller closes the handle. A component that does not exist ends the walk with
        FileNotFoundError."""
        todo = _parts(path)
        todo.reverse()
        stack = [os.dup(self.fd)]
        links = 0
        try:
            while todo:
                name = todo.pop()
                if name == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                fd = os.open(name, _STEP, dir_fd=stack[-1])
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode) and (todo or follow):
                    target = os.readlink("", dir_fd=fd)
                    os.close(fd)
                    links += 1
                    if links > MAX_LINKS or not target:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
                    if target.startswith("/"):
                        for other in stack[1:]:
                            os.close(other)
                        del stack[1:]
                    todo.extend(reversed([c for c in target.split("/") if c and c != "."]))
                    continue
                if todo and not stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
                if not todo:
                    os.close(fd)
                    return stack.pop(), name
                stack.append(fd)
            return stack.pop(), None
        finally:
            for fd in stack:
                os.close(fd)

    def _open(self, path, flags):
        """A descriptor of ``path`` opened with ``flags`` inside the root (O_NOFOLLOW in ``flags``:
        a link at the end is not followed). The root's /proc is no file of the container's to read."""
        if _under_proc(path):
            raise OSError(errno.EACCES, "a container's /proc is never read from its node: process facts come from the "
                                        "node's own /proc", path)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC):
            raise OSError(errno.EROFS, "a container is only read from its node, never written", path)
        follow = not flags & os.O_NOFOLLOW
        c = calls()
        fd = c.open2(self.fd, path, flags, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
        if fd is None:
            parent, name = self._walk(path, follow)
            try:
                # The walk read every link on the way: the last step never follows one (a link
                # put there meanwhile is refused, ELOOP), whatever ``flags`` say.
                fd = os.open(name or ".", flags | os.O_NOFOLLOW | _CLOEXEC, dir_fd=parent)
            finally:
                os.close(parent)
        if (flags & _PATH) != _PATH:
            kind = PSEUDO_FS.get(c.fs_type(fd))
            if kind:
                os.close(fd)
                raise OSError(errno.EACCES, "on the container's %s: a kernel file system's, never read as its data" % kind, path)
        return fd

    def open(self, path, flags):
        return self._open(path, flags)

    def stat(self, path, follow_symlinks=True):
        fd = self._open(path, _PATH | (0 if follow_symlinks else os.O_NOFOLLOW))
        try:
            return os.fstat(fd)
        finally:
            os.close(fd)

    def listdir(self, path):
        fd = self._open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def readlink(self, path):
        fd = self._open(path, _PATH | os.O_NOFOLLOW)
        try:
            return os.readlink("", dir_fd=fd)
        except FileNotFoundError:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path) from None  # not a link, as readlink(2) says
        finally:
            os.close(fd)

    def realpath(self, path):
        """The path with every link and ``..`` resolved inside the root, as posixpath.realpath
        gives it: what does not exist is kept as written, its ``..`` taken away textually."""
        if path in self._real:
            return self._real[path]
        todo = _parts(path)
        todo.reverse()
        stack = [os.dup(self.fd)]  # a handle for each name that exists, the root first
        names = []
        links = 0
        try:
            while todo:
                name = todo.pop()
                if name == "..":
                    if len(names) >= len(stack) and names:
                        names.pop()  # a name that does not exist
                    elif len(stack) > 1:
                        os.close(stack.pop())
                        names.pop()
                    continue
                if len(names) >= len(stack):  # below a name that does not exist: text only
                    names.append(name)
                    continue
                try:
                    fd = os.open(name, _STEP, dir_fd=stack[-1])
                except OSError:
                    names.append(name)
                    continue
                st = os.fstat(fd)
                if stat.S_ISLNK(st.st_mode) and links < MAX_LINKS:
                    target = os.readlink("", dir_fd=fd)
                    os.close(fd)
                    links += 1
                    if target.startswith("/"):
                        for other in stack[1:]:
                            os.close(other)
                        del stack[1:]
                        names = []
                    todo.extend(reversed([c for c in target.split("/") if c and c != "."]))
                    continue
                stack.append(fd)
                names.append(name)
        finally:
            for fd in stack:
                os.close(fd)
        real = "/" + "/".join(names)
        if len(self._real) < 4096:
            self._real[path] = real
        return real


def _under_proc(path):
    return isinstance(path, str) and (posixpath.normpath("/" + path.lstrip("/")) + "/").startswith("/proc/")


# --------------------------------------------------------------------------- this thread's root


def current():
    """The Root this thread reads through, or None (the host's own /)."""
    return getattr(_state, "root", None)


@contextlib.contextmanager
def inside(root):
    """Every path this thread resolves through this module resolves inside ``root`` until the end."""
    before = current()
    _state.root = root
    try:
        yield root
    finally:
        _state.root = before


def carried(function):
    """``function`` as a thread started from this one runs it: inside this thread's root."""
    root = current()
    if root is None:
        return function

    def run(*args, **kwargs):
        with inside(root):
            return function(*args, **kwargs)

    return run


# --------------------------------------------------------------------------- os, through the root


def open(path, flags, mode=0o777):  # noqa: A001 - os.open's name, through the root
    root = current()
    return os.open(path, flags, mode) if root is None else root.open(path, flags)


def stat_path(path, follow_symlinks=True):
    root = current()
    return os.stat(path, follow_symlinks=follow_symlinks) if root is None else root.stat(path, follow_symlinks)


def lstat(path):
    return stat_path(path, follow_symlinks=False)


def listdir(path):
    root = current()
    return os.listdir(path) if root is None else root.listdir(path)


def readlink(path):
    root = current()
    return os.readlink(path) if root is None else root.readlink(path)


def realpath(path):
    root = current()
    return os.path.realpath(path) if root is None else root.realpath(path)


def _is(path, test, follow=True):
    try:
        return test(stat_path(path, follow).st_mode)
    except (OSError, ValueError):
        return False


def exists(path):
    return _is(path, lambda mode: True)


def lexists(path):
    return _is(path, lambda mode: True, follow=False)


def isdir(path):
    return _is(path, stat.S_ISDIR)


def isfile(path):
    return _is(path, stat.S_ISREG)


def executable(path):
    """A regular file that may be run: os.access(X_OK) on the host; inside a root, an execute bit
    (the node never runs it, the question is what the container would)."""
    root = current()
    if root is None:
        return os.path.isfile(path) and os.access(path, os.X_OK)
    return _is(path, lambda mode: stat.S_ISREG(mode) and bool(mode & 0o111))


def anchor(flags):
    """A new handle of ``/`` opened with ``flags``: the root's when this thread is inside one."""
    root = current()
    if root is None:
        return os.open("/", flags)
    return root.open("/", flags)
