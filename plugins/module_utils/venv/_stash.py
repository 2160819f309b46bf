# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The stash: the files a kept package still needs, kept aside in root's directory while an
uninstall runs and written back through directory handles after it (venv/_removal.py).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tree
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _restore
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._restore import _CLOEXEC, _DIR_FLAGS, _state_dir_fd

# The files a kept package still needs are copied, before the uninstall, into a directory of
# root's alone beside STATE_DIR (one per run), and written back after it through directory
# handles re-walked from / to the venv's directory without following a link: the uninstall runs
# the venv's programs as its owner (its .pth lines included), who may meanwhile swap any
# directory of the venv for a link, and root must never write where such a link points.
_COPY_CHUNK = 1 << 20
_SEEK_DATA, _SEEK_HOLE = getattr(os, "SEEK_DATA", 3), getattr(os, "SEEK_HOLE", 4)
# The largest file kept aside: shared files are small (an __init__.py every wheel of a family
# holds); a larger one is not copied into root's directory: it is named, and its package is
# recorded as restore pending until it is reinstalled.
STASH_FILE_MAX = 1 << 30
# The most data one removal keeps aside in all (holes, which are not copied, aside). Past it the
# removal is refused before anything is removed: root's disk is not the venv owner's to fill,
# and a venv whose shared files hold that much is not what this repair was made for.
STASH_TOTAL_MAX = 2 << 30


class StashFull(GpufleetError):
    """Keeping a file aside would take the stash past STASH_TOTAL_MAX; ``where`` names it."""

    def __init__(self, where=None):
        super().__init__("keeping %s aside would take the stash past %d bytes" % (where or "a file", STASH_TOTAL_MAX))
        self.where = where


def stash_dir():
    """Where the copies go: ``stash`` beside _restore.STATE_DIR (looked up at each call)."""
    return os.path.join(os.path.dirname(_restore.STATE_DIR), "stash")


def _data_extent(fd, pos):
    """``(start, end)`` of the first run of data at or after ``pos`` (SEEK_DATA/SEEK_HOLE: what
    lies between runs is a hole, which reads as zeros and takes no space); None when none is
    left. Where the kernel cannot say, the rest of the file is one run."""
    try:
        start = os.lseek(fd, pos, _SEEK_DATA)
        return start, os.lseek(fd, start, _SEEK_HOLE)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # nothing but a hole (or nothing) from pos on
            return None
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    size = os.fstat(fd).st_size
    return (pos, size) if size > pos else None


def _copy_fd(src, dst, algo="sha256", limit=None, budget=None):
    """Copy ``src`` to ``dst`` (a new file), its holes left holes: a sparse file is copied
    sparse, and no more is written than it holds. ``(hash, written)``: the hash of the whole
    file, holes as the zeros they read as, and the bytes of data written. Past ``limit`` bytes
    of file: ValueError; past ``budget`` bytes written: StashFull, before they are written."""
    import hashlib

    h = hashlib.new(algo)
    zeros = memoryview(bytes(_COPY_CHUNK))
    pos = written = 0
    while True:
        extent = _data_extent(src, pos)
        # What is left before the next data (or before the end) is a hole: hashed, never written.
        start = extent[0] if extent else max(pos, os.fstat(src).st_size)
        if limit is not None and start > limit:
            raise ValueError("larger than %d bytes" % limit)
        while pos < start:
            n = min(start - pos, _COPY_CHUNK)
            h.update(zeros[:n])
            pos += n
        if extent is None:
            os.ftruncate(dst, pos)  # a hole at the end is the file's size, not data
            return h, written
        os.lseek(src, pos, os.SEEK_SET)
        os.lseek(dst, pos, os.SEEK_SET)
        while pos < extent[1]:
            chunk = os.read(src, min(_COPY_CHUNK, extent[1] - pos))
            if not chunk:
                break  # the file shrank meanwhile: its new end is found above
            pos += len(chunk)
            if limit is not None and pos > limit:
                raise ValueError("larger than %d bytes" % limit)
            written += len(chunk)
            if budget is not None and written > budget:
                raise StashFull()
            h.update(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(dst, view):]


class Stash(object):
    """Copies of files taken from below a directory (the venv's) through handles, put back
    through handles.

    Each item: ``site`` (that directory's real path), ``chain`` (its directories' identities
    from / as walked when taken), ``rel`` (the file below it), ``dirs`` (``[name, dev, ino, mode,
    uid, gid]`` of each directory between), the file's mode and owner, and the copy's name."""

    def __init__(self):
        import secrets

        self.made = []  # the directories above the run's that this run made, to remove when empty
        if os.geteuid() == 0:
            here = stash_dir()
            while here != "/" and not os.path.lexists(here):
                self.made.append(here)
                here = os.path.dirname(here)
            # Made root's alone (0700) when absent; one found open to anyone else is refused, never
            # changed: a directory this run did not make is not root's to chmod.
            base = _state_dir_fd(create=True, path=stash_dir(), mode=0o700)
            try:
                if os.fstat(base).st_mode & 0o077:
                    raise OSError(errno.EPERM, "%s is not root's alone: make it so with chmod 700 %s" % (stash_dir(), stash_dir()))
                self.name = "%d-%s" % (os.getpid(), secrets.token_hex(8))
                os.mkdir(self.name, 0o700, dir_fd=base)
                self.fd = os.open(self.name, _DIR_FLAGS, dir_fd=base)
            finally:
                os.close(base)
            self.where = os.path.join(stash_dir(), self.name)
        else:  # not root: nothing is written anywhere a link could send it but where we may write
            self.where = tempfile.mkdtemp(prefix="gpufleet-preserve-")
            self.fd = os.open(self.where, _DIR_FLAGS)
        self.items = []
        self.used = 0  # bytes of data kept aside, against STASH_TOTAL_MAX
        # (dev, ino) of a directory when the files were taken -> of the one put_back made in its place
        self.remade = {}

    def take(self, site, rel, digest=None, algo=None):
        """Copy ``rel`` of the directory ``site`` (real, absolute: the venv's) here; a problem
        (text) when it cannot be (a link on the way, a file that is no regular file or no longer
        matches ``digest``), else None. StashFull when its data would take the stash past
        STASH_TOTAL_MAX: the removal must not start."""
        import base64
        import hashlib

        parts = rel.split("/")
        where = os.path.join(site, rel)
        if rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
            return "%s is not below %s: not kept aside" % (where, site)
        dirs = []
        opened = []
        try:
            top, chain = _tree.walk(site)
            opened.append(top)
            here = top
            for name in parts[:-1]:
                child = here.child(name)
                opened.append(child)
                st = os.fstat(child.fd)
                dirs.append([name, child.dev, child.ino, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid])
                here = child
            src = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=here.fd)
            try:
                st = os.fstat(src)
                if not stat.S_ISREG(st.st_mode):
                    return "%s is not a regular file: not preserved" % where
                if st.st_size > STASH_FILE_MAX:
                    return "%s is larger than %d bytes: not kept aside" % (where, STASH_FILE_MAX)
                # Its data as its blocks say (a sparse file's holes take none), before a byte is copied;
                # the copy counts again what it writes, should the file grow meanwhile.
                if self.used + min(st.st_size, st.st_blocks * 512) > STASH_TOTAL_MAX:
                    raise StashFull(where)
                copy = str(len(self.items))
                dst = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=self.fd)
                try:
                    h, wrote = _copy_fd(src, dst, algo if digest and algo in hashlib.algorithms_guaranteed else "sha256",
                                        STASH_FILE_MAX, STASH_TOTAL_MAX - self.used)
                except StashFull:
                    raise StashFull(where) from None
                finally:
                    os.close(dst)
                self.used += wrote
            finally:
                os.close(src)
        except (_tree.UnsafePath, OSError, ValueError) as exc:
            return "%s could not be copied before the uninstall (%s): not preserved" % (
                where, exc.reason if isinstance(exc, _tree.UnsafePath) else (getattr(exc, "strerror", None) or exc))
        finally:
            for d in opened:
                d.close()
        if digest and base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii") != digest:
            return "%s changed while it was copied (it no longer matches its RECORD): not preserved" % where
        self.items.append({"site": site, "chain": chain, "rel": rel, "dirs": dirs, "copy": copy,
                           "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid})
        return None

    def put_back(self, item):
        """Write ``item`` back where it was taken, unless something is there now; a problem (text)
        naming what changed when the way there is not the one walked when it was taken."""
        site, rel = item["site"], item["rel"]
        where = os.path.join(site, rel)
        opened = []
        try:
            top, _chain = _tree.walk(site, expect=item["chain"])
            opened.append(top)
            here = top
            for name, dev, ino, mode, uid, gid in item["dirs"]:
                path = _tree._join(here.path, name)
                made = False
                try:
                    fd = os.open(name, _tree.DIR_FLAGS, dir_fd=here.fd)
                except FileNotFoundError:
                    # Removed with the package (its last file went): made again, as it was.
                    os.mkdir(name, 0o700, dir_fd=here.fd)
                    fd = os.open(name, _tree.DIR_FLAGS, dir_fd=here.fd)
                    made = True
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise _tree._refusal(where, here.fd, path, name, False) from None
                    raise
                child = _tree.Dir(fd, path)
                opened.append(child)
                if made and os.fstat(fd).st_uid == os.geteuid():
                    if (uid, gid) != (os.fstat(fd).st_uid, os.fstat(fd).st_gid):
                        os.fchown(fd, uid, gid)
                    os.fchmod(fd, mode)
                    # The next files of that directory are put back into this one, not refused as exchanged.
                    self.remade[(dev, ino)] = (child.dev, child.ino)
                elif made:  # not the directory this run made (its inode may even be the old one's again)
                    raise _tree.ChainChanged(where, path, f"is reached through {path}, which this run made again and found "
                                                          f"exchanged for a directory of uid {os.fstat(fd).st_uid} when it opened it")
                elif (child.dev, child.ino) not in ((dev, ino), self.remade.get((dev, ino))):
                    raise _tree.ChainChanged(where, path, "is reached through %s, which is another directory than "
                                             "before the uninstall (it was exchanged meanwhile)" % path)
                here = child
            name = rel.rsplit("/", 1)[-1]
            try:
                here.lstat(name)
                return None  # there again (the installer kept it, or its owner put it back)
            except FileNotFoundError:
                pass
            tmp = ".gpufleet-restore-%d-%s" % (os.getpid(), item["copy"])
            src = os.open(item["copy"], os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC, dir_fd=self.fd)
            try:
                dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=here.fd)
                try:
                    _copy_fd(src, dst)
                    os.fchmod(dst, item["mode"])
                    os.fsync(dst)
                    # linkat, relative to the handle: never replaces what appeared meanwhile.
                    with contextlib.suppress(FileExistsError):
                        os.link(tmp, name, src_dir_fd=here.fd, dst_dir_fd=here.fd, follow_symlinks=False)
                    if (item["uid"], item["gid"]) != (os.fstat(dst).st_uid, os.fstat(dst).st_gid) and os.geteuid() == 0:
                        os.fchown(dst, item["uid"], item["gid"])
                finally:
                    os.close(dst)
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=here.fd)
            finally:
                os.close(src)
        except _tree.UnsafePath as exc:
            return "%s was not put back: %s %s; nothing was written there" % (
                where, "it" if exc.path == where else exc.path, exc.reason)
        except OSError as exc:
            return "%s was not put back: %s" % (where, exc.strerror or exc)
        finally:
            for d in opened:
                d.close()
        return None

    def close(self):
        """Remove the copies (through the handle), the run's directory, and the directories above
        it that this run made, when they are empty: a removal leaves no trace of its stash."""
        with _tree.Dir(self.fd, self.where) as d:
            _tree.clear(d)
        self.fd = None
        for path in [self.where] + self.made:
            try:
                pfd = os.open(os.path.dirname(path), _DIR_FLAGS)  # root's directories (see __init__)
            except OSError:
                return
            try:
                os.rmdir(os.path.basename(path), dir_fd=pfd)
            except OSError:
                return  # not empty: another run's stash is there
            finally:
                os.close(pfd)


def stash_need(preserve):
    """``[(bytes, path)]``: the data each file of ``preserve`` would add to the stash, as lstat
    says now (a file outside the venv or larger than STASH_FILE_MAX is not kept aside)."""
    out = []
    for anchor, rel, _algo, _digest, _keepers in preserve:
        if anchor is None:
            continue
        where = os.path.join(anchor, rel)
        try:
            st = os.lstat(where)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size <= STASH_FILE_MAX:
            out.append((min(st.st_size, st.st_blocks * 512), where))
    return out


def stash_full(preserve, which):
    """The refusal of a removal whose shared files the stash cannot hold (STASH_TOTAL_MAX)."""
    keepers = sorted(set("%s==%s" % k for _a, _r, _al, _d, ks in preserve for k in ks))
    return ("the files that %s share with the packages to remove hold more than %d bytes of data, the most a removal keeps "
            "aside while it runs (STASH_TOTAL_MAX; %s); nothing was removed. Shared files are small (the __init__.py a "
            "family of wheels holds): see what those packages' RECORD lists (pip_inventory verify_files=true) and "
            "reinstall them if that is not what they ship, or remove them too (also_remove) and install them again "
            "afterwards" % (", ".join(keepers), STASH_TOTAL_MAX, which))
