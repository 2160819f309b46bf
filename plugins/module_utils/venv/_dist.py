# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Installed Python distributions, read from ``*.dist-info`` on disk: their METADATA and RECORD,
the files a RECORD names checked and anchored, the distributions of a list of site directories.
Where a venv's site directories are is venv/_venv.py; pip_inventory's result venv/_inventory.py.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import errno
import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root, _tree
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import (
    CAPS,
    Skipped,
    decode,
    open_stat,
    read_fd,
    read_file,
    read_optional,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._names import canonical_name

# re, csv, hashlib, base64 and json are imported where used: a plain inventory needs none
# of them, and on a target every millisecond of start-up is paid per host.


class DistError(GpufleetError):
    """Bad input that the user must fix (path, venv, baseline)."""


_ALNUM = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_NAME_CHARS = _ALNUM | frozenset("._-")
_VERSION_CHARS = _ALNUM | frozenset(".!+_-")


def valid_project_name(name):
    """A project name as PEP 508 defines it; anything else is no package an installer can be
    given (a name starting with ``-`` would be read as one of its options)."""
    return (isinstance(name, str) and bool(name) and name[0] in _ALNUM and name[-1] in _ALNUM
            and all(c in _NAME_CHARS for c in name))


def valid_version(version):
    """Only the characters of a PEP 440 version (local label included), starting with one
    that cannot be read as an option."""
    return (isinstance(version, str) and bool(version) and version[0] in _ALNUM
            and all(c in _VERSION_CHARS for c in version))


_decode = decode

# At most this many problems of one kind are listed per file (a garbled file of a million
# lines is one problem and a count, not a million problems).
_LISTED = 3


def _count_more(problems, what, kind, count):
    if count > _LISTED:
        problems.append("%s has %d more %s" % (what, count - _LISTED, kind))


def parse_metadata(data, what="METADATA", problems=None):
    """Parse the header block of a METADATA / PKG-INFO file.

    Only the headers are read (the body is the long description). Returns a dict with
    ``name``, ``version`` and ``requires_dist`` (list). Problems are appended to ``problems``.
    """
    if problems is None:
        problems = []
    # Only the header block, cut at the first blank line before decoding: the body (the long
    # description) is never read, so a body that is not UTF-8 is not this file's problem here.
    for blank in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        end = data.find(blank)
        if end >= 0:
            data = data[:end]
    text = _decode(data, what, problems)
    fields = {"requires_dist": []}
    last = None
    malformed = 0
    for line in text.splitlines():
        if not line.strip():
            break
        if line[0] in " \t" and last is not None:
            continue  # folded continuation of a long header: none we read is folded
        key, sep, value = line.partition(":")
        if not sep:
            malformed += 1
            if malformed <= _LISTED:
                problems.append("%s has a malformed header line: %r" % (what, line[:80]))
            last = None
            continue
        key = key.strip().lower()
        value = value.strip()
        last = key
        if key == "name" and "name" not in fields:
            fields["name"] = value
        elif key == "version" and "version" not in fields:
            fields["version"] = value
        elif key == "requires-dist":
            fields["requires_dist"].append(value)
    _count_more(problems, what, "malformed header lines", malformed)
    return fields


def record_lines(text):
    """RECORD's rows: lines end with LF or CRLF only. (str.splitlines would also break a row at
    characters a file name may hold, such as NEL, U+2028 or the form feed.)"""
    lines = text.split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def parse_record(data, what="RECORD", problems=None, site_dir=None):
    """Parse a RECORD file.

    Returns ``(path, algorithm, digest, size)`` rows, or with ``site_dir``
    ``(abs_path, path, algorithm, digest, size)``. ``algorithm``/``digest`` are ``None``
    where the row has no hash (RECORD itself, .pyc); ``size`` is ``None`` where absent or
    unreadable. Garbled rows are reported in ``problems``, not fatal. One pass, no
    regular expressions: torch's RECORD alone has some 15,000 rows.
    """
    import csv

    if problems is None:
        problems = []
    text = _decode(data, what, problems)
    rows = []
    append = rows.append
    prefix = site_dir.rstrip("/") + "/" if site_dir is not None else None
    lines = record_lines(text)
    # Without a quote character no field holds a comma, and splitting from the right is
    # exact and cheaper than the csv module; otherwise let csv do the unquoting.
    reader = (line.rsplit(",", 2) for line in lines) if '"' not in text else csv.reader(lines)
    bad = refused = 0
    try:
        for lineno, row in enumerate(reader, 1):
            if not row or not row[0]:
                continue
            path = row[0]
            n = len(row)
            algo = digest = size = None
            if n > 1 and row[1]:
                algo, _sep, digest = row[1].partition("=")
                if not digest:
                    bad += 1
                    if bad <= _LISTED:
                        problems.append("%s line %d has a malformed hash %r" % (what, lineno, row[1][:40]))
                    algo = digest = None
            if n > 2 and row[2]:
                if row[2].isdigit():
                    size = int(row[2])
                else:
                    bad += 1
                    if bad <= _LISTED:
                        problems.append("%s line %d has a malformed size %r" % (what, lineno, row[2][:20]))
            if prefix is None:
                append((path, algo, digest, size))
            elif path[0] == "/" or ".." in path or "./" in path or "//" in path:
                abs_path = os.path.normpath(os.path.join(site_dir, path))
                why = outside_row(site_dir, path, abs_path)
                if why:
                    refused += 1
                    if refused <= _LISTED:
                        problems.append(_REFUSED % (what, lineno, path[:200], why))
                    continue
                append((abs_path, path, algo, digest, size))
            else:
                append((prefix + path, path, algo, digest, size))
    except csv.Error as exc:
        problems.append("%s is not valid CSV: %s" % (what, exc))
    _count_more(problems, what, "malformed hashes or sizes", bad)
    _count_more(problems, what, "rows naming a file outside the environment (refused)", refused)
    return rows


# A RECORD row is a path relative to the site directory. Installers write rows with `..` for
# what goes beside it (bin/ scripts, include/, share/), always below the environment's prefix:
# a row that is absolute or leaves the prefix names a file of somebody else, and is refused.
_REFUSED = ("%s line %d names %r, %s: refused (never read, removed nor put back); an installer writes only "
            "below the environment, so this RECORD was written by hand: reinstall the package")


def environment_prefix(site_dir):
    """The directory an environment's installer writes below, for its site directory:
    ``<prefix>/lib/pythonX.Y/site-packages`` (or dist-packages, lib64, ``Lib/site-packages``,
    ``lib/python3/dist-packages``) gives ``<prefix>``; any other directory is its own prefix."""
    head = os.path.normpath(site_dir)
    if os.path.basename(head) in ("site-packages", "dist-packages"):
        head = os.path.dirname(head)
        if os.path.basename(head).startswith("python"):
            head = os.path.dirname(head)
        if os.path.basename(head) in ("lib", "lib64", "Lib"):
            head = os.path.dirname(head)
    return head


def outside_row(site_dir, rel, abs_path):
    """Why the RECORD row ``rel`` (``abs_path`` once normalised) is refused, or None."""
    if rel[0] == "/":
        return "an absolute path"
    prefix = environment_prefix(site_dir).rstrip("/") + "/"
    if not abs_path.startswith(prefix):
        return "which resolves outside the environment %s" % prefix.rstrip("/")
    return None


def file_digest(path, algo="sha256"):
    """Return the urlsafe-base64 digest (no padding) of a file, as RECORD writes it.

    A regular file only, never through a symbolic link (OSError otherwise: a FIFO listed in
    RECORD would block the read forever, a link to /dev/zero never end)."""
    import base64
    import hashlib

    h = hashlib.new(algo)
    try:
        fd, st = open_stat(path)
    except Skipped as exc:
        raise OSError(errno.EINVAL, exc.problem) from None
    try:
        # Most files are small: one read of their size (and the byte that shows the end).
        want = min(st.st_size + 1, 1 << 20)
        while True:
            chunk = os.read(fd, want)
            if not chunk:
                break
            h.update(chunk)
            want = 1 << 20
    finally:
        os.close(fd)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii")


def file_identity(st):
    """``[dev, ino, size, mtime_ns, ctime_ns]`` of a stat result."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def path_identity(path):
    """file_identity() of ``path`` itself (a link is not followed), or None when it does not
    exist or cannot be looked at."""
    try:
        st = _root.lstat(path)
    except OSError:
        return None
    return file_identity(st)


class Anchor(object):
    """A site directory opened from / without following a link (fs/_tree.walk) and held open:
    its real path, ``chain`` (the device and inode of every directory from / down to it, as
    walked) and ``dir`` (its handle), or None for both when it cannot be walked so (a link on
    the way: its files are then read by path, as before, and nothing read from them is kept by
    the evidence cache). Every dist-info file is read relative to the held handle, so what is
    read is the directory the chain names, whatever is renamed above it afterwards."""

    def __init__(self, site):
        self.site = site
        self.real = _root.realpath(site)
        self.chain = None
        self.dir = None
        try:
            self.dir, self.chain = _tree.walk(self.real)
        except (OSError, ValueError, _tree.UnsafePath):
            self.chain = None

    def open_info(self, name):
        """The dist-info directory ``name`` of the site as a _tree.Dir, opened relative to the
        held handle without following a link; OSError else."""
        return self.dir.child(name)

    def close(self):
        if self.dir is not None:
            self.dir.close()
            self.dir = None

    def __del__(self):
        self.close()


class Distribution(object):
    """One installed distribution: its dist-info directory and what it says."""

    def __init__(self, site_dir, info_dir, anchor=None):
        self.site_dir = site_dir
        self.info_dir = info_dir
        self.problems = []
        # Read through handles when the site was walked (Anchor): what was read, as fstat saw it.
        self.anchor = anchor if anchor is not None and anchor.chain is not None else None
        self.info_identity = None  # the dist-info directory's, at the first read through it
        self.read_identities = {}  # file name -> identity of what was read
        self.steady = self.anchor is not None  # False once a read found a directory exchanged
        self.is_egg_info = info_dir.endswith(".egg-info")
        meta_name = "PKG-INFO" if self.is_egg_info else "METADATA"
        # The long description after the headers can be large: the read stops at the blank line.
        data = self._read(meta_name, "metadata", stop=(b"\n\n", b"\r\n\r\n"))
        what = "%s/%s" % (os.path.basename(info_dir), meta_name)
        fields = {"requires_dist": []} if data is None else parse_metadata(data, what, self.problems)
        stem = os.path.basename(info_dir).rsplit(".", 1)[0]
        dir_name, _sep, dir_version = stem.partition("-")
        self.name = fields.get("name") or dir_name
        self.version = fields.get("version") or dir_version or None
        if not fields.get("name") or not fields.get("version"):
            self.problems.append("%s lacks Name or Version; taken from the directory name" % os.path.basename(info_dir))
        self.key = canonical_name(self.name)
        self.requires_dist = fields["requires_dist"]
        self._record = None
        self._record_data = None
        self._paths = None
        self._installer = False
        self._told = []  # problems a kept read told (venv/_evcache.py), not to be told twice

    def replay(self, problems):
        """Tell ``problems`` that a kept (cached) read of this package found; a live read of
        the same files later in the run does not tell them again."""
        self.problems.extend(problems)
        self._told.extend(problems)

    def _untell(self, start):
        """Drop the problems found since ``start`` that a replay already told."""
        if self._told and len(self.problems) > start:
            fresh = self.problems[start:]
            del self.problems[start:]
            for problem in fresh:
                if problem in self._told:
                    self._told.remove(problem)
                else:
                    self.problems.append(problem)

    def _read(self, fname, kind, stop=None, missing_ok=False):
        """A file of the dist-info directory through the file layer; None (and a problem,
        unless ``missing_ok`` and it does not exist) when it is skipped. With an Anchor, the
        file is opened relative to the dist-info directory reached through handles, and its
        identity (fstat of what was read) is kept in ``read_identities``."""
        what = "%s/%s" % (os.path.basename(self.info_dir), fname)
        if self.anchor is None:
            reader = read_optional if missing_ok else read_file
            return reader(os.path.join(self.info_dir, fname), kind, self.problems, what=what, stop=stop)
        info = self._open_info(what)
        if info is None:
            return None
        with info:
            try:
                fd, st = open_stat(fname, info.fd, what)
            except Skipped as exc:
                if not (missing_ok and exc.problem.endswith(" does not exist")):
                    self.problems.append(exc.problem)
                return None
        try:
            self.read_identities[fname] = file_identity(st)
            return read_fd(fd, CAPS[kind], what, self.problems, stop, size=st.st_size)
        except Skipped as exc:
            self.problems.append(exc.problem)
            return None
        finally:
            os.close(fd)

    def _open_info(self, what):
        """The dist-info directory as a _tree.Dir through the Anchor, or None (and a problem)
        when a directory on the way is not the one first walked."""
        try:
            info = self.anchor.open_info(os.path.basename(self.info_dir))
        except FileNotFoundError:
            self.problems.append("%s does not exist" % what)
            return None
        except (_tree.UnsafePath, OSError) as exc:
            self.steady = False
            self.problems.append("%s was not read: %s %s" % (
                what, exc.path if isinstance(exc, _tree.UnsafePath) else self.info_dir,
                exc.reason if isinstance(exc, _tree.UnsafePath) else "cannot be opened: %s" % (exc.strerror or exc)))
            return None
        ident = file_identity(os.fstat(info.fd))
        if self.info_identity is None:
            self.info_identity = ident
        elif ident[:2] != self.info_identity[:2]:
            info.close()
            self.steady = False
            self.problems.append("%s was not read: %s is another directory than when it was first read "
                                 "(it was exchanged meanwhile)" % (what, self.info_dir))
            return None
        return info

    def identities(self):
        """What the evidence cache keys this package on, all through handles: the site's chain,
        the dist-info directory, RECORD (fstat, or what was read) and METADATA (what was read);
        None for each that cannot be had so (then nothing of it is kept)."""
        meta = "PKG-INFO" if self.is_egg_info else "METADATA"
        if self.anchor is None or not self.steady:
            return [None, None, None, None]
        opened = self._open_info("%s/RECORD" % os.path.basename(self.info_dir))
        if opened is None:
            return [None, None, None, None]
        with opened:
            info = file_identity(os.fstat(opened.fd))
            record = self.read_identities.get("RECORD")
            if record is None:
                try:
                    fd, st = open_stat("RECORD", opened.fd, "RECORD")
                    os.close(fd)
                    record = file_identity(st)
                except Skipped:
                    record = None
        return [self.anchor.chain, info, record, self.read_identities.get(meta)]

    @property
    def installer(self):
        if self._installer is False:
            data = self._read("INSTALLER", "installer", missing_ok=True)
            text = data.decode("utf-8", "replace").strip() if data is not None else ""
            self._installer = text or None
        return self._installer

    def _record_bytes(self):
        if self._record_data is None:
            data = self._read("RECORD", "record", missing_ok=self.is_egg_info)
            if data is None:
                data = b""
            self._record_data = data
        return self._record_data

    @property
    def record(self):
        """RECORD rows as ``(abs_path, rel_path, algo, digest, size)``; [] when missing."""
        if self._record is None:
            start = len(self.problems)
            what = "%s/RECORD" % os.path.basename(self.info_dir)
            self._record = parse_record(self._record_bytes(), what, self.problems, self.site_dir)
            self._untell(start)
        return self._record

    @property
    def paths(self):
        """``(abs_path, rel_path)`` of every RECORD row, without parsing hashes or sizes.

        The scan needs only the paths of most packages (their hashes only where a path is
        shared), so this is the cheap pass: one split per line.
        """
        if self._paths is None:
            start = len(self.problems)
            self._paths = self._read_paths()
            self._untell(start)
        return self._paths

    def _read_paths(self):
        if self._record is not None:
            return [(r[0], r[1]) for r in self._record]
        data = self._record_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        if text is None or '"' in text:
            return [(r[0], r[1]) for r in self.record]  # quoting or bad bytes: the full parser
        prefix = self.site_dir.rstrip("/") + "/"
        rels = [line.rsplit(",", 2)[0] for line in record_lines(text)]  # as parse_record splits
        if text.startswith("/") or "\n/" in text or ".." in text or "./" in text or "//" in text:
            # Some path needs normalising (absolute, `..`, `.`, doubled slashes): per line.
            out = []
            for rel in rels:
                if not rel:
                    continue
                if rel[0] == "/" or ".." in rel or "./" in rel or "//" in rel:
                    abs_path = os.path.normpath(os.path.join(self.site_dir, rel))
                    if outside_row(self.site_dir, rel, abs_path):
                        return [(r[0], r[1]) for r in self.record]  # the full parser names the refusal
                    out.append((abs_path, rel))
                else:
                    out.append((prefix + rel, rel))
            return out
        # The common case, in bulk: every path is relative and already normal.
        return [(prefix + rel, rel) for rel in rels if rel]

    def as_dict(self):
        return {
            "name": self.name,
            "version": self.version,
            "location": self.site_dir,
            "installer": self.installer,
        }

    def verify(self):
        """Compare every hashed RECORD file with the disk, as debsums does.

        Returns ``(missing, modified, checked)``: relative paths and the count checked.
        Size is compared first so most mismatches cost no hashing.
        """
        missing, modified, checked = [], [], 0
        for abs_path, rel, algo, digest, size in self.record:
            if not digest:
                continue
            checked += 1
            try:
                st = _root.stat_path(abs_path)
            except OSError:
                missing.append(rel)
                continue
            if size is not None and st.st_size != size:
                modified.append(rel)
                continue
            try:
                if file_digest(abs_path, algo) != digest:
                    modified.append(rel)
            except (IOError, OSError, ValueError):
                modified.append(rel)
        return missing, modified, checked


def iter_distributions(site_dirs):
    """Yield the distributions of every site directory, first on the path wins.

    Returns ``(distributions, shadowed)``: later copies of the same project are shadowed.
    """
    dists = []
    shadowed = []
    seen = {}
    anchors = {}
    for site, entry in info_entries(site_dirs):
        path = os.path.join(site, entry)
        if not _root.isdir(path):
            continue
        if site not in anchors:
            anchors[site] = Anchor(site)
        dist = Distribution(site, path, anchors[site])
        if dist.key in seen:
            shadowed.append(dist)
            continue
        seen[dist.key] = dist
        dists.append(dist)
    return dists, shadowed


def info_entries(site_dirs):
    """``(site, entry)`` of every ``*.dist-info`` / ``*.egg-info`` name in the site directories, in order."""
    for site in site_dirs:
        try:
            entries = sorted(_root.listdir(site))
        except OSError:
            continue
        for entry in entries:
            if entry.endswith((".dist-info", ".egg-info")):
                yield site, entry
