# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""pve_tag_plan (the verdict tags, by node)."""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.filter.proxmox import pve_tag_plan


def check(name, ok, error=None):
    return {"name": name, "ok": ok, "severity": "fail", "error": error}


RECORDS = [
    {"host": "a", "node": "pve1", "vmid": 100, "ready": True, "checks": [check("gpu_idle", True)], "error": None},
    {"host": "b", "node": "pve1", "vmid": 101, "ready": False, "checks": [check("venv_clean", False)], "error": None},
    {"host": "c", "node": "pve2", "vmid": 200, "ready": False,
     "checks": [check("venv_clean", False), check("gpu_healthy", False)], "error": None},
    {"host": "d", "node": "pve2", "vmid": 201, "ready": False, "checks": [check("gpu_idle", False, True)], "error": None},
    {"host": "e", "node": "pve2", "vmid": 202, "ready": False, "checks": [], "error": "unreachable"},
    {"host": "f", "node": "pve3", "vmid": 300, "ready": True, "checks": [check("gpu_idle", True)], "error": None},
]


def test_each_read_container_gets_its_verdict_tag_from_its_node():
    hostvars = {h: {"gpufleet_pve_tags": True} for h in "abcde"}
    hostvars["f"] = {"gpufleet_pve_tags": "false"}
    plan = pve_tag_plan(RECORDS, hostvars)
    assert plan["nodes"] == ["pve1", "pve2"]
    assert plan["by_node"] == {
        "pve1": [{"host": "a", "vmid": 100, "add": ["gpufleet-ok"], "remove": ["gpufleet-dirty", "gpufleet-unhealthy"]},
                 {"host": "b", "vmid": 101, "add": ["gpufleet-dirty"], "remove": ["gpufleet-ok", "gpufleet-unhealthy"]}],
        "pve2": [{"host": "c", "vmid": 200, "add": ["gpufleet-unhealthy"], "remove": ["gpufleet-ok", "gpufleet-dirty"]}],
    }


def test_no_tags_unless_asked():
    assert pve_tag_plan(RECORDS, {h: {} for h in "abcdef"}) == {"nodes": [], "by_node": {}}
