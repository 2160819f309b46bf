# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A short tmp_path, for tests whose temporary directory holds ssh control sockets.

ssh's control socket path may be at most 90 bytes (plugins/plugin_utils/_ssh.py:
CONTROL_PATH_MAX), and the pct connection and the proxmox_lxc inventory refuse a deeper
control_path_dir. pytest's own tmp_path is deeper than that under pytest-xdist
(/tmp/pytest-of-root/pytest-<n>/popen-gw<k>/<test name, up to 30 characters><n>/): a conftest
whose tmp_path fixture yields from directory() gives its tests one of 16 bytes or so instead
(/tmp/gf-XXXXXXXX), removed after the test.
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile


@contextlib.contextmanager
def directory():
    path = pathlib.Path(tempfile.mkdtemp(prefix="gf-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
