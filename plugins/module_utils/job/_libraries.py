# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The CUDA libraries a running job has mapped: /proc/<pid>/maps read, each library judged.

What a process maps is what it runs on, whatever the venv holds now. For each PID, its maps are
read (bounded in bytes and time; a process that exits meanwhile is left out) and every mapped
shared object of the CUDA runtime and driver side, cuDNN, NCCL, cuBLAS, cuSPARSELt, NVSHMEM,
Triton or torch is listed with the path the process sees, the package whose RECORD lists it,
its CUDA major (the contamination check's evidence: the soname's major, the ``nvidia/cuNN/``
layout, the ELF's DT_NEEDED, the package's label or name family) and whether maps says
``(deleted)`` (a file removed or replaced under the running process).

The reads take a ``proc`` root and an ``open_file(path) -> fd`` opener, so that a reader on a
Proxmox VE node can give the node's /proc (host PIDs) and an opener that resolves each path
inside the container's root directory handle: the paths in maps are the process's own, that
is the container's. Nothing of the process or of the venv is executed; files are opened
``O_NOFOLLOW|O_NONBLOCK``, regular files only (fs/_files.py).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import errno
import os
import re
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import Skipped, open_regular, read_fd
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import proc_file
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import label_cuda, name_cuda, soname_cuda
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._elf import _read_needed
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import current_view

PROC = "/proc"
# A torch job's maps run to a few thousand lines (well under 1 MiB); a cap stops a broken one.
MAPS_CAP = 16 << 20
# Seconds all the maps and libraries of one call may take (the caller can give less).
READ_SECONDS = 10.0
DELETED = " (deleted)"

# The library families, kept as data: (family, regular expression on the file's name). First
# match wins: cuSPARSELt before cuSPARSE, cuBLAS before the rest of CUDA.
FAMILIES = (
    ("cudnn", r"^libcudnn"),
    ("nccl", r"^libnccl"),
    ("cublas", r"^libcublas"),
    ("cusparselt", r"^libcusparseLt"),
    ("nvshmem", r"^(?:lib)?nvshmem"),
    ("cuda", (r"^lib(?:cudart|cuda|nvrtc|nvrtc-builtins|nvJitLink|cupti|cufft|cufftw|curand|cusolver|cusolverMg|cusparse"
              r"|nvToolsExt|nvperf_host|nvperf_target|cufile|cufile_rdma|nvidia-ml|nvblas|npp\w*|nvjpeg)(?=[.\-_]|$)")),
    ("triton", r"^libtriton"),
    ("torch", r"^lib(?:torch|c10|shm|caffe2)(?=[._]|$)"),
)
_FAMILIES = tuple((name, re.compile(rx)) for name, rx in FAMILIES)
# Extensions found by their package's directory in a site directory: torch/_C.cpython-*.so,
# triton/_C/libtriton.so. Only there: a venv under /opt/torch/ holds numpy too, and Triton's own
# cache (~/.triton/cache) holds the helper modules it compiled, which are no library of a package.
_DIR_FAMILIES = (("triton", re.compile(r"/(?:site|dist)-packages/triton/")), ("torch", re.compile(r"/(?:site|dist)-packages/torch/")))
_SO_RE = re.compile(r"\.so(?:\.\d+)*$")
# Mapped libraries whose soname's major is the CUDA major, besides those the contamination check
# reads (_cuda.CUDA_SONAMES): a deleted one's name is all that is left to say its major. Two
# digits: a toolkit's CUPTI file is libcupti.so.2025.1.1 behind its soname's link.
CUDA_MAJOR_SONAMES = ("libcupti",)
_MAJOR_SONAME_RE = re.compile(r"^(?:%s)\.so\.(\d{2})(?:\.|$)" % "|".join(re.escape(s) for s in CUDA_MAJOR_SONAMES))
_CU_DIR_RE = re.compile(r"/nvidia/cu(\d{2})/")


def family(path):
    """The library family of a mapped file's path, or None for anything else."""
    base = path.rsplit("/", 1)[-1]
    if not _SO_RE.search(base):
        return None
    for name, rx in _FAMILIES:
        if rx.match(base):
            return name
    for name, rx in _DIR_FAMILIES:
        if rx.search(path):
            return name
    return None


def library_key(path):
    """What makes two files the same library whatever their version: the name before ``.so``
    (``libnccl`` of ``libnccl.so.2``, ``libcudart`` of ``libcudart.so.12`` and ``.so.13``)."""
    base = path.rsplit("/", 1)[-1]
    return base.split(".so", 1)[0]


def parse_maps(data):
    """``[(path, deleted)]`` of the files a maps text (bytes) names, each once, in order."""
    seen = {}
    for line in data.split(b"\n"):
        fields = line.split(None, 5)
        if len(fields) < 6 or fields[4] == b"0" or not fields[5].startswith(b"/"):
            continue  # anonymous, [heap], [stack], [vdso]
        path = fields[5].decode("utf-8", "replace")
        deleted = path.endswith(DELETED)
        if deleted:
            path = path[:-len(DELETED)]
        seen[path] = seen.get(path, False) or deleted
    return list(seen.items())


def read_maps(pid, proc=PROC, problems=None, seconds=READ_SECONDS):
    """The bytes of /proc/<pid>/maps (capped at MAPS_CAP, within ``seconds``), or None when the
    process is gone. Another user's process that cannot be read is said in ``problems``."""
    problems = [] if problems is None else problems
    what = "%s/%d/maps" % (proc, pid)
    if current_view() is not None:
        # A container read from its node: the node's /proc of its process, never its own procfs.
        try:
            data = proc_file(what)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ESRCH):
                problems.append("%s cannot be read: %s" % (what, exc.strerror or exc))
            return None
        if len(data) > MAPS_CAP:
            problems.append("%s is larger than %d bytes: truncated at %d bytes" % (what, MAPS_CAP, MAPS_CAP))
        return data[:MAPS_CAP]
    try:
        # /proc files are not symbolic links and cannot be FIFOs; the flags are the file layer's all the same.
        fd = os.open(what, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return None
        problems.append("%s cannot be read: %s" % (what, exc.strerror or exc))
        return None
    try:
        return read_fd(fd, MAPS_CAP, what, problems, seconds=seconds)
    except Skipped as exc:
        if "No such process" not in exc.problem:
            problems.append(exc.problem)
        return None
    finally:
        os.close(fd)


def default_open(path):
    """The in-host opener: the file itself, O_NOFOLLOW, a regular file (fs/_files.py)."""
    return open_regular(path)


def read_needed(path, open_file=default_open):
    """DT_NEEDED of a mapped library through ``open_file``; None when it cannot be read."""
    try:
        fd = open_file(path)
    except (Skipped, OSError):
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            return _read_needed(f)
    except (IOError, OSError, ValueError, OverflowError, MemoryError):
        return None
    except Exception:  # noqa: BLE001 - a malformed ELF (struct.error) is "cannot be read", not a crash
        return None


class VenvIndex(object):
    """The venv's shared objects by path, each with the packages whose RECORD lists it.

    ``dists``: the venv's distributions (venv/_dist.py); ``clobbered``: the contamination
    check's ``clobbered`` (a file two packages install is the one of those that overwrote it);
    ``resolve``: how a site directory is seen by the process (maps names files by their real
    path: a venv reached through a symbolic link is indexed under both).

    A RECORD is read only when a mapped file asks for it, the likeliest packages first (a torch
    venv's RECORDs list tens of thousands of files, most of them of no library): the owner of a
    file in a site directory is looked for in the packages named like its first directory, then
    in the rest; the venv's copy of a library mapped from outside it in the packages that ship
    CUDA libraries (nvidia-*, torch, triton)."""

    SHIPPERS = ("nvidia-", "torch", "triton")

    def __init__(self, dists, clobbered=(), resolve=None):
        self.dists = list(dists)
        self.owners = {}
        self.keys = {}
        self.rel = {}
        self.sites = {}  # a site directory as RECORD names it -> as the process sees it
        self._loaded = set()
        resolve = resolve or _root.realpath
        for dist in self.dists:
            site = dist.site_dir.rstrip("/") + "/"
            if site not in self.sites:
                try:
                    self.sites[site] = resolve(site.rstrip("/")).rstrip("/") + "/"
                except (OSError, ValueError):
                    self.sites[site] = site
        # (rel, owner) -> the packages whose bytes the file holds now
        self.overwritten = dict(((c.get("path"), c.get("owner")), list(c.get("overwritten_by") or ())) for c in clobbered or ())
        self._clobbered_names = {}
        for (rel, owner), winners in self.overwritten.items():
            self._clobbered_names.setdefault(rel, set()).update([owner] + winners)

    def _load(self, dist):
        if id(dist) in self._loaded:
            return
        self._loaded.add(id(dist))
        site = dist.site_dir.rstrip("/") + "/"
        real = self.sites[site]
        for abs_path, rel in dist.paths:
            if ".so" not in rel or family(abs_path) is None:
                continue
            names = [abs_path] + ([real + abs_path[len(site):]] if real != site and abs_path.startswith(site) else [])
            for name in names:
                owners = self.owners.setdefault(name, [])
                if dist not in owners:
                    owners.append(dist)
                self.rel[name] = rel
            self.keys.setdefault(library_key(abs_path), []).append(names[-1])

    def _rel(self, path):
        """The path relative to the site directory it is in (as RECORD or the process names it), or None."""
        for site, real in self.sites.items():
            for prefix in (site, real):
                if path.startswith(prefix):
                    return path[len(prefix):]
        return None

    def owner(self, path):
        """(the package whose file it is, every package listing it): a file two packages list is
        the one that overwrote it (clobbered), else the first."""
        rel = self._rel(path)
        if rel is None:
            return None, []
        if path not in self.owners:
            first = rel.split("/", 1)[0].lower().replace("_", "-")
            likely = [d for d in self.dists if d.key == first or d.key.startswith(first + "-") or first.startswith(d.key)]
            for dist in likely + [d for d in self.dists if d not in likely]:
                self._load(dist)
                if path in self.owners:
                    break
        # A file two packages install: both are read, so that the clobbered one is told apart.
        names = self._clobbered_names.get(self.rel.get(path, rel)) or ()
        for dist in self.dists:
            if dist.name in names:
                self._load(dist)
        owners = self.owners.get(path) or []
        if len(owners) > 1:
            rel = self.rel.get(path)
            for dist in owners:
                winners = self.overwritten.get((rel, dist.name))
                if winners:
                    for other in owners:
                        if other.name in winners:
                            return other, owners
        return (owners[0] if owners else None), owners

    def ships(self, path):
        """Paths in the venv of the same library (library_key) as ``path``."""
        for dist in self.dists:
            if dist.key.startswith(self.SHIPPERS):
                self._load(dist)
        return self.keys.get(library_key(path), [])


def package_major(dist):
    """(CUDA major, reason) a package's label or name says, or None."""
    if dist is None:
        return None
    found = label_cuda(dist.version)
    if found:
        return found[0], "package %s %s carries the local label for CUDA %s" % (dist.name, dist.version, found[1] or found[0])
    found = name_cuda(dist.key, dist.version)
    if found:
        return found[0], "package %s %s: %s" % (dist.name, dist.version, found[1])
    return None


def judge_library(path, deleted, index, open_file=default_open, needed_cache=None):
    """One mapped library: its family, package, CUDA major and the evidence for it."""
    base = path.rsplit("/", 1)[-1]
    evidence = []
    majors = []
    named = _MAJOR_SONAME_RE.match(base)
    major = int(named.group(1)) if named else soname_cuda(base)
    if major is not None:
        majors.append(major)
        evidence.append("soname %s" % base)
    match = _CU_DIR_RE.search(path)
    if match:
        majors.append(int(match.group(1)))
        evidence.append("under nvidia/cu%s/ (the CUDA %s layout)" % (match.group(1), match.group(1)))
    if not deleted:  # a deleted file's path names another file now (or none): its links are not this one's
        cache = {} if needed_cache is None else needed_cache
        if path not in cache:
            cache[path] = read_needed(path, open_file)
        for soname in cache[path] or ():
            linked = soname_cuda(soname)
            if linked is not None:
                majors.append(linked)
                evidence.append("links %s (DT_NEEDED)" % soname)
    dist, owners = index.owner(path) if index is not None else (None, [])
    from_package = package_major(dist)
    if from_package:
        if not majors:
            majors.append(from_package[0])
        evidence.append(from_package[1])
    # Only a shared library by its soname (lib*.so*) has a copy the venv ships: a Python extension
    # module's file name says nothing of which library it is.
    ships = [] if index is None or owners or not base.startswith("lib") else [p for p in index.ships(path) if p != path]
    return {
        "path": path,
        "family": family(path),
        "package": dist.name if dist is not None else None,
        "package_version": dist.version if dist is not None else None,
        "owners": [d.name for d in owners],
        "cuda_major": majors[0] if majors else None,
        "evidence": evidence,
        "deleted": bool(deleted),
        # Mapped from outside the venv while the venv ships that library itself.
        "outside_venv": bool(ships),
        "venv_copy": ships[0] if ships else None,
    }


def mapped_libraries(pids, proc=PROC, open_file=None, index=None, seconds=READ_SECONDS, describe=None):
    """What each of ``pids`` has mapped of the CUDA side: ``{"processes": [...], "problems": [...]}``.

    Each process: ``pid``, ``comm``, ``libraries`` (judge_library()'s dicts); a PID that is gone
    (or a zombie) is left out. ``proc``: the /proc to read (the node's, for host PIDs);
    ``open_file(path) -> fd``: how a mapped path is opened for its DT_NEEDED (default: in this
    host, O_NOFOLLOW, regular files only) - a node reader gives one resolving inside the
    container's root; ``index``: a VenvIndex (no package, no outside-the-venv without it);
    ``seconds``: the bound for the whole call (processes not read by then are said in
    ``problems``); ``describe(pid) -> {"comm": ...}`` names a process (default: its comm file)."""
    open_file = open_file or default_open
    deadline = time.monotonic() + seconds
    problems = []
    out = []
    needed = {}
    judged = {}  # a job's processes (its workers) map the same files: each is judged once
    todo = sorted(set(int(p) for p in pids))
    for n, pid in enumerate(todo):
        left = deadline - time.monotonic()
        if left <= 0:
            problems.append("%d process(es) not read within %ss: %s" % (
                len(todo) - n, seconds, ", ".join(str(p) for p in todo[n:][:5])))
            break
        data = read_maps(pid, proc, problems, seconds=left)
        if data is None:
            continue
        libraries = []
        for path, deleted in parse_maps(data):
            if family(path):
                if (path, deleted) not in judged:
                    judged[(path, deleted)] = judge_library(path, deleted, index, open_file, needed)
                libraries.append(dict(judged[(path, deleted)]))
        out.append({"pid": pid, "comm": _comm(pid, proc, describe), "libraries": libraries})
    return {"processes": out, "problems": problems}


def _comm(pid, proc, describe):
    if describe is not None:
        info = describe(pid) or {}
        return info.get("comm")
    try:
        return proc_file("%s/%d/comm" % (proc, pid))[:64].decode("utf-8", "replace").strip()
    except OSError:
        return None


def wrong(library, ref_major, reference=None):
    """Why a mapped library is wrong for a job whose torch is built for CUDA ``ref_major``
    (a list of reasons; empty when it is fine). ``reference`` words the reference (default
    ``"torch is CUDA <ref_major>"``)."""
    reasons = []
    major = library.get("cuda_major")
    if ref_major is not None and major is not None and major != ref_major:
        reasons.append("CUDA %s, %s" % (major, reference or "torch is CUDA %s" % ref_major))
    if library.get("outside_venv"):
        reasons.append("mapped from outside the venv, which ships %s" % library.get("venv_copy"))
    if library.get("deleted"):
        reasons.append("deleted since it was mapped (removed or replaced under the running job)")
    return reasons
