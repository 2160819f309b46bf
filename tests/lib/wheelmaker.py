# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Build small, real wheels for tests: real names, versions and file layouts, tiny payloads.

A wheel is a zip with a dist-info (METADATA, WHEEL, RECORD) as PEP 427 describes; writing
one takes twenty lines, where the `wheel` or `build` packages would need a source tree and
a build backend per fixture. pip and uv install what this writes like any other wheel.
ELF payloads are compiled with gcc so DT_NEEDED is real.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import zipfile


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(outdir, name, version, files=None, requires=(), tag="py3-none-any", metadata_extra=""):
    """Write ``name-version-tag.whl`` into outdir and return its path.

    ``files`` maps paths inside site-packages to bytes (str is encoded as UTF-8).
    """
    files = dict(files or {})
    dist = re.sub(r"[-_.]+", "_", name)
    info = "%s-%s.dist-info" % (dist, version)
    meta = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    meta += "".join("Requires-Dist: %s\n" % r for r in requires)
    meta += metadata_extra + "\nA test fixture wheel.\n"
    files["%s/METADATA" % info] = meta
    files["%s/WHEEL" % info] = "Wheel-Version: 1.0\nGenerator: gpufleet-tests\nRoot-Is-Purelib: true\nTag: %s\n" % tag
    path = os.path.join(outdir, "%s-%s-%s.whl" % (dist, version.replace("-", "_"), tag))
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for arc, content in sorted(files.items()):
            data = content.encode("utf-8") if isinstance(content, str) else content
            zf.writestr(arc, data)
            record.append("%s,%s,%d" % (arc, _digest(data), len(data)))
        record.append("%s/RECORD,," % info)
        zf.writestr("%s/RECORD" % info, "\n".join(record) + "\n")
    return path


def build_shared_object(workdir, soname, needed=(), symbol="fixture"):
    """Compile a real shared object with the given soname and DT_NEEDED entries."""
    os.makedirs(workdir, exist_ok=True)
    src = os.path.join(workdir, "%s.c" % symbol)
    with open(src, "w") as f:
        f.write("int %s(void) { return 42; }\n" % re.sub(r"\W", "_", symbol))
    stubs = []
    for lib in needed:
        stub = os.path.join(workdir, lib)
        if not os.path.exists(stub):
            stub_src = os.path.join(workdir, "stub_%s.c" % re.sub(r"\W", "_", lib))
            with open(stub_src, "w") as f:
                f.write("int stub_%s(void) { return 0; }\n" % re.sub(r"\W", "_", lib))
            subprocess.run(["gcc", "-shared", "-fPIC", "-o", stub, "-Wl,-soname," + lib, stub_src], check=True)
        stubs.append(stub)
    out = os.path.join(workdir, soname)
    argv = ["gcc", "-shared", "-fPIC", "-o", out, "-Wl,-soname," + soname, "-Wl,--no-as-needed", src] + stubs
    subprocess.run(argv, check=True)
    with open(out, "rb") as f:
        return f.read()
