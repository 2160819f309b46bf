# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""torch_cache end to end on real trees, real venvs, real processes and real permission errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from ansible.module_utils.testing import patch_module_args
from cachetree import (
    FLASHINFER_CUBINS,
    INDUCTOR_TREE,
    TRITON_TREE,
    TVM_FFI_TREE,
    flashinfer_release,
    flashinfer_tree,
    holder,
    install,
    install_wheel,
    listing,
    make_tree,
    make_venv,
    snapshot,
    uninstall,
)

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import MARKER
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv
from ansible_collections.gpufleet.hygiene.plugins.modules import torch_cache


@pytest.fixture
def job(tmp_path):
    """A training job's private caches (as its environment names them), filled like torch fills them."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home), "USER": "trainer",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torchinductor_trainer"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
        "CUDA_CACHE_PATH": str(tmp_path / "nv"),
        "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "fi"),
        "TVM_FFI_CACHE_DIR": str(tmp_path / "tvm"),
    }
    make_tree(env["TORCHINDUCTOR_CACHE_DIR"], INDUCTOR_TREE)
    make_tree(str(tmp_path / "fi/.cache/flashinfer"), flashinfer_tree("0.6.11.post1", "120f"))
    make_tree(env["TVM_FFI_CACHE_DIR"], TVM_FFI_TREE)
    make_tree(env["TRITON_CACHE_DIR"], TRITON_TREE)
    make_tree(env["TORCH_EXTENSIONS_DIR"], {"fused_adam/fused_adam.so": b"\x7fELF" * 10, "fused_adam/build.ninja": b"rule cc\n"})
    make_tree(env["CUDA_CACHE_PATH"], {"index": b"\0" * 64, "ab/cd/0123": b"\1" * 32})
    return env


def by_name(result):
    return {c["name"]: c for c in result["caches"]}


def test_present_reports_every_cache_and_changes_nothing(run_module, job, tmp_path):
    before = snapshot(str(tmp_path))
    result = run_module(torch_cache.main, dict(environment=job))
    assert result["changed"] is False
    caches = by_name(result)
    assert list(caches) == ["inductor", "triton", "torch_extensions", "cuda", "flashinfer", "tvm_ffi"]
    ind = caches["inductor"]
    assert ind["path"] == job["TORCHINDUCTOR_CACHE_DIR"] and ind["exists"] is True
    assert ind["entries"] == len(INDUCTOR_TREE)
    assert ind["size"] == sum(len(v) for v in INDUCTOR_TREE.values())
    assert ind["source"] == "TORCHINDUCTOR_CACHE_DIR"
    assert ind["fingerprint"] is None and ind["stale"] is None and ind["action"] == "none"
    assert caches["torch_extensions"]["entries"] == 2 and caches["torch_extensions"]["build_dir"] is None
    assert caches["cuda"]["size"] == 96
    fi = caches["flashinfer"]
    assert (fi["path"], fi["source"]) == (str(tmp_path / "fi/.cache/flashinfer"), "default: $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer")
    assert fi["entries"] == len(flashinfer_tree("0.6.11.post1", "120f"))
    assert (caches["tvm_ffi"]["path"], caches["tvm_ffi"]["entries"]) == (job["TVM_FFI_CACHE_DIR"], len(TVM_FFI_TREE))
    assert result["fingerprint"] is None
    assert snapshot(str(tmp_path)) == before


def test_absent_clears_contents_keeps_roots_then_changes_nothing(run_module, job):
    result = run_module(torch_cache.main, dict(state="absent", environment=job, caches=["inductor", "triton"]))
    assert result["changed"] is True
    caches = by_name(result)
    assert set(caches) == {"inductor", "triton"}
    assert caches["inductor"]["removed"] == len(INDUCTOR_TREE)
    assert caches["triton"]["freed"] == sum(len(v) for v in TRITON_TREE.values())
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        assert os.path.isdir(job[var]) and os.listdir(job[var]) == []
    assert os.listdir(job["TORCH_EXTENSIONS_DIR"]) == ["fused_adam"]  # not selected: untouched
    again = run_module(torch_cache.main, dict(state="absent", environment=job, caches=["inductor", "triton"]))
    assert again["changed"] is False
    assert [c["action"] for c in again["caches"]] == ["none", "none"]


def test_absent_clears_every_kind_by_its_own_rules(run_module, job, tmp_path):
    """Every cache the job's variables place, FlashInfer's under its base and TVM FFI's, emptied
    through their handles; FlashInfer's downloaded cubins kept; a second run finds nothing."""
    make_tree(str(tmp_path / "fi/.cache/flashinfer"), FLASHINFER_CUBINS)
    result = run_module(torch_cache.main, dict(state="absent", environment=job))
    caches = by_name(result)
    assert {n: c["action"] for n, c in caches.items()} == dict.fromkeys(caches, "clear") and len(caches) == 6
    assert caches["flashinfer"]["removed"] == len(flashinfer_tree("0.6.11.post1", "120f"))
    assert caches["tvm_ffi"]["freed"] == sum(len(v) for v in TVM_FFI_TREE.values())
    for name in ("inductor", "triton", "torch_extensions", "cuda", "tvm_ffi"):
        assert os.listdir(caches[name]["path"]) == [], name
    assert os.listdir(caches["flashinfer"]["path"]) == ["cubins"]
    assert run_module(torch_cache.main, dict(state="absent", environment=job))["changed"] is False


def test_check_mode_and_diff_change_nothing(run_module, job, tmp_path):
    before = snapshot(str(tmp_path))
    result = run_module(torch_cache.main, dict(state="absent", environment=job), check_mode=True, diff=True)
    assert result["changed"] is True
    assert [c["action"] for c in result["caches"]] == ["clear"] * 6
    assert snapshot(str(tmp_path)) == before
    diff = {d["before_header"]: d for d in result["diff"]}
    d = diff["inductor cache %s" % job["TORCHINDUCTOR_CACHE_DIR"]]
    assert "entries: %d\n" % len(INDUCTOR_TREE) in d["before"]
    assert "entries: 0\n" in d["after"]
    assert d["after_header"] == "inductor cache %s: %d entries removed" % (job["TORCHINDUCTOR_CACHE_DIR"], len(INDUCTOR_TREE))


def test_fresh_keeps_while_unchanged_and_clears_when_real_wheels_change(run_module, job, tmp_path, wheel_dir):
    venv = make_venv(str(tmp_path / "venv"))
    install(venv, wheel_dir, "torch==2.8.0+cu128", "triton==3.4.0")
    args = dict(state="fresh", venv=venv, environment=job, caches=["inductor", "triton"])
    ind = job["TORCHINDUCTOR_CACHE_DIR"]

    # Nothing recorded yet: who built these is unknown, so they go and the fingerprint is recorded.
    first = run_module(torch_cache.main, args)
    assert first["changed"] is True
    assert first["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}
    assert [c["action"] for c in first["caches"]] == ["clear_and_record"] * 2
    assert os.listdir(ind) == [MARKER]
    with open(os.path.join(ind, MARKER)) as f:
        marker = json.load(f)
    assert marker["fingerprint"] == first["fingerprint"] and marker["venv"] == venv

    # The job compiles again: the cache fills, the environment is unchanged, the cache stays.
    make_tree(ind, INDUCTOR_TREE)
    kept = run_module(torch_cache.main, args)
    assert kept["changed"] is False
    assert by_name(kept)["inductor"]["stale"] is False
    assert by_name(kept)["inductor"]["entries"] == len(INDUCTOR_TREE)
    assert by_name(kept)["inductor"]["fingerprint"] == first["fingerprint"]

    # present with venv says the same without touching anything
    report = run_module(torch_cache.main, dict(args, state="present"))
    assert report["changed"] is False and by_name(report)["inductor"]["stale"] is False

    # A real upgrade of torch (CUDA 12.8 -> 13.0) and triton in the venv: the cache is stale.
    install(venv, wheel_dir, "torch==2.8.0+cu130", "triton==3.5.0")
    stale = run_module(torch_cache.main, dict(args, state="present"))
    assert by_name(stale)["inductor"]["stale"] is True and os.path.exists(os.path.join(ind, "fxgraph"))
    cleared = run_module(torch_cache.main, args, diff=True)
    assert cleared["changed"] is True
    assert cleared["fingerprint"] == {"torch": "2.8.0+cu130", "triton": "3.5.0", "cuda": "13.0", "flashinfer": None}
    assert by_name(cleared)["inductor"]["removed"] == len(INDUCTOR_TREE)
    assert by_name(cleared)["triton"]["action"] == "record"  # empty already: only the record changes
    assert os.listdir(ind) == [MARKER]
    assert "triton 3.4.0" in cleared["diff"][0]["before"] and "triton 3.5.0" in cleared["diff"][0]["after"]

    again = run_module(torch_cache.main, args)
    assert again["changed"] is False


def test_fresh_clears_the_seeds_flashinfer_workspace_once_flashinfer_changes(run_module, tmp_path, wheel_dir, flashinfer_wheels):
    """The seed's venv: torch cu128 beside the real flashinfer-python 0.6.11.post1, whose JIT
    modules sit in the job's ~/.cache/flashinfer as that release lays them out. The workspace is
    kept while torch, CUDA and FlashInfer stay, and cleared (its downloaded cubins kept) once the
    purge of the seed's leftovers removes FlashInfer, or an upgrade replaces it."""
    venv = make_venv(str(tmp_path / "venv"))
    install(venv, wheel_dir, "torch==2.8.0+cu128", "triton==3.4.0")
    install_wheel(venv, flashinfer_wheels["0.6.11.post1"])
    release = flashinfer_release(venv)
    home = tmp_path / "home"
    root = home / ".cache" / "flashinfer"
    make_tree(str(root), dict(flashinfer_tree(release, "120f"), **FLASHINFER_CUBINS))
    args = dict(state="fresh", venv=venv, environment={"HOME": str(home)}, caches=["flashinfer"])

    first = run_module(torch_cache.main, args)
    assert first["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": release}
    [fi] = first["caches"]
    assert (fi["path"], fi["action"], fi["removed"]) == (str(root), "clear_and_record", len(flashinfer_tree(release, "120f")))
    assert sorted(os.listdir(str(root))) == [MARKER, "cubins"]

    make_tree(str(root), flashinfer_tree(release, "120f"))  # the job builds its modules again
    kept = run_module(torch_cache.main, args)
    assert kept["changed"] is False and kept["caches"][0]["stale"] is False
    assert os.path.exists(str(root / release / "120f" / "cached_ops" / "norm" / "norm.so"))

    uninstall(venv, "flashinfer-python")  # the seed's purge of its serving leftovers
    stale = run_module(torch_cache.main, dict(args, state="present"))
    assert stale["fingerprint"]["flashinfer"] is None and stale["caches"][0]["stale"] is True
    cleared = run_module(torch_cache.main, args, diff=True)
    assert cleared["changed"] is True and cleared["caches"][0]["action"] == "clear_and_record"
    assert "flashinfer 0.6.11.post1" in cleared["diff"][0]["before"] and "flashinfer -" in cleared["diff"][0]["after"]
    assert sorted(os.listdir(str(root))) == [MARKER, "cubins"]
    assert run_module(torch_cache.main, args)["changed"] is False

    install_wheel(venv, flashinfer_wheels["0.6.0"])
    make_tree(str(root), flashinfer_tree("0.6.0", "120f"))
    assert run_module(torch_cache.main, args)["caches"][0]["action"] == "clear_and_record"
    install_wheel(venv, flashinfer_wheels["0.6.11.post1"])  # an upgrade: built by 0.6.0, stale now
    make_tree(str(root), flashinfer_tree("0.6.0", "120f"))
    upgraded = run_module(torch_cache.main, args)
    assert upgraded["caches"][0]["action"] == "clear_and_record" and upgraded["fingerprint"]["flashinfer"] == "0.6.11.post1"
    assert sorted(os.listdir(str(root))) == [MARKER, "cubins"]


def test_fresh_creates_a_missing_root_to_hold_the_record(run_module, tmp_path, wheel_dir):
    venv = make_venv(str(tmp_path / "venv"))
    install(venv, wheel_dir, "torch==2.8.0+cu128", "triton==3.4.0")
    env = {"HOME": str(tmp_path), "TRITON_CACHE_DIR": str(tmp_path / "not-yet/triton")}
    args = dict(state="fresh", venv=venv, environment=env, caches=["triton"])
    checked = run_module(torch_cache.main, args, check_mode=True, diff=True)
    assert checked["changed"] is True and not os.path.exists(env["TRITON_CACHE_DIR"])
    # Its --diff says that this removes nothing (a missing cache is not a clear).
    [d] = checked["diff"]
    assert d["after_header"].endswith(": fingerprint recorded, nothing removed (the directory created)"), d
    result = run_module(torch_cache.main, args)
    assert result["changed"] is True and os.listdir(env["TRITON_CACHE_DIR"]) == [MARKER]
    assert run_module(torch_cache.main, args)["changed"] is False


def test_fresh_requires_venv(run_module, job):
    result = run_module(torch_cache.main, dict(state="fresh", environment=job))
    assert result["failed"] is True
    assert "state is fresh but all of the following are missing: venv" in result["msg"]


def test_nested_triton_inside_inductor_stays_idempotent(run_module, tmp_path, wheel_dir):
    """TRITON_CACHE_DIR under TORCHINDUCTOR_CACHE_DIR (a common layout) must not undo its own record."""
    venv = make_venv(str(tmp_path / "venv"))
    install(venv, wheel_dir, "torch==2.8.0+cu128", "triton==3.4.0")
    ind = tmp_path / "inductor"
    env = {"HOME": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(ind), "TRITON_CACHE_DIR": str(ind / "triton")}
    make_tree(str(ind), INDUCTOR_TREE)
    args = dict(state="fresh", venv=venv, environment=env, caches=["triton", "inductor"])
    assert run_module(torch_cache.main, args)["changed"] is True
    assert sorted(os.listdir(str(ind))) == [MARKER, "triton"]
    assert os.listdir(str(ind / "triton")) == [MARKER]
    assert run_module(torch_cache.main, args)["changed"] is False


# --------------------------------------------------------------------------- hostile input


def test_symlink_in_cache_never_reaches_outside(run_module, job, tmp_path):
    precious = tmp_path / "precious"
    make_tree(str(precious), {"ckpt/step_1000.pt": b"weights", "README": b"keep"})
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"outside the cache")
    before = snapshot(str(precious))
    ind = job["TORCHINDUCTOR_CACHE_DIR"]
    os.symlink(str(secret), os.path.join(ind, "fxgraph/ab/link-to-file"))
    os.symlink(str(precious), os.path.join(ind, "link-to-dir"))
    os.symlink("../../../../precious/ckpt", os.path.join(ind, "fxgraph/ab/fab12cd/dotdot"))
    result = run_module(torch_cache.main, dict(state="absent", environment=job, caches=["inductor"]))
    assert result["changed"] is True and os.listdir(ind) == []
    assert secret.read_bytes() == b"outside the cache"
    assert snapshot(str(precious)) == before


def test_root_that_is_a_symlink_is_refused(run_module, job, tmp_path):
    real = tmp_path / "victim"
    make_tree(str(real), {"thesis.tex": b"years of work"})
    os.symlink(str(real), str(tmp_path / "link-root"))
    env = dict(job, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "link-root"))
    result = run_module(torch_cache.main, dict(state="absent", environment=env))
    assert result["failed"] is True
    assert "refusing to touch the inductor cache" in result["msg"] and "is a symbolic link to %s" % real in result["msg"]
    assert "point the variable at it directly" in result["msg"]
    assert (real / "thesis.tex").read_bytes() == b"years of work"
    assert os.listdir(job["TRITON_CACHE_DIR"]) != []  # refused before anything was cleared
    assert "Traceback" not in json.dumps(result)


@pytest.mark.parametrize("var,value,fragment", [
    ("TORCHINDUCTOR_CACHE_DIR", "", "TORCHINDUCTOR_CACHE_DIR is set but empty"),
    ("TORCH_EXTENSIONS_DIR", "/", "/ is / itself"),
    ("CUDA_CACHE_PATH", "/usr/local", "/usr/local is the system directory /usr/local"),
    ("TRITON_CACHE_DIR", "/etc", "is the top-level directory /etc"),
    ("TRITON_CACHE_DIR", "rel/cache", "is not an absolute path"),
    ("TRITON_CACHE_DIR", "/tmp\n/etc", "holds a control character"),
    ("CUDA_CACHE_PATH", "/tmp/cache\t", "holds a control character"),
])
def test_dangerous_variables_are_refused(run_module, job, var, value, fragment):
    env = dict(job)
    env[var] = value
    result = run_module(torch_cache.main, dict(state="absent", environment=env))
    assert result["failed"] is True and fragment in result["msg"]
    assert os.listdir(job["TORCHINDUCTOR_CACHE_DIR"]) != [] or var == "TORCHINDUCTOR_CACHE_DIR"
    # present reports the same problem without failing
    report = run_module(torch_cache.main, dict(environment=env))
    assert report["changed"] is False and any(fragment in p for c in report["caches"] for p in c["problems"])


def test_home_itself_is_refused(run_module, job):
    env = dict(job, CUDA_CACHE_PATH=job["HOME"] + "/.nv/..")
    result = run_module(torch_cache.main, dict(state="absent", environment=env, caches=["cuda"]))
    assert result["failed"] is True and "is the home directory %s itself" % job["HOME"] in result["msg"]


@pytest.fixture(scope="module")
def not_caches(tmp_path_factory):
    """A home with its own entries, and a real venv: directories that are no cache of any kind."""
    base = tmp_path_factory.mktemp("not-caches")
    home = base / "home"
    make_tree(str(home), {".ssh/authorized_keys": b"ssh-ed25519 AAAA... admin", ".ssh/id_ed25519": b"key",
                          ".config/git/config": b"[user]\n", "notes.txt": b"mine"})
    venv = make_venv(str(base / "venv"))
    site = Venv.of(venv, None).own_site_dirs[0]
    make_tree(site, {"torch/__init__.py": b"", "torch-2.8.0.dist-info/METADATA": b"Name: torch\n"})
    return {"home": str(home), "venv": venv, "site": site, "bin": os.path.join(venv, "bin")}


# (the variable, the directory it names, the rule that refuses it: {home}, {venv}, {site} filled in)
NOT_CACHES = [
    ("TRITON_CACHE_DIR", "/var/lib/dpkg", "/var/lib/dpkg lies in the system directory /var/lib"),
    ("CUDA_CACHE_PATH", "/usr/local/lib", "/usr/local/lib lies in the system directory /usr/local/lib"),
    ("TRITON_CACHE_DIR", "{home}/.ssh", ("{home}/.ssh is inside the home directory {home} and is not a triton cache "
     "location (~/.triton/cache) and does not look like one: it holds the file 'authorized_keys'")),
    ("TORCH_EXTENSIONS_DIR", "{home}/.ssh", ("{home}/.ssh is inside the home directory {home} and is not a "
     "torch_extensions cache location")),
    ("TORCHINDUCTOR_CACHE_DIR", "{home}/.config", ("{home}/.config is inside the home directory {home} and is not an "
     "inductor cache location")),
    ("TORCHINDUCTOR_CACHE_DIR", "{bin}", "{bin} lies in the virtual environment {venv}"),
    ("CUDA_CACHE_PATH", "{site}", "{site} lies in the virtual environment {venv}"),
    ("TRITON_CACHE_DIR", "{home}", "{home} is the home directory {home} itself"),
]


@pytest.mark.parametrize("check_mode", [True, False], ids=["check", "real"])
@pytest.mark.parametrize("var,path,rule", NOT_CACHES, ids=[f"{v}={p}" for v, p, _r in NOT_CACHES])
def test_directories_that_are_not_caches_are_refused_with_the_rule(run_module, not_caches, var, path, rule, check_mode):
    path, rule = path.format(**not_caches), rule.format(**not_caches)
    if not os.path.isdir(path):
        pytest.skip(f"{path} is not on this machine")
    kind = {"TRITON_CACHE_DIR": "triton", "CUDA_CACHE_PATH": "cuda", "TORCH_EXTENSIONS_DIR": "torch_extensions",
            "TORCHINDUCTOR_CACHE_DIR": "inductor"}[var]
    watched = {p: listing(p) for p in (path, not_caches["home"], not_caches["venv"])}
    env = {"HOME": not_caches["home"], "USER": "trainer", var: path}
    for venv in (not_caches["venv"], None):  # the venv given, or only its pyvenv.cfg to tell
        result = run_module(torch_cache.main, dict(state="absent", environment=env, caches=[kind], venv=venv),
                            check_mode=check_mode)
        expected = rule if venv or "virtual environment" not in rule else rule + " (it holds pyvenv.cfg)"
        assert result["failed"] is True and result["changed"] is False
        assert result["msg"].startswith(f"refusing to touch the {kind} cache: {expected}"), result["msg"]
        assert result["caches"][0]["action"] == "none"
    assert {p: listing(p) for p in watched} == watched


def test_a_cache_named_by_a_variable_is_cleared_when_it_looks_like_one(run_module, tmp_path):
    """Off the known layout, what the root holds decides: a real Triton cache under a home is cleared."""
    home = tmp_path / "home"
    scratch = home / "scratch" / "triton"
    make_tree(str(scratch), TRITON_TREE)
    env = {"HOME": str(home), "TRITON_CACHE_DIR": str(scratch)}
    result = run_module(torch_cache.main, dict(state="absent", environment=env, caches=["triton"]))
    assert result["changed"] is True and os.listdir(str(scratch)) == []
    (scratch / "notes.txt").write_text("not a kernel")
    refused = run_module(torch_cache.main, dict(state="absent", environment=env, caches=["triton"]))
    assert refused["failed"] is True and "it holds the file 'notes.txt'" in refused["msg"]
    assert (scratch / "notes.txt").read_text() == "not a kernel"


def test_a_symlink_earlier_in_the_path_is_refused_and_its_target_kept(run_module, job, tmp_path):
    """TRITON_CACHE_DIR=~/datalink/cache, ~/datalink a link: the link is named, nothing behind it goes."""
    data = tmp_path / "data"
    make_tree(str(data / "cache"), TRITON_TREE)
    os.symlink(str(data), os.path.join(job["HOME"], "datalink"))
    before = snapshot(str(data))
    env = dict(job, TRITON_CACHE_DIR=os.path.join(job["HOME"], "datalink", "cache"))
    for check_mode in (True, False):
        result = run_module(torch_cache.main, dict(state="absent", environment=env, caches=["triton"]), check_mode=check_mode)
        assert result["failed"] is True
        assert ("refusing to touch the triton cache: %s/datalink/cache is reached through the symbolic link "
                "%s/datalink (to %s)" % (job["HOME"], job["HOME"], data)) in result["msg"]
    assert snapshot(str(data)) == before


def test_missing_venv_fails_cleanly(run_module, job, tmp_path):
    result = run_module(torch_cache.main, dict(state="fresh", venv=str(tmp_path / "no-venv"), environment=job))
    assert result["failed"] is True and result["msg"] == "venv %s does not exist" % (tmp_path / "no-venv")
    assert os.listdir(job["TORCHINDUCTOR_CACHE_DIR"]) != []


def test_unknown_user_fails_cleanly(run_module):
    result = run_module(torch_cache.main, dict(user="no-such-user-xyz"))
    assert result["failed"] is True and "user no-such-user-xyz does not exist" in result["msg"]


# --------------------------------------------------------------------------- running jobs


def test_cache_held_by_a_running_process_is_refused_unless_forced(run_module, job):
    so = os.path.join(job["TRITON_CACHE_DIR"], "QWERTY123/cuda_utils.so")
    with holder(so, "map") as proc:
        result = run_module(torch_cache.main, dict(state="absent", environment=job, caches=["inductor", "triton"]))
        assert result["failed"] is True
        assert "PID %d" % proc.pid in result["msg"] and "force: true" in result["msg"]
        assert "the triton cache %s is in use" % job["TRITON_CACHE_DIR"] in result["msg"]
        assert os.path.exists(so)
        assert os.listdir(job["TORCHINDUCTOR_CACHE_DIR"]) != []  # nothing cleared at all
        checked = run_module(torch_cache.main, dict(state="absent", environment=job), check_mode=True)
        assert checked["failed"] is True  # check mode predicts the refusal
        forced = run_module(torch_cache.main, dict(state="absent", environment=job, force=True))
        assert forced["changed"] is True and os.listdir(job["TRITON_CACHE_DIR"]) == []
        holders = by_name(forced)["triton"]["holders"]
        assert [h["pid"] for h in holders] == [proc.pid]


# --------------------------------------------------------------------------- permission errors


def _run_as_nobody(args):
    """Run the module in a real forked process that dropped to uid/gid 65534; return its JSON result."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 70
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            sys.stdout = os.fdopen(wfd, "w")
            with patch_module_args(args):
                torch_cache.main()
        except SystemExit as exc:
            code = exc.code or 0
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd) as f:
        out = f.read()
    _pid, status = os.waitpid(pid, 0)
    result = json.loads(out)
    assert bool(result.get("failed")) == (os.waitstatus_to_exitcode(status) != 0)
    return result


def test_permission_denied_says_what_to_fix(run_module):
    """Another account's cache: the unlink fails for real, and the message says how to fix it."""
    base = tempfile.mkdtemp(prefix="torch-cache-perm-", dir="/tmp")
    locked = None
    try:
        os.chmod(base, 0o755)
        root = os.path.join(base, "inductor")
        make_tree(root, INDUCTOR_TREE)
        for dirpath, _dirs, _files in os.walk(root):
            os.chmod(dirpath, 0o755)
        args = dict(state="absent", environment={"HOME": "/tmp", "TORCHINDUCTOR_CACHE_DIR": root}, caches=["inductor"])
        if os.geteuid() == 0:
            result = _run_as_nobody(args)  # root may unlink anything: clear as another account
        else:
            locked = os.path.join(root, "fxgraph/ab/fab12cd")
            os.chmod(locked, 0o555)
            result = run_module(torch_cache.main, args)
        assert result["failed"] is True
        assert "cannot clear the inductor cache %s: permission denied" % root in result["msg"]
        assert "Permission denied" in result["msg"] and "become: true" in result["msg"]
        assert "Traceback" not in json.dumps(result)
        assert os.path.exists(os.path.join(root, "fxgraph/ab/fab12cd/entry"))
    finally:
        if locked:
            os.chmod(locked, 0o755)
        shutil.rmtree(base)


def test_immutable_file_fails_even_for_root(run_module, job):
    if os.geteuid() != 0:
        pytest.fail("chattr +i needs root (the suite runs as root in CI)")
    victim = os.path.join(job["TRITON_CACHE_DIR"], "ZXCVB456/add_kernel.cubin")
    chattr = subprocess.run(["chattr", "+i", victim], capture_output=True, text=True, check=False)
    if chattr.returncode != 0:
        pytest.skip("this file system does not support chattr +i: %s" % chattr.stderr.strip())
    try:
        result = run_module(torch_cache.main, dict(state="absent", environment=job, caches=["triton"]))
        assert result["failed"] is True and result["changed"] is True  # the rest was cleared
        assert "permission denied on 1 of 1 paths" in result["msg"]
        assert victim + ": Operation not permitted" in result["msg"] and "chattr -i" in result["msg"]
        assert os.path.exists(victim)
        assert not os.path.exists(os.path.join(job["TRITON_CACHE_DIR"], "QWERTY123"))
    finally:
        subprocess.run(["chattr", "-i", victim], check=True)
