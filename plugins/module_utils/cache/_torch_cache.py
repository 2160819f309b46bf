# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Compile caches of torch, Triton and CUDA: found, measured, cleared safely, kept fresh.

Where each cache lives is decided the way the libraries decide it (see docs/torch_cache.md):

- TorchInductor: ``TORCHINDUCTOR_CACHE_DIR``, else ``<tempfile.gettempdir()>/torchinductor_<user>``
  (torch/_inductor/runtime/cache_dir_utils.py). Inductor puts Triton's kernels under
  ``<inductor>/triton/<device>`` unless ``TRITON_CACHE_DIR`` is set.
- Triton: ``TRITON_CACHE_DIR``, else ``<TRITON_HOME or ~>/.triton/cache`` (triton/knobs.py).
- torch_extensions: ``TORCH_EXTENSIONS_DIR``, else ``<XDG_CACHE_HOME or ~/.cache>/torch_extensions``
  (torch/utils/cpp_extension.py); torch adds a ``py<ver>_cu<ver>`` folder under the default
  root only, never under the variable.
- CUDA JIT: ``CUDA_CACHE_PATH``, else ``~/.nv/ComputeCache``.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import re
import stat

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_optional
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import (
    UnsafePath,
    clear,
    is_empty,
    lookup,
    make_dirs,
    opened,
    write_file,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import measure as measure_tree
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import open_files
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox._view import getpwall, getpwnam, getpwuid
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import (
    read_torch_version_py,
    torch_reference,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import Venv

CACHE_NAMES = ("inductor", "triton", "torch_extensions", "cuda")
MARKER = ".gpufleet-hygiene-fingerprint.json"
FINGERPRINT_KEYS = ("torch", "triton", "cuda")
TRITON_NAMES = ("triton", "pytorch-triton", "pytorch-triton-rocm")

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

_USER_UNSAFE = re.compile(r'[\\/:*?"<>|]')
_PY_DIR = re.compile(r"python(\d+)\.(\d+)([a-z]*)$")


class CacheError(GpufleetError):
    """Something about a cache the user must fix: the message says what."""


# --------------------------------------------------------------------------- who and where


class Identity:
    """The account the training job runs as and the environment it starts with."""

    def __init__(self, user=None, home=None, environment=None, process_env=None):
        process_env = os.environ if process_env is None else process_env
        if environment is not None:
            env = {str(k): None if v is None else str(v) for k, v in environment.items()}
        elif user:
            env = {}  # the module's own variables belong to the account running Ansible
        else:
            env = dict(process_env)
        self.env = env
        self.uid = self.gid = None
        account = None
        if user:
            try:
                account = getpwnam(user)
            except KeyError:
                raise CacheError(f"user {user} does not exist on this host: give an existing account, "
                                 "or leave user out and set home and environment") from None
        else:
            try:
                account = getpwuid(os.getuid())
            except KeyError:
                account = None
        if account is not None:
            self.uid, self.gid = account.pw_uid, account.pw_gid
        self.account = account
        # getpass.getuser(): LOGNAME, USER, LNAME, USERNAME, then the password database.
        name = None
        for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
            if env.get(var):
                name = env[var]
                break
        if name is None:
            name = user or (account.pw_name if account is not None else None)
        self.name = name
        # os.path.expanduser('~'): HOME when set, else the password database.
        self.home_problem = None
        if home:
            self.home, self.home_source = home, "home option"
        elif "HOME" in env:
            self.home, self.home_source = env["HOME"], "HOME"
        elif account is not None:
            self.home, self.home_source = account.pw_dir, "password database"
        else:
            self.home, self.home_source = None, None
        if not self.home:
            self.home_problem = ("the home directory is unknown (HOME is empty or unset and the "
                                 "account has no password entry): give home or user")
        elif not os.path.isabs(self.home):
            self.home_problem = f"the home directory {self.home!r} is not an absolute path: give home"

    def tmpdir(self):
        """tempfile.gettempdir() for the job: TMPDIR, TEMP, TMP, then /tmp, /var/tmp, /usr/tmp."""
        notes = []
        for var in ("TMPDIR", "TEMP", "TMP"):
            value = self.env.get(var)
            if not value:
                continue
            if not os.path.isabs(value):
                notes.append(f"{var}={value} skipped: relative to the job's working directory")
                continue
            if os.path.isdir(value):
                return value, var, notes
            notes.append(f"{var}={value} skipped: not a directory")
        for cand in ("/tmp", "/var/tmp", "/usr/tmp"):
            if os.path.isdir(cand):
                return cand, cand, notes
        return "/tmp", "/tmp", notes


class Location:
    """Where one cache lives, as the job would compute it, and why."""

    def __init__(self, name, path, source, problem=None, build_dir=None, notes=()):
        self.name = name
        self.path = path
        self.source = source
        self.problem = problem
        self.build_dir = build_dir
        self.notes = list(notes)


def _from_variable(name, var, value):
    if value is None or not value.strip():
        return Location(name, None, var, f"{var} is set but empty: it names no cache directory (and "
                        f"clearing ${var}/ would clear /); unset it or give it an absolute directory")
    if not os.path.isabs(value):
        return Location(name, value, var, f"{var}={value} is not an absolute path (it would depend on the "
                        "job's working directory): give an absolute directory")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        # A newline or tab in a cache variable is a quoting mistake: state fresh would create
        # the directory "/tmp\n/etc" and record it as a cache.
        return Location(name, None, var, f"{var}={value!r} holds a control character (a newline or tab from a "
                        "quoting mistake?): give the cache's directory alone")
    # Not normalised: "link/.." is resolved by the kernel through the link, and so is it here.
    return Location(name, value, var)


def _home_path(ident, name, rel, source):
    if ident.home_problem:
        return Location(name, None, source, ident.home_problem)
    return Location(name, os.path.join(ident.home, rel), source)


def python_tag(site_dirs):
    """``py311`` (``py313t`` for a free-threaded build) from a venv's own site-packages
    (lib/pythonX.Y/site-packages)."""
    for site in site_dirs:
        match = _PY_DIR.search(os.path.dirname(site))
        if match:
            return "py{}{}{}".format(*match.groups())
    return None


# Where the other caches live: (their own variable, a variable naming a base directory, the
# path under that base, the path under the home directory), as Triton, torch and the driver say.
_PLACES = {
    "triton": ("TRITON_CACHE_DIR", "TRITON_HOME", ".triton/cache", ".triton/cache"),
    "torch_extensions": ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "torch_extensions", ".cache/torch_extensions"),
    "cuda": ("CUDA_CACHE_PATH", None, None, ".nv/ComputeCache"),
}


def _place(name, ident):
    own, base_var, under_base, under_home = _PLACES[name]
    env = ident.env
    if own in env:
        return _from_variable(name, own, env[own])
    if base_var in env:
        base = _from_variable(name, base_var, env[base_var])
        if base.problem:
            return base
        return Location(name, os.path.join(base.path, under_base), f"default: ${base_var}/{under_base}")
    return _home_path(ident, name, under_home, f"default: ~/{under_home}")


def locate(name, ident, fingerprint=None, pytag=None):
    """The cache ``name`` as the job with ``ident`` would place it."""
    env = ident.env
    if name == "inductor":
        if "TORCHINDUCTOR_CACHE_DIR" in env:
            return _from_variable(name, "TORCHINDUCTOR_CACHE_DIR", env["TORCHINDUCTOR_CACHE_DIR"])
        if not ident.name:
            return Location(name, None, "default", "the user name is unknown: give user, or USER in environment")
        tmp, tmp_source, notes = ident.tmpdir()
        path = os.path.join(tmp, "torchinductor_" + _USER_UNSAFE.sub("_", ident.name))
        return Location(name, path, f"default: <tmp>/torchinductor_<user> (tmp from {tmp_source})", notes=notes)
    if name not in _PLACES:
        raise CacheError("unknown cache {!r}: choose from {}".format(name, ", ".join(CACHE_NAMES)))
    loc = _place(name, ident)
    # torch builds into py<ver>_cu<ver> under its default root only, never under the variable.
    if (name == "torch_extensions" and loc.source.startswith("default") and loc.path and not loc.problem
            and fingerprint and fingerprint.get("torch") and pytag):
        cuda = fingerprint.get("cuda")
        cu = "cu" + cuda.replace(".", "") if cuda and cuda != "cpu" else "cpu"
        loc.build_dir = os.path.join(loc.path, f"{pytag}_{cu}")
    return loc


# --------------------------------------------------------------------------- safety


def protected_homes(extra=()):
    """Every home directory of the password database, resolved, plus ``extra``."""
    homes = set()
    try:
        entries = getpwall()
    except (KeyError, OSError):  # a broken name service
        entries = []
    for entry in entries:
        if entry.pw_dir and os.path.isabs(entry.pw_dir):
            homes.add(os.path.realpath(entry.pw_dir))
    for path in extra:
        if path and os.path.isabs(path):
            homes.add(os.path.realpath(path))
    homes.discard("/")
    return homes


def _within(path, root):
    return path == root or path.startswith(root.rstrip("/") + "/")


def _venv_around(real):
    """The virtual environment ``real`` is, or lies in (a directory holding pyvenv.cfg), or None."""
    cur = real
    while cur != "/":
        if os.path.lexists(os.path.join(cur, "pyvenv.cfg")):
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
        if _within(real, tree):
            return f"lies in the system directory {tree}"
    if len(parts) == 2 and "/" + parts[0] in SYSTEM_PARENTS:
        return f"is the system directory {real}"
    for tree in FORBIDDEN_TREES:
        if _within(tree, real):
            return f"contains the system directory {tree}"
    for home in sorted(homes):
        if _within(home, real):
            return f"contains the home directory {home}"
    if venv:
        for spelt in sorted({os.path.normpath(venv), os.path.realpath(venv)}):
            if _within(spelt, real):
                return f"contains the virtual environment {spelt}"
            if _within(real, spelt):
                return f"lies in the virtual environment {spelt}"
    around = _venv_around(real)
    if around:
        return f"lies in the virtual environment {around} (it holds pyvenv.cfg)"
    return None


# What each kind's root is called where torch, Triton and the driver put it (the tail of the
# path), and, for a root found elsewhere, what its top level must hold to be taken for one.
LAYOUTS = {
    "inductor": "<tmp>/torchinductor_<user>",
    "triton": "~/.triton/cache",
    "torch_extensions": "~/.cache/torch_extensions",
    "cuda": "~/.nv/ComputeCache",
}
INDUCTOR_DIRS = frozenset(("fxgraph", "aotautograd", "triton", "locks", "cache", "kernel", "kernels", "precompile",
                           "precompiled_headers", "dynamo", "pgo", "autotune", "cutlass", "cuda", "cudagraphs",
                           "aot_inductor", "cpp_wrapper", "static_cuda_launcher"))
_INDUCTOR_CODE_DIR = re.compile(r"[a-z0-9_]{2}\Z")  # codecache: <root>/<2 chars of the hash>/
# Keys in base32 (upper case) or hex; a device index where Inductor keeps Triton's kernels.
_TRITON_KEY = re.compile(r"(?:[A-Z0-9]{6,}|[0-9a-f]{16,}|[0-9]{1,3})\Z")
_EXT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_EXT_BUILD_ROOT = re.compile(r"py\d+t?_(?:cu\d+|cpu)\Z")
_CUDA_BUCKET = re.compile(r"[0-9a-fA-F]{1,2}\Z")


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
        if _within(real, home):
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


# --------------------------------------------------------------------------- measuring


def measure(root):
    """``(size_bytes, entries, problems)`` of a cache root (a Dir or a path), marker excluded.

    Symbolic links are counted as entries, never followed; another file system mounted
    inside is not entered; a hard-linked file is counted once.
    """
    try:
        with opened(root) as d:
            return measure_tree(d, skip=(MARKER,))
    except (OSError, UnsafePath) as exc:
        return 0, 0, ["{}: {}".format(getattr(root, "path", root), getattr(exc, "strerror", None) or exc)]


def has_content(root, keep_marker=True):
    """Whether the root (a Dir or a path) holds anything (the marker aside when ``keep_marker``)."""
    try:
        with opened(root) as d:
            return not is_empty(d, skip=(MARKER,) if keep_marker else ())
    except (OSError, UnsafePath):
        return True  # unreadable: let the clear report why


# --------------------------------------------------------------------------- clearing


def clear_root(root):
    """Remove everything inside a cache root (a Dir or a path) and keep the directory itself.

    Works through directory handles opened without following links (fs/_tree.py), so nothing
    outside the root is reached even if a directory on the way or inside is swapped.
    The marker goes first, so an interrupted clear is never taken for a fresh cache.
    """
    with opened(root) as d:
        return clear(d, first=(MARKER,))


def describe_errors(name, root, errors):
    """A message for the failures of a clear that says what to fix."""
    denied = [(p, e) for p, e in errors if getattr(e, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS)]
    first = errors[:3]
    listed = "; ".join("{}: {}".format(p, getattr(e, "strerror", None) or e) for p, e in first)
    if denied:
        hint = ("run the task as the cache's owner or with become: true; a file marked immutable "
                "(lsattr shows 'i') must be released with chattr -i first; a read-only mount must be "
                "remounted read-write")
        return (f"cannot clear the {name} cache {root}: permission denied on {len(denied)} of "
                f"{len(errors)} paths ({listed}): {hint}")
    return f"cannot clear the {name} cache {root}: {len(errors)} paths failed ({listed})"


# --------------------------------------------------------------------------- holders


def find_holders(roots, proc="/proc", skip_pids=None):
    """Processes with a file, a mapping or their working directory under one of ``roots``.

    Returns ``({root: [{pid, command, paths}]}, uninspected)``; ``uninspected`` counts
    processes whose /proc entries could not be read (not root, or gone meanwhile).
    """
    found = {r: {} for r in roots}
    uninspected = 0
    try:
        for pid, paths, denied in open_files(proc, set(skip_pids or (os.getpid(),)), cwd=True, maps=True):
            uninspected += denied
            for path in paths:
                for root in roots:
                    if _within(path, root):
                        held = found[root].setdefault(pid, [])
                        if path not in held and len(held) < 5:
                            held.append(path)
    except OSError:
        return {r: [] for r in roots}, 0
    result = {}
    for root, by_pid in found.items():
        result[root] = [{"pid": pid, "command": _command(proc, pid), "paths": paths} for pid, paths in sorted(by_pid.items())]
    return result, uninspected


def _command(proc, pid):
    try:
        with open("%s/%d/cmdline" % (proc, pid), "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        if argv:
            text = " ".join(" ".join(argv).split())
            return text if len(text) <= 200 else text[:197] + "..."
    except OSError:
        pass
    try:
        with open("%s/%d/comm" % (proc, pid), "rb") as f:
            return "[{}]".format(f.read().decode("utf-8", "replace").strip())
    except OSError:
        return "?"


# --------------------------------------------------------------------------- fingerprint


def venv_fingerprint(venv, run):
    """``{torch, triton, cuda}`` of a venv (a path or a Venv), read from dist-info and
    torch/version.py.

    Nothing is imported: the versions come from the files on disk. A missing package is None;
    ``cuda`` is ``"cpu"`` for a CPU-only torch.
    """
    dists = Venv.of(venv, run).distributions
    by_key = {d.key: d for d in dists}
    torch = by_key.get("torch")
    triton = None
    for key in TRITON_NAMES:
        if key in by_key:
            triton = by_key[key]
            break
    ref = torch_reference(dists)
    if isinstance(ref, tuple):
        cuda = ref[1]
    elif ref == "cpu":
        cuda = "cpu"
    else:
        cuda = None
    torch_version = None
    if torch is not None:
        # What torch.__version__ says (2.11.0+cu130), which its dist-info may not (2.11.0).
        info = read_torch_version_py(torch.site_dir, torch.problems)
        torch_version = (info or {}).get("version") or torch.version
    return {
        "torch": torch_version,
        "triton": triton.version if triton else None,
        "cuda": cuda,
    }


def same_fingerprint(recorded, current):
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return False
    return all(recorded.get(k) == current.get(k) for k in FINGERPRINT_KEYS)


def read_marker(real_root):
    """``(fingerprint or None, problem or None)`` recorded in the root's marker."""
    path = os.path.join(real_root, MARKER)
    unread = []
    data = read_optional(path, "marker", unread, what="it")
    if unread:  # skipped, or larger than any marker written: not one
        return None, f"marker {path} cannot be read: {unread[0]}; it is rewritten on the next clear"
    if data is None:
        return None, None
    try:
        data = json.loads(data.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: nesting deeper than the parser's stack ("[[[[..."), no marker ever written.
        return None, f"marker {path} is not valid JSON ({exc}): it is rewritten on the next clear"
    fp = data.get("fingerprint") if isinstance(data, dict) else None
    if not isinstance(fp, dict):
        return None, f"marker {path} holds no fingerprint: it is rewritten on the next clear"
    return {k: fp.get(k) for k in FINGERPRINT_KEYS}, None


def write_marker(root, fingerprint, venv, owner=None):
    """Record ``fingerprint`` in ``<root>/MARKER`` (root: a Dir or a path) atomically, through
    the root's handle, owned like the root (or by ``owner``)."""
    body = json.dumps({
        "fingerprint": {k: fingerprint.get(k) for k in FINGERPRINT_KEYS},
        "venv": venv,
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "recorded_by": "gpufleet.hygiene.torch_cache",
    }, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    with opened(root) as d:
        write_file(d, MARKER, body, owner=owner)


def make_root(path, owner=None):
    """Create a missing cache root (and missing parents) through handles, owned by ``owner``
    when root; the umask applies, as it does when torch creates it. Returns its Dir."""
    return make_dirs(path, 0o777, owner)


# --------------------------------------------------------------------------- the whole job


def _fp_text(fp):
    if not fp:
        return "none recorded"
    return ", ".join("{} {}".format(k, fp.get(k) or "-") for k in FINGERPRINT_KEYS)


def _state_text(entry):
    lines = ["path: {}".format(entry["path"]), "exists: {}".format(entry["exists"])]
    if entry["exists"]:
        lines.append("entries: {}".format(entry["entries"]))
        lines.append("size: {}".format(entry["size"]))
        lines.append("fingerprint: {}".format(_fp_text(entry["fingerprint"])))
    return "\n".join(lines) + "\n"


class TorchCache:
    """Report, clear or keep fresh the selected caches of one account."""

    def __init__(self, caches, state="present", venv=None, user=None, home=None, environment=None,
                 force=False, check_mode=False, run=None, proc="/proc"):
        self.names = []
        for name in caches or CACHE_NAMES:
            if name not in self.names:
                self.names.append(name)
        self.state = state
        self.env = Venv.of(venv, run) if venv else None  # a path, or the Venv a readiness read shares
        self.venv = self.env.path if self.env else None
        self.force = force
        self.check_mode = check_mode
        self.run = run
        self.proc = proc
        self.ident = Identity(user=user, home=home, environment=environment)
        self.owner = (self.ident.uid, self.ident.gid) if user and self.ident.uid is not None else None
        self.warnings = []

    def execute(self):
        if self.state == "fresh" and not self.venv:
            raise CacheError("state=fresh needs venv: the virtual environment whose torch, triton and "
                             "CUDA versions the caches must match")
        current = venv_fingerprint(self.env, self.run) if self.env else None
        pytag = python_tag(self.env.own_site_dirs) if self.env else None
        homes = protected_homes([self.ident.home])
        entries = []
        for name in self.names:
            loc = locate(name, self.ident, current, pytag)
            entries.append(self._inspect(loc, homes, current))
        result = {"changed": False, "caches": entries, "fingerprint": current, "diff": []}
        refused = [e for e in entries if e.get("_problem")]
        if refused and self.state != "present":
            e = refused[0]
            raise CacheError("refusing to touch the {} cache: {}".format(e["name"], e["_problem"]), self._public(result))
        for e in refused:
            self.warnings.append("{} cache: {}".format(e["name"], e["_problem"]))
        self._plan(entries, current)
        self._check_holders(entries, result)
        # Outer roots first: clearing one that holds another must not undo the inner's marker.
        order = sorted((e for e in entries if e["action"] != "none"), key=lambda e: e["path"].count("/"))
        for e in order:
            result["changed"] = True
            result["diff"].append(self._diff(e, current))
            if not self.check_mode:
                self._apply(e, current, result)
        return self._public(result)

    def _public(self, result):
        out = dict(result)
        out["caches"] = [{k: v for k, v in e.items() if not k.startswith("_")} for e in result["caches"]]
        return out

    def _inspect(self, loc, homes, current):
        entry = {
            "name": loc.name, "path": loc.path, "configured": loc.path, "source": loc.source,
            "exists": False, "size": 0, "entries": 0, "fingerprint": None, "stale": None,
            "marker": None, "holders": [], "action": "none", "removed": 0, "freed": 0,
            "problems": list(loc.notes),
        }
        if loc.name == "torch_extensions":
            entry["build_dir"] = loc.build_dir
        if loc.problem:
            entry["_problem"] = loc.problem
            entry["problems"].append(loc.problem)
            return entry
        with open_root(loc.path, homes, self.venv, loc.name) as root:
            if root.real:
                entry["path"] = root.real
            entry["exists"] = root.exists
            if root.problem:
                entry["_problem"] = f"{loc.path} {root.problem}"
                entry["problems"].append(entry["_problem"])
                return entry
            entry["marker"] = os.path.join(root.real, MARKER)
            if root.exists:
                entry["_id"] = (root.dir.dev, root.dir.ino)
                size, count, problems = measure(root.dir)
                entry["size"], entry["entries"] = size, count
                entry["problems"].extend(problems)
                entry["_content"] = has_content(root.dir)
                entry["_any"] = has_content(root.dir, keep_marker=False)
        if entry["exists"]:
            recorded, mproblem = read_marker(entry["path"])
            entry["fingerprint"] = recorded
            if mproblem:
                entry["problems"].append(mproblem)
        if current is not None:
            if entry["exists"] and entry["_content"]:
                entry["stale"] = not same_fingerprint(entry["fingerprint"], current)
            else:
                entry["stale"] = False
        return entry

    def _plan(self, entries, current):
        for e in entries:
            if e.get("_problem"):
                continue
            if self.state == "absent":
                if e["exists"] and e["_any"]:
                    e["action"] = "clear"
            elif self.state == "fresh":
                if e["exists"] and same_fingerprint(e["fingerprint"], current):
                    continue
                if e["exists"] and e["_content"]:
                    e["action"] = "clear_and_record"
                else:
                    e["action"] = "record"

    def _check_holders(self, entries, result):
        roots = [e["path"] for e in entries if e["exists"] and not e.get("_problem")]
        if not roots:
            return
        holders, uninspected = find_holders(roots, self.proc)
        for e in entries:
            e["holders"] = holders.get(e["path"], []) if e["exists"] and not e.get("_problem") else []
        clearing = [e for e in entries if e["action"] in ("clear", "clear_and_record")]
        if clearing and uninspected:
            self.warnings.append(f"{uninspected} processes could not be inspected for open cache files "
                                 "(run with become: true to see every holder)")
        for e in clearing:
            if not e["holders"]:
                continue
            who = "; ".join(f"PID {h['pid']} ({h['command']}) holds {h['paths'][0]}" for h in e["holders"][:3])
            if not self.force:
                raise CacheError(
                    "the {} cache {} is in use by a running process: {}. Stop the job first, or set "
                    "force: true to clear it from under the job".format(e["name"], e["path"], who),
                    self._public(result))
            self.warnings.append("force: clearing the {} cache {} while in use: {}".format(e["name"], e["path"], who))

    def _diff(self, e, current):
        before = _state_text(e)
        after = dict(e)
        after["exists"] = True
        if e["action"] in ("clear", "clear_and_record"):
            after["entries"] = after["size"] = 0
        after["fingerprint"] = None if e["action"] == "clear" else current
        return {
            "before_header": "{} cache {}".format(e["name"], e["path"]),
            "after_header": "{} cache {}".format(e["name"], e["path"]),
            "before": before,
            "after": _state_text(after),
        }

    def _apply(self, e, current, result):
        # Open and judge the root again just before acting: the tree may have changed since it was
        # inspected. Every change below goes through this one handle.
        with open_root(e["configured"], protected_homes([self.ident.home]), self.venv, e["name"]) as root:
            if root.problem or root.real != e["path"] or (root.exists and (root.dir.dev, root.dir.ino) != e.get("_id")):
                raise CacheError("refusing to touch the {} cache: {} {}".format(
                    e["name"], e["configured"], root.problem or "changed while being inspected"), self._public(result))
            if e["action"] in ("clear", "clear_and_record") and root.exists:
                self._clear(e, root.dir, result)
            if e["action"] in ("record", "clear_and_record"):
                self._record(e, root, current, result)

    def _clear(self, e, d, result):
        try:
            res = clear_root(d)
        except OSError as exc:
            raise CacheError(f"cannot open the {e['name']} cache {d.path}: {exc.strerror}", self._public(result)) from exc
        e["removed"], e["freed"] = res.removed, res.freed
        e["problems"].extend(res.kept)
        if res.errors:
            raise CacheError(describe_errors(e["name"], d.path, res.errors), self._public(result))
        e["entries"], e["size"] = 0, 0
        e["fingerprint"] = None

    def _record(self, e, root, current, result):
        try:
            if root.dir is None:
                root.dir = make_root(e["path"], self.owner)
            write_marker(root.dir, current, self.venv, self.owner)
        except UnsafePath as exc:
            raise CacheError("refusing to touch the {} cache: {}".format(e["name"], exc.msg), self._public(result)) from exc
        except OSError as exc:
            raise CacheError(
                "cannot record the fingerprint in the {} cache {}: {} (run as the cache's owner or "
                "with become: true)".format(e["name"], e["path"], exc.strerror), self._public(result)) from exc
        e["exists"] = True
        e["fingerprint"] = {k: current.get(k) for k in FINGERPRINT_KEYS}
        e["stale"] = False
