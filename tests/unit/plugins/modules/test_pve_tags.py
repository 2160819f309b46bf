# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""pve_tags against the simulated fleet's pct stand-in (tests/sim/bin/pct) over a container
config written here: the real file changes only when the set of tags does, other tags kept."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.hygiene.plugins.modules import pve_tags

PCT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "sim", "bin", "pct"))
CONF = ("arch: amd64\nhostname: train-101\nmemory: 2048\ntags: GPUfleet-dirty;team-a\n"
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n")
OK = {"vmid": 101, "add": ["gpufleet-ok"], "remove": ["gpufleet-dirty", "gpufleet-unhealthy"], "pct_path": PCT}


@pytest.fixture
def conf(tmp_path, monkeypatch):
    d = tmp_path / "nodes" / "pve1" / "pve" / "lxc"
    d.mkdir(parents=True)
    path = d / "101.conf"
    path.write_text(CONF)
    # What the node's sshd tells the stand-in (tests/sim/fleet's SetEnv).
    monkeypatch.setenv("GPUFLEET_SIM_STATE", str(tmp_path))
    monkeypatch.setenv("GPUFLEET_SIM_NODE", "pve1")
    return path


def test_sets_the_verdict_keeps_other_tags_and_is_idempotent(run_module, conf):
    first = run_module(pve_tags.main, OK)
    assert first["changed"] is True
    assert (first["previous"], first["tags"]) == (["GPUfleet-dirty", "team-a"], ["gpufleet-ok", "team-a"])
    assert conf.read_text() == CONF.replace("tags: GPUfleet-dirty;team-a", "tags: gpufleet-ok;team-a")
    mtime = conf.stat().st_mtime_ns
    again = run_module(pve_tags.main, OK)
    assert again["changed"] is False and again["tags"] == ["gpufleet-ok", "team-a"]
    assert conf.stat().st_mtime_ns == mtime


def test_check_mode_and_diff_change_nothing(run_module, conf):
    res = run_module(pve_tags.main, OK, check_mode=True, diff=True)
    assert res["changed"] is True and res["tags"] == ["gpufleet-ok", "team-a"]
    assert res["diff"]["before"] == "tags: GPUfleet-dirty;team-a\n" and res["diff"]["after"] == "tags: gpufleet-ok;team-a\n"
    assert conf.read_text() == CONF


def test_a_container_without_tags_gets_the_key_and_loses_it_when_empty(run_module, conf):
    conf.write_text("arch: amd64\nhostname: train-101\n")
    assert run_module(pve_tags.main, dict(OK, add=["gpufleet-unhealthy"], remove=["gpufleet-ok"]))["changed"] is True
    assert conf.read_text() == "arch: amd64\nhostname: train-101\ntags: gpufleet-unhealthy\n"
    res = run_module(pve_tags.main, dict(OK, add=[], remove=["gpufleet-unhealthy"]))
    assert res["changed"] is True and res["tags"] == []
    assert conf.read_text() == "arch: amd64\nhostname: train-101\n"


@pytest.mark.parametrize("args, msg", [
    ({"add": ["bad tag;x"]}, "not a Proxmox VE tag: 'bad tag;x'"),
    ({"add": ["-x"]}, "not a Proxmox VE tag: '-x'"),
    ({"add": ["gpufleet-ok"], "remove": ["GPUFLEET-OK"]}, "tags both to add and to remove: gpufleet-ok"),
    ({"vmid": 99}, "vmid must be an integer from 100 to 999999999"),
    ({"vmid": 102}, "pct config 102 failed (rc=255): Configuration file 'nodes/pve1/lxc/102.conf' does not exist"),
])
def test_bad_input_is_said(run_module, conf, args, msg):
    res = run_module(pve_tags.main, dict(OK, **args))
    assert res["failed"] is True and msg in res["msg"]
    assert conf.read_text() == CONF


def test_the_same_tags_in_another_order_or_case_are_not_rewritten(run_module, conf):
    conf.write_text("hostname: train-101\ntags: Team-A;GPUFLEET-OK\n")
    res = run_module(pve_tags.main, OK)
    assert res["changed"] is False and res["tags"] == ["gpufleet-ok", "team-a"]
    assert conf.read_text() == "hostname: train-101\ntags: Team-A;GPUFLEET-OK\n"
