# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""view/_cgroup: a process belongs to container N only by the cgroup the node made for N, at
the top of its path; whatever a container creates below its own cgroup stays its own."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _cgroup


@pytest.mark.parametrize("text, found", [
    ("0::/lxc/200/ns/user.slice/user-0.slice/session-3.scope\n", ("payload", 200, "/200")),  # Proxmox VE, cgroup v2
    ("12:pids:/lxc/105/ns\n11:memory:/lxc/105/ns\n0::/lxc/105/ns/init.scope\n", ("payload", 105, "/105")),
    ("0::/lxc.payload.300/system.slice/ssh.service\n", ("payload", 300, ".300")),  # plain LXC 4+
    ("0::/lxc.payload.300-1\n", ("payload", 300, ".300-1")),  # a second LXC path's container of that name
    ("0::/lxc.payload/300/x\n", ("payload", 300, "/300")),
    ("0::/lxc.monitor/200\n", ("monitor", 200, "/200")),  # the monitor, on the node
    ("0::/lxc.monitor.200-1\n", ("monitor", 200, ".200-1")),
    ("0::/user.slice/user-0.slice/session-1.scope\n", None),  # the node itself
    ("0::/system.slice/lxc-200.service\n", None),
    ("0::/lxc.payload.web/lxc/101\n", None),  # an LXC container named web: no vmid, whatever it made inside
    # What a container's root makes below its own cgroup is still its own: never another container, never a monitor.
    ("0::/lxc/102/ns/lxc.payload/101\n", ("payload", 102, "/102")),
    ("0::/lxc/102/ns/lxc/101/ns\n", ("payload", 102, "/102")),
    ("0::/lxc/102/ns/lxc.monitor.101\n", ("payload", 102, "/102")),
    ("0::/lxc.payload.102/lxc.payload.101\n", ("payload", 102, ".102")),
    # Nor does a node user's own (delegated) cgroup that names a container below the top.
    ("0::/user.slice/user-1000.slice/user@1000.service/lxc.payload.101\n", None),
    ("0::/user.slice/lxc/101/ns\n", None),
    # A path is everything after the second colon: a delegated cgroup's name may hold colons.
    ("0::/lxc/100/ns/user.slice/x:/lxc/200/ns/init.scope\n", ("payload", 100, "/100")),
])
def test_a_process_is_a_container_s_only_by_the_top_of_its_cgroup(text, found):
    assert _cgroup.classify(text) == found
    assert _cgroup.vmid_of_cgroup(text) == (found[1] if found and found[0] == "payload" else None)
    assert _cgroup.payload_of_cgroup(text) == ((found[1], found[2]) if found and found[0] == "payload" else None)
    assert _cgroup.monitor_key(text) == (found[2] if found and found[0] == "monitor" else None)


@pytest.mark.parametrize("text, vmid, root", [
    ("0::/lxc/200/ns/user.slice\n", 200, "/lxc/200/ns"),
    ("0::/lxc/200/ns\n", 200, "/lxc/200/ns"),
    ("0::/lxc/200\n", 200, "/lxc/200"),
    ("0::/lxc/200/nsx\n", 200, "/lxc/200"),
    ("0::/lxc.payload.300-1/init.scope\n", 300, "/lxc.payload.300-1"),
    ("0::/lxc/102/ns/lxc/200/ns\n", 200, None),
    ("0::/lxc.monitor/200\n", 200, None),
])
def test_a_container_s_cgroup_root_is_the_node_s_cgroup_of_it(text, vmid, root):
    assert _cgroup.cgroup_root(text, vmid) == root


@pytest.mark.parametrize("cgroup, cmdline, found", [
    ("0::/lxc.monitor/100\n", b"[lxc monitor] /var/lib/lxc 100\0", (("/var/lib/lxc", "100"), "/100")),
    ("0::/lxc.monitor.100-1\n", b"[lxc monitor] /srv/lxc/ 100\0", (("/srv/lxc", "100"), ".100-1")),
    # A container's process that calls itself a monitor is still its container's, not a monitor.
    ("0::/lxc/102/ns/lxc.monitor.101\n", b"[lxc monitor] /var/lib/lxc 101\0", None),
    ("0::/lxc.monitor/100\n", b"python3\0", None),
])
def test_a_monitor_is_told_by_its_cgroup_and_its_title(cgroup, cmdline, found):
    assert _cgroup.monitor_of(cgroup, cmdline) == found
