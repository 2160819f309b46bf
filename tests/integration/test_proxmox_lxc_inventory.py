# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.hygiene.proxmox_lxc against the simulated fleet, through ansible-inventory."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import DISCOVERY, PORT, REPO, STATE, VENV_BIN


def inventory(_ansible_cli, path, *extra):
    """(inventory as JSON, warnings text) from ansible-inventory --list."""
    res = subprocess.run([os.path.join(VENV_BIN, "ansible-inventory"), "-i", str(path), "--list", *extra], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=False, timeout=120,
                         env=dict(os.environ, ANSIBLE_NOCOLOR="1"))
    assert res.returncode == 0, res.stderr
    return plain(json.loads(res.stdout)), " ".join(res.stderr.split())


def plain(data):
    """Drop ansible-inventory's untrusted-value wrappers ({"__ansible_unsafe": value})."""
    if isinstance(data, dict):
        if set(data) == {"__ansible_unsafe"}:
            return data["__ansible_unsafe"]
        return {k: plain(v) for k, v in data.items()}
    if isinstance(data, list):
        return [plain(v) for v in data]
    return data


def discovery_config():
    """The fleet's discovery config: JSON after one comment line (JSON is YAML)."""
    with open(DISCOVERY) as f:
        return json.loads("".join(line for line in f if not line.startswith("#")))


def config(tmp_path, name, **changes):
    cfg = discovery_config()
    cfg.update(changes)
    path = tmp_path / ("%s.proxmox_lxc.yml" % name)
    path.write_text(json.dumps(cfg))
    return path


def test_discovers_the_fleet(ansible_cli):
    inv, _warnings = inventory(ansible_cli, DISCOVERY)
    assert sorted(inv["pve_nodes"]["hosts"]) == ["pve1", "pve2", "pve3"]
    assert sorted(inv["pve_containers"]["hosts"]) == ["train-100", "train-101", "train-200", "train-201"]
    assert sorted(inv["pve_node_pve1"]["hosts"]) == ["train-100", "train-101"]
    assert sorted(inv["pve_node_pve2"]["hosts"]) == ["train-200", "train-201"]
    assert "hosts" not in inv.get("pve_node_pve3", {})          # the empty node: a group, no hosts
    assert inv["pve_stopped"]["hosts"] == ["train-101"]
    assert sorted(inv["pve_running"]["hosts"]) == ["train-100", "train-200", "train-201"]
    assert sorted(inv["pve_gpu"]["hosts"]) == ["train-100", "train-101", "train-200", "train-201"]
    hv = inv["_meta"]["hostvars"]
    assert hv["train-200"]["ansible_connection"] == "gpufleet.hygiene.pct"
    assert (hv["train-200"]["ansible_pct_node_host"], hv["train-200"]["ansible_pct_vmid"]) == ("127.0.1.2", 200)
    assert hv["train-200"]["pve_gpus"] == ["/dev/nvidia0"]          # lxc.mount.entry style
    assert hv["train-201"]["pve_gpus"] == ["/dev/nvidia1"]          # devN: style
    assert hv["train-101"]["pve_status"] == "stopped" and hv["train-101"]["pve_node"] == "pve1"
    assert hv["pve3"]["ansible_host"] == "127.0.1.3" and hv["pve3"]["ansible_port"] == PORT


def test_a_container_without_a_hostname(ansible_cli, node_ssh, tmp_path):
    """pct lists a container without a hostname as CT<vmid>: it is named <node>-<vmid>, no hostname."""
    conf = os.path.join(STATE, "nodes", "pve1", "pve", "lxc", "101.conf")
    with open(conf) as f:
        original = f.read()
    try:
        with open(conf, "w") as f:
            f.write("".join(line for line in original.splitlines(keepends=True) if not line.startswith("hostname:")))
        listed = node_ssh("pve1", "pct list").stdout.decode().splitlines()
        assert "%-10s %-10s %-12s %-20s" % (101, "stopped", "", "CT101") in listed
        inv, _warnings = inventory(ansible_cli, config(tmp_path, "nohostname"))
    finally:
        with open(conf, "w") as f:
            f.write(original)
    assert sorted(inv["pve_node_pve1"]["hosts"]) == ["pve1-101", "train-100"]
    hv = inv["_meta"]["hostvars"]["pve1-101"]
    assert (hv["pve_name"], hv["ansible_pct_vmid"], hv["pve_status"]) == ("", 101, "stopped")


def test_unreachable_node_is_a_warning(ansible_cli, tmp_path):
    nodes = discovery_config()["nodes"]
    path = config(tmp_path, "down", nodes=nodes + [{"name": "pve9", "host": "127.0.1.250", "port": 2222}])
    inv, warnings = inventory(ansible_cli, path)
    assert "node pve9 (root@127.0.1.250:2222) skipped: unreachable" in warnings
    assert sorted(inv["pve_containers"]["hosts"]) == ["train-100", "train-101", "train-200", "train-201"]
    assert "pve9" not in inv["pve_nodes"]["hosts"]


@pytest.mark.parametrize("known_hosts, why", [("empty", "host key unknown"), ("wrong", "host key does not match")])
def test_host_keys_are_checked_by_the_inventory_and_the_connection_alike(ansible_cli, fleet, tmp_path, known_hosts, why):
    """One known_hosts file refuses the node's key for the inventory and for the connection of a
    container of that node, each with ssh's words and the same fix."""
    kh = tmp_path / "known_hosts"
    if known_hosts == "wrong":
        with open(os.path.join(fleet["client"], "known_hosts")) as f:
            keys = f.read().splitlines()
        kh.write_text(keys[1].replace("[127.0.1.2]", "[127.0.1.1]") + "\n")
    else:
        kh.write_text("")
    # Control paths of their own: a live master to the node would carry either past its host key.
    cfg = discovery_config()
    container_vars = dict(cfg["container_vars"], ansible_pct_control_path_dir=str(tmp_path / "cp-inventory"))
    path = config(tmp_path, "hk", known_hosts_file=str(kh), nodes=[{"name": "pve1", "host": "127.0.1.1", "port": PORT}],
                  container_vars=container_vars)
    inv, warnings = inventory(ansible_cli, path)
    fix = "; to fix: " + ("add the node's host key to %s" % kh if known_hosts == "empty" else "if the node was reinstalled")
    assert "node pve1 (root@127.0.1.1:%d) skipped: %s" % (PORT, why) in warnings, warnings
    assert fix in warnings, warnings
    assert "train-100" not in inv["_meta"]["hostvars"]
    # Refused before any login: no master is left behind in that directory.
    res = ansible_cli("ansible", "-i", DISCOVERY, "train-100", "-m", "ansible.builtin.ping",
                      "-e", "ansible_pct_known_hosts_file=%s" % kh, "-e", "ansible_pct_control_path_dir=%s" % (tmp_path / "cp"))
    assert "train-100 | UNREACHABLE!" in res.stdout, res.stdout
    assert "host key of node root@127.0.1.1:%d is unknown or does not match" % PORT in res.stdout, res.stdout
    assert fix in res.stdout, res.stdout


def test_cache(ansible_cli, node_ssh, tmp_path):
    cache_dir = tmp_path / "cache"
    path = config(tmp_path, "cached", cache=True, cache_plugin="ansible.builtin.jsonfile",
                  cache_connection=str(cache_dir), cache_timeout=3600)
    inv, _warnings = inventory(ansible_cli, path)
    assert inv["pve_stopped"]["hosts"] == ["train-101"]
    assert len(os.listdir(cache_dir)) == 1
    try:
        assert node_ssh("pve1", "pct start 101").returncode == 0
        cached, _warnings = inventory(ansible_cli, path)
        assert cached["pve_stopped"]["hosts"] == ["train-101"]          # served from the cache
        fresh, _warnings = inventory(ansible_cli, path, "--flush-cache")
        assert "pve_stopped" not in fresh or "train-101" not in fresh["pve_stopped"].get("hosts", [])
        assert "train-101" in fresh["pve_running"]["hosts"]
    finally:
        assert node_ssh("pve1", "pct stop 101").returncode == 0


def test_discovered_hosts_are_reachable_with_the_pct_connection(ansible_cli):
    res = ansible_cli("ansible", "-i", DISCOVERY, "pve_running", "-m", "ansible.builtin.command", "-a", "cat /etc/hostname")
    assert res.returncode == 0, res.stdout
    for host in ("train-100", "train-200", "train-201"):
        assert "%s | CHANGED | rc=0 >>\n%s" % (host, host) in res.stdout


LOADED = "Loaded config def from plugin (connection/ansible_collections.gpufleet.hygiene.plugins.connection.pct)"


def test_the_connection_is_loaded_once_before_the_workers_fork(ansible_cli, tmp_path):
    """The inventory plugin (discovery) and the preload callback (a static inventory) load the pct
    connection in the controller's main process, so the forked workers (one per host and task)
    inherit it instead of each loading it and parsing its documentation again. ansible-core's
    debug log says each time a plugin's options are defined."""
    # The repository's ansible.cfg without the callback (callbacks_enabled cannot be emptied from
    # the environment).
    with open(os.path.join(REPO, "ansible.cfg")) as f:
        without = [line for line in f if not line.startswith("callbacks_enabled")]
    (tmp_path / "ansible.cfg").write_text("".join(without))
    play = tmp_path / "play.yml"
    play.write_text("- hosts: '{{ pattern }}'\n  gather_facts: false\n  tasks:\n    - ansible.builtin.command: 'true'\n      changed_when: false\n")

    def loads(inventory, pattern, callback):
        env = {"ANSIBLE_DEBUG": "1", "ANSIBLE_COLLECTIONS_PATH": os.path.join(REPO, ".ansible", "collections")}
        if not callback:
            env["ANSIBLE_CONFIG"] = str(tmp_path / "ansible.cfg")
        res = ansible_cli("ansible-playbook", "-i", str(inventory), str(play), "-e", "pattern=" + pattern, env=env)
        assert res.returncode == 0, res.stdout[-3000:]
        return res.stdout.count(LOADED)

    inv, _warnings = inventory(ansible_cli, DISCOVERY)
    running = inv["pve_running"]["hosts"]
    static = tmp_path / "static.json"
    static.write_text(json.dumps({"all": {"hosts": {h: inv["_meta"]["hostvars"][h] for h in running}}}))
    assert len(running) == 3
    assert loads(DISCOVERY, "pve_running", callback=False) == 1     # discovery loads it
    assert loads(static, "all", callback=True) == 1                 # the callback does
    assert loads(static, "all", callback=False) == 3                # else each worker does
