# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Where the compile caches of torch, Triton, CUDA, FlashInfer and TVM FFI live, as the job
would place them: the account and environment it runs with, its variables, its defaults. Each
is decided the way the libraries decide it (see docs/torch_cache.md):

- TorchInductor: ``TORCHINDUCTOR_CACHE_DIR``, else ``<tempfile.gettempdir()>/torchinductor_<user>``
  (torch/_inductor/runtime/cache_dir_utils.py). Inductor puts Triton's kernels under
  ``<inductor>/triton/<device>`` unless ``TRITON_CACHE_DIR`` is set.
- Triton: ``TRITON_CACHE_DIR``, else ``<TRITON_HOME or ~>/.triton/cache`` (triton/knobs.py).
- torch_extensions: ``TORCH_EXTENSIONS_DIR``, else ``<XDG_CACHE_HOME or ~/.cache>/torch_extensions``
  (torch/utils/cpp_extension.py); torch adds a ``py<ver>_cu<ver>`` folder under the default
  root only, never under the variable.
- CUDA JIT: ``CUDA_CACHE_PATH``, else ``~/.nv/ComputeCache``.
- FlashInfer's JIT workspace: ``<FLASHINFER_WORKSPACE_BASE or ~>/.cache/flashinfer``
  (flashinfer/jit/env.py); the releases before the variable used ``~/.cache/flashinfer``.
- TVM FFI's build cache (sglang's JIT kernels): ``TVM_FFI_CACHE_DIR`` (``~`` expanded), else
  ``~/.cache/tvm-ffi`` (tvm_ffi/cpp/extension.py, load_inline.py in 0.1.0).

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import getpwnam, getpwuid

CACHE_NAMES = ("inductor", "triton", "torch_extensions", "cuda", "flashinfer", "tvm_ffi")

_USER_UNSAFE = re.compile(r'[\\/:*?"<>|]')


class CacheError(GpufleetError):
    """Something about a cache the user must fix: the message says what."""


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
            if _root.isdir(value):
                return value, var, notes
            notes.append(f"{var}={value} skipped: not a directory")
        for cand in ("/tmp", "/var/tmp", "/usr/tmp"):
            if _root.isdir(cand):
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


def _from_variable(name, var, value, ident=None):
    if value is None or not value.strip():
        return Location(name, None, var, f"{var} is set but empty: it names no cache directory (and "
                        f"clearing ${var}/ would clear /); unset it or give it an absolute directory")
    if var in _EXPANDS_TILDE and ident is not None and (value == "~" or value.startswith("~/")):
        # Path.expanduser(), as the library does: HOME, else the password database.
        if ident.home_problem:
            return Location(name, None, var, f"{var}={value} starts with ~ and " + ident.home_problem)
        value = ident.home + value[1:]
    elif var in _EXPANDS_TILDE and value.startswith("~"):
        return Location(name, value, var, f"{var}={value} names another account's home directory: give an "
                        "absolute directory")
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


# Where the other caches live: (their own variable, a variable naming a base directory, the
# path under that base, the path under the home directory), as Triton, torch, the driver,
# FlashInfer and TVM FFI say. FlashInfer has no variable of its own for the root: only a base.
_PLACES = {
    "triton": ("TRITON_CACHE_DIR", "TRITON_HOME", ".triton/cache", ".triton/cache"),
    "torch_extensions": ("TORCH_EXTENSIONS_DIR", "XDG_CACHE_HOME", "torch_extensions", ".cache/torch_extensions"),
    "cuda": ("CUDA_CACHE_PATH", None, None, ".nv/ComputeCache"),
    "flashinfer": (None, "FLASHINFER_WORKSPACE_BASE", ".cache/flashinfer", ".cache/flashinfer"),
    "tvm_ffi": ("TVM_FFI_CACHE_DIR", None, None, ".cache/tvm-ffi"),
}
# Variables the library passes through Path.expanduser() (tvm_ffi); the others are used as they are.
_EXPANDS_TILDE = frozenset(("TVM_FFI_CACHE_DIR",))

# Every variable of the job's environment that moves a cache (the roles pass these alone).
PLACING_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TRITON_HOME", "TORCH_EXTENSIONS_DIR",
                     "XDG_CACHE_HOME", "CUDA_CACHE_PATH", "FLASHINFER_WORKSPACE_BASE", "TVM_FFI_CACHE_DIR",
                     "HOME", "USER", "LOGNAME", "LNAME", "USERNAME", "TMPDIR", "TEMP", "TMP")


def _place(name, ident):
    own, base_var, under_base, under_home = _PLACES[name]
    env = ident.env
    if own is not None and own in env:
        return _from_variable(name, own, env[own], ident)
    if base_var is not None and base_var in env:
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
