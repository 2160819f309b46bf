# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A lock per host (container) that outlives one module call.

A playbook takes it at the start of its work on a host and gives it back at the end, so
two runs never act on one container at once. It is a file created with O_EXCL holding the
owner (a run id), the time taken and an expiry: a run that died leaves a lock that expires
instead of one that blocks forever. Private to gpufleet.hygiene; standard library only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, out_of_range


class LockError(GpufleetError):
    """The lock cannot be read, taken or given back: the message says what."""


def bad_wait(timeout):
    """What is wrong with the seconds to wait for another run's lock (host_lock's timeout), or None."""
    return out_of_range("timeout", timeout, least=0)


def read_lock(path):
    try:
        with open(path, "rb") as f:
            data = f.read(65536)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LockError("cannot read lock %s: %s" % (path, exc.strerror or exc)) from exc
    try:
        info = json.loads(data.decode("utf-8"))
        if not isinstance(info, dict):
            raise ValueError("not an object")
        expires = float(info.get("expires") or 0)
        if not math.isfinite(expires):
            raise ValueError("expires is not a finite number")
    except (ValueError, TypeError, RecursionError):  # RecursionError: "[[[[..." nested deeper than json's stack
        return {"owner": None, "taken": 0, "expires": 0, "garbled": True}
    return info


def _write_new(path, info):
    """Create the lock with its content in one step: written to a file of its own first, then
    hard-linked to ``path`` (which fails if ``path`` exists). Another run never sees a lock
    that exists but is still empty, which it would take for a garbled one and take over."""
    parent = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        os.chmod(tmp, 0o644)
        os.link(tmp, path)
    finally:
        # Also on a full file system, which creates the file and then refuses its content:
        # nothing is left behind, and no lock exists.
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def acquire(path, owner, ttl, wait, check_mode=False, now=time.time, sleep=time.sleep):
    """Take the lock for ``owner``. Returns ``(changed, info, note)``."""
    if not owner:
        raise LockError("owner is empty: give the id of this run")
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        raise LockError("the directory of lock %s does not exist" % path)
    deadline = now() + wait
    note = None
    while True:
        held = read_lock(path)
        if held is None:
            info = {"owner": owner, "taken": now(), "expires": now() + ttl, "pid": os.getpid()}
            if check_mode:
                return True, info, note
            try:
                _write_new(path, info)
                return True, info, note
            except FileExistsError:
                continue  # another run won the race: look again
            except OSError as exc:
                raise LockError("cannot create lock %s: %s; nothing was changed on this host. Free space on "
                                "its filesystem (or make it writable), or choose another path for the lock, "
                                "then run again" % (path, exc.strerror or exc)) from exc
        if held.get("owner") == owner:
            return False, held, note
        if held.get("garbled") or float(held.get("expires") or 0) < now():
            note = "took over an expired lock of %s (taken %s)" % (
                held.get("owner") or "an unreadable owner", _when(held.get("taken")))
            if check_mode:
                return True, {"owner": owner, "taken": now(), "expires": now() + ttl}, note
            _remove_if(path, held)
            continue
        if now() >= deadline:
            raise LockError(
                "%s is held by %s since %s (expires %s): another run is acting on this host, and nothing "
                "was changed here. Wait for it and run again; if that run is gone (interrupted before it "
                "gave the lock back), run again as its owner to resume its work (the playbooks: "
                "-e gpufleet_run_id=%s), or remove the lock (host_lock state=absent force=true)"
                % (path, held.get("owner"), _when(held.get("taken")), _when(held.get("expires")), held.get("owner")))
        sleep(0.5)


def release(path, owner, force=False, check_mode=False):
    """Give the lock back. Returns ``(changed, note)``."""
    held = read_lock(path)
    if held is None:
        return False, None
    if held.get("owner") != owner and not force:
        return False, "lock %s belongs to %s, not to %s: left in place" % (path, held.get("owner"), owner)
    if not check_mode:
        _remove_if(path, held)
    return True, None


def _remove_if(path, held):
    # Remove only the lock that was read, not one another run took since.
    current = read_lock(path)
    if current == held:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _when(stamp):
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(stamp)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"
