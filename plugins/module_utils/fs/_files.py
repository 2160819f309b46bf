# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Reading files that a container's user controls, as root, without hanging or exhausting memory.

Every file is opened ``O_RDONLY|O_NONBLOCK|O_NOFOLLOW|O_CLOEXEC`` (optionally relative to a
directory handle), accepted only when fstat says it is a regular file, and read up to a cap
that depends on what kind of file it is (CAPS), within a time bound. A file that is skipped or
cut short is said in a ``problem`` (a line of text for the caller's ``problems`` list), never
a hang, a traceback, or a blame of the file for a cut the reader made.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import errno
import os
import stat
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root

# The most bytes read of each kind of file. Real files are far below: a cap only stops a hostile
# or broken one (a link to /dev/zero is refused before, a huge regular file is cut here).
CAPS = {
    "metadata": 4 << 20,  # METADATA / PKG-INFO headers (the long description after them is not read)
    "record": 64 << 20,  # RECORD: one row per installed file
    "installer": 4 << 10,  # INSTALLER: one word
    "torch_version": 64 << 10,  # torch/version.py
    "pyvenv_cfg": 64 << 10,  # pyvenv.cfg
    "pth": 64 << 10,  # a site directory's *.pth
    "marker": 64 << 10,  # a cache's fingerprint marker (JSON)
    "requirements": 16 << 20,  # a baseline requirements / lock file
    "passwd": 16 << 20,  # a container's /etc/passwd, read from its node
    "elf_header": 4 << 10,  # an ELF header and its program headers
    "elf_dynamic": 1 << 20,  # an ELF's dynamic section
    "elf_strtab": 16 << 20,  # the part of an ELF's string table holding DT_NEEDED names
}

# Seconds one file may take to read (a file on a stalled network file system, say).
READ_SECONDS = 10.0

_CHUNK = 1 << 20
_STOP_FIRST, _STOP_NEXT = 8 << 10, 64 << 10
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_KINDS_OF_FILE = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class Skipped(GpufleetError):
    """A file that is not read: ``problem`` (and ``msg``) says which and why."""

    def __init__(self, problem):
        super().__init__(problem)
        self.problem = problem


def _what(st_mode):
    for test, name in _KINDS_OF_FILE:
        if test(st_mode):
            return name
    return "not a regular file"


def open_regular(path, dir_fd=None, what=None):
    """A file descriptor of ``path`` (relative to ``dir_fd`` when given), a regular file that is
    not a symbolic link; raises Skipped otherwise. Opening never blocks (a FIFO is refused after
    its O_NONBLOCK open, before any read)."""
    return open_stat(path, dir_fd, what)[0]


def open_stat(path, dir_fd=None, what=None):
    """open_regular(), and the file's fstat: ``(fd, stat_result)``."""
    what = what or path
    try:
        # A path is resolved inside the container's root when a node reads one (fs/_root); a
        # name relative to a handle is one entry of a directory opened that way.
        fd = _root.open(path, _FLAGS) if dir_fd is None else os.open(path, _FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Skipped("%s is a symbolic link: not followed, not read" % what) from None
        if exc.errno == errno.ENOENT:
            raise Skipped("%s does not exist" % what) from None
        raise Skipped("%s cannot be opened: %s" % (what, exc.strerror or exc)) from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise Skipped("%s cannot be read: %s" % (what, exc.strerror or exc)) from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise Skipped("%s is %s, not a regular file: not read" % (what, _what(st.st_mode)))
    return fd, st


def utf8_cut(data):
    """``data`` without a UTF-8 character cut at its end (a cap may stop inside one)."""
    end = len(data)
    i = end - 1
    # Back over at most three continuation bytes to the lead byte of the last character.
    while i >= 0 and end - i <= 4 and (data[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0:
        return data
    lead = data[i]
    need = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else 4 if lead >> 3 == 0b11110 else 1
    return data if end - i >= need else data[:i]


def read_fd(fd, cap, what, problems, stop=None, seconds=READ_SECONDS, size=None):
    """At most ``cap`` bytes of an open regular file, in chunks, within ``seconds``. ``stop``
    (a tuple of byte strings, such as blank lines): stop reading once one is seen. ``size``: the
    file's size as fstat gave it, to read it in one call. A cap or a time bound that bites is
    said in ``problems``; the bytes read are returned whole-character."""
    deadline = time.monotonic() + seconds
    # Each read allocates what it asks for: ask for what the file holds (a small first read
    # when only its beginning is wanted), not for the chunk size.
    want = _STOP_FIRST if stop else (size + 1 if size is not None else _CHUNK)
    parts = []
    total = 0
    tail = b""
    keep = max(len(s) for s in stop) - 1 if stop else 0
    while True:
        try:
            # One byte past the cap tells a file of exactly the cap from a larger one.
            chunk = os.read(fd, min(want, cap + 1 - total))
        except BlockingIOError:
            chunk = None
            time.sleep(0.01)
        except OSError as exc:
            raise Skipped("%s cannot be read: %s" % (what, exc.strerror or exc)) from None
        if chunk == b"":
            return b"".join(parts)
        if chunk:
            parts.append(chunk)
            total += len(chunk)
            want = _STOP_NEXT if stop else _CHUNK
            if total > cap:
                problems.append("%s is larger than %d bytes: truncated at %d bytes" % (what, cap, cap))
                return utf8_cut(b"".join(parts)[:cap])
            if stop:
                # Look only at the new bytes and the few before them: linear in the file.
                window = tail + chunk
                if any(s in window for s in stop):
                    return b"".join(parts)
                tail = window[-keep:] if keep else b""
        if time.monotonic() > deadline:
            problems.append("%s took more than %ss to read: cut at %d bytes" % (what, seconds, total))
            return utf8_cut(b"".join(parts))


def read_file(path, kind, problems, dir_fd=None, what=None, stop=None):
    """The bytes of a file a user controls (see the module's docstring), or None when it is
    skipped; why is appended to ``problems``. ``kind`` is a key of CAPS."""
    what = what or path
    try:
        fd, st = open_stat(path, dir_fd, what)
    except Skipped as exc:
        problems.append(exc.problem)
        return None
    try:
        return read_fd(fd, CAPS[kind], what, problems, stop, size=st.st_size)
    except Skipped as exc:
        problems.append(exc.problem)
        return None
    finally:
        os.close(fd)


def read_optional(path, kind, problems, dir_fd=None, what=None, stop=None):
    """read_file(), except that a file that does not exist is None without a problem."""
    local = []
    data = read_file(path, kind, local, dir_fd, what, stop)
    if data is None and local and local[0].endswith(" does not exist"):
        return None
    problems.extend(local)
    return data


def read_text(path, kind, problems, dir_fd=None, what=None, stop=None, missing_ok=False):
    """read_file() decoded as UTF-8 (Latin-1, with a problem, when it is not); None when skipped."""
    what = what or path
    reader = read_optional if missing_ok else read_file
    data = reader(path, kind, problems, dir_fd, what, stop)
    return None if data is None else decode(data, what, problems)


def decode(data, what, problems):
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problems.append("%s is not valid UTF-8 (%s); read it as Latin-1" % (what, exc.reason))
        return data.decode("latin-1")
