# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""DT_NEEDED read from real objects built with gcc, including names that run past the span
of the string table read first."""

from __future__ import annotations

import os
import subprocess

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _elf


def _stub(workdir, filename, soname):
    src = os.path.join(workdir, filename + ".c")
    with open(src, "w") as f:
        f.write("int stub_%d(void) { return 0; }\n" % len(os.listdir(workdir)))
    out = os.path.join(workdir, filename)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", out, "-Wl,-soname," + soname, src], check=True)
    return out


def test_long_names_and_order(tmp_path):
    work = str(tmp_path)
    long_name = "lib" + "x" * 3000 + ".so.7"  # longer than the first read's slack
    # Without libc (-nostdlib) the last stub's name is the last string: the read runs on.
    stubs = [_stub(work, "a.so", "libcudart.so.12"), _stub(work, "c.so", "libfoo.so.1"), _stub(work, "b.so", long_name)]
    main_src = os.path.join(work, "main.c")
    with open(main_src, "w") as f:
        f.write("int main_fn(void) { return 1; }\n")
    out = os.path.join(work, "main.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", "-o", out, "-Wl,--no-as-needed", main_src] + stubs, check=True)
    assert _elf.dt_needed(out) == ["libcudart.so.12", "libfoo.so.1", long_name]


def test_not_elf_and_truncated(tmp_path):
    text = tmp_path / "script.so"
    text.write_text("#!/bin/sh\n")
    assert _elf.dt_needed(str(text)) is None
    work = str(tmp_path)
    full = _stub(work, "d.so", "libd.so.1")
    with open(full, "rb") as f:
        head = f.read(80)
    cut = tmp_path / "cut.so"
    cut.write_bytes(head)
    assert _elf.dt_needed(str(cut)) is None
    assert _elf.dt_needed(str(tmp_path / "missing.so")) is None
