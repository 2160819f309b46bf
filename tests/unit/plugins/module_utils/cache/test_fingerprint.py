# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a cache is built against: a real venv's fingerprint and Python tag (cache/_fingerprint.py)."""

from __future__ import annotations

import os
import subprocess

from cachetree import install, install_wheel, make_venv, uninstall

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._fingerprint import python_tag, same_fingerprint, venv_fingerprint
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv


def run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def test_python_tag_from_a_real_venv(tmp_path):
    venv = make_venv(str(tmp_path / "venv"))
    site = [d for d in os.listdir(os.path.join(venv, "lib")) if d.startswith("python")][0]
    assert python_tag(Venv(venv, run).own_site_dirs) == "py" + site[len("python"):].replace(".", "")


def test_fingerprint_follows_real_wheel_changes(tmp_path, wheel_dir):
    venv = make_venv(str(tmp_path / "venv"))
    install(venv, wheel_dir, "torch==2.8.0+cu128", "triton==3.4.0")
    first = venv_fingerprint(venv, run)
    assert first == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}
    install(venv, wheel_dir, "triton==3.5.0")
    second = venv_fingerprint(venv, run)
    assert second == {"torch": "2.8.0+cu128", "triton": "3.5.0", "cuda": "12.8", "flashinfer": None}
    assert not same_fingerprint(first, second)
    # torch without a local label: CUDA comes from torch/version.py
    install(venv, wheel_dir, "torch==2.9.0")
    assert venv_fingerprint(venv, run) == {"torch": "2.9.0", "triton": "3.5.0", "cuda": "13.0", "flashinfer": None}


def test_fingerprint_of_a_venv_without_torch(tmp_path):
    venv = make_venv(str(tmp_path / "venv"))
    assert venv_fingerprint(venv, run) == {"torch": None, "triton": None, "cuda": None, "flashinfer": None}


def _dist_info_version(venv, name):
    site = Venv(venv, run).own_site_dirs[0]
    [info] = [d for d in os.listdir(site) if d.startswith(name + "-") and d.endswith(".dist-info")]
    with open(os.path.join(site, info, "METADATA"), encoding="utf-8") as f:
        return [line.split(":", 1)[1].strip() for line in f if line.startswith("Version:")][0]


def test_fingerprint_holds_the_real_flashinfer_release(tmp_path, wheel_dir, flashinfer_wheels):
    """The released flashinfer-python wheels, installed as they are: its version comes from its
    dist-info (nothing imported: flashinfer would import torch and look for a GPU), and follows an
    upgrade and the purge of the seed's leftovers."""
    venv = make_venv(str(tmp_path / "venv"))
    install(venv, wheel_dir, "torch==2.8.0+cu128", "triton==3.4.0")
    install_wheel(venv, flashinfer_wheels["0.6.0"])
    old = venv_fingerprint(venv, run)
    assert old == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": "0.6.0"}
    install_wheel(venv, flashinfer_wheels["0.6.11.post1"])
    seed = venv_fingerprint(venv, run)
    assert seed["flashinfer"] == _dist_info_version(venv, "flashinfer_python") == "0.6.11.post1"
    assert not same_fingerprint(old, seed)
    uninstall(venv, "flashinfer-python")
    gone = venv_fingerprint(venv, run)
    assert gone == dict(seed, flashinfer=None) and not same_fingerprint(seed, gone)


def test_a_record_without_flashinfer_matches_a_venv_without_it():
    """Records written before FlashInfer was part of the fingerprint read as flashinfer None: a
    venv without FlashInfer keeps its caches, one with it has them cleared once."""
    old = {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8"}
    assert same_fingerprint(old, dict(old, flashinfer=None))
    assert not same_fingerprint(old, dict(old, flashinfer="0.6.11.post1"))
