# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A log that a container's user writes (the training job's), opened and read as root safely.

The log's directory is opened from ``/`` through directory handles that follow no symbolic link
(fs._tree.lookup); the log is opened relative to that handle the way fs._files opens every file
a user controls (``O_NONBLOCK|O_NOFOLLOW``, a regular file only). Its size, mtime and inode come
from fstat of that descriptor, never from a stat of the path; only a window of it is read (from
an offset, at most a given number of bytes, within a time bound). So a log that is a link to a
root-only file, a FIFO, ``/dev/zero``, or a log under a directory swapped for a link is refused
with a problem that says so; nothing of what it points to is read or stat'ed.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import check_range
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import READ_SECONDS, Skipped, open_stat
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import UnsafePath, lookup

_CHUNK = 1 << 20


def check_since(since):
    """A ``since`` of the launch (``{offset, inode}``, None for none) that names no place in a
    file: a GpufleetError in the wording of common/_errors.out_of_range."""
    if since is not None:
        check_range("since.offset", int(since.get("offset") or 0), least=0)
        check_range("since.inode", since.get("inode") or 0, least=0)


def open_log(path):
    """``(fd, stat_result)`` of the regular file ``path``, reached from / without following any
    link. Raises Skipped (its ``problem`` says why: a link on the way or at the end, not a
    regular file, missing); the caller closes the descriptor."""
    if not isinstance(path, str) or not path.startswith("/"):
        raise Skipped("%r is not an absolute path: give the log's absolute path" % (path,))
    parent, name = posixpath.split(posixpath.normpath(path))
    if not name:
        raise Skipped("%s is a directory, not a regular file: not read" % path)
    try:
        _real, d = lookup(parent)
    except UnsafePath as exc:
        raise Skipped("%s: its directory %s %s: not followed, not read" % (path, exc.path, exc.reason)) from None
    except (OSError, ValueError) as exc:
        raise Skipped("%s cannot be opened: %s" % (path, getattr(exc, "strerror", None) or exc)) from None
    if d is None:
        raise Skipped("%s does not exist" % path)
    with d:
        return open_stat(name, d.fd, path)


def stat_log(path):
    """fstat of the log opened as open_log() opens it (never a stat of the path). Raises Skipped."""
    fd, st = open_log(path)
    os.close(fd)
    return st


def read_at(fd, start, count, what, seconds=READ_SECONDS):
    """At most ``count`` bytes of the open file ``fd`` from ``start``, within ``seconds``: what
    the file holds there now, never more (a file that grows while read is cut at ``count``)."""
    deadline = time.monotonic() + seconds
    parts, total = [], 0
    while total < count:
        try:
            chunk = os.pread(fd, min(_CHUNK, count - total), start + total)
        except BlockingIOError:
            chunk = None
            time.sleep(0.01)
        except OSError as exc:
            raise Skipped("%s cannot be read: %s" % (what, exc.strerror or exc)) from None
        if chunk == b"":
            break
        if chunk:
            parts.append(chunk)
            total += len(chunk)
        if time.monotonic() > deadline:
            break
    return b"".join(parts)


def read_window(path, max_bytes, since=None):
    """The bytes the throughput gate judges, read through open_log(): the last ``max_bytes`` of the
    log from where it stood at launch. ``(data, cut, where, stat)``: ``cut`` when the start of that
    part is out of view, ``where`` as the gate's ``read_from`` (with ``since``, else None).

    ``since`` is {inode, offset}: a log with another inode (rotated) or shorter than offset
    (truncated) is read from its start. Raises Skipped."""
    fd, st = open_log(path)
    try:
        size, start, where = st.st_size, 0, None
        if since is not None:
            offset, inode = int(since.get("offset") or 0), since.get("inode")
            reason = "launch"
            if inode is not None and int(inode) != st.st_ino:
                reason, offset = "rotated", 0
            elif size < offset:
                reason, offset = "truncated", 0
            start = offset
            where = {"offset": offset, "inode": st.st_ino, "from": reason}
        begin = max(start, size - max_bytes)
        return read_at(fd, begin, size - begin, path), size - start > max_bytes, where, st
    finally:
        os.close(fd)


class Follower:
    """Reads a log as it grows, from an offset, a bounded number of bytes at a time, through
    open_log() each time (a log swapped for a link meanwhile is refused then). lines() gives the
    complete lines written since the last call; a line longer than ``max_line`` is cut there."""

    def __init__(self, path, since=None, max_line=64 << 10, per_read=4 << 20):
        self.path, self.since, self.max_line, self.per_read = path, since, max_line, per_read
        self.pos = None
        self.inode = None
        self.where = None
        self.partial = b""
        self.more = False

    def _start(self, st):
        offset, reason = 0, "launch"
        if self.since is not None:
            offset, inode = int(self.since.get("offset") or 0), self.since.get("inode")
            if inode is not None and int(inode) != st.st_ino:
                reason, offset = "rotated", 0
            elif st.st_size < offset:
                reason, offset = "truncated", 0
        self.pos, self.inode = offset, st.st_ino
        self.where = {"offset": offset, "inode": st.st_ino, "from": reason}

    def lines(self):
        """New complete lines (bytes, without their newline); [] when the log does not exist yet.
        Raises Skipped for a log that is refused."""
        try:
            fd, st = open_log(self.path)
        except Skipped as exc:
            if exc.problem.endswith(" does not exist"):
                return []
            raise
        with contextlib.closing(_Fd(fd)):
            if self.pos is None:
                self._start(st)
            elif st.st_ino != self.inode or st.st_size < self.pos:
                # Rotated or truncated while waited on: what is there now is the new run's.
                self.where = {"offset": 0, "inode": st.st_ino, "from": "rotated" if st.st_ino != self.inode else "truncated"}
                self.pos, self.inode, self.partial = 0, st.st_ino, b""
            data = read_at(fd, self.pos, min(self.per_read, max(0, st.st_size - self.pos)), self.path)
        self.pos += len(data)
        self.more = st.st_size > self.pos  # written beyond this read's bound: read on at once
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        if len(self.partial) > self.max_line:  # a line without an end: judged by its first part
            lines.append(self.partial[:self.max_line])
            self.partial = b""
        return [line[:self.max_line] for line in lines]


class _Fd:
    def __init__(self, fd):
        self.fd = fd

    def close(self):
        os.close(self.fd)
