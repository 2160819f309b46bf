# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Root's state directory on the host read, and the record of failed restores kept there.

A removal whose reinstall fails leaves packages without their files; which ones is recorded in
STATE_DIR (root's own, outside every venv and home) until a read finds their files back, so that
every read in between reports them. The read needs this module; the removal (venv/_removal.py)
writes the record, and its stash (venv/_stash.py) lives beside STATE_DIR.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import canonical_name, valid_project_name, valid_version
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import seen_uid

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


def pending_problem(item):
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
