# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A file written whole or not at all, on the controller (the reports, the outcome callback's file).

Its own module: the outcome callback, loaded by every run, needs this and none of the report's
code, which ansible-core's collection loader would otherwise compile from source at every start.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import contextlib
import os
import tempfile


def write_atomic(path, text, mode=0o644):
    """Write text to path through a temporary file in the same directory and a rename.

    The temporary name starts with a dot and does not end in .prom, so a textfile collector
    scanning the directory never reads a half-written file.
    """
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
