# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a compile cache is built against: the torch, Triton, CUDA and FlashInfer versions of a
virtual environment (its fingerprint), read from the files on disk, and the Python tag torch
names its extension builds by.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import (
    read_torch_version_py,
    torch_reference,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv

FINGERPRINT_KEYS = ("torch", "triton", "cuda", "flashinfer")
TRITON_NAMES = ("triton", "pytorch-triton", "pytorch-triton-rocm")
# flashinfer-python on PyPI; flashinfer on the project's own wheel index before it.
FLASHINFER_NAMES = ("flashinfer-python", "flashinfer")

_PY_DIR = re.compile(r"python(\d+)\.(\d+)([a-z]*)$")


def python_tag(site_dirs):
    """``py311`` (``py313t`` for a free-threaded build) from a venv's own site-packages
    (lib/pythonX.Y/site-packages)."""
    for site in site_dirs:
        match = _PY_DIR.search(os.path.dirname(site))
        if match:
            return "py{}{}{}".format(*match.groups())
    return None


def _first(by_key, names):
    for key in names:
        if key in by_key:
            return by_key[key]
    return None


def venv_fingerprint(venv, run):
    """``{torch, triton, cuda, flashinfer}`` of a venv (a path or a Venv), read from dist-info
    and torch/version.py.

    Nothing is imported: the versions come from the files on disk. A missing package is None;
    ``cuda`` is ``"cpu"`` for a CPU-only torch.
    """
    dists = Venv.of(venv, run).distributions
    by_key = {d.key: d for d in dists}
    torch = by_key.get("torch")
    triton = _first(by_key, TRITON_NAMES)
    # FlashInfer names its workspace by this version too (<root>/<version>/), so its dist-info
    # is what the JIT modules were built by.
    flashinfer = _first(by_key, FLASHINFER_NAMES)
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
        "flashinfer": flashinfer.version if flashinfer else None,
    }


def same_fingerprint(recorded, current):
    if not isinstance(recorded, dict) or not isinstance(current, dict):
        return False
    return all(recorded.get(k) == current.get(k) for k in FINGERPRINT_KEYS)


def fingerprint_text(fp):
    if not fp:
        return "none recorded"
    return ", ".join("{} {}".format(k, fp.get(k) or "-") for k in FINGERPRINT_KEYS)
