# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Real compile-cache trees, real venvs with torch/triton wheels, and real processes holding files.

The trees mimic what torch and Triton write (hash-named folders, .so launchers, .cubin
kernels, a locks folder); sizes and names are real on disk, contents are tiny.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from cuda_fixtures import UV
from wheelmaker import build_wheel

INDUCTOR_TREE = {
    "fxgraph/ab/fab12cd/entry": b"x" * 300,
    "aotautograd/cd/acd34/entry": b"y" * 200,
    "triton/0/KX3J4ABC/triton_poi_fused_add_0.cubin": b"\x7fELF" + b"\0" * 96,
    "triton/0/KX3J4ABC/triton_poi_fused_add_0.json": b'{"name": "triton_poi_fused_add_0"}',
    "triton/0/KX3J4ABC/__grp__triton_poi_fused_add_0.json": b"{}",
    "locks/fxgraph.lock": b"",
    "cu/cuabc123.py": b"# generated\n",
}

TRITON_TREE = {
    "QWERTY123/cuda_utils.so": b"\x7fELF" + b"\0" * 60,
    "QWERTY123/__triton_launcher.so": b"\x7fELF" + b"\0" * 40,
    "ZXCVB456/add_kernel.cubin": b"\0" * 128,
    "ZXCVB456/add_kernel.ptx": b".version 8.7\n",
}


def make_tree(root, files):
    """Write ``{relpath: bytes}`` under root; return the total bytes written."""
    total = 0
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)
    return total


def snapshot(root):
    """Everything under root, not following links: ``{relpath: ("f", bytes) | ("l", target) | ("d", None)}``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("l", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("d", None)
            else:
                with open(path, "rb") as f:
                    out[rel] = ("f", f.read())
    return out


def torch_wheels(outdir, torch="2.8.0+cu128", cuda="12.8", triton="3.4.0"):
    """A torch wheel with a real torch/version.py and a triton wheel, as PyTorch ships them."""
    version_py = "__version__ = '%s'\ndebug = False\ncuda: Optional[str] = %s\ngit_version = 'abc'\nhip = None\n" % (
        torch, "'%s'" % cuda if cuda else "None")
    build_wheel(outdir, "torch", torch, {"torch/__init__.py": "", "torch/version.py": version_py},
                requires=["triton==%s" % triton] if triton else ())
    if triton:
        build_wheel(outdir, "triton", triton, {"triton/__init__.py": "__version__ = '%s'\n" % triton})
    return outdir


def make_venv(path):
    subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, path], check=True)
    return path


def install(venv, wheel_dir, *reqs):
    subprocess.run([UV, "pip", "install", "--quiet", "--python", os.path.join(venv, "bin", "python"),
                    "--no-index", "--find-links", wheel_dir] + list(reqs), check=True)


_HOLDER = r"""
import mmap, os, sys, time
path, how = sys.argv[1], sys.argv[2]
keep = []
if how == "open":
    keep.append(open(path, "rb"))
elif how == "map":
    with open(path, "rb") as f:
        keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))  # the fd closes, the mapping stays
elif how == "cwd":
    os.chdir(path)
print("ready", flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def holder(path, how="open"):
    """A real process that holds ``path`` open, mapped, or as its working directory."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, path, how], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("holder process did not start: %r" % line)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
