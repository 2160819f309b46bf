# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Files of a venv as its installer writes them, for the tests of venv/_dist, _venv and _inventory:
a venv's layout (no interpreter that runs) and dist-info directories with their RECORD."""

from __future__ import annotations

import base64
import hashlib
import os

SITE_REL = os.path.join("lib", "python3.11", "site-packages")


def _write(path, data=b""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def _digest(data, algo="sha256"):
    return base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode("ascii")


def _make_venv(root, python="python"):
    """A venv's layout on disk: bin/<python> (executable), pyvenv.cfg, lib/python3.11/site-packages."""
    _write(os.path.join(root, "bin", python), "#!/bin/sh\n")
    os.chmod(os.path.join(root, "bin", python), 0o755)
    _write(os.path.join(root, "pyvenv.cfg"), "home = /usr/bin\nversion_info = 3.11.2\n")
    site = os.path.join(root, SITE_REL)
    os.makedirs(site, exist_ok=True)
    return site


def _dist_info(site, name, version, files=None, installer=None, metadata=None, record=True):
    """A dist-info directory with METADATA, INSTALLER and a RECORD of ``files`` (rel -> bytes),
    each row with its hash and size, as pip writes it."""
    info = os.path.join(site, "%s-%s.dist-info" % (name, version))
    _write(os.path.join(info, "METADATA"),
           metadata if metadata is not None else "Metadata-Version: 2.1\nName: %s\nVersion: %s\n\n" % (name, version))
    if installer is not None:
        _write(os.path.join(info, "INSTALLER"), installer)
    rows = []
    for rel, data in (files or {}).items():
        _write(os.path.join(site, rel), data)
        rows.append("%s,sha256=%s,%d" % (rel, _digest(data), len(data)))
    rows.append("%s-%s.dist-info/RECORD,," % (name, version))
    if record:
        _write(os.path.join(info, "RECORD"), "\n".join(rows) + "\n")
    return info
