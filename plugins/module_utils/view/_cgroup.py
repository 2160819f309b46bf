# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which container a process of the node belongs to, by the cgroup the node made for it.

LXC puts a container's processes in a cgroup named after it at the top of the node's hierarchy,
and its monitor (a process of the node) in another:

- Proxmox VE (``lxc.cgroup.dir.container = lxc/<vmid>``, ``.inner = ns``): ``/lxc/<vmid>/ns/...``,
  its monitor in ``/lxc.monitor/<vmid>``;
- plain LXC 4+: ``/lxc.payload.<name>/...`` (``lxc.payload/<name>`` with a cgroup directory
  configured), its monitor in ``/lxc.monitor.<name>``; ``<name>-1``, ``-2``... when a container
  of that name already runs from another LXC path on the host.

Only that first component counts, at the top of the path: whatever a container's root creates
below its own cgroup (``/lxc/102/ns/lxc.payload/101``, ``/lxc/102/ns/lxc.monitor.101``) is still
container 102's, never 101's nor a monitor. A path is everything after a line's second colon (a
delegated cgroup's name may hold colons).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import re

# The node's cgroup of a container (or of its monitor), anchored at the top of the path.
_TOP = re.compile(r"^/(?:lxc\.(payload|monitor)([./])([^/]+)|(lxc)(/)([^/]+))(?:/|$)")
_NAME = re.compile(r"^(\d+)(-\d+)?$")


def classify(text):
    """``(kind, vmid, key)`` of a /proc/<pid>/cgroup text: ``kind`` "payload" (a container's
    process) or "monitor" (its LXC monitor, on the node), ``key`` the separator and the name
    (".100-1", "/100") that tells two containers of one vmid from different LXC paths apart and
    that a container's monitor carries too; None for the node's own processes and for a
    container of LXC's whose name is no vmid. The first line naming a container decides."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _TOP.match(path)
        if not m:
            continue
        kind = m.group(1) or "payload"
        sep, name = (m.group(2), m.group(3)) if m.group(1) else (m.group(5), m.group(6))
        number = _NAME.match(name)
        if not number:
            return None
        return kind, int(number.group(1)), sep + name
    return None


def vmid_of_cgroup(text):
    """The container (vmid) a process belongs to, or None: the node's own processes, a
    container's monitor (it runs on the node) and any container whose name is no vmid."""
    found = classify(text)
    return found[1] if found and found[0] == "payload" else None


def payload_of_cgroup(text):
    """``(vmid, cgroup key)`` of a container's process (``(100, ".100-1")``), or None."""
    found = classify(text)
    return (found[1], found[2]) if found and found[0] == "payload" else None


def monitor_key(text):
    """The cgroup key of an LXC monitor's cgroup text (``"/100"``), or None."""
    found = classify(text)
    return found[2] if found and found[0] == "monitor" else None


def monitor_of(cgroup, cmdline):
    """``((LXC path, container name), cgroup key)`` of an LXC monitor process (its cgroup a
    monitor's, its command line ``[lxc monitor] <lxcpath> <name>``), or None."""
    key = monitor_key(cgroup)
    parts = cmdline.split(b"\0")[0].decode("utf-8", "replace").split(" ")
    if key is None or len(parts) != 4 or parts[:2] != ["[lxc", "monitor]"]:
        return None
    return (parts[2].rstrip("/") or "/", parts[3]), key


def cgroup_root(text, vmid):
    """The container's own cgroup as the node names it (``/lxc/<vmid>/ns`` with Proxmox VE's
    inner directory, ``/lxc.payload.<vmid>``): what its cgroup namespace shows as ``/``."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _TOP.match(path)
        if m and (classify(line) or ())[:2] == ("payload", vmid):
            top = m.group(0).rstrip("/")
            return top + "/ns" if m.group(4) and (path + "/").startswith(top + "/ns/") else top
    return None
