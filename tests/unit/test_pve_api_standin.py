# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Proxmox VE API stand-in (tests/standins/pve_api.py) over a fleet state directory written
here (no containers run: lxc-info finds none, so every container reads as stopped)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request

import pveapi
import pytest

CONF_100 = """arch: amd64
cores: 8
hostname: train-100
memory: 65536
tags: team-a
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
"""
CONF_200 = "arch: amd64\ndev0: /dev/nvidia1\nmemory: 1024\n"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    state = tmp_path_factory.mktemp("sim")
    (state / "fleet.json").write_text(json.dumps({"nodes": [
        {"name": "pve1", "address": "127.0.1.1", "port": 2222, "containers": []},
        {"name": "pve2", "address": "127.0.1.2", "port": 2222, "containers": []},
        {"name": "pve3", "address": "127.0.1.3", "port": 2222, "containers": []}]}))
    for node, vmid, text in (("pve1", 100, CONF_100), ("pve2", 200, CONF_200)):
        d = state / "nodes" / node / "pve" / "lxc"
        d.mkdir(parents=True)
        (d / ("%d.conf" % vmid)).write_text(text)
    with pveapi.running(state) as info:
        info["state"] = state
        yield info


def call(api, path, method="GET", header=True, body=None):
    ctx = ssl.create_default_context(cafile=api["cafile"])
    req = urllib.request.Request(api["url"] + "/api2/json" + path, method=method,
                                 data=urllib.parse.urlencode(body).encode() if body is not None else None)
    if header:
        req.add_header("Authorization", api["header"] if header is True else header)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.reason


def test_tls_with_its_own_certificate_and_token_only(api):
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(api["url"] + "/api2/json/version", timeout=10)
    assert call(api, "/version", header=False) == (401, "No ticket")
    assert call(api, "/version", header="PVEAPIToken=%s=wrong" % api["token_id"]) == (401, "invalid token value!")
    code, body = call(api, "/version")
    assert code == 200 and body["data"]["version"] == "9.0.3" and body["data"]["release"] == "9.0"


def test_the_cluster_as_the_api_shapes_it(api):
    _code, status = call(api, "/cluster/status")
    nodes = [e for e in status["data"] if e["type"] == "node"]
    assert [(e["name"], e["ip"], e["online"]) for e in nodes] == [("pve1", "127.0.1.1", 1), ("pve2", "127.0.1.2", 1),
                                                                  ("pve3", "127.0.1.3", 1)]
    _code, res = call(api, "/cluster/resources?type=vm")
    assert [(e["id"], e["type"], e["vmid"], e["node"], e["name"], e["status"], e.get("tags")) for e in res["data"]] == [
        ("lxc/100", "lxc", 100, "pve1", "train-100", "stopped", "team-a"), ("lxc/200", "lxc", 200, "pve2", "CT200", "stopped", None)]
    _code, listed = call(api, "/nodes")
    assert [n["node"] for n in listed["data"]] == ["pve1", "pve2", "pve3"]
    _code, cts = call(api, "/nodes/pve1/lxc")
    assert [(c["vmid"], c["name"], c["type"], c["maxmem"]) for c in cts["data"]] == [(100, "train-100", "lxc", 65536 << 20)]
    _code, conf = call(api, "/nodes/pve1/lxc/100/config")
    assert conf["data"]["cores"] == 8 and conf["data"]["hostname"] == "train-100" and len(conf["data"]["digest"]) == 40
    assert conf["data"]["lxc"] == [["lxc.cgroup2.devices.allow", "c 195:* rwm"],
                                   ["lxc.mount.entry", "/dev/nvidia0 dev/nvidia0 none bind,optional,create=file"]]
    assert call(api, "/nodes/pve1/lxc/999/config") == (500, "Configuration file 'nodes/pve1/lxc/999.conf' does not exist")
    assert call(api, "/nodes/pve9/lxc") == (595, "no such cluster node 'pve9'")


def test_put_tags_keeps_them_in_the_config_as_proxmox_does(api):
    conf = api["state"] / "nodes" / "pve1" / "pve" / "lxc" / "100.conf"
    assert call(api, "/nodes/pve1/lxc/100/config", "PUT", body={"tags": "team-a;GPUfleet-OK,team-a"})[0] == 200
    assert "tags: gpufleet-ok;team-a\n" in conf.read_text()
    assert conf.read_text().index("tags:") < conf.read_text().index("lxc.")
    assert call(api, "/nodes/pve1/lxc/100/config", "PUT", body={"tags": "bad$tag"})[0] == 400
    _code, got = call(api, "/nodes/pve1/lxc/100/config")
    assert call(api, "/nodes/pve1/lxc/100/config", "PUT", body={"tags": "x", "digest": "0" * 40})[0] == 500
    assert call(api, "/nodes/pve1/lxc/100/config", "PUT", body={"tags": "team-a", "digest": got["data"]["digest"]})[0] == 200
    assert conf.read_text() == CONF_100
    assert call(api, "/nodes/pve1/lxc/100/config", "PUT", body={"memory": "1"})[0] == 400
