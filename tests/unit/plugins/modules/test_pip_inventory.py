# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""pip_inventory on real venvs, cross-checked against uv's own listing."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from cuda_fixtures import UV, make_venv
from wheelmaker import build_wheel

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import canonical_name
from ansible_collections.gpufleet.hygiene.plugins.modules import pip_inventory


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("wheels"))
    build_wheel(d, "Flash_Attn", "2.8.3", {"flash_attn/__init__.py": "x = 1\n", "flash_attn/ops.py": "y = 2\n"})
    build_wheel(d, "zope.interface", "7.2", {"zope/interface/__init__.py": ""})
    build_wheel(d, "torch", "2.8.0+cu128", {"torch/__init__.py": ""})
    build_wheel(d, "numpy", "2.2.6", {"numpy/__init__.py": ""})
    return d


@pytest.fixture
def venv(tmp_path, wheels):
    path = make_venv(str(tmp_path / "venv"), UV)
    subprocess.run([UV, "pip", "install", "--quiet", "--python", os.path.join(path, "bin", "python"), "--no-index",
                    "--find-links", wheels, "flash-attn==2.8.3", "zope.interface==7.2", "torch==2.8.0+cu128",
                    "numpy==2.2.6"], check=True)
    return path


def uv_list(venv):
    out = subprocess.run([UV, "pip", "list", "--format", "json", "--python", os.path.join(venv, "bin", "python")],
                         check=True, capture_output=True, text=True).stdout
    return {p["name"].lower(): p["version"] for p in json.loads(out)}


def test_inventory_matches_uv_pip_list(run_module, venv):
    result = run_module(pip_inventory.main, dict(venv=venv))
    assert result["changed"] is False
    ours = {canonical_name(p["name"]): p["version"] for p in result["packages"]}
    assert ours == {canonical_name(k): v for k, v in uv_list(venv).items()}
    assert result["count"] == 4
    pkg = {p["name"]: p for p in result["packages"]}["torch"]
    assert pkg["installer"] == "uv"
    assert pkg["location"] == result["site_dirs"][0]


def test_baseline_drift(run_module, venv, tmp_path):
    baseline = tmp_path / "requirements.lock"
    baseline.write_text(
        "# uv pip compile output\n"
        "flash-attn==2.8.3 \\\n    --hash=sha256:abc\n    # via -r requirements.in\n"
        "torch==2.8.0\n"               # local label ignored, as PEP 440 says
        "numpy==2.3.0 ; python_version >= '3.9'\n"
        "transformers==4.57.1\n"
        "accelerate>=1.0\n"
        "-r other.txt\n")
    result = run_module(pip_inventory.main, dict(venv=venv, baseline=str(baseline)))
    drift = result["drift"]
    assert [e["name"] for e in drift["extra"]] == ["zope.interface"]
    assert sorted(m["name"] for m in drift["missing"]) == ["accelerate", "transformers"]
    assert drift["changed"] == [{"name": "numpy", "baseline": "2.3.0", "installed": "2.2.6"}]


def test_verify_files_finds_modified_and_missing(run_module, venv):
    clean = run_module(pip_inventory.main, dict(venv=venv, verify_files=True))
    assert clean["integrity"]["ok"] is True
    assert clean["integrity"]["files_checked"] >= 8
    site = clean["site_dirs"][0]
    with open(os.path.join(site, "flash_attn", "__init__.py"), "w") as f:
        f.write("x = 3\n")  # same size, other bytes: only the hash tells
    os.remove(os.path.join(site, "flash_attn", "ops.py"))
    result = run_module(pip_inventory.main, dict(venv=venv, verify_files=True))
    assert result["integrity"]["ok"] is False
    assert result["integrity"]["packages"] == [{"name": "Flash_Attn", "version": "2.8.3",
                                                "missing": ["flash_attn/ops.py"],
                                                "modified": ["flash_attn/__init__.py"]}]


def test_python_option_reads_the_interpreters_sys_path(run_module, venv):
    result = run_module(pip_inventory.main, dict(python=os.path.join(venv, "bin", "python")))
    assert {p["name"] for p in result["packages"]} >= {"torch", "numpy", "Flash_Attn", "zope.interface"}


def test_system_site_packages_are_seen(run_module, tmp_path):
    inner = str(tmp_path / "inner")
    subprocess.run(["python3", "-m", "venv", "--without-pip", "--system-site-packages", inner], check=True)
    base = subprocess.run(["python3", "-c", "import pip, os; print(os.path.dirname(os.path.dirname(pip.__file__)))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    result = run_module(pip_inventory.main, dict(venv=inner))
    assert result["site_dirs"][0].startswith(inner)
    assert base in result["site_dirs"]
    pip = {p["name"]: p for p in result["packages"]}["pip"]
    assert pip["location"] == base


@pytest.mark.parametrize("args, message", [
    (dict(venv="/nonexistent"), "venv /nonexistent does not exist"),
    (dict(venv="/etc/hostname"), "is not a directory"),
    (dict(venv="/nonexistent", python="/usr/bin/python3"), "mutually exclusive"),
    (dict(), "one of the following is required"),
    (dict(python="/nonexistent/python"), "python /nonexistent/python does not exist or is not executable"),
])
def test_bad_input(run_module, args, message):
    result = run_module(pip_inventory.main, args)
    assert result["failed"]
    assert message in result["msg"]


def test_unreadable_baseline(run_module, venv, tmp_path):
    result = run_module(pip_inventory.main, dict(venv=venv, baseline=str(tmp_path / "nope.txt")))
    assert result["failed"]
    assert "baseline %s cannot be read" % (tmp_path / "nope.txt") in result["msg"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"torch==2.8\n\xff\xfe\n")
    result = run_module(pip_inventory.main, dict(venv=venv, baseline=str(bad)))
    assert result["failed"] and "not valid UTF-8" in result["msg"]
