# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Directory trees that users own, walked, measured and cleared through directory handles.

A path is opened from ``/`` one component at a time with ``O_NOFOLLOW|O_DIRECTORY`` (or in
one ``openat2`` call with ``RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH`` where the kernel has it);
a symbolic link anywhere in the path is refused and named, so a directory that a user swaps
for a link (``renameat2`` with ``RENAME_EXCHANGE``) between a check and the open is never
followed. Below the opened directory everything goes through handles: children are opened
relative to their parent's handle without following links and compared with what was
listed, files are removed with ``unlinkat``/``rmdir`` relative to it, never by a path
string, and another file system mounted inside is never entered.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
# A directory opened to be listed; a step of the walk needs only search permission (O_PATH).
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_STEP_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# Beyond this depth a tree is not entered: each level holds a descriptor open while it is walked.
MAX_DEPTH = 256

# usable: None not tried yet; False the kernel, libc or a seccomp filter lacks it (the walk is used).
OPENAT2 = {"usable": None}


class UnsafePath(GpufleetError):
    """A path that is not walked: a symbolic link or a non-directory on the way.

    ``component`` is the path up to the refused entry; ``reason`` a phrase that follows the
    whole path in a message ("… is reached through the symbolic link …")."""

    def __init__(self, path, component, reason):
        super().__init__(f"{path} {reason}")
        self.path = path
        self.component = component
        self.reason = reason


class Dir:
    """An open directory: its descriptor, the path it was reached by, its device and inode."""

    def __init__(self, fd, path):
        self.fd = fd
        self.path = path
        st = os.fstat(fd)
        self.dev, self.ino = st.st_dev, st.st_ino

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def names(self):
        return os.listdir(self.fd)

    def lstat(self, name):
        return os.stat(name, dir_fd=self.fd, follow_symlinks=False)

    def child(self, name, st=None):
        """The subdirectory ``name``, opened without following a link; when ``st`` (its lstat at
        listing time) is given, refused unless it is still that directory."""
        fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        try:
            child = Dir(fd, _join(self.path, name))
        except OSError:
            os.close(fd)
            raise
        if st is not None and (child.dev, child.ino) != (st.st_dev, st.st_ino):
            child.close()
            raise OSError(errno.EAGAIN, "replaced while being walked")
        return child


def _join(parent, name):
    return parent.rstrip("/") + "/" + name


def _parts(path):
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{path!r} is not an absolute path")
    if "\0" in path:
        raise ValueError("a path cannot hold a NUL byte")
    return [c for c in path.split("/") if c and c != "."]


def _openat2(path):
    """A descriptor of ``path`` resolved beneath / with no symbolic link, or None when openat2
    cannot say (not available, or it failed: the walk then finds and names the reason)."""
    if OPENAT2["usable"] is False:
        return None
    root = _root.anchor(DIR_FLAGS)
    try:
        fd = _root.calls().open2(root, path.lstrip("/") or ".", DIR_FLAGS,
                                 _root.RESOLVE_NO_SYMLINKS | _root.RESOLVE_BENEATH | _root.RESOLVE_NO_MAGICLINKS)
    except OSError:
        return None
    finally:
        os.close(root)
    if fd is None:
        OPENAT2["usable"] = False  # no openat2 here (an old kernel, or a seccomp filter refuses it)
        return None
    OPENAT2["usable"] = True
    return fd


def _refusal(path, parent_fd, here, name, last):
    """Why ``name`` in the directory ``parent_fd`` cannot be a step: an UnsafePath."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            target = "?"
        shown = posixpath.normpath(posixpath.join(posixpath.dirname(here), target))
        if last:
            return UnsafePath(path, here, f"is a symbolic link to {shown}")
        return UnsafePath(path, here, f"is reached through the symbolic link {here} (to {shown})")
    if last:
        return UnsafePath(path, here, "is not a directory")
    return UnsafePath(path, here, f"is reached through {here}, which is not a directory")


def lookup(path):
    """``(real, Dir or None)``: the directory ``path`` opened from / without following any
    symbolic link, or None when it does not exist (``real`` then says where it would be).

    ``real`` is ``path`` with ``.``, ``..`` and repeated slashes resolved; with no link on the
    way that is what the kernel resolves too. Raises UnsafePath for a link or a non-directory
    on the way, ValueError for a relative path, OSError for anything else (EACCES, …).
    """
    parts = _parts(path)
    fd = _openat2(path)
    if fd is not None:
        real = _real(parts)
        try:
            return real, Dir(fd, real)
        except OSError:
            os.close(fd)
            raise
    return _walk(path, parts)


def _real(parts):
    out = []
    for c in parts:
        if c == "..":
            if out:
                out.pop()
        else:
            out.append(c)
    return "/" + "/".join(out)


def _walk(path, parts, make=None):
    """The component walk; with ``make`` (``(mode, owner)``) missing directories are created."""
    stack = [_root.anchor(_STEP_FLAGS)]
    names = []
    try:
        for i, name in enumerate(parts):
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop())
                    names.pop()
                continue
            here = "/" + "/".join(names + [name])
            try:
                fd = os.open(name, _STEP_FLAGS, dir_fd=stack[-1])
            except FileNotFoundError:
                if make is None:
                    return _real(names + parts[i:]), None
                fd = _make(stack[-1], name, make)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refusal(path, stack[-1], here, name, i == len(parts) - 1) from None
                raise
            stack.append(fd)
            names.append(name)
            if not stat.S_ISDIR(os.fstat(fd).st_mode):  # O_PATH|O_NOFOLLOW may open a link itself
                raise _refusal(path, stack[-2], here, name, i == len(parts) - 1)
        fd = os.open(".", DIR_FLAGS, dir_fd=stack[-1])
        try:
            return _real(names), Dir(fd, _real(names))
        except OSError:
            os.close(fd)
            raise
    finally:
        for fd in stack:
            os.close(fd)


def _make(parent_fd, name, make):
    mode, owner = make
    with contextlib.suppress(FileExistsError):  # made meanwhile: opened below like any step
        os.mkdir(name, mode, dir_fd=parent_fd)
    fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    if owner is not None and os.geteuid() == 0 and tuple(owner) != (os.geteuid(), os.getegid()):
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) == (os.geteuid(), os.getegid()):  # ours: we just made it
            os.fchown(fd, owner[0], owner[1])
    return fd


def make_dirs(path, mode=0o777, owner=None):
    """Open ``path``, creating the missing directories on the way (``mode`` under the umask,
    owned by ``owner`` when running as root) through handles; a Dir."""
    return _walk(path, _parts(path), make=(mode, owner))[1]


@contextlib.contextmanager
def opened(root):
    """``root`` as a Dir: a Dir is used as it is, a path is looked up (and must exist)."""
    if isinstance(root, Dir):
        yield root
        return
    _real_path, d = lookup(root)
    if d is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), root)
    with d:
        yield d


# --------------------------------------------------------------------------- below a handle


def measure(top, skip=()):
    """``(size_bytes, entries, problems)`` of the tree under the Dir ``top``, its names in
    ``skip`` left out. Links are entries, never followed; a hard-linked file counts once;
    another file system mounted inside is not entered."""
    size = entries = 0
    problems = []
    seen = set()

    def trouble(path, why, exc):
        problems.append("{}: {}".format(path, exc.strerror if exc is not None else _WHY[why].format(verb="measured")))

    for _d, _name, st in _below(top, skip, trouble):
        if stat.S_ISDIR(st.st_mode):
            continue
        entries += 1
        if stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            size += st.st_size
    return size, entries, problems


_WHY = {"mount": "another file system is mounted here; not {verb}", "deep": "deeper than %d levels; not {verb}" % MAX_DEPTH}


def _below(top, skip, trouble):
    """Yield ``(dir, name, lstat)`` for every entry under the Dir ``top`` (its names in ``skip``
    aside), a directory after everything in it, so that a clear can remove it then. A
    subdirectory on another file system, deeper than MAX_DEPTH or that cannot be opened is not
    entered nor yielded: ``trouble(path, "mount" | "deep" | "error", OSError or None)`` says so."""
    stack = [(top, [n for n in top.names() if n not in skip], None, None)]
    try:
        while stack:
            d, pending, name_in_parent, st_in_parent = stack[-1]
            if not pending:
                stack.pop()
                if d is not top:
                    d.close()
                    yield stack[-1][0], name_in_parent, st_in_parent
                continue
            name = pending.pop()
            path = _join(d.path, name)
            try:
                st = d.lstat(name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                trouble(path, "error", exc)
                continue
            if not stat.S_ISDIR(st.st_mode):
                yield d, name, st
                continue
            if st.st_dev != top.dev:
                trouble(path, "mount", None)
                continue
            if len(stack) >= MAX_DEPTH:
                trouble(path, "deep", None)
                continue
            try:
                child = d.child(name, st)
            except OSError as exc:
                trouble(path, "error", exc)
                continue
            try:
                names = child.names()
            except OSError as exc:
                child.close()
                trouble(path, "error", exc)
                continue
            stack.append((child, names, name, st))
    finally:
        for d, _pending, _name, _st in stack:
            if d is not top:
                d.close()


def is_empty(top, skip=()):
    """Whether the Dir ``top`` holds nothing but ``skip`` and other file systems' mount points."""
    for name in top.names():
        if name in skip:
            continue
        try:
            st = top.lstat(name)
        except FileNotFoundError:
            continue
        except OSError:
            return False
        if stat.S_ISDIR(st.st_mode) and st.st_dev != top.dev:
            continue  # a mount point is never cleared, so it is not content
        return False
    return True


class ClearResult:
    def __init__(self):
        self.removed = 0
        self.dirs = 0
        self.freed = 0
        self.errors = []  # (path, OSError)
        self.kept = []


def clear(top, first=(), keep=()):
    """Remove everything inside the Dir ``top`` and keep ``top`` itself and its names in
    ``keep``; the names in ``first`` go before anything else. Every removal is relative to a
    handle: a directory swapped for a link is removed as a link, never entered."""
    res = ClearResult()
    for name in first:
        try:
            os.unlink(name, dir_fd=top.fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            res.errors.append((_join(top.path, name), exc))

    def trouble(path, why, exc):
        if why == "mount":
            res.kept.append(f"{path} (another file system is mounted here)")
        else:
            res.errors.append((path, exc if exc is not None else OSError(errno.ELOOP, _WHY[why].format(verb="cleared"))))

    for d, name, st in _below(top, keep, trouble):
        if stat.S_ISDIR(st.st_mode):
            _rmdir(d, name, res)
            continue
        try:
            os.unlink(name, dir_fd=d.fd)  # a symbolic link goes, its target stays
            res.removed += 1
            if stat.S_ISREG(st.st_mode):
                res.freed += st.st_size
        except FileNotFoundError:
            pass
        except OSError as exc:
            res.errors.append((_join(d.path, name), exc))
    return res


def _rmdir(parent, name, res):
    try:
        os.rmdir(name, dir_fd=parent.fd)
        res.dirs += 1
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):  # a kept mount point, or refilled
            res.errors.append((_join(parent.path, name), exc))


def write_file(top, name, data, mode=0o644, owner=None):
    """Write ``name`` in the Dir ``top`` atomically (a temporary file renamed over it), owned by
    ``owner`` (or like ``top``) when running as root; a link at ``name`` is replaced, not followed."""
    tmp = f"{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=top.fd)
    wfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, mode, dir_fd=top.fd)
    try:
        os.write(wfd, data)
        if owner is None:
            st = os.fstat(top.fd)
            owner = (st.st_uid, st.st_gid)
        if os.geteuid() == 0 and tuple(owner) != (os.geteuid(), os.getegid()):
            os.fchown(wfd, owner[0], owner[1])
    finally:
        os.close(wfd)
    os.rename(tmp, name, src_dir_fd=top.fd, dst_dir_fd=top.fd)


class ChainChanged(UnsafePath):
    """A directory on the way that is not the one an earlier walk found (swapped meanwhile)."""


def walk(path, expect=None):
    """``(Dir, chain)``: the directory ``path`` (absolute, no ``..``) opened from / one component at
    a time without following a link, and ``chain``, the ``[dev, ino]`` of / and of each directory
    down to it. With ``expect`` (the chain of an earlier walk of the same path) a directory that is
    not the one found then raises ChainChanged naming it: a parent exchanged for a sibling
    (``renameat2`` with ``RENAME_EXCHANGE``) between two walks is never taken for the first.
    A link or a non-directory on the way raises UnsafePath, as lookup() does."""
    parts = _parts(path)
    if ".." in parts:
        raise ValueError(f"{path!r} holds '..': give the real path")
    fd = _root.anchor(_STEP_FLAGS)
    names = []
    chain = []
    try:
        for i, name in enumerate([None] + parts):
            if name is not None:
                here = "/" + "/".join(names + [name])
                try:
                    child = os.open(name, _STEP_FLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _refusal(path, fd, here, name, i == len(parts)) from None
                    raise
                os.close(fd)
                fd = child
                names.append(name)
            st = os.fstat(fd)
            here = "/" + "/".join(names)
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafePath(path, here, "is not a directory" if i == len(parts) else
                                 f"is reached through {here}, which is not a directory")
            chain.append([st.st_dev, st.st_ino])
            if expect is not None and (len(expect) <= i or list(expect[i]) != chain[-1]):
                raise ChainChanged(path, here, ("is another directory" if i == len(parts) else
                                                f"is reached through {here}, which is another directory")
                                   + " than when it was first read (it was exchanged meanwhile)")
        final = os.open(".", DIR_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    try:
        return Dir(final, _real(parts)), chain
    except OSError:
        os.close(final)
        raise
