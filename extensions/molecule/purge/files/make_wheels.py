# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Real wheels (tests/lib/wheelmaker.py) for the purge scenario: torch +cu128 with its CUDA-12
NCCL, a CUDA-13 NCCL wheel that owns (and overwrites) the same library file, and a leftover."""
import os
import sys

ROOT, OUT = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
# A script run by the scenario with the checkout's root as its first argument: tests/lib is
# only known once that is read, hence the import after it.
import wheelmaker  # noqa: E402  pylint: disable=import-error,wrong-import-position

os.makedirs(OUT, exist_ok=True)
wheelmaker.build_wheel(OUT, "torch", "2.8.0+cu128", {
    "torch/__init__.py": "", "torch/version.py": "__version__ = '2.8.0+cu128'\ncuda = '12.8'\n",
}, requires=["nvidia-nccl-cu12==2.27.3"])
wheelmaker.build_wheel(OUT, "nvidia-nccl-cu12", "2.27.3", {"nvidia/nccl/lib/libnccl.so.2": b"\x7fELF fixture nccl cu12\n"})
wheelmaker.build_wheel(OUT, "nvidia-nccl-cu13", "2.27.7", {"nvidia/nccl/lib/libnccl.so.2": b"\x7fELF fixture nccl cu13\n"})
wheelmaker.build_wheel(OUT, "sglang", "0.5.2", {"sglang/__init__.py": ""})
