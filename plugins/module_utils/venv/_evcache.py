# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The contamination scan's evidence, kept between reads of an unchanged venv.

What the scan derives from a package's RECORD, METADATA and shared objects is kept in a
root-owned directory (DEFAULT_DIR, mode 0700), one file per venv, keyed on what was read, as
it was read: the chain of directories from / to the package's site directory (device and inode
of each, as walked without following a link when the site was opened; its handle is held and
every dist-info file read relative to it, _dist.Anchor), and the identity (device, inode, size,
mtime and ctime in nanoseconds) of its dist-info directory, RECORD and METADATA taken with fstat
of the files read (_dist.Distribution.identities()); of every shared object whose DT_NEEDED was
read, the fstat of the file read; and a fingerprint of the code that derives it. A key that
differs is a miss: that package is read again. A site directory swapped with a sibling as it was
walked is read, and kept, under the sibling's chain, which the venv's own never matches; a
dist-info directory exchanged between two reads of it is kept under no key. The files shared by several packages are hashed on every read (clobbering is judged
live); only which paths are shared, and the RECORD rows naming them, are kept, keyed on every
package's key and the site directories' chains.

Nothing here trusts the venv's owner: the directory is reached from / without following a
link, every ancestor must be root's and writable by no one else, the file must be root's,
mode 0600, one link, and valid JSON of the expected shape; otherwise it is ignored (and
rewritten). Not running as root, there is no cache.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tree
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import Skipped, open_stat, read_fd
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _cuda, _dist, _elf
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import path_identity

DEFAULT_DIR = "/var/cache/gpufleet-hygiene/evidence"
FORMAT = 2
# The most bytes of one venv's cache file read back: far above a real venv's (a few hundred
# bytes per package); a larger file is ignored and rewritten.
MAX_BYTES = 32 << 20
# A file changed within this many seconds of being read may change again without its ctime
# moving (timestamps are taken from a coarse clock, whole seconds on some file systems):
# what was derived from it is not kept until it is older ("racy" entries, as git calls them).
RACY_SECONDS = 2.0

_CODE = []


def _fold(h, obj):
    """Feed ``obj`` (a function, a code object or data) into the hash ``h``, leaving out file
    names and line numbers, which differ between an installed collection and a module payload."""
    code = getattr(obj, "__code__", obj)
    if hasattr(code, "co_code"):
        h.update(code.co_code)
        h.update(repr(code.co_names).encode())
        for const in code.co_consts:
            _fold(h, const)
    else:
        h.update(repr(obj).encode("utf-8", "surrogateescape"))


def code_version():
    """A fingerprint of the code and tables the evidence is derived with: any change to them
    (a new name family, another soname, another parser) makes every kept entry a miss."""
    if not _CODE:
        import hashlib

        h = hashlib.sha256(("%d %s" % (FORMAT, sys.version_info[:2])).encode())
        for obj in (_cuda.NAME_FAMILIES, sorted(_cuda.VERSION_IS_CUDA), _cuda.CUDA_SONAMES, _cuda.LAYERS,
                    _cuda.classify, _cuda.file_cuda, _cuda.name_cuda, _cuda.label_cuda, _cuda.is_cpu_label,
                    _cuda.digits_to_cuda, _cuda.soname_cuda, _cuda.shared_paths, _cuda.scan,
                    _dist.parse_record, _dist.record_lines, _dist.parse_metadata, _dist.Distribution.__init__,
                    _dist.Distribution.paths.fget, _dist.Distribution.record.fget, _dist.Distribution._record_bytes,
                    _elf.dt_needed, _elf._read_needed, _elf.CAPS):
            _fold(h, obj)
        _CODE.append(h.hexdigest()[:32])
    return _CODE[0]


def _racy(idents, now_ns):
    limit = now_ns - int(RACY_SECONDS * 1e9)
    return any(i is not None and (i[3] > limit or i[4] > limit) for i in idents)


def _trusted_dir(st, final):
    """root's, and writable by no one else (an ancestor may be a sticky directory such as /tmp,
    whose children others cannot rename); the cache directory itself is root's alone."""
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        return False
    if final:
        return not st.st_mode & 0o077
    return not st.st_mode & 0o022 or bool(st.st_mode & stat.S_ISVTX)


def _open_dir(path):
    """The cache directory as a _tree.Dir, made (0700) when missing; None when it is not safe:
    a link on the way, an ancestor another user could change, a directory not root's alone.
    Only the cache's own two directories are made (gpufleet-hygiene/evidence of DEFAULT_DIR, the
    last two of another path): a container without /var/cache gets none made for it, and no cache."""
    base = os.path.dirname(os.path.dirname(path))
    try:
        if not stat.S_ISDIR(os.lstat(base).st_mode):
            return None
    except OSError:
        return None
    try:
        top = _tree.make_dirs(path, mode=0o700)
    except (OSError, ValueError, _tree.UnsafePath):
        return None
    try:
        if not _trusted_dir(os.fstat(top.fd), True):
            top.close()
            return None
        here = top.path
        while here != "/":
            here = os.path.dirname(here)
            if not _trusted_dir(os.lstat(here), False):
                top.close()
                return None
    except OSError:
        top.close()
        return None
    return top


def _well_formed(doc, venv, code):
    return (isinstance(doc, dict) and doc.get("format") == FORMAT and doc.get("code") == code
            and doc.get("venv") == venv and isinstance(doc.get("packages"), dict)
            and isinstance(doc.get("shared"), (dict, type(None))))


class EvidenceCache(object):
    """One venv's kept evidence: loaded once, looked up per package, written back once when
    something was derived anew."""

    def __init__(self, top, venv):
        import hashlib

        self.top = top
        self.venv = venv
        self.name = hashlib.sha256(venv.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"
        self.code = code_version()
        self.packages = {}
        self.shared = None
        self.dirty = False
        self.hits = 0
        self.misses = 0
        self._load()

    @classmethod
    def open(cls, setting, venv):
        """The cache for the venv at ``venv`` as ``setting`` says (True or None: DEFAULT_DIR;
        False: none; an absolute path: that directory), or None: off, not root, or no safe
        directory. It never fails a read."""
        if setting is False or (isinstance(setting, str) and setting.strip().lower() in ("false", "no", "off", "0", "")):
            return None
        path = DEFAULT_DIR if setting in (True, None) or (
            isinstance(setting, str) and setting.strip().lower() in ("true", "yes", "on", "1")) else setting
        if not isinstance(path, str) or not path.startswith("/") or os.geteuid() != 0:
            return None
        top = _open_dir(path)
        return None if top is None else cls(top, os.path.realpath(venv))

    def _load(self):
        import json

        try:
            fd, st = open_stat(self.name, self.top.fd)
        except Skipped:
            return
        try:
            if st.st_uid != 0 or st.st_mode & 0o077 or st.st_nlink != 1 or st.st_size > MAX_BYTES:
                return
            doc = json.loads(read_fd(fd, MAX_BYTES, self.name, [], size=st.st_size).decode("utf-8"))
        except (Skipped, ValueError, UnicodeDecodeError, RecursionError):
            return
        finally:
            os.close(fd)
        if _well_formed(doc, self.venv, self.code):
            self.packages = doc["packages"]
            self.shared = doc["shared"]

    def close(self):
        """Write what changed (atomically: a new file renamed over the old one), and let go of
        the directory. A write that fails leaves the read as it was."""
        import json

        try:
            if self.dirty:
                doc = {"format": FORMAT, "code": self.code, "venv": self.venv,
                       "packages": self.packages, "shared": self.shared}
                _tree.write_file(self.top, self.name, json.dumps(doc, separators=(",", ":")).encode("utf-8"),
                                 mode=0o600, owner=(0, 0))
                self.dirty = False
        except (OSError, ValueError):
            pass
        finally:
            self.top.close()

    # ------------------------------------------------------------------ keys
    @staticmethod
    def package_key(dist):
        """The identities a package's evidence is derived from, all taken through directory
        handles (_dist.Distribution.identities): the chain of directories from / to its site
        directory (device and inode of each, as walked), its dist-info directory, RECORD and
        METADATA (or PKG-INFO) as read. A site directory exchanged with a sibling changes the
        chain: a miss."""
        return dist.identities()

    @staticmethod
    def _read_as_keyed(dist, key):
        """Whether what was read of ``dist`` is what ``key`` names: every read steady (no
        directory exchanged on the way), RECORD, when it was read, the file the key names."""
        if not getattr(dist, "steady", False) or None in key[:3]:
            return False
        record = dist.read_identities.get("RECORD")
        return record is None or record == key[2]

    def _keep(self, idents):
        """Whether entries keyed on ``idents`` may be kept (none of them racy)."""
        return not _racy(idents, time.time_ns())

    # ------------------------------------------------------------------ per package
    def package(self, dist, key, scan_binaries):
        """The kept ``(layer, [[major, [reasons]]], problems)`` of ``dist``, or None (a miss)."""
        entry = self.packages.get(dist.info_dir)
        try:
            if (not isinstance(entry, dict) or entry.get("key") != key or entry.get("binaries") != bool(scan_binaries)
                    or any(path_identity(p) != i for p, i in entry["read"])):
                self.misses += 1
                return None
            layer, majors, problems = entry["layer"], entry["majors"], entry["problems"]
            if (layer is not None and not isinstance(layer, int)) or not all(isinstance(p, str) for p in problems):
                self.misses += 1
                return None
            majors = dict((int(m), [str(r) for r in reasons]) for m, reasons in majors)
        except (KeyError, TypeError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return layer, majors, list(problems)

    def keep_package(self, dist, key, scan_binaries, layer, majors, problems, read):
        """Keep what was derived for ``dist``; ``read``: ``[[path, identity]]`` of the files outside
        its dist-info that were read (its shared objects), each as fstat saw the file read (as
        lstat saw the path where it could not be opened). Nothing is kept when a read of ``dist``
        met an exchanged directory or RECORD was not the file the key names."""
        if not self._read_as_keyed(dist, key) or not self._keep(key[1:] + [i for _p, i in read]):
            self.packages.pop(dist.info_dir, None)
            return
        self.packages[dist.info_dir] = {
            "key": key, "binaries": bool(scan_binaries), "layer": layer,
            "majors": [[m, r] for m, r in sorted(majors.items())], "problems": problems, "read": read}
        self.dirty = True

    # ------------------------------------------------------------------ shared paths
    def shared_key(self, dists, keys):
        """The list of packages, each one's key and each site directory's identity, with a
        digest of them all (``"digest"``), which is what is kept and compared."""
        import hashlib
        import json

        chains = dict((d.site_dir, d.anchor.chain if d.anchor is not None else None) for d in dists)
        key = {"sites": [[s, chains[s]] for s in sorted(chains)],
               "packages": [[d.info_dir, k] for d, k in zip(dists, keys)]}
        key["steady"] = all(self._read_as_keyed(d, k) for d, k in zip(dists, keys))
        text = json.dumps(key, separators=(",", ":")).encode("utf-8", "surrogateescape")
        key["digest"] = hashlib.sha256(text).hexdigest()
        return key

    def shared_paths(self, key):
        """The kept ``(entries, problems)``: entries ``[abs_path, [[index, rel, algo, digest]]]``,
        problems one list per package; or None (a miss)."""
        doc = self.shared
        try:
            if not isinstance(doc, dict) or key["digest"] != doc["key"]:
                return None
            entries, problems = doc["entries"], doc["problems"]
            count = len(key["packages"])
            if len(problems) != count or not all(isinstance(p, str) for ps in problems for p in ps):
                return None
            for abs_path, group in entries:
                if not isinstance(abs_path, str) or not all(0 <= g[0] < count and isinstance(g[1], str) for g in group):
                    return None
        except (KeyError, TypeError, ValueError, IndexError):
            return None
        return entries, problems

    def keep_shared(self, key, entries, problems, dists=None):
        idents = [k for _d, ks in key["packages"] for k in ks[1:]]
        steady = dists is None or all(self._read_as_keyed(d, k) for d, (_i, k) in zip(dists, key["packages"]))
        if not key.get("steady") or not steady or any(s[1] is None for s in key["sites"]) or not self._keep(idents):
            self.shared = None
            return
        self.shared = {"key": key["digest"], "entries": entries, "problems": problems}
        self.dirty = True
