# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: proxmox_lxc
short_description: Discover the LXC containers of Proxmox VE nodes over SSH or the Proxmox VE API
description:
  - With O(source=ssh) (the default), logs in to every listed Proxmox VE node with OpenSSH (nodes in
    parallel) and runs C(pct list) and C(pct config <vmid>) for each container.
  - It reaches the nodes the way the P(gpufleet.hygiene.pct#connection) connection does - the same C(ssh)
    command line, built by one function, the same host-key policy (C(StrictHostKeyChecking=yes) against
    O(known_hosts_file), ansible's C(host_key_checking) setting turning it off for both) and the same master
    connection per node (C(ControlPath) in O(control_path_dir)), which the first tasks of the play then reuse.
    Every SSH option here reads the same C([gpufleet_pct]) key and environment variable as the connection's
    option of that name, so that setting one there sets it for both; and every discovered container is given
    the settings the inventory used (C(ansible_pct_*) variables), so what reached its node reaches it.
  - With O(source=api), asks the Proxmox VE API of the cluster with an API token (the same one
    community.proxmox's C(proxmox) inventory uses) - every container of the whole cluster in one call to
    C(/cluster/resources?type=vm), the nodes and their addresses from C(/cluster/status), each container's
    config from C(/nodes/<node>/lxc/<vmid>/config) (in parallel) - and gives the same hosts, variables and
    groups as O(source=ssh). No SSH to the nodes is needed to list them; the containers are still reached
    through their node with the C(gpufleet.hygiene.pct) connection.
  - Every container becomes a host reached with the C(gpufleet.hygiene.pct) connection
    through its node; the nodes become hosts of the C(<group_prefix>nodes) group.
  - Groups by node (C(<prefix>node_<node>)), by status (C(<prefix>running), C(<prefix>stopped))
    and by GPU passthrough (C(<prefix>gpu), C(<prefix>no_gpu)); all containers are in C(<prefix>containers).
    Unprivileged containers (the C(unprivileged) key of C(pct config) is V(1); Proxmox VE's default,
    root mapped to 100000 on the node) are also in C(<prefix>unprivileged), with C(pve_unprivileged=true).
  - Every container gets C(ansible_pct_vmid), its Proxmox VE ID (the connection's O(gpufleet.hygiene.pct#connection:vmid)
    and the name roles and playbooks read), and C(pve_node), its node's inventory name; C(pve_vmid) holds the
    same ID as an alias kept for existing C(compose) and C(keyed_groups). Also C(pve_name), C(pve_status),
    C(pve_lock), C(pve_gpus), C(pve_gpu_indices), C(pve_gpu_all), C(pve_nvidia_devices), C(pve_unprivileged)
    and C(pve_config) (the parsed C(pct config)).
  - GPUs are found in every style Proxmox VE writes passthrough in, C(devN) entries, C(lxc.mount.entry) binds of
    C(/dev/nvidiaN) with C(lxc.cgroup2.devices.allow) rules (C(c 195:* rwm)), or C(c 195:N) cgroup rules alone.
  - A container allowed C(c 195:*) without any C(/dev/nvidiaN) passed through may open every GPU of its node.
    It is in C(<prefix>gpu) with C(pve_gpu_all=true) and empty C(pve_gpu_indices) (which GPUs it uses is
    unknown), and the node's warning says so.
  - A node that cannot be reached (or whose C(pct) fails, or whose containers' configs the API cannot read)
    is a warning; the containers of the other nodes are still returned. Results are cached only when every
    node answered. With O(source=api), an API that cannot be reached, or that refuses the token (HTTP 401 or
    403), fails the inventory with the API path and what to fix.
  - Uses a YAML configuration file that ends with C(proxmox_lxc.yml) or C(proxmox_lxc.yaml).
author: gpufleet.hygiene maintainers (@gpufleet)
version_added: 0.1.0
requirements:
  - the OpenSSH client (C(ssh)) on the controller, for O(source=ssh), as for the connection
extends_documentation_fragment:
  - constructed
  - inventory_cache
  - gpufleet.hygiene.ssh_options
options:
  plugin:
    description: The name of this plugin; must be V(gpufleet.hygiene.proxmox_lxc).
    type: string
    required: true
    choices: [gpufleet.hygiene.proxmox_lxc]
  source:
    description:
      - Where the containers are listed from. V(ssh) runs C(pct) on every node of O(nodes) over SSH;
        V(api) asks the Proxmox VE API at O(api_url) with the token O(api_token_id) / O(api_token_secret).
      - V(inventory) lists nothing itself - it adopts the LXC guests an inventory source parsed before it
        listed with community.proxmox's C(proxmox) inventory's variables (C(proxmox_vmid), C(proxmox_node),
        C(proxmox_vmtype) V(lxc)), giving each what the playbooks and roles read - C(pve_node), C(ansible_pct_vmid),
        C(ansible_pct_node_host) (C(gpufleet_pve_node_addresses) of the guest's node, else the node host's
        C(ansible_host), else the node's name) and the P(gpufleet.hygiene.pct#connection) connection (unless it has
        another C(ansible_connection)) - and a node host without an C(ansible_host) the address
        C(gpufleet_pve_node_addresses) gives it. Put it after that source - a later C(-i), or a later file of the
        same inventory directory (they are parsed in name order). A guest that already has C(ansible_pct_vmid) and
        C(ansible_pct_node_host) is left as it is. The variables seen are those of the inventory sources, their
        groups' and the C(group_vars)/C(host_vars) beside them (as C(ansible.builtin.constructed) with
        C(use_vars_plugins) sees them), and the extra vars (C(-e)) with O(use_extra_vars); not the playbooks' own
        variables, and not templated. Give C(gpufleet_pve_node_addresses) there.
      - Ansible Automation Platform / AWX syncs each inventory source of an inventory on its own, so no source sees
        another's hosts there - compose the same variables in community.proxmox's own source instead (docs/fleet.md).
      - With V(inventory), the adopted guests are in C(<prefix>containers) and C(<prefix>node_<node>), their nodes (when
        they are hosts) in C(<prefix>nodes); O(container_vars), O(compose), O(groups) and O(keyed_groups) apply to them.
        The options of the other sources (O(nodes), the API's, the SSH options, the cache) are not used.
    type: string
    default: ssh
    choices: [ssh, api, inventory]
    version_added: 0.3.0
  nodes:
    description:
      - The Proxmox VE nodes to query (required with O(source=ssh)). Each is a name (also used as address),
        or a mapping with C(name) and optionally C(host), C(port) and C(user).
      - With O(source=api), the nodes come from the API; an entry here only says how to reach that node
        (C(host), C(port), C(user)) instead of the address the API reports (C(/cluster/status)'s C(ip)).
    type: list
    elements: raw
    default: []
  api_url:
    description:
      - Base URL of the Proxmox VE API (any node of the cluster), for example V(https://pve1.example.com:8006).
        Required with O(source=api).
      - It must be an C(https://) URL; an C(http://) one (or any other scheme) is refused before any request, since
        the API token is sent in every request's header. There is no option to send it over plain HTTP.
    type: string
    env:
      - name: GPUFLEET_PVE_API_URL
    version_added: 0.3.0
  api_token_id:
    description:
      - The API token's full ID, C(<user>@<realm>!<tokenid>), for example V(gpufleet@pve!inventory).
        Required with O(source=api). It needs C(VM.Audit) on the containers and C(Sys.Audit) on C(/).
    type: string
    env:
      - name: GPUFLEET_PVE_TOKEN_ID
    version_added: 0.3.0
  api_token_secret:
    description:
      - The API token's secret (a UUID). Required with O(source=api). Keep it in a vault or the environment.
      - It goes only into the C(Authorization) header of the requests, never into a variable, a message or the cache.
    type: string
    env:
      - name: GPUFLEET_PVE_TOKEN_SECRET
    version_added: 0.3.0
  validate_certs:
    description:
      - Verify the API's TLS certificate. On by default; a node's own self-signed certificate needs
        O(ca_path) (the cluster's C(/etc/pve/pve-root-ca.pem)) rather than turning this off.
    type: bool
    default: true
    version_added: 0.3.0
  ca_path:
    description: PEM file of the CA (or the certificate) the API's certificate is verified against.
    type: path
    version_added: 0.3.0
  api_timeout:
    description: Seconds to wait for each API request.
    type: int
    default: 10
    version_added: 0.3.0
  max_workers:
    description: How many nodes are queried at the same time.
    type: int
    default: 8
  pct_path:
    description: Name or path of C(pct) on the nodes.
    type: string
    default: pct
  hostname:
    description:
      - How a container's inventory name is made. V(name) uses its hostname (falling back to
        C(<node>-<vmid>) when it has none, when two containers share it, when it is a node's name, or
        when it is not a DNS name), V(vmid) uses C(ct<vmid>).
    type: string
    default: name
    choices: [name, vmid]
  group_prefix:
    description: Prefix of every group this plugin creates.
    type: string
    default: pve_
  container_vars:
    description:
      - Variables set on every discovered container (literal values, not templated), for
        example C(ansible_pct_method) or C(ansible_pct_control_path_dir).
      - An C(ansible_pct_*) variable here that names one of the SSH options as the containers are given it
        (C(ansible_pct_control_path_dir), C(ansible_pct_ssh_extra_args), ...) is what the containers' connection
        uses, so the inventory uses it too for its own SSH to the nodes.
    type: dict
    default: {}
"""

EXAMPLES = r"""
# cluster.proxmox.yml (community.proxmox's inventory) first, then this file, gpufleet.proxmox_lxc.yml:
# its LXC guests get what the playbooks read (ansible-playbook -i cluster.proxmox.yml -i gpufleet.proxmox_lxc.yml ...)
plugin: gpufleet.hygiene.proxmox_lxc
source: inventory
---
# cluster.proxmox_lxc.yml: every container of the cluster from its API, one call to list them
plugin: gpufleet.hygiene.proxmox_lxc
source: api
api_url: https://pve1.example.com:8006
api_token_id: gpufleet@pve!inventory
# api_token_secret: from GPUFLEET_PVE_TOKEN_SECRET, or a vaulted value
ca_path: /etc/gpufleet/pve-root-ca.pem
private_key_file: ~/.ssh/pve_ed25519
---
# fleet.proxmox_lxc.yml
plugin: gpufleet.hygiene.proxmox_lxc
nodes:
  - pve1.example.com
  - name: pve2
    host: 10.0.0.12
user: root
private_key_file: ~/.ssh/pve_ed25519
container_vars:
  ansible_pct_method: lxc-attach
cache: true
cache_plugin: ansible.builtin.jsonfile
cache_connection: ~/.cache/gpufleet-inventory
cache_timeout: 300
keyed_groups:
  - key: pve_gpu_indices
    prefix: gpu
"""

import concurrent.futures
import json
import os
import re
import shutil
import urllib.error
import urllib.parse

from ansible.config.manager import ensure_type
from ansible.errors import AnsibleError, AnsibleParserError
from ansible.inventory.helpers import get_group_vars
from ansible.module_utils.common.text.converters import to_text
from ansible.module_utils.urls import open_url
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible.utils.display import Display
from ansible.utils.vars import combine_vars
from ansible.vars.plugins import get_vars_from_inventory_sources

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils import _ssh, _ssh_options
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._community_proxmox import AdoptError, adopt
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._preload import CONNECTION, preload_connection

display = Display()

# An API answer larger than this is refused (a cluster's resources are a few hundred bytes a guest).
_API_MAX_BYTES = 64 << 20

_HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?", re.ASCII)
# Proxmox VE's boolean values (PVE::JSONSchema: 1|0, yes|no, on|off, true|false).
_TRUE = ("1", "yes", "on", "true")

# This plugin's SSH options by the connection's name of the same setting (plugin_utils/_ssh_options.py,
# the table the gpufleet.hygiene.ssh_options fragment documents them from): the containers get each as
# ansible_pct_<connection's name>, and an ansible_pct_* of container_vars among them is what the
# inventory uses too.
SSH_OPTIONS = {row.name: row.inventory_name for row in _ssh_options.OPTIONS}
_TYPES = {row.name: row.type for row in _ssh_options.OPTIONS}


class NodeSshError(GpufleetError, AnsibleError):
    """ssh could not reach a node, or a command there ended without an answer; ``kind`` is _pct's
    name of the failure (the words of the skipped node's warning). A GpufleetError, as every error
    of the collection, and an AnsibleError, as the inventory's others."""

    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def is_unprivileged(conf):
    """Whether a container's parsed ``pct config`` says it is unprivileged (``unprivileged: 1``;
    absent is Proxmox VE's privileged default for an existing config)."""
    return str(conf.get("unprivileged", "0")).strip().lower() in _TRUE


def container_host_name(mode, node_name, row, names, node_names=()):
    """A container's inventory name: its hostname, or ``<node>-<vmid>`` when it has none, shares
    it with another container, is a node's name (it would take over that node's host and its
    variables) or is not a DNS name (``pct list`` is what a node says, not what it should)."""
    if mode == "vmid":
        return "ct%d" % row["vmid"]
    name = row.get("name") or ""
    if not name or len(names.get(name, [])) > 1 or name in node_names or not _HOSTNAME.fullmatch(name):
        return "%s-%d" % (node_name, row["vmid"])
    return name


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "gpufleet.hygiene.proxmox_lxc"

    def verify_file(self, path):
        return super().verify_file(path) and path.endswith(("proxmox_lxc.yml", "proxmox_lxc.yaml"))

    # ------------------------------------------------------------------ ssh

    def _nodes(self):
        policy = self._policy()
        nodes = []
        for entry in self.get_option("nodes"):
            item = {"name": entry} if isinstance(entry, str) else entry
            if not isinstance(item, dict) or not item.get("name"):
                raise AnsibleParserError("proxmox_lxc: each entry of nodes needs a name, got %r" % (item,))
            unknown = set(item) - {"name", "host", "port", "user"}
            if unknown:
                raise AnsibleParserError("proxmox_lxc: unknown keys %s in node %s" % (sorted(unknown), item["name"]))
            nodes.append({
                "name": str(item["name"]), "host": str(item.get("host") or item["name"]),
                "port": int(item.get("port") or policy["node_port"]), "user": str(item.get("user") or policy["node_user"]),
            })
        return nodes

    def _policy(self):
        """The SSH settings every node is reached with, by the connection's option names: this
        file's options (or their [gpufleet_pct] / environment sources), with the container_vars'
        ansible_pct_* that name one of them winning, since the containers' connection will use those."""
        given = self.get_option("container_vars") or {}
        policy = {}
        for name, option in SSH_OPTIONS.items():
            value = self.get_option(option)
            var = "ansible_pct_" + name
            if var in given:
                try:
                    value = ensure_type(given[var], _TYPES[name])
                except (TypeError, ValueError) as exc:
                    raise AnsibleParserError("proxmox_lxc: container_vars' %s must be a %s, got %r"
                                             % (var, _TYPES[name], given[var])) from exc
            policy[name] = value
        return policy

    def _ssh_vars(self):
        """The SSH settings given to every container (ansible_pct_*), those set anywhere but in
        their defaults: the connection reads the same ansible.cfg keys and environment variables
        itself, and a default left out keeps the connection's other sources (ansible_user,
        ansible_host_key_checking, ...) working as they did. User and port go per node."""
        out = {}
        for name, option in SSH_OPTIONS.items():
            value, origin = self.get_option_and_origin(option)
            if name not in ("node_user", "node_port") and value is not None and origin != "default":
                out["ansible_pct_" + name] = value
        return out

    def _ssh(self, node, policy, line):
        """(stdout, stderr) of one command line on node over ssh, as the pct connection would run it;
        NodeSshError when ssh did not reach the node (its words and what to fix)."""
        cpdir = os.path.expanduser(policy["control_path_dir"])
        argv = _ssh.argv(node["host"], line, user=node["user"], port=node["port"], executable=policy["ssh_executable"],
                         connect_timeout=policy["connect_timeout"], host_key_checking=policy["host_key_checking"],
                         known_hosts_file=policy["known_hosts_file"], private_key_file=policy["private_key_file"],
                         extra_args=policy["ssh_extra_args"], control_persist=policy["control_persist"],
                         control_path=_ssh.control_path(cpdir, node["user"], node["host"], node["port"]))
        display.vvv("proxmox_lxc: %s" % _pct.shell_line(argv), host=node["name"])
        rc, out, err = _ssh.run(argv, policy["connect_timeout"])
        text = to_text(err, errors="surrogate_or_replace").strip()
        kind = _pct.UNREACHABLE if rc is None else _ssh.failure(rc, out, text)
        if kind:
            fix = _ssh.fix(kind, node["host"], node["port"], policy["known_hosts_file"], policy["private_key_file"])
            raise NodeSshError(kind, "%s%s" % (text or "ssh exited %s" % rc, "; to fix: " + fix if fix else ""))
        return rc, to_text(out, errors="surrogate_or_replace"), text

    def _query_node(self, node, policy):
        """Containers of one node: [{vmid, status, lock, name, config}]; raises on any failure."""
        pct = self.get_option("pct_path")
        rc, out, err = self._ssh(node, policy, _pct.shell_line(_pct.list_argv(pct)))
        if rc != 0:
            raise AnsibleError("`pct list` failed (rc=%d): %s" % (rc, err))
        rows = _pct.parse_list(out)
        if rows:
            # Every container's config in one round trip.
            rc, out, err = self._ssh(node, policy, _pct.configs_line([r["vmid"] for r in rows], pct))
            configs = _pct.split_configs(out)
            for row in rows:
                if row["vmid"] not in configs:
                    raise AnsibleError("`pct config %d` gave nothing: %s" % (row["vmid"], err))
                row["config"] = _pct.parse_config(configs[row["vmid"]])
        return rows

    def _discover(self):
        nodes = self._nodes()
        policy = self._policy()
        if not shutil.which(policy["ssh_executable"]):
            raise AnsibleError("proxmox_lxc: source: ssh runs the OpenSSH client, and %r (ssh_executable) is not found on this "
                               "controller: install it (openssh-client, openssh-clients) or set ssh_executable"
                               % policy["ssh_executable"])
        # The connection's own check of the directory its masters live in, once before any ssh.
        _ssh.private_directory(os.path.expanduser(policy["control_path_dir"]), who="proxmox_lxc")
        results, failed = {}, []

        def one(node):
            try:
                return node, self._query_node(node, policy), None
            except Exception as exc:  # noqa: BLE001 - any failure of one node is that node's warning
                return node, None, exc

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.get_option("max_workers"))) as pool:
            for node, rows, exc in pool.map(one, nodes):
                if exc is not None:
                    failed.append(node["name"])
                    display.warning("proxmox_lxc: node %s (%s@%s:%d) skipped: %s: %s" % (
                        node["name"], node["user"], node["host"], node["port"], self._why(exc), to_text(exc) or type(exc).__name__))
                    continue
                results[node["name"]] = {"node": node, "containers": rows}
        return {"nodes": results, "failed": failed}

    @staticmethod
    def _why(exc):
        kind = getattr(exc, "kind", None)
        if kind is None and isinstance(exc, OSError):
            kind = _pct.UNREACHABLE
        if kind is None and isinstance(exc, AnsibleError):
            kind = _pct.PCT_FAILED
        return _pct.REASONS.get(kind, "failed")

    # ------------------------------------------------------------------ api

    def _api_get(self, path, node=None):
        """``data`` of one GET of the Proxmox VE API; AnsibleError naming the path (and node) otherwise."""
        where = "GET %s%s" % (path, " (node %s)" % node if node else "")
        url = self.get_option("api_url").rstrip("/") + "/api2/json" + path
        headers = {"Authorization": "PVEAPIToken=%s=%s" % (self.get_option("api_token_id"), self.get_option("api_token_secret")),
                   "Accept": "application/json"}
        try:
            resp = open_url(url, method="GET", headers=headers, validate_certs=self.get_option("validate_certs"),
                            ca_path=self.get_option("ca_path"), timeout=self.get_option("api_timeout"),
                            follow_redirects="none", use_proxy=True)
            body = resp.read(_API_MAX_BYTES + 1)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403):
                raise AnsibleError(
                    "proxmox_lxc: the Proxmox VE API refused the token %s on %s (HTTP %d %s): check api_token_id "
                    "(<user>@<realm>!<tokenid>) and api_token_secret, and that the token has VM.Audit on the containers "
                    "and Sys.Audit on / (a token with privilege separation needs its own permissions)"
                    % (self.get_option("api_token_id"), where, exc.code, exc.reason)) from exc
            raise AnsibleError("proxmox_lxc: %s failed: HTTP %d %s" % (where, exc.code, exc.reason)) from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            hint = ""
            if "CERTIFICATE_VERIFY_FAILED" in str(reason):
                hint = " (give the cluster's CA, /etc/pve/pve-root-ca.pem, as ca_path)"
            raise AnsibleError("proxmox_lxc: %s: cannot reach the Proxmox VE API at %s: %s%s"
                               % (where, self.get_option("api_url"), to_text(reason), hint)) from exc
        if len(body) > _API_MAX_BYTES:
            raise AnsibleError("proxmox_lxc: %s: the answer is larger than %d bytes" % (where, _API_MAX_BYTES))
        try:
            return json.loads(body)["data"]
        except (ValueError, KeyError, TypeError) as exc:
            raise AnsibleError("proxmox_lxc: %s: not a Proxmox VE API answer ({\"data\": ...}): %s"
                               % (where, to_text(body[:200], errors="surrogate_or_replace"))) from exc

    @staticmethod
    def _config_text(data):
        """An API config (keys to values, raw lxc.* keys as [[key, value], ...] under ``lxc``) as the
        lines `pct config` prints, so that both sources parse one format."""
        lines = []
        for key, value in data.items():
            if key in ("digest", "lxc"):
                continue
            lines.append("%s: %s" % (key, value))
        for pair in data.get("lxc") or []:
            lines.append("%s: %s" % (pair[0], pair[1]))
        return "\n".join(lines) + "\n"

    def _discover_api(self):
        for opt in ("api_url", "api_token_id", "api_token_secret"):
            if not self.get_option(opt):
                raise AnsibleParserError("proxmox_lxc: source: api needs %s" % opt)
        # The token goes in every request's header: never where anyone on the way can read it.
        url = urllib.parse.urlsplit(self.get_option("api_url"))
        if url.scheme.lower() != "https" or not url.hostname:
            raise AnsibleParserError(
                "proxmox_lxc: api_url %s is no https:// URL, and the API token would cross the network in clear: nothing "
                "was sent. Give the API's https:// address (Proxmox VE serves it at https://<node>:8006), with ca_path for "
                "the cluster's own certificate (/etc/pve/pve-root-ca.pem)" % self.get_option("api_url"))
        if not re.fullmatch(r"[^@!=\s]+@[^@!=\s]+![A-Za-z][A-Za-z0-9._-]*", self.get_option("api_token_id")):
            raise AnsibleParserError("proxmox_lxc: api_token_id must read <user>@<realm>!<tokenid> (e.g. gpufleet@pve!inventory), got %r"
                                     % self.get_option("api_token_id"))
        given = {n["name"]: n for n in self._nodes()} if self.get_option("nodes") else {}
        policy = self._policy()
        members = [e for e in self._api_get("/cluster/status") if e.get("type") == "node" and e.get("name")]
        nodes, offline = {}, []
        for entry in members:
            name = str(entry["name"])
            nodes[name] = given.get(name) or {"name": name, "host": str(entry.get("ip") or name),
                                              "port": int(policy["node_port"]), "user": str(policy["node_user"])}
            if not entry.get("online"):
                offline.append(name)
        guests = [g for g in self._api_get("/cluster/resources?type=vm")
                  if g.get("type") == "lxc" and not g.get("template") and g.get("node") in nodes]
        results, failed = {}, []
        for name in offline:
            failed.append(name)
            display.warning("proxmox_lxc: node %s skipped: the Proxmox VE API reports it offline (/cluster/status)" % name)

        def one(guest):
            node, vmid = guest["node"], int(guest["vmid"])
            path = "/nodes/%s/lxc/%d/config" % (urllib.parse.quote(node, safe=""), vmid)
            try:
                return guest, self._api_get(path, node=node), None
            except AnsibleError as exc:
                return guest, None, exc

        wanted = [g for g in guests if g["node"] not in offline]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.get_option("max_workers"))) as pool:
            answers = list(pool.map(one, wanted))
        errors = {}
        for guest, _data, exc in answers:
            if exc is not None:
                errors.setdefault(guest["node"], exc)
        for name in sorted(nodes):
            if name in offline:
                continue
            if name in errors:
                failed.append(name)
                display.warning("proxmox_lxc: node %s skipped: %s" % (name, to_text(errors[name])))
                continue
            rows = []
            for guest, data, _exc in answers:
                if guest["node"] != name:
                    continue
                conf = _pct.parse_config(self._config_text(data))
                rows.append({"vmid": int(guest["vmid"]), "status": str(guest.get("status") or "unknown"),
                             "lock": conf.get("lock", ""), "name": conf.get("hostname", ""), "config": conf})
            rows.sort(key=lambda r: r["vmid"])
            results[name] = {"node": nodes[name], "containers": rows}
        return {"nodes": results, "failed": failed}

    # ------------------------------------------------------------------ inventory

    def _populate(self, results):
        prefix = self.get_option("group_prefix")
        strict = self.get_option("strict")
        nodes_group = self.inventory.add_group(prefix + "nodes")
        ssh_vars = self._ssh_vars()
        all_group = self.inventory.add_group(prefix + "containers")
        names = {}
        node_names = set(results["nodes"])
        for data in results["nodes"].values():
            for row in data["containers"]:
                names.setdefault(row.get("name") or "", []).append(row["vmid"])
        for node_name in sorted(results["nodes"]):
            data = results["nodes"][node_name]
            node = data["node"]
            self.inventory.add_host(node_name, group=nodes_group)
            self.inventory.set_variable(node_name, "ansible_host", node["host"])
            self.inventory.set_variable(node_name, "ansible_port", node["port"])
            self.inventory.set_variable(node_name, "ansible_user", node["user"])
            if self.get_option("private_key_file"):
                self.inventory.set_variable(node_name, "ansible_ssh_private_key_file", self.get_option("private_key_file"))
            node_group = self.inventory.add_group(self._sanitize_group_name("%snode_%s" % (prefix, node_name)))
            every_gpu = []
            for row in data["containers"]:
                host = self._host_name(node_name, row, names, node_names)
                conf = row.get("config", {})
                passthrough = _pct.gpu_passthrough(conf)
                gpus = passthrough["indices"]
                if passthrough["all"]:
                    every_gpu.append(row["vmid"])
                self.inventory.add_host(host, group=all_group)
                self.inventory.add_child(node_group, host)
                self.inventory.add_child(self.inventory.add_group(self._sanitize_group_name(prefix + row["status"])), host)
                self.inventory.add_child(self.inventory.add_group(prefix + ("gpu" if gpus or passthrough["all"] else "no_gpu")), host)
                unprivileged = is_unprivileged(conf)
                if unprivileged:
                    self.inventory.add_child(self.inventory.add_group(prefix + "unprivileged"), host)
                hostvars = {
                    "ansible_connection": CONNECTION,
                    "ansible_pct_node_host": node["host"],
                    "ansible_pct_node_port": node["port"],
                    "ansible_pct_node_user": node["user"],
                    "ansible_pct_vmid": row["vmid"],
                    "pve_node": node_name,
                    "pve_vmid": row["vmid"],
                    "pve_name": row.get("name") or "",
                    "pve_status": row["status"],
                    "pve_lock": row.get("lock") or "",
                    "pve_gpus": ["/dev/nvidia%s" % i for i in gpus],
                    "pve_gpu_indices": gpus,
                    "pve_gpu_all": passthrough["all"],
                    "pve_nvidia_devices": passthrough["devices"],
                    "pve_unprivileged": unprivileged,
                    "pve_config": conf,
                }
                # The SSH settings the inventory reached the node with: the connection uses the same.
                hostvars.update(ssh_vars)
                hostvars.update(self.get_option("container_vars") or {})
                for key, value in hostvars.items():
                    self.inventory.set_variable(host, key, value)
                allvars = self.inventory.get_host(host).get_vars()
                self._set_composite_vars(self.get_option("compose"), allvars, host, strict=strict)
                self._add_host_to_composed_groups(self.get_option("groups"), allvars, host, strict=strict)
                self._add_host_to_keyed_groups(self.get_option("keyed_groups"), allvars, host, strict=strict)
            if every_gpu:
                display.warning(
                    "proxmox_lxc: on node %s, container(s) %s may open every GPU (lxc.cgroup2.devices.allow: c %d:*) "
                    "but pass no /dev/nvidiaN through: which GPUs they use is unknown here (pve_gpu_all: true, "
                    "pve_gpu_indices empty); gpufleet.hygiene.gpu_state on the node maps their holders"
                    % (node_name, ", ".join(str(v) for v in every_gpu), _pct.NVIDIA_MAJOR))

    # ------------------------------------------------------------------ source: inventory

    def _inventory_vars(self, host, sources):
        """A host's variables as the inventory so far has them: its groups', the group_vars and
        host_vars beside the sources, its own (as ansible.builtin.constructed sees them with
        use_vars_plugins)."""
        groups = host.get_groups()
        out = combine_vars(get_group_vars(groups), get_vars_from_inventory_sources(self.loader, sources, groups, "all"))
        out = combine_vars(out, host.get_vars())
        out = combine_vars(out, get_vars_from_inventory_sources(self.loader, sources, [host], "all"))
        # -e (gpufleet_pve_node_addresses given on the command line), as compose takes it.
        return combine_vars(out, self._vars) if self.get_option("use_extra_vars") else out

    def _adopt(self):
        """source: inventory - the LXC guests of community.proxmox's inventory, parsed before this
        file, given what the playbooks read (plugin_utils/_community_proxmox.py)."""
        prefix = self.get_option("group_prefix")
        strict = self.get_option("strict")
        sources = self.inventory.processed_sources
        hostvars = {name: self._inventory_vars(host, sources) for name, host in self.inventory.hosts.items()}
        try:
            adopted = adopt(hostvars, sorted(hostvars))
        except AdoptError as exc:
            raise AnsibleParserError("proxmox_lxc (source: inventory): %s" % exc) from exc
        if not any(hv.get("proxmox_vmid") is not None for hv in hostvars.values()):
            display.warning("proxmox_lxc (source: inventory): no host of the inventory so far has proxmox_vmid (no guest of "
                            "community.proxmox's inventory); put this file after that inventory")
        for node in adopted["nodes"]:
            self.inventory.set_variable(node["host"], "ansible_host", node["ansible_host"])
        containers = self.inventory.add_group(prefix + "containers")
        nodes = self.inventory.add_group(prefix + "nodes")
        for guest in adopted["containers"]:
            host = guest["host"]
            self.inventory.add_child(containers, host)
            self.inventory.add_child(self.inventory.add_group(self._sanitize_group_name("%snode_%s" % (prefix, guest["pve_node"]))), host)
            if guest["pve_node"] in self.inventory.hosts:
                self.inventory.add_child(nodes, guest["pve_node"])
            given = {k: v for k, v in guest.items() if k != "host"}
            given.update(self.get_option("container_vars") or {})
            for key, value in given.items():
                self.inventory.set_variable(host, key, value)
            allvars = combine_vars(hostvars[host], given)
            self._set_composite_vars(self.get_option("compose"), allvars, host, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), allvars, host, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), allvars, host, strict=strict)
        if adopted["containers"]:
            preload_connection()  # as for the other sources: loaded once, before the forks

    def _host_name(self, node_name, row, names, node_names):
        return container_host_name(self.get_option("hostname"), node_name, row, names, node_names)

    def parse(self, inventory, loader, path, cache=True):
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        if self.get_option("source") == "inventory":
            self._adopt()
            return
        api = self.get_option("source") == "api"
        if not api and not self.get_option("nodes"):
            raise AnsibleParserError("proxmox_lxc: nodes is required with source: ssh (or set source: api)")
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        results = None
        if use_cache:
            try:
                results = self._cache[cache_key]
            except KeyError:
                update_cache = True
        if results is None:
            results = self._discover_api() if api else self._discover()
            if results["failed"]:
                update_cache = False
        if update_cache:
            self._cache[cache_key] = results
        self._populate(results)
        # Its containers' connection, loaded here, before ansible-core forks a worker per host
        # and task, is inherited by every worker instead of loaded by each (plugin_utils/_preload.py).
        preload_connection()
