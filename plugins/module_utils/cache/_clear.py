# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What a cache root holds (measured, never following a link), which processes hold files in
it, and emptying it through directory handles, the marker first.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import errno
import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._marker import MARKER
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._roots import within
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import UnsafePath, clear, is_empty, opened
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import measure as measure_tree
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import open_files, proc_file


def measure(root, keep=()):
    """``(size_bytes, entries, problems)`` of a cache root (a Dir or a path), marker and the
    names in ``keep`` (what the root holds beside the cache) excluded.

    Symbolic links are counted as entries, never followed; another file system mounted
    inside is not entered; a hard-linked file is counted once.
    """
    try:
        with opened(root) as d:
            return measure_tree(d, skip=(MARKER,) + tuple(keep))
    except (OSError, UnsafePath) as exc:
        return 0, 0, ["{}: {}".format(getattr(root, "path", root), getattr(exc, "strerror", None) or exc)]


def has_content(root, keep_marker=True, keep=()):
    """Whether the root (a Dir or a path) holds anything but ``keep`` (the marker aside too
    when ``keep_marker``)."""
    try:
        with opened(root) as d:
            return not is_empty(d, skip=((MARKER,) if keep_marker else ()) + tuple(keep))
    except (OSError, UnsafePath):
        return True  # unreadable: let the clear report why


# --------------------------------------------------------------------------- clearing


def clear_root(root, keep=()):
    """Remove everything inside a cache root (a Dir or a path) and keep the directory itself
    and its names in ``keep``.

    Works through directory handles opened without following links (fs/_tree.py), so nothing
    outside the root is reached even if a directory on the way or inside is swapped.
    The marker goes first, so an interrupted clear is never taken for a fresh cache.
    """
    with opened(root) as d:
        return clear(d, first=(MARKER,), keep=keep)


def describe_errors(name, root, errors):
    """A message for the failures of a clear that says what to fix."""
    denied = [(p, e) for p, e in errors if getattr(e, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS)]
    first = errors[:3]
    listed = "; ".join("{}: {}".format(p, getattr(e, "strerror", None) or e) for p, e in first)
    if denied:
        hint = ("run the task as the cache's owner or with become: true; a file marked immutable "
                "(lsattr shows 'i') must be released with chattr -i first; a read-only mount must be "
                "remounted read-write")
        return (f"cannot clear the {name} cache {root}: permission denied on {len(denied)} of "
                f"{len(errors)} paths ({listed}): {hint}")
    return f"cannot clear the {name} cache {root}: {len(errors)} paths failed ({listed})"


def find_holders(roots, proc="/proc", skip_pids=None, kept=None):
    """Processes with a file, a mapping or their working directory under one of ``roots``, the
    paths under ``kept[root]`` (what a clear of that root leaves) aside.

    Returns ``({root: [{pid, command, paths}]}, uninspected)``; ``uninspected`` counts
    processes whose /proc entries could not be read (not root, or gone meanwhile).
    """
    found = {r: {} for r in roots}
    kept = kept or {}
    uninspected = 0
    try:
        for pid, paths, denied in open_files(proc, set(skip_pids or (os.getpid(),)), cwd=True, maps=True):
            uninspected += denied
            for path in paths:
                for root in roots:
                    if within(path, root) and not any(within(path, k) for k in kept.get(root, ())):
                        held = found[root].setdefault(pid, [])
                        if path not in held and len(held) < 5:
                            held.append(path)
    except OSError:
        return {r: [] for r in roots}, 0
    result = {}
    for root, by_pid in found.items():
        result[root] = [{"pid": pid, "command": _command(proc, pid), "paths": paths} for pid, paths in sorted(by_pid.items())]
    return result, uninspected


def _command(proc, pid):
    try:
        argv = [a.decode("utf-8", "replace") for a in proc_file("%s/%d/cmdline" % (proc, pid)).split(b"\0") if a]
        if argv:
            text = " ".join(" ".join(argv).split())
            return text if len(text) <= 200 else text[:197] + "..."
    except OSError:
        pass
    try:
        return "[{}]".format(proc_file("%s/%d/comm" % (proc, pid)).decode("utf-8", "replace").strip())
    except OSError:
        return "?"
