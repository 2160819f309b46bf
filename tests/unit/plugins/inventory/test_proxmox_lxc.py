# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parsing of `pct list` / `pct config` by the proxmox_lxc inventory plugin (no fleet needed)."""

from __future__ import annotations

import importlib
import os

from ansible.plugins.loader import init_plugin_loader

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".ansible", "collections"))
# Through the collection loader, as ansible loads it (and as the connection tests need it).
init_plugin_loader([COLLECTIONS])
_plugin = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.inventory.proxmox_lxc")
gpu_indices, nvidia_devices = _plugin.gpu_indices, _plugin.nvidia_devices
parse_pct_config, parse_pct_list = _plugin.parse_pct_config, _plugin.parse_pct_list

LIST = (
    "VMID       Status     Lock         Name                \n"
    "100        running                 pihole              \n"
    "200        stopped    backup       db                  \n"
    "300        running                                     \n"
)


def test_pct_list_rows_with_blank_lock_and_name():
    assert parse_pct_list(LIST) == [
        {"vmid": 100, "status": "running", "lock": "", "name": "pihole"},
        {"vmid": 200, "status": "stopped", "lock": "backup", "name": "db"},
        {"vmid": 300, "status": "running", "lock": "", "name": ""},
    ]


def test_pct_list_empty_node_has_no_header():
    assert parse_pct_list("") == []


MOUNT_STYLE = """arch: amd64
hostname: train-100
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /srv/data mnt/data none bind 0 0
"""

DEV_STYLE = """dev0: /dev/nvidia1
dev1: path=/dev/nvidia2,gid=44,mode=0660
dev2: /dev/nvidiactl
dev3: /dev/dri/renderD128
hostname: train-101
"""


def test_pct_config_keys_and_raw_lxc_lists():
    conf = parse_pct_config(MOUNT_STYLE)
    assert conf["hostname"] == "train-100"
    assert conf["lxc.cgroup2.devices.allow"] == ["c 195:* rwm", "c 508:* rwm"]
    assert len(conf["lxc.mount.entry"]) == 4


def test_gpus_from_mount_entries():
    devices = nvidia_devices(parse_pct_config(MOUNT_STYLE))
    assert devices == ["/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl"]
    assert gpu_indices(devices) == [0, 3]


def test_gpus_from_dev_entries_pve9():
    devices = nvidia_devices(parse_pct_config(DEV_STYLE))
    assert devices == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl"]
    assert gpu_indices(devices) == [1, 2]


def test_no_passthrough():
    conf = parse_pct_config("arch: amd64\nhostname: web\nmemory: 512\n")
    assert nvidia_devices(conf) == [] and gpu_indices([]) == []


def test_host_name_never_takes_a_node_or_an_odd_name():
    host_name = _plugin.container_host_name
    rows = [{"vmid": 100, "name": "pve2"}, {"vmid": 101, "name": "a;touch$(x)"}, {"vmid": 102, "name": "-oProxyCommand=x"},
            {"vmid": 103, "name": "train-103"}, {"vmid": 104, "name": "9" * 300}]
    names = {r["name"]: [r["vmid"]] for r in rows}
    got = [host_name("name", "pve1", r, names, {"pve1", "pve2"}) for r in rows]
    # pve2 is a node: a container so named would take over that node's host and its variables.
    assert got == ["pve1-100", "pve1-101", "pve1-102", "train-103", "pve1-104"]


def test_pct_list_vmid_longer_than_nine_digits_is_no_row():
    assert parse_pct_list("1" * 5000 + " running\n1234567890 running\n100 running\n") == [
        {"vmid": 100, "status": "running", "lock": "", "name": ""}]
