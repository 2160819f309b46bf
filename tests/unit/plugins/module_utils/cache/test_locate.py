# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Where the caches are, as torch, Triton, CUDA, FlashInfer and TVM FFI compute it (cache/_locate.py)."""

from __future__ import annotations

import os
import pwd

import pytest
import yaml

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._locate import PLACING_VARIABLES, CacheError, Identity, locate

ME = pwd.getpwuid(os.getuid())


def test_defaults_follow_home_tmp_and_user(tmp_path):
    home, tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    tmp.mkdir()
    ident = Identity(environment={"HOME": str(home), "USER": "alice", "TMPDIR": str(tmp)})
    assert locate("inductor", ident).path == str(tmp / "torchinductor_alice")
    assert locate("triton", ident).path == str(home / ".triton/cache")
    assert locate("torch_extensions", ident).path == str(home / ".cache/torch_extensions")
    assert locate("cuda", ident).path == str(home / ".nv/ComputeCache")
    assert locate("inductor", ident).source == "default: <tmp>/torchinductor_<user> (tmp from TMPDIR)"


def test_variables_win_and_extensions_get_no_subfolder(tmp_path):
    env = {
        "HOME": str(tmp_path), "USER": "alice",
        "TORCHINDUCTOR_CACHE_DIR": "/scratch/ind", "TRITON_CACHE_DIR": "/scratch/tri",
        "TORCH_EXTENSIONS_DIR": "/scratch/ext", "CUDA_CACHE_PATH": "/scratch/nv",
    }
    ident = Identity(environment=env)
    fp = {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8"}
    locs = {n: locate(n, ident, fp, "py311") for n in ("inductor", "triton", "torch_extensions", "cuda")}
    assert {n: (loc.path, loc.source) for n, loc in locs.items()} == {
        "inductor": ("/scratch/ind", "TORCHINDUCTOR_CACHE_DIR"),
        "triton": ("/scratch/tri", "TRITON_CACHE_DIR"),
        "torch_extensions": ("/scratch/ext", "TORCH_EXTENSIONS_DIR"),
        "cuda": ("/scratch/nv", "CUDA_CACHE_PATH"),
    }
    assert locs["torch_extensions"].build_dir is None  # torch adds py/cu only under the default root


def test_default_extensions_root_names_the_build_folder(tmp_path):
    ident = Identity(environment={"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    loc = locate("torch_extensions", ident, {"torch": "2.8.0+cu128", "cuda": "12.8"}, "py311")
    assert loc.path == str(tmp_path / "xdg/torch_extensions")
    assert loc.build_dir == str(tmp_path / "xdg/torch_extensions/py311_cu128")
    cpu = locate("torch_extensions", ident, {"torch": "2.8.0+cpu", "cuda": "cpu"}, "py312")
    assert cpu.build_dir == str(tmp_path / "xdg/torch_extensions/py312_cpu")


def test_triton_home_moves_the_default(tmp_path):
    ident = Identity(environment={"HOME": "/nowhere", "TRITON_HOME": str(tmp_path)})
    assert locate("triton", ident).path == str(tmp_path / ".triton/cache")


def test_user_name_is_sanitised_like_torch(tmp_path):
    ident = Identity(environment={"LOGNAME": "dom\\al:ice", "USER": "bob", "TMPDIR": str(tmp_path)})
    assert locate("inductor", ident).path == str(tmp_path / "torchinductor_dom_al_ice")


def test_tmpdir_that_is_not_a_directory_is_skipped_as_tempfile_does(tmp_path):
    ident = Identity(environment={"USER": "a", "TMPDIR": str(tmp_path / "missing"), "TMP": str(tmp_path)})
    loc = locate("inductor", ident)
    assert loc.path == str(tmp_path / "torchinductor_a")
    assert any("not a directory" in n for n in loc.notes)


def test_named_user_uses_password_database_not_our_environment(monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/should/not/be/used")
    monkeypatch.setenv("HOME", "/should/not/be/used")
    ident = Identity(user=ME.pw_name)
    assert locate("triton", ident).path == os.path.join(ME.pw_dir, ".triton/cache")
    assert locate("inductor", ident).path.endswith("/torchinductor_" + ME.pw_name)
    assert (ident.uid, ident.gid) == (ME.pw_uid, ME.pw_gid)


def test_module_environment_is_used_without_user(monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/scratch/from-env")
    assert locate("triton", Identity()).path == "/scratch/from-env"


def test_unknown_user_is_a_clear_error():
    with pytest.raises(CacheError, match="user no-such-user-xyz does not exist"):
        Identity(user="no-such-user-xyz")


@pytest.mark.parametrize("var,value,expect", [
    ("TORCHINDUCTOR_CACHE_DIR", "", "is set but empty"),
    ("TRITON_CACHE_DIR", "   ", "is set but empty"),
    ("TORCH_EXTENSIONS_DIR", None, "is set but empty"),
    ("CUDA_CACHE_PATH", "relative/dir", "is not an absolute path"),
    ("TRITON_CACHE_DIR", "~/.triton/cache", "is not an absolute path"),
    ("XDG_CACHE_HOME", "", "is set but empty"),
    ("HOME", "", "home directory is unknown"),
])
def test_empty_or_relative_variables_are_problems(var, value, expect):
    names = {"XDG_CACHE_HOME": "torch_extensions", "HOME": "cuda"}
    name = names.get(var) or {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton",
                              "TORCH_EXTENSIONS_DIR": "torch_extensions", "CUDA_CACHE_PATH": "cuda"}[var]
    loc = locate(name, Identity(environment={"HOME": "/root", var: value}))
    assert expect in loc.problem


def test_flashinfer_workspace_under_home_or_its_base(tmp_path):
    """flashinfer/jit/env.py: <FLASHINFER_WORKSPACE_BASE or Path.home()>/.cache/flashinfer, the
    base taken as it is (no ~); the releases before the variable used the home's."""
    home = Identity(environment={"HOME": str(tmp_path)})
    loc = locate("flashinfer", home)
    assert (loc.path, loc.source, loc.problem) == (str(tmp_path / ".cache/flashinfer"), "default: ~/.cache/flashinfer", None)
    base = Identity(environment={"HOME": "/nowhere", "FLASHINFER_WORKSPACE_BASE": "/scratch/fi"})
    loc = locate("flashinfer", base)
    assert (loc.path, loc.source) == ("/scratch/fi/.cache/flashinfer", "default: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer")
    # XDG_CACHE_HOME moves torch's extensions, not FlashInfer's workspace.
    xdg = Identity(environment={"HOME": str(tmp_path), "XDG_CACHE_HOME": "/xdg"})
    assert locate("flashinfer", xdg).path == str(tmp_path / ".cache/flashinfer")


@pytest.mark.parametrize("value,expect", [
    ("", "is set but empty"),
    ("~/fi", "is not an absolute path"),  # FlashInfer does not expand ~: the job's working directory
    ("scratch", "is not an absolute path"),
    ("/scratch\n/etc", "holds a control character"),
])
def test_flashinfer_base_that_names_no_directory_is_refused(value, expect):
    loc = locate("flashinfer", Identity(environment={"HOME": "/root", "FLASHINFER_WORKSPACE_BASE": value}))
    assert expect in loc.problem and "FLASHINFER_WORKSPACE_BASE" in loc.problem


def test_tvm_ffi_cache_and_its_tilde(tmp_path):
    """tvm_ffi/cpp/extension.py: TVM_FFI_CACHE_DIR through Path.expanduser(), else ~/.cache/tvm-ffi."""
    env = {"HOME": str(tmp_path)}
    assert locate("tvm_ffi", Identity(environment=env)).path == str(tmp_path / ".cache/tvm-ffi")
    assert locate("tvm_ffi", Identity(environment=dict(env, TVM_FFI_CACHE_DIR="/scratch/tvm"))).path == "/scratch/tvm"
    loc = locate("tvm_ffi", Identity(environment=dict(env, TVM_FFI_CACHE_DIR="~/jit")))
    assert (loc.path, loc.source, loc.problem) == (str(tmp_path / "jit"), "TVM_FFI_CACHE_DIR", None)
    assert locate("tvm_ffi", Identity(environment=dict(env, TVM_FFI_CACHE_DIR="~"))).path == str(tmp_path)
    other = locate("tvm_ffi", Identity(environment=dict(env, TVM_FFI_CACHE_DIR="~alice/jit")))
    assert other.path == "~alice/jit" and "names another account's home directory" in other.problem
    nohome = locate("tvm_ffi", Identity(environment={"HOME": "", "TVM_FFI_CACHE_DIR": "~/jit"}))
    assert nohome.path is None and "starts with ~ and the home directory is unknown" in nohome.problem
    assert "is set but empty" in locate("tvm_ffi", Identity(environment=dict(env, TVM_FFI_CACHE_DIR=""))).problem


def test_the_roles_pass_every_variable_that_places_a_cache():
    """purge and verify pass only the job's variables that place the caches (a token in the job's
    environment must not become a module argument): each one the caches are found by."""
    repo = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..")
    for role, key in (("purge", "purge__cache_vars"), ("verify", "verify__cache_vars")):
        with open(os.path.join(repo, "roles", role, "vars", "main.yml"), encoding="utf-8") as f:
            passed = yaml.safe_load(f)[key]
        assert sorted(passed) == sorted(PLACING_VARIABLES), role
