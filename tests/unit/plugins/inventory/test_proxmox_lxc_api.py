# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""proxmox_lxc with source: api against the Proxmox VE API stand-in (tests/standins/pve_api.py)
over a fleet state directory written here: the same hosts, variables and groups as the rows the
SSH source makes of the same configs, TLS verified, a refused token said as such."""

from __future__ import annotations

import importlib
import json
import os
import urllib.error
import urllib.request

import pveapi
import pytest
from ansible.errors import AnsibleError
from ansible.inventory.data import InventoryData
from ansible.plugins.loader import init_plugin_loader, inventory_loader

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".ansible", "collections"))
init_plugin_loader([COLLECTIONS])
_plugin = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.inventory.proxmox_lxc")
_pct = _plugin._pct

CONFS = {
    ("pve1", 100): "arch: amd64\ncores: 8\nhostname: train-100\nmemory: 65536\n"
                   "lxc.cgroup2.devices.allow: c 195:* rwm\nlxc.cgroup2.devices.allow: c 508:* rwm\n"
                   "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n",
    ("pve1", 101): "arch: amd64\ndev0: /dev/nvidia1\ndev1: /dev/nvidiactl\nhostname: train-101\nlock: backup\nmemory: 2048\n",
    ("pve2", 200): "arch: amd64\nmemory: 2048\nlxc.cgroup2.devices.allow: c 195:* rwm\n",
}


def _fleet_state(tmp_path_factory):
    state = tmp_path_factory.mktemp("sim")
    nodes = [{"name": n, "address": "127.0.1.%d" % i, "port": 2222, "containers": []} for i, n in enumerate(("pve1", "pve2", "pve3"), 1)]
    (state / "fleet.json").write_text(json.dumps({"nodes": nodes}))
    for (node, vmid), text in CONFS.items():
        d = state / "nodes" / node / "pve" / "lxc"
        d.mkdir(parents=True, exist_ok=True)
        (d / ("%d.conf" % vmid)).write_text(text)
    return state


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with pveapi.running(_fleet_state(tmp_path_factory)) as info:
        yield info


@pytest.fixture
def plain_api(tmp_path_factory):
    """The stand-in over plain HTTP, each request it answers a line of ``info["log"]``."""
    state = _fleet_state(tmp_path_factory)
    log = state / "requests.log"
    with open(log, "w") as f, pveapi.running(state, log=f, plain=True) as info:
        info["log"] = log
        yield info


def plugin_with(**options):
    plugin = inventory_loader.get("gpufleet.hygiene.proxmox_lxc")
    plugin.inventory = InventoryData()
    plugin.set_options(direct=dict({"plugin": "gpufleet.hygiene.proxmox_lxc"}, **options))
    return plugin


def api_options(api, **extra):
    options = {"source": "api", "api_url": api["url"], "api_token_id": api["token_id"], "api_token_secret": api["secret"],
               "ca_path": api["cafile"], "port": 2222}
    options.update(extra)
    return options


def snapshot(plugin):
    inv = plugin.inventory
    return ({name: host.get_vars() for name, host in inv.hosts.items()},
            {name: sorted(h.name for h in group.get_hosts()) for name, group in inv.groups.items()})


def test_api_source_gives_what_the_ssh_source_gives(api):
    plugin = plugin_with(**api_options(api))
    results = plugin._discover_api()
    assert results["failed"] == []
    plugin._populate(results)
    got_hosts, got_groups = snapshot(plugin)

    # The SSH source's rows of the same configs: what `pct list` and `pct config` give for them
    # (the stand-in runs no container, so all are stopped).
    rows = {}
    for (node, vmid), text in CONFS.items():
        conf = _pct.parse_config(text)
        rows.setdefault(node, []).append({"vmid": vmid, "status": "stopped", "lock": conf.get("lock", ""),
                                          "name": conf.get("hostname", ""), "config": conf})
    ssh_nodes = {n: {"node": {"name": n, "host": "127.0.1.%d" % i, "port": 2222, "user": "root"}, "containers": rows.get(n, [])}
                 for i, n in enumerate(("pve1", "pve2", "pve3"), 1)}
    ssh = plugin_with(nodes=list(ssh_nodes), port=2222)
    ssh._populate({"nodes": ssh_nodes, "failed": []})
    want_hosts, want_groups = snapshot(ssh)

    assert got_hosts == want_hosts
    assert got_groups == want_groups
    assert sorted(got_hosts) == ["pve1", "pve2", "pve2-200", "pve3", "train-100", "train-101"]
    assert got_hosts["train-100"]["pve_gpu_indices"] == [0] and got_hosts["train-101"]["pve_gpu_indices"] == [1]
    assert got_hosts["train-101"]["pve_lock"] == "backup" and got_hosts["pve2-200"]["pve_gpu_all"] is True
    assert got_hosts["train-101"]["ansible_pct_node_host"] == "127.0.1.1"       # /cluster/status's ip
    assert got_groups["pve_node_pve3"] == []


def test_a_node_given_in_nodes_is_reached_as_given(api):
    plugin = plugin_with(**api_options(api, nodes=[{"name": "pve1", "host": "pve1.example.com", "port": 22}]))
    plugin._populate(plugin._discover_api())
    hosts, _groups = snapshot(plugin)
    assert (hosts["train-100"]["ansible_pct_node_host"], hosts["train-100"]["ansible_pct_node_port"]) == ("pve1.example.com", 22)
    assert hosts["pve2-200"]["ansible_pct_node_host"] == "127.0.1.2"


def test_a_refused_token_is_said_to_be_the_token(api):
    plugin = plugin_with(**api_options(api, api_token_secret="not-the-secret"))
    with pytest.raises(AnsibleError, match=r"refused the token gpufleet@pve!hygiene on GET /cluster/status \(HTTP 401"):
        plugin._discover_api()


def test_tls_is_verified_by_default(api):
    plugin = plugin_with(**{**api_options(api), "ca_path": None})
    with pytest.raises(AnsibleError, match=r"GET /cluster/status: cannot reach .*CERTIFICATE_VERIFY_FAILED.*ca_path"):
        plugin._discover_api()


def test_bad_token_id_and_missing_options_are_said(api):
    with pytest.raises(AnsibleError, match=r"api_token_id must read <user>@<realm>!<tokenid>"):
        plugin_with(**api_options(api, api_token_id="hygiene"))._discover_api()
    with pytest.raises(AnsibleError, match=r"source: api needs api_url"):
        plugin_with(**{**api_options(api), "api_url": None})._discover_api()


@pytest.mark.parametrize("scheme", ["http", "HTTP", "ftp", ""])
def test_an_api_url_that_is_not_https_is_refused_and_no_request_is_sent(plain_api, scheme):
    """The stand-in answers plain HTTP (pveproxy never does): an http:// api_url would send the
    token in clear, so it is refused before any request, saying what to give instead."""
    url = plain_api["url"].replace("http://", "%s://" % scheme if scheme else "")
    plugin = plugin_with(**api_options(plain_api, api_url=url, ca_path=None))
    with pytest.raises(AnsibleError) as exc:
        plugin._discover_api()
    assert exc.value.message == (
        "proxmox_lxc: api_url %s is no https:// URL, and the API token would cross the network in clear: nothing was sent. "
        "Give the API's https:// address (Proxmox VE serves it at https://<node>:8006), with ca_path for the cluster's own "
        "certificate (/etc/pve/pve-root-ca.pem)" % url)
    assert plain_api["secret"] not in exc.value.message
    assert plain_api["log"].read_text() == ""
    # The stand-in does log what reaches it: a request of the test's own, without the token, is there.
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(plain_api["url"] + "/api2/json/version", timeout=10)
    assert "GET /api2/json/version" in plain_api["log"].read_text()
