# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A cache root opened from / through real directories only and judged: never a system
directory, a home, a virtual environment or anything holding one, and, away from where its
kind puts it, only a directory that looks like that kind's cache.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import os
import re
import stat

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._locate import CacheError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._marker import MARKER
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import UnsafePath, lookup, make_dirs
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import getpwall

# A cache root may never be one of these, lie inside one, nor hold one.
FORBIDDEN_TREES = (
    "/proc", "/sys", "/dev", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
    "/libx32", "/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec",
    "/usr/include", "/usr/share", "/usr/src", "/usr/games", "/var/lib", "/var/log", "/var/spool",
    "/var/mail", "/var/backups", "/usr/local/bin", "/usr/local/sbin", "/usr/local/lib",
    "/usr/local/lib64", "/usr/local/libexec", "/usr/local/include", "/usr/local/share",
    "/usr/local/etc", "/usr/local/src", "/usr/local/games",
)
# Directories two levels down that belong to the system (/usr/local, /var/tmp, /run/user).
SYSTEM_PARENTS = ("/usr", "/var", "/run", "/opt", "/srv", "/mnt", "/media", "/snap")


def protected_homes(extra=()):
    """Every home directory of the password database, resolved, plus ``extra``."""
    homes = set()
    try:
        entries = getpwall()
    except (KeyError, OSError):  # a broken name service
        entries = []
    for entry in entries:
        if entry.pw_dir and os.path.isabs(entry.pw_dir):
            homes.add(_root.realpath(entry.pw_dir))
    for path in extra:
        if path and os.path.isabs(path):
            homes.add(_root.realpath(path))
    homes.discard("/")
    return homes


def within(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _venv_around(real):
    """The virtual environment ``real`` is, or lies in (a directory holding pyvenv.cfg), or None."""
    cur = real
    while cur != "/":
        if _root.lexists(os.path.join(cur, "pyvenv.cfg")):
            return cur
        cur = os.path.dirname(cur)
    return None


def unsafe_root(real, homes=(), venv=None):
    """Why ``real`` (a resolved absolute path) may never be cleared, or None.

    The rules that hold for every kind of cache: not /, a top-level or system directory, a
    home directory or one holding it, a virtual environment, inside one or holding one.
    """
    if real == "/":
        return "is / itself"
    for home in sorted(homes):
        if real == home:
            return f"is the home directory {home} itself"
    parts = real.strip("/").split("/")
    if len(parts) == 1:
        return f"is the top-level directory {real}"
    for tree in FORBIDDEN_TREES:
        if within(real, tree):
            return f"lies in the system directory {tree}"
    if len(parts) == 2 and "/" + parts[0] in SYSTEM_PARENTS:
        return f"is the system directory {real}"
    for tree in FORBIDDEN_TREES:
        if within(tree, real):
            return f"contains the system directory {tree}"
    for home in sorted(homes):
        if within(home, real):
            return f"contains the home directory {home}"
    if venv:
        for spelt in sorted({os.path.normpath(venv), _root.realpath(venv)}):
            if within(spelt, real):
                return f"contains the virtual environment {spelt}"
            if within(real, spelt):
                return f"lies in the virtual environment {spelt}"
    around = _venv_around(real)
    if around:
        return f"lies in the virtual environment {around} (it holds pyvenv.cfg)"
    return None


# What each kind's root is called where torch, Triton, the driver, FlashInfer and TVM FFI put it
# (the tail of the path), and, for a root found elsewhere, what its top level must hold to be
# taken for one.
LAYOUTS = {
    "inductor": "<tmp>/torchinductor_<user>",
    "triton": "~/.triton/cache",
    "torch_extensions": "~/.cache/torch_extensions",
    "cuda": "~/.nv/ComputeCache",
    "flashinfer": "<FLASHINFER_WORKSPACE_BASE or ~>/.cache/flashinfer",
    "tvm_ffi": "~/.cache/tvm-ffi",
}
# What a root holds beside its kind's cache, never measured nor cleared: FlashInfer downloads its
# prebuilt kernels into <root>/cubins (checksummed, not built here); an offline host could not
# fetch them again.
KEPT = {"flashinfer": ("cubins",)}
INDUCTOR_DIRS = frozenset(("fxgraph", "aotautograd", "triton", "locks", "cache", "kernel", "kernels", "precompile",
                           "precompiled_headers", "dynamo", "pgo", "autotune", "cutlass", "cuda", "cudagraphs",
                           "aot_inductor", "cpp_wrapper", "static_cuda_launcher"))
_INDUCTOR_CODE_DIR = re.compile(r"[a-z0-9_]{2}\Z")  # codecache: <root>/<2 chars of the hash>/
# Keys in base32 (upper case) or hex; a device index where Inductor keeps Triton's kernels.
_TRITON_KEY = re.compile(r"(?:[A-Z0-9]{6,}|[0-9a-f]{16,}|[0-9]{1,3})\Z")
_EXT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXT_BUILD_ROOT = re.compile(r"py\d+t?_(?:cu\d+|cpu)\Z")
_CUDA_BUCKET = re.compile(r"[0-9a-fA-F]{1,2}\Z")
# FlashInfer 0.5 on: <root>/<release>/<archs>/ (0.6.11.post1, 0.0.0+unknown from a source tree);
# before: <root>/<archs>/ (80, 90a, 80_89_90a, 120f; noarch when no GPU was seen).
_FLASHINFER_RELEASE = re.compile(r"\d+(?:\.\d+)+(?:(?:a|b|rc|\.post|\.dev)\d+)*(?:\+[A-Za-z0-9_.]+)?\Z")
_FLASHINFER_ARCHS = re.compile(r"(?:\d+[a-z]?(?:_\d+[a-z]?)*|noarch)\Z")
_TVM_FFI_BUILD = re.compile(r".+_[0-9a-f]{16}\Z")  # <module name>_<16 hex digits of its sources' hash>


def is_layout(kind, real):
    """Whether ``real`` is where ``kind`` puts its cache (its variable aside)."""
    if kind == "inductor":
        return os.path.basename(real).startswith("torchinductor_")
    if kind == "triton":
        return real.endswith("/.triton/cache")
    if kind == "torch_extensions":
        return os.path.basename(real) == "torch_extensions"
    if kind == "cuda":
        return real.endswith("/.nv/ComputeCache")
    if kind == "flashinfer":
        return real.endswith("/.cache/flashinfer")
    if kind == "tvm_ffi":
        return real.endswith("/.cache/tvm-ffi")
    raise CacheError(f"unknown cache {kind!r}")


def _top(d):
    out = []
    for name in sorted(d.names()):
        if name == MARKER:
            continue
        try:
            out.append((name, d.lstat(name)))
        except FileNotFoundError:
            continue
    return out


def _dirs_only(kind, entries):
    for name, st in entries:
        if not stat.S_ISDIR(st.st_mode):
            return f"holds the file {name!r}, and a {kind} cache's top level holds only folders"
    return None


def _ext_folder(d, name, st):
    """Whether ``name`` in ``d`` is a torch extension's build folder (build.ninja or lock)."""
    try:
        with d.child(name, st) as sub:
            names = set(sub.names())
    except OSError:
        return False
    return bool(names & {"build.ninja", "lock"})


def content_problem(kind, d):
    """Why the Dir ``d`` does not look like a ``kind`` cache, or None when it does (an empty
    directory too: it holds nothing to lose). Only its top level is read (two levels for
    torch_extensions): this guards against a mistaken variable, not against the cache's owner."""
    entries = _top(d)
    if kind == "inductor":
        for name, st in entries:
            if not stat.S_ISDIR(st.st_mode) or not (name in INDUCTOR_DIRS or _INDUCTOR_CODE_DIR.match(name)):
                return (f"holds {name!r}, and an inductor cache's top level holds only the folders "
                        "fxgraph, aotautograd, triton, locks, … and two-character code folders")
        return None
    if kind == "triton":
        why = _dirs_only(kind, entries)
        for name, _st in entries:
            if why is None and not _TRITON_KEY.match(name):
                why = f"holds {name!r}, and a triton cache's top level holds only folders named by a hash or a device index"
        return why
    if kind == "torch_extensions":
        why = _dirs_only(kind, entries)
        for name, st in entries:
            if why is not None:
                break
            if _EXT_BUILD_ROOT.match(name):
                continue
            if not _EXT_NAME.match(name) or not _ext_folder(d, name, st):
                why = (f"holds {name!r}, which is not an extension's build folder (one holding build.ninja "
                       "or lock) nor a py<ver>_cu<ver> folder")
        return why
    if kind == "cuda":
        for name, st in entries:
            if name == "index" and stat.S_ISREG(st.st_mode):
                continue
            if not (stat.S_ISDIR(st.st_mode) and _CUDA_BUCKET.match(name)):
                return f"holds {name!r}, and a CUDA JIT cache holds only its index and hexadecimal folders"
        return None
    if kind == "flashinfer":
        why = _dirs_only(kind, entries)
        for name, _st in entries:
            if why is None and not (name in KEPT[kind] or _FLASHINFER_RELEASE.match(name) or _FLASHINFER_ARCHS.match(name)):
                why = (f"holds {name!r}, and a flashinfer workspace's top level holds only release folders "
                       "(0.6.11.post1), CUDA architecture folders (90a, 80_89) and cubins")
        return why
    if kind == "tvm_ffi":
        why = _dirs_only(kind, entries)
        for name, _st in entries:
            if why is None and not _TVM_FFI_BUILD.match(name):
                why = f"holds {name!r}, and a tvm_ffi cache's top level holds only <module>_<hash> build folders"
        return why
    raise CacheError(f"unknown cache {kind!r}")


def cache_problem(kind, real, d, homes=()):
    """Why ``real`` (opened as ``d``, or None when missing) is not a ``kind`` cache, or None."""
    if is_layout(kind, real):
        return None
    why = content_problem(kind, d) if d is not None else None
    if why is None:
        return None
    where = "is not {} {} cache location ({})".format("an" if kind == "inductor" else "a", kind, LAYOUTS[kind])
    for home in sorted(homes):
        if within(real, home):
            where = f"is inside the home directory {home} and " + where
            break
    return f"{where} and does not look like one: it {why}"


class Root:
    """A cache root as opened: ``real`` path, ``dir`` (a Dir, or None when it does not exist or
    is refused), ``exists`` and ``problem`` (why it may not be touched, or None)."""

    def __init__(self, real=None, d=None, exists=False, problem=None):
        self.real, self.dir, self.exists, self.problem = real, d, exists, problem

    def close(self):
        if self.dir is not None:
            self.dir.close()
            self.dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_root(path, homes=(), venv=None, kind=None):
    """The cache root ``path`` opened from / through real directories only, judged by the rules
    every root obeys and, with ``kind``, by what that kind's cache is (see cache_problem)."""
    if not path:
        return Root(problem="is empty")
    if not os.path.isabs(path):
        return Root(problem="is not an absolute path")
    try:
        real, d = lookup(path)
    except UnsafePath as exc:
        if exc.reason.startswith("is a symbolic link to "):
            return Root(exc.component, problem=exc.reason + (
                ": the cache root itself must be a real directory; if that target is the cache, "
                "point the variable at it directly"))
        if exc.reason.startswith("is reached through the symbolic link"):
            return Root(exc.component, problem=exc.reason + (
                ": every directory from / down to a cache root must be a real one, since a link can "
                "be swapped to point anywhere; point the variable at the real directory"))
        return Root(exc.component, problem=exc.reason)
    except (ValueError, OSError) as exc:
        return Root(problem="cannot be opened: {}".format(getattr(exc, "strerror", None) or exc))
    root = Root(real, d, d is not None)
    try:
        root.problem = unsafe_root(real, homes, venv)
        if root.problem is None and kind is not None:
            root.problem = cache_problem(kind, real, d, homes)
    except OSError as exc:
        root.problem = f"cannot be read: {exc.strerror}"
    if root.problem:
        root.close()
    return root


def check_root(path, homes=(), venv=None, kind=None):
    """``(real_path, problem)`` for a cache root as configured; problem None when safe."""
    with open_root(path, homes, venv, kind) as root:
        return root.real, root.problem


def make_root(path, owner=None):
    """Create a missing cache root (and missing parents) through handles, owned by ``owner``
    when root; the umask applies, as it does when torch creates it. Returns its Dir."""
    return make_dirs(path, 0o777, owner)
