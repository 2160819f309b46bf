# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""cuda_contamination on real venvs with real wheels installed by uv and pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest
from cuda_fixtures import (
    SEED_ADDED,
    SEED_BASE,
    SEED_CUDA13,
    SEED_LEFTOVERS,
    SHARED_LIBS,
    UV,
    build_cuda13_wheels,
    install,
    make_seed_venv,
    make_venv,
    pins,
)
from wheelmaker import build_shared_object, build_wheel

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _checks, _options, _readiness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _contamination, _restore, _stash
from ansible_collections.gpufleet.hygiene.plugins.modules import cuda_contamination, pip_inventory

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def cuda13_wheels(tmp_path_factory):
    root = tmp_path_factory.mktemp("cu13")
    build_cuda13_wheels(str(root / "wheels"), str(root / "work"))
    return str(root / "wheels")


@pytest.fixture
def seed_venv(tmp_path, seed_wheels):
    """The seed's Frankenstein venv, installed in two steps as it happened."""
    return make_seed_venv(str(tmp_path / "venv"), seed_wheels)


def inventory(run_module, venv, **kw):
    result = run_module(pip_inventory.main, dict(venv=venv, **kw))
    assert not result.get("failed"), result
    return result


def names_versions(inv):
    return {p["name"]: p["version"] for p in inv["packages"]}


@pytest.fixture(autouse=True)
def uv_on_path(monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(UV) + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch):
    """The record of failed restores, in this test's own directory instead of /var/lib."""
    path = str(tmp_path / "state" / "restore")
    monkeypatch.setattr(_restore, "STATE_DIR", path)
    return path


def test_seed_environment_flags_exactly_the_cuda13_packages(run_module, seed_venv):
    result = run_module(cuda_contamination.main, dict(venv=seed_venv))
    assert not result.get("failed"), result
    assert result["reference"] == {"cuda_major": 12, "cuda_version": "12.8",
                                   "source": "torch 2.8.0+cu128 (local version label)"}
    flagged = {c["name"]: c for c in result["contaminants"]}
    assert set(flagged) == SEED_CUDA13
    assert result["clean"] is False
    for item in flagged.values():
        assert item["cuda_major"] == 13
        assert item["evidence"], item
    assert flagged["sglang-kernel"]["layer"] == "version label"
    assert "0.4.2.post2+cu130" in flagged["sglang-kernel"]["evidence"][0]
    assert flagged["nvidia-nccl-cu13"]["layer"] == "name"
    assert any("overwrote nvidia/nccl/lib/libnccl.so.2 of nvidia-nccl-cu12 2.27.3" in e
               for e in flagged["nvidia-nccl-cu13"]["evidence"])
    clobbered = {(c["path"], c["owner"]) for c in result["clobbered"]}
    assert clobbered == {(path, "nvidia-%s-cu12" % sub) for sub, path in SHARED_LIBS.items()}
    assert all(c["state"] == "overwritten" and c["overwritten_by"] == [c["owner"].replace("cu12", "cu13")]
               for c in result["clobbered"])
    # The leftovers carry no CUDA evidence: unknown, not matches and not contaminants.
    for name in ("flash-attn-4", "flashinfer-python", "sglang", "safetensors"):
        assert name in result["unknown"]
    assert result["changed"] is False


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_seed_remediation_removes_exactly_what_was_asked_and_restores_clobbered(
        run_module, tmp_path, seed_wheels, installer, state_dir):
    venv = make_venv(str(tmp_path / "venv"), UV, seed_pip=(installer == "pip"))
    install(UV, venv, seed_wheels, pins(SEED_BASE))
    install(UV, venv, seed_wheels, pins(SEED_ADDED))
    before = names_versions(inventory(run_module, venv))
    args = dict(venv=venv, remove=True, also_remove=SEED_LEFTOVERS, find_links=seed_wheels,
                no_index=True, installer=installer)

    result = run_module(cuda_contamination.main, args, diff=True)
    assert not result.get("failed"), result.get("msg", result)
    assert result["changed"] is True
    assert result["installer"] == installer
    assert {r["name"] for r in result["removed"]} == {n for n, _v in SEED_ADDED}
    assert {r["name"] for r in result["restored"]} == {"nvidia-%s-cu12" % s for s in SHARED_LIBS}
    assert result["clean"] is True
    assert "sglang-kernel==0.4.2.post2+cu130" in result["diff"]["before"]
    assert "sglang-kernel" not in result["diff"]["after"]

    after = inventory(run_module, venv, verify_files=True)
    expected = {n: v for n, v in before.items() if n not in {a for a, _v in SEED_ADDED}}
    assert names_versions(after) == expected
    assert after["integrity"]["ok"], after["integrity"]
    # The restored CUDA 12 libraries are the cu12 bytes again, needing libcudart.so.12.
    site = after["site_dirs"][0]
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._elf import dt_needed
    for path in SHARED_LIBS.values():
        assert "libcudart.so.12" in dt_needed(os.path.join(site, path))
    # Files every nvidia package shares (nvidia/__init__.py) survived the uninstall, put back
    # from a stash of root's that is gone once the run is done.
    assert result["preserved_files"] > 0
    assert os.path.isfile(os.path.join(site, "nvidia", "__init__.py"))
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))

    again = run_module(cuda_contamination.main, args)
    assert again["changed"] is False
    assert again["contaminants"] == [] and again["removed"] == [] and again["clean"] is True


def test_check_mode_reports_the_plan_and_changes_nothing(run_module, seed_venv, seed_wheels):
    before = inventory(run_module, seed_venv, verify_files=True)
    result = run_module(cuda_contamination.main, dict(
        venv=seed_venv, remove=True, also_remove=SEED_LEFTOVERS, find_links=seed_wheels, no_index=True),
        check_mode=True, diff=True)
    assert result["changed"] is True
    assert {r["name"] for r in result["removed"]} == {n for n, _v in SEED_ADDED}
    assert {r["name"] for r in result["restored"]} == {"nvidia-%s-cu12" % s for s in SHARED_LIBS}
    assert result["clean"] is False
    after = inventory(run_module, seed_venv, verify_files=True)
    assert after["packages"] == before["packages"]
    assert after["integrity"] == before["integrity"]


def test_protected_contaminant_is_kept(run_module, seed_venv):
    result = run_module(cuda_contamination.main, dict(
        venv=seed_venv, remove=True, protect=["torch", "NVIDIA_NCCL_cu13"]), check_mode=True)
    assert {"name": "nvidia-nccl-cu13", "reason": "protected"} in result["kept"]
    assert "nvidia-nccl-cu13" not in {r["name"] for r in result["removed"]}


def test_protected_and_also_remove_is_refused(run_module, seed_venv):
    before = inventory(run_module, seed_venv)
    result = run_module(cuda_contamination.main, dict(venv=seed_venv, remove=True, also_remove=["torch"]))
    assert result["failed"]
    assert "torch is both protected and in also_remove" in result["msg"]
    assert inventory(run_module, seed_venv)["packages"] == before["packages"]


def test_consistent_cuda13_environment_is_clean(run_module, tmp_path, cuda13_wheels):
    from cuda_fixtures import CUDA13_ENV
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, cuda13_wheels, pins(CUDA13_ENV))
    result = run_module(cuda_contamination.main, dict(venv=venv))
    assert result["reference"]["cuda_major"] == 13
    assert result["contaminants"] == []
    assert result["clean"] is True
    # nvidia-cufft 12.x is a CUDA 13 wheel: its files, under nvidia/cu13/lib, say so.
    assert "nvidia-cufft" not in result["unknown"]
    assert result["clobbered"] == []


def test_torch_version_py_is_the_reference_when_unlabelled(run_module, tmp_path):
    wheels = str(tmp_path / "w")
    os.makedirs(wheels)
    build_wheel(wheels, "torch", "2.11.0", {"torch/__init__.py": "", "torch/version.py":
                                            "__version__ = '2.11.0'\ncuda: Optional[str] = '13.0'\n"})
    build_wheel(wheels, "nvidia-nccl-cu12", "2.27.3", {"nvidia/nccl/__init__.py": ""})
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, wheels, ["torch==2.11.0", "nvidia-nccl-cu12==2.27.3"])
    result = run_module(cuda_contamination.main, dict(venv=venv))
    assert result["reference"]["source"] == "torch 2.11.0 (torch/version.py: cuda = '13.0')"
    assert [c["name"] for c in result["contaminants"]] == ["nvidia-nccl-cu12"]


def test_binaries_and_requirements_evidence(run_module, tmp_path):
    wheels, work = str(tmp_path / "w"), str(tmp_path / "work")
    os.makedirs(wheels)
    build_wheel(wheels, "torch", "2.8.0+cu128", {"torch/__init__.py": ""})
    so = build_shared_object(work, "_ops.so", ["libcudart.so.13"])
    build_wheel(wheels, "mystery-ops", "1.0", {"mystery_ops/_ops.so": so})
    build_wheel(wheels, "serving-shim", "0.1", {"serving_shim/__init__.py": ""}, requires=["nvidia-nccl-cu13>=2"])
    build_wheel(wheels, "plain", "1.0", {"plain/__init__.py": ""})
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, wheels, ["torch==2.8.0+cu128", "mystery-ops==1.0", "plain==1.0"])
    install(UV, venv, wheels, ["--no-deps", "serving-shim==0.1"])
    result = run_module(cuda_contamination.main, dict(venv=venv))
    flagged = {c["name"]: c for c in result["contaminants"]}
    assert set(flagged) == {"mystery-ops", "serving-shim"}
    assert flagged["mystery-ops"]["layer"] == "binaries"
    assert "mystery_ops/_ops.so links libcudart.so.13 (DT_NEEDED)" in flagged["mystery-ops"]["evidence"][0]
    assert flagged["serving-shim"]["layer"] == "requirements"
    assert "weak evidence" in flagged["serving-shim"]["evidence"][0]
    assert "plain" in result["unknown"]
    off = run_module(cuda_contamination.main, dict(venv=venv, scan_binaries=False))
    assert "mystery-ops" not in {c["name"] for c in off["contaminants"]}


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_uninstall_failing_half_way_reports_and_loses_nothing_else(run_module, tmp_path, seed_wheels, installer):
    seed_venv = make_venv(str(tmp_path / "venv"), UV, seed_pip=(installer == "pip"))
    install(UV, seed_venv, seed_wheels, pins(SEED_BASE))
    install(UV, seed_venv, seed_wheels, pins(SEED_ADDED))
    site = inventory(run_module, seed_venv)["site_dirs"][0]
    # A package whose RECORD is gone cannot be uninstalled by pip or uv.
    os.remove(os.path.join(site, "sglang_kernel-0.4.2.post2+cu130.dist-info", "RECORD"))
    before = names_versions(inventory(run_module, seed_venv))
    result = run_module(cuda_contamination.main, dict(
        venv=seed_venv, remove=True, also_remove=["sglang"], installer=installer,
        find_links=seed_wheels, no_index=True))
    assert result["failed"]
    assert "still installed sglang-kernel" in result["msg"]
    after = names_versions(inventory(run_module, seed_venv))
    gone = set(before) - set(after)
    assert gone == {r["name"] for r in result["removed"]}
    assert gone <= SEED_CUDA13 | {"sglang"}
    assert "sglang-kernel" in after


def test_restore_without_a_source_names_the_packages_and_the_command(run_module, tmp_path, seed_wheels):
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, seed_wheels, pins(SEED_BASE))
    install(UV, venv, seed_wheels, ["nvidia-nccl-cu13==2.28.9"])
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True, find_links=empty, no_index=True))
    assert result["failed"]
    assert "could not reinstall nvidia-nccl-cu12==2.27.3" in result["msg"]
    assert "Restore them with:" in result["msg"] and "nvidia-nccl-cu12==2.27.3" in result["msg"]
    assert [r["name"] for r in result["removed"]] == ["nvidia-nccl-cu13"]
    assert "nvidia-nccl-cu12" in names_versions(inventory(run_module, venv))


@pytest.mark.parametrize("args, message", [
    (dict(venv="/nonexistent/venv"), "venv /nonexistent/venv does not exist"),
    (dict(expected_cuda="twelve"), "expected_cuda 'twelve' is not a CUDA version"),
    (dict(expected_cuda="12.8.1"), "expected_cuda '12.8.1' is not a CUDA version"),
    (dict(expected_cuda="0"), "expected_cuda '0' is not a CUDA version"),
    (dict(remove=True, also_remove=["sglang; touch /tmp/PWNED"]), "also_remove holds 'sglang; touch /tmp/PWNED', which is not"),
    (dict(remove=True, also_remove=["--python=/usr/bin/python3"]), "also_remove holds '--python=/usr/bin/python3', which is not"),
    (dict(remove=True, also_remove=["$(touch /tmp/PWNED)", "`id`"]), "'$(touch /tmp/PWNED)', '`id`', which are not package names"),
    (dict(remove=True, also_remove=["../torch"]), "also_remove holds '../torch'"),
    (dict(remove=True, also_remove=["sglang\nrm"]), "also_remove holds 'sglang\\nrm'"),
    (dict(protect=["torch", "-e"]), "protect holds '-e', which is not a package name"),
])
def test_bad_input_is_a_clear_error(run_module, tmp_path, args, message):
    venv = make_venv(str(tmp_path / "venv"), UV)
    result = run_module(cuda_contamination.main, dict({"venv": venv}, **args))
    assert result["failed"]
    assert message in result["msg"]


def test_no_reference_names_expected_cuda(run_module, tmp_path):
    venv = make_venv(str(tmp_path / "venv"), UV)
    result = run_module(cuda_contamination.main, dict(venv=venv))
    assert result["failed"]
    assert "set expected_cuda" in result["msg"]
    ok = run_module(cuda_contamination.main, dict(venv=venv, expected_cuda="13"))
    assert ok["reference"] == {"cuda_major": 13, "cuda_version": "13", "source": "expected_cuda"}


def test_venv_without_python(run_module, tmp_path):
    venv = tmp_path / "broken"
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    result = run_module(cuda_contamination.main, dict(venv=str(venv), expected_cuda="12"))
    assert result["failed"]
    assert "has no bin/python" in result["msg"]


def test_garbled_metadata_and_record_are_reported_not_fatal(run_module, seed_venv):
    site = inventory(run_module, seed_venv)["site_dirs"][0]
    meta = os.path.join(site, "safetensors-0.6.2.dist-info", "METADATA")
    # New files, not writes through the installed ones: uv hard-links installed files to its cache,
    # and a write in place would garble every later install of the same wheel.
    os.unlink(meta)
    with open(meta, "wb") as f:
        f.write(b"Metadata-Version: 2.1\nName: safetensors\nVersion: 0.6.2\nSummary: caf\xe9 \xff\n\n")
    record = os.path.join(site, "nvidia_cudnn_cu13-9.19.0.56.dist-info", "RECORD")
    with open(record, "rb") as f:
        kept = f.read()
    os.unlink(record)
    with open(record, "wb") as f:
        f.write(kept + b'"unterminated,\xff\xfe\n')
    result = run_module(cuda_contamination.main, dict(venv=seed_venv))
    assert not result.get("failed"), result
    assert any("safetensors-0.6.2.dist-info/METADATA is not valid UTF-8" in p for p in result["problems"])
    assert any("nvidia_cudnn_cu13-9.19.0.56.dist-info/RECORD" in p for p in result["problems"])
    assert {c["name"] for c in result["contaminants"]} == SEED_CUDA13


def test_expected_cuda_overrides_torch_and_warns(run_module, seed_venv):
    result = run_module(cuda_contamination.main, dict(venv=seed_venv, expected_cuda="13"))
    flagged = {c["name"] for c in result["contaminants"]}
    assert "torch" in flagged and "nvidia-nccl-cu12" in flagged
    assert not flagged & SEED_CUDA13
    warnings = [w["event"]["msg"] for w in result["warnings"]]
    assert any("torch itself does not match" in w for w in warnings)


def test_venv_seeing_another_environments_torch_through_a_pth(run_module, tmp_path, cuda13_wheels, seed_wheels):
    """A venv pointed at an image's torch with a .pth file (as on GPU images whose python is
    itself a venv): torch there is the reference, only the venv's own packages are removed."""
    from cuda_fixtures import CUDA13_ENV
    image = make_venv(str(tmp_path / "image"), UV)
    install(UV, image, cuda13_wheels, pins(CUDA13_ENV))
    image_site = inventory(run_module, image)["site_dirs"][0]
    venv = make_venv(str(tmp_path / "venv"), UV)
    site = inventory(run_module, venv)["site_dirs"][0]
    with open(os.path.join(site, "_image.pth"), "w") as f:
        f.write("# the image's packages\n%s\nimport sys\n" % image_site)
    install(UV, venv, seed_wheels, ["nvidia-nccl-cu12==2.27.3"])
    before_image = inventory(run_module, image)["packages"]
    result = run_module(cuda_contamination.main, {"venv": venv, "remove": True})
    assert result["reference"]["source"] == "torch 2.9.0+cu130 (local version label)"
    assert [c["name"] for c in result["contaminants"]] == ["nvidia-nccl-cu12"]
    assert [r["name"] for r in result["removed"]] == ["nvidia-nccl-cu12"]
    assert result["clean"] is True
    assert inventory(run_module, image)["packages"] == before_image
    assert "nvidia-nccl-cu12" not in names_versions(inventory(run_module, venv))


def test_hostile_dist_info_names_never_reach_the_installer(run_module, seed_venv, seed_wheels, tmp_path):
    """A dist-info whose METADATA names it as an installer option (a hostile or broken wheel)
    is reported as kept and never put on uv's command line: the other venv it points at, and
    the rest of this one, stay as they were; the real contaminants are still removed."""
    other = make_venv(str(tmp_path / "other"), UV)
    install(UV, other, seed_wheels, pins(SEED_BASE) + pins(SEED_ADDED))
    other_before = inventory(run_module, other, verify_files=True)
    site = inventory(run_module, seed_venv)["site_dirs"][0]
    evil = os.path.join(site, "evil-1.0+cu130.dist-info")
    os.makedirs(evil)
    with open(os.path.join(evil, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: --python=%s/bin/python\nVersion: 1.0+cu130\n\n" % other)
    with open(os.path.join(evil, "RECORD"), "w") as f:
        f.write("evil-1.0+cu130.dist-info/METADATA,,\n")
    result = run_module(cuda_contamination.main, dict(
        venv=seed_venv, remove=True, also_remove=SEED_LEFTOVERS, find_links=seed_wheels, no_index=True))
    assert not result.get("failed"), result
    [kept] = [k for k in result["kept"] if k["name"].startswith("--python")]
    assert "not handed to uv or pip" in kept["reason"]
    assert {r["name"] for r in result["removed"]} == {n for n, _v in SEED_ADDED}
    assert os.path.isdir(evil)
    other_after = inventory(run_module, other, verify_files=True)
    assert other_after["packages"] == other_before["packages"]
    assert other_after["integrity"] == other_before["integrity"]


def test_removal_only_from_a_virtual_or_conda_environment(run_module, seed_venv):
    """A system prefix (/usr on a distribution with lib/python3.X/site-packages) looks like a
    venv: bin/python3 and site-packages. Without pyvenv.cfg or conda-meta nothing is removed."""
    before = inventory(run_module, seed_venv, verify_files=True)
    cfg = os.path.join(seed_venv, "pyvenv.cfg")
    os.rename(cfg, cfg + ".away")
    alias = seed_venv + "/bin/../"  # as "/opt/venv/../../usr" would reach a prefix
    result = run_module(cuda_contamination.main, dict(venv=alias, remove=True, also_remove=SEED_LEFTOVERS))
    assert result["failed"]
    assert "has no pyvenv.cfg and no conda-meta: it is neither a virtual nor a conda environment" in result["msg"]
    os.rename(cfg + ".away", cfg)
    after = inventory(run_module, seed_venv, verify_files=True)
    assert after["packages"] == before["packages"] and after["integrity"] == before["integrity"]
    os.rename(cfg, cfg + ".away")
    os.makedirs(os.path.join(seed_venv, "conda-meta"))
    check = run_module(cuda_contamination.main, dict(venv=seed_venv, remove=True), check_mode=True)
    assert not check.get("failed") and check["changed"], check


@pytest.fixture
def own_files(monkeypatch):
    """Venvs whose files are their own: uv hard-links installed files to its cache, and these tests
    take installed files away and put them back."""
    monkeypatch.setenv("UV_NO_CACHE", "1")


def _readiness_read(venv):
    p = dict((k, v.get("default")) for k, v in _options.ARGUMENT_SPEC.items())
    p.update(venv=venv, verify_files=True, caches=False, require_gpu=False, nvidia_smi="/nonexistent/nvidia-smi")
    env = _readiness.Venv(venv, _contamination_run)
    return _readiness.read_venv(p, env, False, []), _readiness.read_packages(p, env)


def _contamination_run(argv):
    import subprocess

    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def test_a_failed_restore_keeps_the_venv_not_clean_until_the_files_are_back(run_module, tmp_path, seed_wheels, state_dir, own_files):
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, seed_wheels, pins(SEED_BASE))
    install(UV, venv, seed_wheels, ["nvidia-nccl-cu13==2.28.9"])
    # No find_links and no index: the cu12 files the cu13 wheel overwrote cannot come back.
    failed = run_module(cuda_contamination.main, dict(venv=venv, remove=True, no_index=True))
    assert failed["failed"] and "could not reinstall nvidia-nccl-cu12==2.27.3" in failed["msg"]
    assert [p["name"] for p in failed["restore_pending"]] == ["nvidia-nccl-cu12"]
    assert failed["clean"] is False
    records = os.listdir(state_dir)
    assert len(records) == 1 and os.stat(os.path.join(state_dir, records[0])).st_uid == os.geteuid()

    # Every later read says so, naming the missing file and the fix, as pip_inventory's check does.
    for _round in range(2):
        again = run_module(cuda_contamination.main, dict(venv=venv))
        assert again["clean"] is False and again["contaminants"] == []
        [pending] = again["restore_pending"]
        problem = pending.pop("problem")
        assert pending == {"name": "nvidia-nccl-cu12", "version": "2.27.3", "installed": True,
                           "missing": ["nvidia/nccl/lib/libnccl.so.2"], "modified": []}
        assert problem in again["problems"]
        assert "nvidia/nccl/lib/libnccl.so.2" in problem and "reinstall it with find_links" in problem
    files = inventory(run_module, venv, verify_files=True)["integrity"]["packages"]
    assert [(p["name"], p["missing"]) for p in files] == [("nvidia-nccl-cu12", ["nvidia/nccl/lib/libnccl.so.2"])]
    venv_check = _checks.check_venv(_readiness_read(venv)[0])
    assert venv_check["ok"] is False and "libnccl.so.2" in venv_check["summary"]

    # A run with a wheel directory reinstalls it: clean again, the record gone.
    fixed = run_module(cuda_contamination.main, dict(venv=venv, remove=True, find_links=seed_wheels, no_index=True))
    assert not fixed.get("failed"), fixed
    assert fixed["changed"] and fixed["removed"] == []
    assert fixed["restored"] == [{"name": "nvidia-nccl-cu12", "version": "2.27.3"}]
    assert fixed["clean"] is True and fixed["restore_pending"] == [] and fixed["problems"] == []
    assert os.listdir(state_dir) == []
    assert inventory(run_module, venv, verify_files=True)["integrity"]["ok"] is True
    assert run_module(cuda_contamination.main, dict(venv=venv))["clean"] is True
    assert _checks.check_venv(_readiness_read(venv)[0])["ok"] is True
    second = run_module(cuda_contamination.main, dict(venv=venv, remove=True, find_links=seed_wheels, no_index=True))
    assert second["changed"] is False


def test_files_put_back_by_hand_clear_the_record_on_the_next_read(run_module, tmp_path, seed_wheels, state_dir, own_files):
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, seed_wheels, pins(SEED_BASE))
    install(UV, venv, seed_wheels, ["nvidia-nccl-cu13==2.28.9"])
    assert run_module(cuda_contamination.main, dict(venv=venv, remove=True, no_index=True))["failed"]
    assert run_module(cuda_contamination.main, dict(venv=venv), check_mode=True)["clean"] is False
    subprocess_install = [UV, "pip", "install", "--quiet", "--python", os.path.join(venv, "bin", "python"), "--reinstall",
                          "--no-deps", "--no-index", "--find-links", seed_wheels, "nvidia-nccl-cu12==2.27.3"]
    assert _contamination_run(subprocess_install)[0] == 0
    # Check mode reads and reports, and leaves the record to a real run.
    assert run_module(cuda_contamination.main, dict(venv=venv), check_mode=True)["clean"] is True
    assert len(os.listdir(state_dir)) == 1
    assert run_module(cuda_contamination.main, dict(venv=venv))["clean"] is True
    assert os.listdir(state_dir) == []


def test_a_record_others_may_write_is_not_trusted(run_module, tmp_path, seed_wheels, state_dir, own_files):
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, seed_wheels, pins(SEED_BASE))
    install(UV, venv, seed_wheels, ["nvidia-nccl-cu13==2.28.9"])
    assert run_module(cuda_contamination.main, dict(venv=venv, remove=True, no_index=True))["failed"]
    os.chmod(state_dir, 0o777)
    result = run_module(cuda_contamination.main, dict(venv=venv))
    assert result["restore_pending"] == []
    assert any("cannot be read" in p and "writable by another user" in p for p in result["problems"]), result["problems"]


# ------------------------------------- restore through directory handles (the venv's owner swaps)

NOBODY = 65534


@pytest.fixture
def reachable():
    """A directory another user can reach (the tests' own are root's alone)."""
    import shutil
    import tempfile

    root = tempfile.mkdtemp(prefix="gpufleet-owned-", dir="/tmp")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


SWAP_PTH = (
    "import os; s, t, m = %r, %r, %r; d = os.path.join(s, 'shared'); "
    "open(m, 'a').write('%%d\\n' %% os.getuid()); "
    "os.path.isdir(d) and not os.path.islink(d) and "
    "(os.rename(d, os.path.join(s, '.shared-real')), os.symlink(t, d))\n")


def _nobody_venv_sharing_a_file(root, wheels, seed_pip=False):
    """A real venv of nobody's: keeppkg (kept) and droppkg 1.0+cu130 (removed) both install
    shared/ld.so.preload, with the same bytes; a .pth line of nobody's swaps site/shared for a
    link to ``target`` at every start of the interpreter, and writes its uid to ``marker``."""
    import subprocess

    venv = os.path.join(root, "venv")
    # An interpreter another user can run (the tests' own may sit under root's home).
    if seed_pip:
        subprocess.run(["/usr/bin/python3.11", "-m", "venv", venv], check=True)
    else:
        subprocess.run([UV, "venv", "--quiet", "--python", "/usr/bin/python3.11", venv], check=True)
    subprocess.run([UV, "pip", "install", "--quiet", "--link-mode", "copy", "--python", os.path.join(venv, "bin", "python"),
                    "--no-index", "--find-links", wheels, "keeppkg==1.0", "droppkg==1.0+cu130"], check=True)
    site = _contamination.Venv(venv, None).own_site_dirs[0]
    target = os.path.join(root, "rootonly")
    os.mkdir(target, 0o700)  # root's alone: nobody can create anything in it
    marker = os.path.join(root, "pth-ran-as")
    open(marker, "w").close()
    with open(os.path.join(site, "zz_swap.pth"), "w") as f:
        f.write(SWAP_PTH % (site, target, marker))
    subprocess.run(["chown", "-R", "%d:%d" % (NOBODY, NOBODY), venv, marker], check=True)
    return venv, site, target, marker


@pytest.fixture(scope="session")
def sharing_wheels(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("sharing"))
    body = "/tmp/the-venv-owner-s-library.so\n"
    build_wheel(out, "keeppkg", "1.0", {"keeppkg/__init__.py": "", "shared/ld.so.preload": body})
    build_wheel(out, "droppkg", "1.0+cu130", {"droppkg/__init__.py": "", "shared/ld.so.preload": body})
    # A script both install in the venv's bin/ (RECORD: ../../../bin/sharedtool).
    tool = "#!/bin/sh\necho shared\n"
    build_wheel(out, "keeptool", "1.0", {"keeptool/__init__.py": "", "keeptool-1.0.data/scripts/sharedtool": tool})
    build_wheel(out, "droptool", "1.0+cu130", {"droptool/__init__.py": "", "droptool-1.0+cu130.data/scripts/sharedtool": tool})
    return out


def test_a_shared_script_in_bin_is_kept_through_the_venv_s_handle(run_module, tmp_path, sharing_wheels, state_dir):
    """A file two packages share outside site-packages (a bin/ script, RECORD's ../../../bin row)
    is kept aside and put back below the venv's directory, like one in site-packages."""
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, sharing_wheels, ["keeptool==1.0", "droptool==1.0+cu130"])
    tool = os.path.join(venv, "bin", "sharedtool")
    with open(tool, "rb") as f:
        body = f.read()
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True, expected_cuda="12"))
    assert not result.get("failed"), result.get("msg")
    assert [r["name"] for r in result["removed"]] == ["droptool"] and result["preserved_files"] == 1
    with open(tool, "rb") as f:
        assert f.read() == body
    assert os.access(tool, os.X_OK)
    assert inventory(run_module, venv, verify_files=True)["integrity"]["ok"] is True


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_a_swapped_directory_during_the_uninstall_is_never_followed_by_the_restore(
        run_module, reachable, sharing_wheels, state_dir, installer):
    """The venv's owner swaps a directory for a link to a root-only one from a .pth line that runs
    (as them) during the uninstall; the kept file is put back through handles re-walked from the
    site directory, so the link is refused and named, and nothing appears in the root-only directory."""
    venv, site, target, marker = _nobody_venv_sharing_a_file(reachable, sharing_wheels, seed_pip=(installer == "pip"))
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True, expected_cuda="12", installer=installer))
    # The .pth line ran during the uninstall, as the venv's owner, and swapped the directory.
    with open(marker) as f:
        ran = f.read().split()
    assert ran and set(ran) == {str(NOBODY)}, ran
    assert os.path.islink(os.path.join(site, "shared"))
    # Root created nothing in the root-only directory.
    assert os.listdir(target) == []
    # pip removes what the link hides; uv stops at the file it may not remove there, and says so.
    assert [r["name"] for r in result["removed"]] == (["droppkg"] if installer == "pip" else []), result["msg"]
    assert installer == "pip" or "uv exited" in result["msg"]
    # The refusal is named, and the keeper that lost its file is reported until it is back.
    assert result["failed"]
    assert "shared/ld.so.preload" in result["msg"] and "symbolic link" in result["msg"], result["msg"]
    assert [p["name"] for p in result["restore_pending"]] == ["keeppkg"]
    # The stash was root's, outside the venv: nothing of it is left in the user's tree, nor beside.
    assert not [n for n in os.listdir(venv) if n.startswith(".gpufleet")]
    assert not [n for n in os.listdir(site) if n.startswith(".gpufleet")]
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))


@pytest.fixture
def shared_dir():
    """A directory another user may traverse (pytest's tmp_path is root's alone); removed afterwards."""
    path = tempfile.mkdtemp(prefix="gpufleet-user-venv-", dir="/var/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_a_users_venv_is_repaired_by_its_user_and_stays_all_theirs(run_module, shared_dir, seed_wheels, own_files):
    """The seed venv owned by a user (nobody here; trainer in an unprivileged container): root runs
    the removal, the installer runs as the venv's owner, and the directories the uninstall took away
    with the shared files kept for the cu12 packages are made again as that user's, so that the
    user's restore can write there: every file and directory of the venv is still the user's."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the venv is given to another user")
    uid = gid = 65534
    wheels = shutil.copytree(seed_wheels, os.path.join(shared_dir, "wheels"))
    # The system's interpreter, which the user can run (the test runner's may live in root's home).
    venv = os.path.join(shared_dir, "venv")
    subprocess.run([UV, "venv", "--quiet", "--python", "/usr/bin/python3", venv], check=True)
    install(UV, venv, wheels, pins(SEED_BASE))
    install(UV, venv, wheels, pins(SEED_ADDED))
    for top, dirs, files in os.walk(venv):
        for name in [top] + [os.path.join(top, n) for n in dirs + files]:
            os.lchown(name, uid, gid)

    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True, also_remove=SEED_LEFTOVERS,
                                                      find_links=wheels, no_index=True, installer="uv"))
    assert not result.get("failed"), result.get("msg", result)
    assert {r["name"] for r in result["removed"]} == {n for n, _v in SEED_ADDED}
    assert {r["name"] for r in result["restored"]} == {"nvidia-%s-cu12" % s for s in SHARED_LIBS}
    assert result["clean"] is True
    assert inventory(run_module, venv, verify_files=True)["integrity"]["ok"]
    not_theirs = [os.path.join(top, n) for top, dirs, files in os.walk(venv) for n in [""] + dirs + files
                  if os.lstat(os.path.join(top, n)).st_uid != uid or os.lstat(os.path.join(top, n)).st_gid != gid]
    assert not_theirs == [], not_theirs


# ---------------------------------- the audit's case: sparse files a kept and a removed package share

SPARSE_SIZE = 128 << 20  # the audit's files were 1 GiB; the shape is what matters, and this keeps the test short
SPARSE_FILES = ["bigdata/f%d.bin" % i for i in range(3)]


@pytest.fixture(scope="session")
def sparse_wheels(tmp_path_factory):
    """keeppkg 1.0 and droppkg 1.0+cu130 both install bigdata/f0..f2.bin, alone in that directory
    (empty in the wheels: the venv's owner makes them sparse), and the sha256 RECORD gives a file of
    SPARSE_SIZE zeros."""
    import base64
    import hashlib

    out = str(tmp_path_factory.mktemp("sparse"))
    build_wheel(out, "keeppkg", "1.0", dict({"keeppkg/__init__.py": ""}, **{f: "" for f in SPARSE_FILES}))
    build_wheel(out, "droppkg", "1.0+cu130", dict({"droppkg/__init__.py": ""}, **{f: "" for f in SPARSE_FILES}))
    h = hashlib.sha256()
    zeros = bytes(1 << 20)
    for _block in range(SPARSE_SIZE >> 20):
        h.update(zeros)
    return out, "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode("ascii")


def _sparse_shared_venv(path, wheels, zeros_digest, seed_pip):
    """A real venv holding keeppkg and droppkg, whose shared files its owner made sparse files of
    SPARSE_SIZE bytes, no byte of data, and listed so in both RECORDs."""
    venv = make_venv(path, UV, seed_pip=seed_pip)
    install(UV, venv, wheels, ["keeppkg==1.0", "droppkg==1.0+cu130"])
    site = _contamination.Venv(venv, None).own_site_dirs[0]
    for rel in SPARSE_FILES:
        with open(os.path.join(site, rel), "wb") as f:
            f.truncate(SPARSE_SIZE)
    for info in ("keeppkg-1.0.dist-info", "droppkg-1.0+cu130.dist-info"):
        record = os.path.join(site, info, "RECORD")
        with open(record) as f:
            rows = f.read().splitlines()
        rows = ["%s,%s,%d" % (r.split(",")[0], zeros_digest, SPARSE_SIZE) if r.split(",")[0] in SPARSE_FILES else r for r in rows]
        with open(record, "w") as f:
            f.write("\n".join(rows) + "\n")
    return venv, site


@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_sparse_files_a_kept_and_a_removed_package_share_are_all_put_back_sparse(
        run_module, tmp_path, sparse_wheels, state_dir, own_files, monkeypatch, installer):
    """The audit's case: three sparse files (no byte of data) that keeppkg and the removed droppkg
    both list, alone in their directory, which the uninstall removes. Each is kept aside and put back
    sparse (the stash and the venv take what the files take: nothing), all three into the directory
    the first put-back made again, and keeppkg is whole. The stash's bound counts their data, not
    their size: below their sizes' sum, it still takes them."""
    wheels, zeros_digest = sparse_wheels
    venv, site = _sparse_shared_venv(str(tmp_path / "venv"), wheels, zeros_digest, seed_pip=(installer == "pip"))
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", 2 * SPARSE_SIZE, raising=False)
    aside = []
    real_put_back = _stash.Stash.put_back

    def put_back(self, item):  # what the stash holds of each file, and whether its directory is there, just before
        st = os.stat(os.path.join(self.where, item["copy"]))
        aside.append(("/".join(item["rel"].rsplit("/", 2)[-2:]), st.st_size, st.st_blocks * 512,
                      os.path.isdir(os.path.join(site, "bigdata"))))
        return real_put_back(self, item)

    monkeypatch.setattr(_stash.Stash, "put_back", put_back)
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True, expected_cuda="12", installer=installer))
    assert not result.get("failed"), result.get("msg")
    assert (result["removed"], result["preserved_files"]) == ([{"name": "droppkg", "version": "1.0+cu130"}], 3)
    assert not os.path.isdir(os.path.join(site, "droppkg"))
    # The uninstall removed the directory: the first put-back made it again, the next two went into it.
    assert [(rel, size, there) for rel, size, _allocated, there in aside] == [
        ("bigdata/f0.bin", SPARSE_SIZE, False), ("bigdata/f1.bin", SPARSE_SIZE, True), ("bigdata/f2.bin", SPARSE_SIZE, True)]
    assert all(allocated <= 64 << 10 for _rel, _size, allocated, _there in aside), aside
    for rel in SPARSE_FILES:
        st = os.stat(os.path.join(site, rel))
        assert (st.st_size, st.st_blocks * 512 <= 64 << 10) == (SPARSE_SIZE, True), (rel, st.st_blocks)
    assert inventory(run_module, venv, verify_files=True)["integrity"]["ok"] is True
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))


@pytest.fixture(scope="session")
def dense_wheels(tmp_path_factory):
    """keeppkg 1.0 and droppkg 1.0+cu130 both install bigdata/f0..f2.bin, 512 KiB of data each."""
    out = str(tmp_path_factory.mktemp("dense"))
    files = {f: os.urandom(512 << 10) for f in SPARSE_FILES}
    build_wheel(out, "keeppkg", "1.0", dict({"keeppkg/__init__.py": ""}, **files))
    build_wheel(out, "droppkg", "1.0+cu130", dict({"droppkg/__init__.py": ""}, **files))
    return out


def test_shared_files_the_stash_cannot_hold_stop_the_removal_before_anything_is_removed(
        run_module, tmp_path, dense_wheels, state_dir, own_files, monkeypatch):
    """Three shared files of 512 KiB of data each against a stash bound of 1 MiB: the removal is
    refused before the installer runs, in check mode and in a run, naming the kept package and what
    to do; the venv is as it was, and no stash is left."""
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, dense_wheels, ["keeppkg==1.0", "droppkg==1.0+cu130"])
    before = inventory(run_module, venv, verify_files=True)
    monkeypatch.setattr(_stash, "STASH_TOTAL_MAX", 1 << 20, raising=False)
    for check_mode in (True, False):
        result = run_module(cuda_contamination.main, dict(venv=venv, remove=True, expected_cuda="12"), check_mode=check_mode)
        assert result["failed"] and result["changed"] is False and result["removed"] == [], result
        assert result["msg"].startswith("the files that keeppkg==1.0 share with the packages to remove hold more than 1048576 "
                                        "bytes of data, the most a removal keeps aside while it runs (STASH_TOTAL_MAX; the "
                                        "largest: "), result["msg"]
        assert "nothing was removed" in result["msg"] and "also_remove" in result["msg"]
    after = inventory(run_module, venv, verify_files=True)
    assert names_versions(after) == names_versions(before) and names_versions(after)["droppkg"] == "1.0+cu130"
    assert after["integrity"]["ok"] is True
    assert not os.path.exists(os.path.join(os.path.dirname(state_dir), "stash"))
