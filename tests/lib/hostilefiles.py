# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a hostile user puts where a reader expects a regular file (a FIFO, a link to /dev/zero),
and a call that must return within a bound: the file layer's tests (fs/test_files.py) and the
venv readers' (venv/test_dist_hostile.py) share them."""

from __future__ import annotations

import os
import threading
import time

BOUND = 5.0  # seconds: every hostile read returns well within it


def timed(call, *args, **kw):
    """call(*args) in a thread; its result and seconds, or a failure when it outlives BOUND."""
    out = {}

    def target():
        out["value"] = call(*args, **kw)

    thread = threading.Thread(target=target, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive(), "%s hung for more than %ss" % (getattr(call, "__name__", call), BOUND)
    return out["value"], time.monotonic() - start


def replace(path, how):
    """The file at ``path`` replaced by a FIFO (how="fifo") or by a link to ``how``."""
    os.remove(path)
    if how == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(how, path)
