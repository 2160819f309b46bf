# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Proxmox VE API over the session's simulated fleet, through the API stand-in
(tests/standins/pve_api.py): proxmox_lxc's source: api gives what source: ssh gives, and
community.proxmox's own `proxmox` inventory (installed by make setup) gives hosts that preflight
runs over unchanged."""

from __future__ import annotations

import json
import os
import re
import shutil

import pveapi
import pytest
import yaml
from conftest import DISCOVERY, INVENTORY, REPO, STATE
from test_proxmox_lxc_inventory import discovery_config, inventory, plain

PREFLIGHT = os.path.join(REPO, "playbooks", "preflight.yml")
HYGIENE = os.path.join(REPO, "playbooks", "hygiene.yml")
EXAMPLE = os.path.join(REPO, "inventory", "example-community-proxmox.yml")
ADOPT = os.path.join(REPO, "inventory", "example-community-proxmox.gpufleet.proxmox_lxc.yml")
COMMUNITY = os.path.join(REPO, ".ansible", "collections", "ansible_collections", "community", "proxmox", "MANIFEST.json")


@pytest.fixture(scope="module")
def api(fleet):
    with pveapi.running(STATE) as info:
        yield info


def sim_inventory():
    with open(INVENTORY) as f:
        return json.loads("".join(line for line in f if not line.startswith("#")))


def test_api_source_gives_what_the_ssh_source_gives(ansible_cli, api, fleet, tmp_path):
    cfg = discovery_config()
    del cfg["nodes"]  # the nodes and their addresses come from the API (/cluster/status)
    cfg.update(source="api", api_url=api["url"], api_token_id=api["token_id"], api_token_secret=api["secret"],
               ca_path=api["cafile"], port=fleet["port"])
    path = tmp_path / "cluster.proxmox_lxc.yml"
    path.write_text(json.dumps(cfg))
    by_ssh, _warnings = inventory(ansible_cli, DISCOVERY)
    by_api, warnings = inventory(ansible_cli, path)
    assert "WARNING" not in warnings, warnings
    assert by_api == by_ssh
    assert sorted(by_api["pve_containers"]["hosts"]) == ["train-100", "train-101", "train-200", "train-201"]
    assert by_api["pve_stopped"]["hosts"] == ["train-101"]


def test_api_source_refuses_a_wrong_token_as_a_token_problem(ansible_cli, api, tmp_path):
    path = tmp_path / "wrong.proxmox_lxc.yml"
    path.write_text(json.dumps({"plugin": "gpufleet.hygiene.proxmox_lxc", "source": "api", "api_url": api["url"],
                                "api_token_id": api["token_id"], "api_token_secret": "0" * 32, "ca_path": api["cafile"]}))
    res = ansible_cli("ansible-inventory", "-i", str(path), "--list", env={"ANSIBLE_INVENTORY_UNPARSED_FAILED": "1"})
    assert res.returncode != 0
    assert "refused the token gpufleet@pve!hygiene on GET /cluster/status (HTTP 401" in " ".join(res.stdout.split())
    assert "0" * 32 not in res.stdout


def community_inventory(tmp_path, api, fleet, adopt=True):
    """community.proxmox's inventory of the fleet as its users write it, and beside it what they keep
    in their own variables: how to log in to the nodes, and this fleet's role variables; then (unless
    not adopt) the proxmox_lxc source that gives its guests what the playbooks read, the example's."""
    assert os.path.exists(COMMUNITY), "community.proxmox is not installed: make setup"
    inv = tmp_path / "community"
    inv.mkdir()
    # The example inventory, pointed at the stand-in; its token secret from the environment.
    with open(EXAMPLE) as f:
        cfg = yaml.safe_load(f)
    assert cfg["validate_certs"] is True and "token_secret" not in cfg
    cfg.update(url=api["url"], user=api["user"], token_id=api["token_name"])
    (inv / "cluster.proxmox.yml").write_text(json.dumps(cfg))
    sim = sim_inventory()["all"]["children"]
    common = {k: v for k, v in sim["pve_containers"]["vars"].items() if k != "ansible_connection"}
    node = next(iter(sim["pve_nodes"]["hosts"].values()))
    common["ansible_pct_node_port"] = node["ansible_port"]
    node_vars = {k: v for k, v in node.items() if k != "ansible_host"}
    hosts = {}
    for group in sim["pve_containers"]["children"].values():
        for name, hv in group["hosts"].items():
            # And where the node keeps it: a simulated node's containers are in an LXC path of its own,
            # not Proxmox VE's /var/lib/lxc, and another fleet on this host may run a container of the
            # same vmid (the node read would then refuse to guess which one is meant).
            hosts[name] = {k: v for k, v in hv.items() if k.startswith("gpufleet_") or k == "ansible_pct_lxc_path"}
            # This fleet's venvs hold no torch: the CUDA they are held to.
            hosts[name]["gpufleet_expected_cuda"] = "12.8"
    # The nodes' names do not resolve here: where each is, given once (docs/fleet.md).
    common["gpufleet_pve_node_addresses"] = {n["name"]: n["address"] for n in fleet["nodes"]}
    (inv / "site.yml").write_text(json.dumps({"all": {"vars": common, "hosts": hosts,
                                                      "children": {"proxmox_nodes": {"vars": node_vars}}}}))
    if adopt:
        # Parsed last (the directory's files in name order), as docs/fleet.md lays the files out.
        shutil.copy(ADOPT, inv / "zz-gpufleet.proxmox_lxc.yml")
    return inv, {"REQUESTS_CA_BUNDLE": api["cafile"], "PROXMOX_TOKEN_SECRET": api["secret"]}


def test_community_proxmox_inventory_runs_preflight_unchanged(ansible_cli, api, fleet, node_ssh, tmp_path):
    inv, env = community_inventory(tmp_path, api, fleet)
    res = ansible_cli("ansible-inventory", "-i", str(inv), "--list", env=env)
    assert res.returncode == 0, res.stdout[-3000:]
    listed = plain(json.loads(res.stdout[res.stdout.index("{"):]))
    hv = listed["_meta"]["hostvars"]
    assert sorted(listed["proxmox_all_lxc"]["hosts"]) == ["train-100", "train-101", "train-200", "train-201"]
    assert listed["proxmox_all_stopped"]["hosts"] == ["train-101"]
    assert (hv["train-200"]["proxmox_vmid"], hv["train-200"]["proxmox_node"]) == (200, "pve2")
    # How each guest is reached, from the inventory itself (the proxmox_lxc source after it): what
    # ansible-inventory shows, the node's address included (gpufleet_pve_node_addresses, given once).
    assert (hv["train-200"]["ansible_connection"], hv["train-200"]["ansible_pct_vmid"], hv["train-200"]["pve_node"],
            hv["train-200"]["ansible_pct_node_host"]) == ("gpufleet.hygiene.pct", 200, "pve2", "127.0.1.2")
    # The nodes keep ssh.
    assert hv["pve2"].get("ansible_connection", "ssh") == "ssh" and "ansible_pct_vmid" not in hv["pve2"]
    res = ansible_cli("ansible-inventory", "-i", str(inv), "--host", "train-200", env=env)
    assert res.returncode == 0, res.stdout[-3000:]
    shown = plain(json.loads(res.stdout[res.stdout.index("{"):]))
    assert (shown["ansible_connection"], shown["ansible_pct_vmid"], shown["pve_node"]) == ("gpufleet.hygiene.pct", 200, "pve2")
    # The node's address, as the API reports it (/nodes/{node}/network).
    assert hv["pve2"]["ansible_host"] == "127.0.1.2"

    running = ["train-100", "train-200", "train-201"]
    assert sorted(listed["pve_containers"]["hosts"]) == sorted(listed["proxmox_all_lxc"]["hosts"])
    res = ansible_cli("ansible-playbook", "-i", str(inv), PREFLIGHT, "-e", "gpufleet_hosts=pve_containers:&proxmox_all_running",
                      env=env)
    assert res.returncode == 0, res.stdout[-4000:]
    section = res.stdout.split("TASK [Fleet summary, one line per container]", 1)[1].split("PLAY [", 1)[0]
    said = dict(re.findall(r"^\s+- '?([\w.-]+) - (ready|NOT READY)", section, re.MULTILINE))
    assert said == dict.fromkeys(running, "ready"), section
    recap = res.stdout.split("PLAY RECAP", 1)[1]
    for node in ("pve1", "pve2"):
        # The containers were read by their nodes (the play's hosts): ok, nothing failed or unreachable.
        assert re.search(r"^%s\s+: ok=[1-9]\d*\s+changed=0\s+unreachable=0\s+failed=0" % node, recap, re.MULTILINE), recap
    assert not re.search(r"^train-", recap, re.MULTILINE), recap  # ready: not one task on a container

    # Without the playbooks (ad hoc), nothing more given: the inventory says how to reach the guest
    # (its compose) and where its node is (gpufleet_pve_node_addresses).
    res = ansible_cli("ansible", "train-200", "-i", str(inv), "-m", "ansible.builtin.command", "-a", "cat /proc/sys/kernel/hostname",
                      env=env)
    assert res.returncode == 0, res.stdout[-3000:]
    # The container pct enters on its node as vmid 200, and no other.
    want = node_ssh("pve2", "pct exec 200 -- cat /proc/sys/kernel/hostname").stdout.decode().strip()
    assert want and re.search(r"^train-200 \| CHANGED \| rc=0 >>\n%s$" % re.escape(want), res.stdout, re.MULTILINE), \
        (want, res.stdout[-3000:])


def test_community_proxmox_inventory_without_the_source_that_adopts_its_guests_stops_at_the_plan(ansible_cli, api, fleet, tmp_path):
    """The same inventory without its second source: preflight reads nothing and says which
    source to add, naming the guests, instead of reading them through their own ansible_host."""
    inv, env = community_inventory(tmp_path, api, fleet, adopt=False)
    res = ansible_cli("ansible-playbook", "-i", str(inv), PREFLIGHT, "-e", "gpufleet_hosts=proxmox_all_lxc", env=env)
    assert res.returncode == 2, res.stdout[-4000:]
    out = " ".join(res.stdout.split())
    assert ("configuration error, nothing was read or changed: train-100, train-101, train-200, train-201: LXC guest(s) "
            "of community.proxmox's inventory (proxmox_vmid, proxmox_node) without the variables the plays read") in out, out[-3000:]
    assert "inventory/example-community-proxmox.gpufleet.proxmox_lxc.yml" in out
    recap = res.stdout.split("PLAY RECAP", 1)[1]
    assert not re.search(r"^(train|pve)", recap, re.MULTILINE), recap  # no task ran on any guest or node


def conf_tags(node, vmid):
    """The tags line of a container's PVE config (the file pct config prints), or None."""
    with open(os.path.join(STATE, "nodes", node, "pve", "lxc", "%d.conf" % vmid)) as f:
        lines = [line for line in f.read().splitlines() if line.startswith("tags:")]
    return lines[0] if lines else None


def test_pve_tags_show_each_verdict_and_keep_other_tags(ansible_cli, node_ssh, tmp_path):
    """-e gpufleet_pve_tags=true: preflight tags every container it read, through pct set on its
    node; --check changes nothing, a second run changes nothing, the container's own tag stays."""
    extra = tmp_path / "expect-cuda.yml"
    extra.write_text(json.dumps({"all": {"hosts": {"train-100": {"gpufleet_expected_cuda": "12.8"}}}}))
    args = ["-i", INVENTORY, "-i", str(extra), PREFLIGHT, "-e", "gpufleet_hosts=train-100:train-101:train-200:train-201",
            "-e", "gpufleet_pve_tags=true"]
    assert node_ssh("pve1", "pct set 100 --tags team-a").returncode == 0
    try:
        before = {vmid: conf_tags(node, vmid) for node, vmid in (("pve1", 100), ("pve1", 101), ("pve2", 200), ("pve2", 201))}
        assert before == {100: "tags: team-a", 101: None, 200: None, 201: None}

        # 200 and 201 are not ready (no reference CUDA), 101 is stopped (not read): each fails, rc 2.
        res = ansible_cli("ansible-playbook", "--check", "--diff", *args)
        assert res.returncode == 2, res.stdout[-4000:]
        assert "changed: [pve1] => (item=train-100)" in res.stdout, res.stdout[-4000:]
        assert re.search(r"-tags: team-a\n\+tags: gpufleet-ok;team-a", res.stdout), res.stdout[-4000:]
        assert {v: conf_tags(n, v) for n, v in (("pve1", 100), ("pve1", 101), ("pve2", 200), ("pve2", 201))} == before

        res = ansible_cli("ansible-playbook", *args)
        assert res.returncode == 2, res.stdout[-4000:]
        assert conf_tags("pve1", 100) == "tags: gpufleet-ok;team-a"
        assert conf_tags("pve2", 200) == conf_tags("pve2", 201) == "tags: gpufleet-dirty"
        assert conf_tags("pve1", 101) is None                   # stopped: nothing read, no verdict
        # What Proxmox VE's own CLI shows on the node.
        assert "tags: gpufleet-ok;team-a" in node_ssh("pve1", "pct config 100").stdout.decode()

        res = ansible_cli("ansible-playbook", *args)
        assert res.returncode == 2, res.stdout[-4000:]
        assert re.search(r"^ok: \[pve1\] => \(item=train-100\)", res.stdout, re.MULTILINE), res.stdout[-4000:]
        recap = res.stdout.split("PLAY RECAP", 1)[1]
        for node in ("pve1", "pve2"):
            assert re.search(r"^%s\s+: ok=\d+\s+changed=0\s" % node, recap, re.MULTILINE), recap
    finally:
        for node, vmid in (("pve1", 100), ("pve2", 200), ("pve2", 201)):
            node_ssh(node, "pct set %d --delete tags" % vmid)


def test_hygiene_tags_each_verdict_too(ansible_cli, node_ssh, tmp_path):
    """A report-only hygiene run with gpufleet_pve_tags tags what it read: train-100 ready, train-200
    not; a second container's verdict changes, its tag follows, its own tag stays."""
    extra = tmp_path / "expect-cuda.yml"
    extra.write_text(json.dumps({"all": {"hosts": {"train-100": {"gpufleet_expected_cuda": "12.8", "gpufleet_pve_tags": True},
                                                   "train-200": {"gpufleet_pve_tags": True}}}}))
    assert node_ssh("pve2", "pct set 200 --tags 'gpufleet-ok;Team-B'").returncode == 0
    try:
        res = ansible_cli("ansible-playbook", "-i", INVENTORY, "-i", str(extra), HYGIENE,
                          "-e", "gpufleet_hosts=train-100:train-200", "-e", "gpufleet_hygiene_remediate=false",
                          "-e", "gpufleet_report_dir=%s" % (tmp_path / "report"))
        assert res.returncode == 0, res.stdout[-4000:]
        assert conf_tags("pve1", 100) == "tags: gpufleet-ok"
        assert conf_tags("pve2", 200) == "tags: gpufleet-dirty;team-b"
        assert conf_tags("pve2", 201) is None                   # not among the hosts: untouched
    finally:
        for node, vmid in (("pve1", 100), ("pve2", 200)):
            node_ssh(node, "pct set %d --delete tags" % vmid)
