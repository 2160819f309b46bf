# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Find and remove packages built for another CUDA major, restoring what they clobbered.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import tempfile
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root, _tree
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import seen_uid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import reference, scan
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import (
    DistError,
    Venv,
    canonical_name,
    file_digest,
    info_entries,
    valid_project_name,
    valid_version,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._evcache import EvidenceCache
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._pkgtool import (
    Installer,
    has_pip,
    privileged_run,
    run_as,
    shell_join,
)


class VenvLock(object):
    """An exclusive flock on the venv directory itself, so two runs never remove at once and
    no lock file is left in the user's venv."""

    def __init__(self, venv, timeout):
        self.path = venv
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(self.fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise DistError(
                        "another run holds the lock on venv %s for more than %ss; wait for it or raise lock_timeout"
                        % (self.path, self.timeout)) from None
                time.sleep(0.1)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# A failed restore is remembered here until the files are back: root's own directory, outside
# every venv and home, so that the venv's owner can neither forge nor erase the record (a
# record in the venv, or in its parent, would be theirs to delete). One file per venv.
STATE_DIR = "/var/lib/gpufleet-hygiene/restore"
_STATE_MAX = 65536
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _CLOEXEC


def _trusted(st):
    """Owned by root or by us, and no one else may write to it (a sticky directory such as /tmp
    excepted: its children are checked in turn)."""
    return seen_uid(st.st_uid) in (0, os.geteuid()) and (not st.st_mode & 0o022 or st.st_mode & stat.S_ISVTX)


def _distrust(st):
    """Why a directory of root's state may not be trusted (None: it may): its owner, or who
    else may write to it."""
    if _trusted(st):
        return None
    uid = seen_uid(st.st_uid)
    if uid not in (0, os.geteuid()):
        return "belongs to uid %d, not root" % uid
    return "is writable by another user than root"


def _state_dir_fd(create, path=None, mode=0o755):
    """STATE_DIR (or ``path``) opened component by component from /, no symlink followed, each
    directory trusted; None when it does not exist (and not ``create``). Directories made are
    0755, the last one ``mode``. A path that names / itself is refused (EINVAL): no state is kept
    in /, and nothing of root's is made in it or changed on it."""
    parts = [p for p in (path or STATE_DIR).split("/") if p and p != "."]
    if not parts or ".." in parts:
        raise OSError(errno.EINVAL, "%r is no directory below / (a path without '..')" % (path or STATE_DIR))
    fd = _root.anchor(_DIR_FLAGS)  # a container read from its node: its own /
    try:
        for i, part in enumerate(parts):
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(part, mode if i == len(parts) - 1 else 0o755, dir_fd=fd)
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            why = _distrust(os.fstat(fd))
            if why:
                raise OSError(errno.EPERM, "%s %s" % (part, why))
        if os.fstat(fd).st_mode & 0o022:
            raise OSError(errno.EPERM, "it is writable by another user than root")
        return fd
    except BaseException:
        os.close(fd)
        raise


# ------------------------------------------------------------------ the stash
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
    """Where the copies go: ``stash`` beside STATE_DIR."""
    return os.path.join(os.path.dirname(STATE_DIR), "stash")


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


class RestoreRecord(object):
    """The packages of one venv that lost files in a removal and were not restored:
    ``[{name, version}]``, kept in STATE_DIR until a read finds their files back."""

    def __init__(self, venv):
        import hashlib

        self.venv = _root.realpath(venv)
        self.name = hashlib.sha256(self.venv.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"
        self.where = os.path.join(STATE_DIR, self.name)

    def load(self, problems):
        import json

        try:
            dfd = _state_dir_fd(create=False)
            if dfd is None:
                return []
            try:
                fd = os.open(self.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dfd)
            finally:
                os.close(dfd)
        except FileNotFoundError:
            return []
        except OSError as exc:
            problems.append("the record of failed restores %s cannot be read: %s" % (self.where, exc.strerror or exc))
            return []
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or not _trusted(st) or st.st_mode & 0o022 or st.st_size > _STATE_MAX:
                problems.append("the record of failed restores %s is not a regular file of root's under %d bytes: "
                                "ignored" % (self.where, _STATE_MAX))
                return []
            data = os.read(fd, _STATE_MAX + 1)
        finally:
            os.close(fd)
        try:
            doc = json.loads(data.decode("utf-8"))
            entries = [(e["name"], e["version"]) for e in doc["packages"]] if doc.get("venv") == self.venv else []
        except (ValueError, KeyError, TypeError, AttributeError):
            problems.append("the record of failed restores %s is malformed: ignored" % self.where)
            return []
        return [(n, v) for n, v in entries if valid_project_name(n) and valid_version(v)]

    def store(self, pins):
        """Record ``pins`` ((name, version) pairs), or with none remove the record. Returns a
        problem (text) when it cannot, else None."""
        import json

        try:
            dfd = _state_dir_fd(create=bool(pins))
            if dfd is None:
                return None
            try:
                if not pins:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.name, dir_fd=dfd)
                    return None
                doc = {"venv": self.venv, "since": int(time.time()),
                       "packages": [{"name": n, "version": v} for n, v in pins]}
                tmp = ".%s.%d" % (self.name, os.getpid())
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                             0o644, dir_fd=dfd)
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f, sort_keys=True)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            return ("could not %s the record of failed restores %s (%s): run as root so that the next reads "
                    "know the files are missing" % ("write" if pins else "clear", self.where, exc.strerror or exc))
        return None


def unrestored(dists, pins):
    """Of ``pins`` ((name, version)), those whose files are not all back: ``[{name, version,
    installed, missing, modified}]``, each package checked against its own RECORD."""
    by_key = dict((d.key, d) for d in dists)
    out = []
    for name, version in pins:
        dist = by_key.get(canonical_name(name))
        if dist is None:
            out.append({"name": name, "version": version, "installed": False, "missing": [], "modified": []})
            continue
        missing, modified, _checked = dist.verify()
        if missing or modified:
            out.append({"name": dist.name, "version": dist.version, "installed": True,
                        "missing": missing, "modified": modified})
    return out


def _pending_problem(item):
    if not item["installed"]:
        what = "is not installed any more"
    else:
        files = item["missing"] + item["modified"]
        what = "has %d file(s) missing or differing from its RECORD (%s%s)" % (
            len(files), ", ".join(files[:5]), " and %d more" % (len(files) - 5) if len(files) > 5 else "")
    return ("%s %s lost files when the packages that had overwritten them were removed, and their reinstall "
            "failed: it %s. The venv stays not clean until they are back: reinstall it with find_links "
            "(cuda_contamination remove=true find_links=<a directory holding %s==%s>, or pip install "
            "--force-reinstall --no-deps --find-links <that directory> %s==%s)"
            % (item["name"], item["version"], what, item["name"], item["version"], item["name"], item["version"]))


# What a dist-info says is put on an installer's command line only when it is a package
# name and a version: "--python=/usr/bin/python3" as a Name would be an option of uv.
_UNSAFE = ("its metadata names it %r, version %r, which an installer would not read as a package (%s): "
           "not handed to uv or pip; remove that directory by hand")


def blocking_entries(sites):
    """The ``*.dist-info`` / ``*.egg-info`` entries of ``sites`` whose directory name is no
    ``name-version`` an installer can parse: uv refuses a whole venv that holds one."""
    found = []
    for site, entry in info_entries(sites):
        name, _sep, version = entry.rsplit(".", 1)[0].partition("-")
        if not valid_project_name(name) or (version and not valid_version(version.split("-", 1)[0])):
            found.append(os.path.join(site, entry))
    return found


def _stash_need(preserve):
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


def _stash_full(preserve, which):
    """The refusal of a removal whose shared files the stash cannot hold (STASH_TOTAL_MAX)."""
    keepers = sorted(set("%s==%s" % k for _a, _r, _al, _d, ks in preserve for k in ks))
    return ("the files that %s share with the packages to remove hold more than %d bytes of data, the most a removal keeps "
            "aside while it runs (STASH_TOTAL_MAX; %s); nothing was removed. Shared files are small (the __init__.py a "
            "family of wheels holds): see what those packages' RECORD lists (pip_inventory verify_files=true) and "
            "reinstall them if that is not what they ship, or remove them too (also_remove) and install them again "
            "afterwards" % (", ".join(keepers), STASH_TOTAL_MAX, which))


def _pkg_lines(dists):
    return "".join("%s==%s\n" % (d.name, d.version) for d in sorted(dists, key=lambda d: d.key))


class Contamination(object):
    """The scan, and with ``remove`` the remediation, of one venv (a path or a Venv)."""

    def __init__(self, venv, run, expected_cuda=None, protect=("torch",), also_remove=(),
                 find_links=None, no_index=False, installer="auto", scan_binaries=True,
                 lock_timeout=60, check_mode=False, path_env=None, evidence_cache=True):
        self.env = Venv.of(venv, run)
        self.venv = self.env.path
        self.run_cmd = run
        self.expected_cuda = expected_cuda
        for option, names in (("also_remove", also_remove), ("protect", protect)):
            bad = [n for n in names if not valid_project_name(n)]
            if bad:
                raise DistError(
                    "%s holds %s, which %s: a name is letters, digits, '.', '_' and '-', starting and ending with a "
                    "letter or digit (as in sglang, flashinfer-python)"
                    % (option, ", ".join(repr(n) for n in bad), "is not a package name" if len(bad) == 1 else "are not package names"))
        self.protect = set(canonical_name(p) for p in protect)
        self.also_remove = [canonical_name(n) for n in also_remove]
        self.find_links = find_links
        self.no_index = no_index
        self.installer_pref = installer
        self.scan_binaries = scan_binaries
        self.evidence_cache = evidence_cache
        self.lock_timeout = lock_timeout
        self.check_mode = check_mode
        self.path_env = path_env
        self._identity = None
        self._ran = False  # whether an installer was started: until then nothing of the venv changed
        clash = sorted(set(self.also_remove) & self.protect)
        if clash:
            raise DistError(
                "%s is both protected and in also_remove; a protected package is never removed: "
                "drop it from also_remove or from protect" % ", ".join(clash))
        if find_links and not _root.isdir(find_links):
            raise DistError("find_links %s is not a directory of wheels" % find_links)
        self.python = self.env.python
        self.sites = self.env.site_dirs
        root = _root.realpath(self.venv) + os.sep
        self.own_sites = set(_root.realpath(s) for s in self.sites if _root.realpath(s).startswith(root))
        self.restore_record = RestoreRecord(self.venv)

    def _installer_run(self, argv):
        """An installer's argv run as whoever controls the venv (run_as()): root never runs a
        program, an interpreter or a .pth line that a user could have put there."""
        self._ran = True
        return privileged_run(self._identity, self.run_cmd)(argv)

    def scan(self):
        dists = self.env.distributions
        ref, warnings = reference(dists, self.expected_cuda)
        cache = EvidenceCache.open(self.evidence_cache, self.venv)
        try:
            contaminants, unknown, clobbered, shared = scan(dists, ref["cuda_major"], self.scan_binaries, cache)
        finally:
            if cache is not None:
                cache.close()
        problems = list(self.env.problems)
        for dist in dists:
            problems.extend(dist.problems)
        pending = self.pending(dists, problems)
        result = {
            "reference": ref,
            "contaminants": contaminants,
            "clobbered": [dict((k, v) for k, v in c.items() if k != "file") for c in clobbered],
            "unknown": unknown,
            "restore_pending": pending,
            "clean": not contaminants and not pending,
            "scanned": len(dists),
            "problems": problems,
            "warnings": warnings,
        }
        return result, dists, clobbered, shared

    def pending(self, dists, problems):
        """The packages a failed restore left without their files, each checked against its
        RECORD (only those: a read stays cheap); the record is cleared once they are back."""
        recorded = self.restore_record.load(problems)
        if not recorded:
            return []
        pending = unrestored(dists, recorded)
        if not pending and not self.check_mode:
            cleared = self.restore_record.store([])
            if cleared:
                problems.append(cleared)
        for item in pending:
            item["problem"] = _pending_problem(item)
            problems.append(item["problem"])
        return pending

    def run(self, remove=False):
        """The cuda_contamination module's result: the scan, and with ``remove`` the removal.
        A failure once the scan is done carries the result so far (its ``partial``)."""
        result, dists, _clobbered, shared = self.scan()
        result["changed"] = False
        if not remove:
            return result
        try:
            return self.remediate(result, dists, shared)
        except GpufleetError as exc:
            partial = exc.partial or result
            if not self._ran:
                # Refused (or stopped) before any installer ran: what the plan would have removed
                # and restored did not happen, and the venv is as the scan found it.
                partial.update(changed=False, removed=[], restored=[], preserved_files=0)
                partial.pop("installer", None)
                if "diff" in partial:
                    partial["diff"]["after"] = partial["diff"]["before"]
            raise GpufleetError(exc.msg, partial) from exc

    # ------------------------------------------------------------------ removal
    def _anchored(self, dist, abs_path):
        """``(anchor, rel)``: the file at ``abs_path`` (a RECORD row of ``dist``) as a path below
        the venv's real directory, where the stash takes it from and puts it back (a bin/ script
        as well as a file of site-packages); ``(None, abs_path)`` when it is not below it."""
        venv = _root.realpath(self.venv)
        rel = os.path.relpath(abs_path, dist.site_dir)
        real = os.path.normpath(os.path.join(_root.realpath(dist.site_dir), rel))
        if _root.realpath(dist.site_dir) not in self.own_sites or not real.startswith(venv.rstrip("/") + "/"):
            return None, abs_path
        return venv, real[len(venv.rstrip("/")) + 1:]

    def plan(self, dists, contaminants, shared):
        by_key = dict((d.key, d) for d in dists)
        remove, kept = [], []
        for item in contaminants:
            key = canonical_name(item["name"])
            dist = by_key[key]
            if key in self.protect:
                kept.append({"name": item["name"], "reason": "protected"})
            elif not valid_project_name(dist.name) or not valid_version(dist.version):
                kept.append({"name": item["name"], "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
            elif _root.realpath(dist.site_dir) not in self.own_sites:
                kept.append({"name": item["name"], "reason": "installed outside the venv, in %s" % dist.site_dir})
            else:
                remove.append(dist)
        for key in self.also_remove:
            dist = by_key.get(key)
            if dist is None or dist in remove:
                continue
            if _root.realpath(dist.site_dir) not in self.own_sites:
                kept.append({"name": dist.name, "reason": "installed outside the venv, in %s" % dist.site_dir})
                continue
            if not valid_project_name(dist.name) or not valid_version(dist.version):
                kept.append({"name": dist.name, "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
                continue
            remove.append(dist)
        removing = set(d.key for d in remove)
        preserve = {}  # abs_path -> [site (real), rel, algo, digest, [keepers]]: content a keeper still needs
        reinstall = {}  # key -> dist whose shared files no longer match its RECORD
        for abs_path, group in shared.items():
            if not any(d.key in removing for d, _r, _a, _h in group):
                continue
            keepers = [(d, a, h) for d, _r, a, h in group if d.key not in removing]
            if not keepers:
                continue
            for dist, algo, digest in keepers:
                ok = False
                if _root.lexists(abs_path):
                    if not digest:
                        ok = True
                    else:
                        try:
                            ok = file_digest(abs_path, algo) == digest
                        except (IOError, OSError, ValueError):
                            ok = False
                if ok:
                    entry = preserve.setdefault(abs_path, list(self._anchored(dist, abs_path)) + [algo, digest, []])
                    if not entry[3] and digest:
                        entry[2:4] = [algo, digest]
                    entry[4].append((dist.name, dist.version))
                elif valid_project_name(dist.name) and valid_version(dist.version):
                    reinstall[dist.key] = dist
                elif not any(k["name"] == dist.name for k in kept):
                    kept.append({"name": dist.name, "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
        return remove, kept, sorted(preserve.values(), key=lambda e: (e[0] or "", e[1])), sorted(
            reinstall.values(), key=lambda d: d.key)

    def remediate(self, result, dists, shared):
        if not (_root.isfile(os.path.join(self.venv, "pyvenv.cfg")) or _root.isdir(os.path.join(self.venv, "conda-meta"))):
            # A system prefix (/usr, or "/opt/venv/../../usr") has a bin/python3 and, on many
            # distributions, a lib/python3.X/site-packages: it looks like a venv, and is the OS's.
            raise DistError(
                "venv %s (%s) has no pyvenv.cfg and no conda-meta: it is neither a virtual nor a conda environment, "
                "and packages are removed only from one of those; give the training venv's own directory"
                % (self.venv, _root.realpath(self.venv)))
        remove, kept, preserve, reinstall = self.plan(dists, result["contaminants"], shared)
        # What an earlier run failed to restore is reinstalled now, with or without a removal.
        keys = set(d.key for d in reinstall)
        pending = [(p["name"], p["version"]) for p in result["restore_pending"] if canonical_name(p["name"]) not in keys]
        result["kept"] = kept
        result["removed"] = [{"name": d.name, "version": d.version} for d in remove]
        result["restored"] = [{"name": d.name, "version": d.version} for d in reinstall] + [
            {"name": n, "version": v} for n, v in pending]
        result["preserved_files"] = len(preserve)
        before = _pkg_lines(dists)
        removing = set(d.key for d in remove)
        result["diff"] = {"before": before, "after": _pkg_lines([d for d in dists if d.key not in removing])}
        if not remove and not pending:
            result["changed"] = False
            return result
        # Validate before destroy: shared files too large to keep aside stop the removal here, in
        # check mode too (the stash counts again as it copies, before the uninstall).
        need = _stash_need(preserve) if remove else []
        if sum(size for size, _w in need) > STASH_TOTAL_MAX:
            largest = sorted(need, reverse=True)[:3]
            raise DistError(_stash_full(preserve, "the largest: %s" % ", ".join(
                "%s (%d bytes)" % (where, size) for size, where in largest)), result)
        installer = Installer.choose(self.installer_pref, self.venv, self.python, self.sites, self.path_env)
        blocking = blocking_entries(sorted(self.own_sites))
        if blocking and installer.tool == "uv":
            if self.installer_pref == "auto" and has_pip(self.sites):
                installer = Installer("pip", self.python)  # pip passes over such an entry; uv refuses the venv
            else:
                raise DistError(
                    "uv refuses this venv because of %s, whose name is no package name-version; nothing was removed. "
                    "Remove %s by hand (%s) and run again%s"
                    % (", ".join(repr(os.path.basename(b)) for b in blocking),
                       "it" if len(blocking) == 1 else "them", "; ".join("rm -r -- %s" % shell_join([b]) for b in blocking),
                       "" if self.installer_pref == "uv" else ", or install pip into the venv, which passes over it"),
                    result)
        # Who runs it is decided before anything changes: a venv no identity can run safely is refused.
        self._identity = run_as(self.venv, self.python, sorted(self.own_sites), installer.uv or installer.python)
        result["changed"] = True
        result["installer"] = installer.tool
        if self.check_mode:
            return result
        with VenvLock(self.venv, self.lock_timeout):
            return self._execute(result, dists, remove, preserve, reinstall, installer, pending)

    def _uninstall(self, remove, preserve, installer):
        """Uninstall ``remove``, keeping the files in ``preserve`` that a remaining package needs:
        copied into root's stash before, written back through directory handles after (Stash).
        Returns the installer's ``(rc, out, err)`` and the files not kept: ``[(problem, keepers)]``."""
        lost = []
        stash = None
        if preserve:
            try:
                stash = Stash()
            except OSError as exc:
                raise DistError(
                    "could not make %s, where the files the removed packages share with kept ones are kept during the "
                    "uninstall (%s); nothing was removed: run as root, with %s root's and writable by root alone"
                    % (stash_dir(), exc.strerror or exc, os.path.dirname(stash_dir()))) from None
        try:
            taken = []
            for anchor, rel, algo, digest, keepers in preserve:
                if anchor is None:
                    lost.append(("%s is not in the venv: not kept aside" % rel, keepers))
                    continue
                try:
                    problem = stash.take(anchor, rel, digest, algo)
                except StashFull as exc:
                    raise DistError(_stash_full(preserve, "it went past it at %s" % exc.where)) from None
                if problem:
                    lost.append((problem, keepers))
                else:
                    taken.append(keepers)
            argv = installer.uninstall([d.name for d in remove])
            rc, out, err = self._installer_run(argv)
            for item, keepers in zip(stash.items if stash else [], taken):
                problem = stash.put_back(item)
                if problem:
                    lost.append((problem, keepers))
        finally:
            if stash is not None:
                stash.close()
        return rc, out, err, lost

    def _execute(self, result, dists, remove, preserve, reinstall, installer, pending):
        rc, out, err, unkept = self._uninstall(remove, preserve, installer) if remove else (0, "", "", [])

        after = self.env.rescan()
        present = set(d.key for d in after)
        removed = [d for d in remove if d.key not in present]
        failed = [d for d in remove if d.key in present]
        result["removed"] = [{"name": d.name, "version": d.version} for d in removed]
        lost = [d for d in dists if d.key not in present and d not in remove]

        pins = [(d.name, d.version) for d in reinstall if d.key in present or d in lost] + pending
        restore_failed = None
        if pins:
            rargv = installer.reinstall(pins, self.find_links, self.no_index)
            rrc, rout, rerr = self._installer_run(rargv)
            if rrc != 0:
                restore_failed = (rargv, (rerr or rout or "").strip())
        after = self.env.rescan()
        result["diff"]["after"] = _pkg_lines(after)
        result["restored"] = [] if restore_failed else [{"name": n, "version": v} for n, v in pins]
        present = set(d.key for d in after)
        lost = [d.name for d in dists if d.key not in present and d not in remove]
        # What is still not back is recorded (outside the venv) so that every later read reports
        # it until it is; once all is back the record goes.
        still = unrestored(after, pins)
        # A kept package whose file could not be put back is recorded like a failed reinstall.
        pinned = set(canonical_name(n) for n, _v in pins)
        extra = []
        for _problem, keepers in unkept:
            for name, version in keepers:
                if canonical_name(name) not in pinned and valid_project_name(name) and valid_version(version):
                    pinned.add(canonical_name(name))
                    extra.append((name, version))
        damaged = ["%s (%d missing, %d modified)" % (p["name"], len(p["missing"]), len(p["modified"]))
                   for p in still if p["installed"]]
        still += unrestored(after, extra)
        recorded = self.restore_record.store([(p["name"], p["version"]) for p in still])
        new_result, _d, _c, _s = self.scan()
        result["clean"] = new_result["clean"]
        result["clobbered_after"] = new_result["clobbered"]
        before_pending = set(item["problem"] for item in result["restore_pending"])
        result["restore_pending"] = new_result["restore_pending"]
        result["problems"] = [p for p in result["problems"] if p not in before_pending] + [
            p for p in new_result["problems"] if p not in result["problems"]] + ([recorded] if recorded else [])
        if recorded:
            # The record could not be written, so the read above did not see what is still not
            # back: it is reported from what this run found, and the venv is not clean.
            seen = set(canonical_name(p["name"]) for p in result["restore_pending"])
            for item in still:
                if canonical_name(item["name"]) not in seen:
                    item["problem"] = _pending_problem(item)
                    result["restore_pending"].append(item)
                    result["problems"].insert(len(result["problems"]) - 1, item["problem"])
                    result["clean"] = False

        errors = []
        if rc != 0 or failed:
            # The installer's own words say what stopped it: no guess at a cause here.
            errors.append(
                "the uninstall failed part-way (%s exited %s): removed %s; still installed %s: %s. Fix what %s names "
                "and run again: the next run removes what is left and restores the files the removed packages had "
                "overwritten"
                % (installer.tool, rc, ", ".join(d.name for d in removed) or "nothing",
                   ", ".join(d.name for d in failed) or "nothing", (err or out or "").strip()[:600] or "no message",
                   installer.tool))
        if restore_failed:
            rargv, text = restore_failed
            hint = list(rargv)
            if not self.find_links:
                hint[-len(pins):-len(pins)] = ["--find-links", "<a directory holding these wheels>"]
            errors.append(
                "could not reinstall %s, whose files the removed packages had overwritten: no "
                "configured source has them. Restore them with: %s (%s)"
                % (", ".join("%s==%s" % p for p in pins), shell_join(hint), text[-400:]))
        if lost:
            errors.append("packages that were not asked for disappeared: %s" % ", ".join(lost))
        if unkept:
            errors.append(
                "files that kept packages share with the removed ones were not put back: %s. Reinstall %s "
                "(cuda_contamination remove=true find_links=<a directory holding them>) once the venv's directories "
                "are plain directories again"
                % ("; ".join(p for p, _k in unkept[:5]) + (" and %d more" % (len(unkept) - 5) if len(unkept) > 5 else ""),
                   ", ".join(sorted(set("%s==%s" % k for _p, ks in unkept for k in ks)))))
        if damaged and not restore_failed:
            errors.append("restored packages still differ from their RECORD: %s" % ", ".join(damaged))
        if errors:
            raise GpufleetError("; ".join(errors), result)
        return result
