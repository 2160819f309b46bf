# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_elf: DT_NEEDED read from real objects built with gcc, including names that run past the
span of the string table read first; garbage that is no ELF object, and the system's own libm."""

from __future__ import annotations

import os
import subprocess

import pytest

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


# ----------------------------------------------------------------- garbage and the system's libm


@pytest.mark.parametrize("blob", [b"", b"\x7fELF", b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\xff" * 48,
                                  b"\x7fELF\x09\x01" + b"\0" * 100, b"not an elf at all" * 10])
def test_elf_garbage_is_not_a_crash(tmp_path, blob):
    path = tmp_path / "x.so"
    path.write_bytes(blob)
    assert _elf.dt_needed(str(path)) in (None, [])


def test_elf_real_library():
    libc = [p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
                        "/lib/aarch64-linux-gnu/libm.so.6") if os.path.exists(p)]
    assert libc, "this test needs the system libm"
    assert "libc.so.6" in _elf.dt_needed(libc[0])
