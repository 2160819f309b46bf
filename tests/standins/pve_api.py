# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""STAND-IN for the Proxmox VE REST API, used only with the simulated fleet (tests/sim/fleet).

This is NOT Proxmox VE's API server (pveproxy). It serves, over HTTPS with a self-signed
certificate made at start, the paths that community.proxmox's `proxmox` inventory plugin (with
want_proxmox_nodes_ansible_host, /nodes/{node}/network too) and
gpufleet.hygiene's `proxmox_lxc` inventory (`source: api`) read, from the simulated fleet's
real state: the nodes of <state>/fleet.json, each container's PVE config in
<state>/nodes/<node>/pve/lxc/<vmid>.conf (the file the pct stand-in reads and writes) and
each container's real LXC state (`lxc-info` in <state>/nodes/<node>/lxc).

    python3 tests/standins/pve_api.py --state /var/tmp/gpufleet-sim --port 8006 \
        --token 'root@pam!gpufleet=SECRET' [--listen 127.0.0.1] [--cert-dir DIR] [--plain-http]

prints one JSON line when it listens: {"url": ..., "cafile": ..., "pid": ...}.

Shapes: every answer is {"data": ...} (pveproxy's JSON formatter). Where each shape comes from
is said beside each handler: the `returns` schemas of pve-manager's PVE/API2/Cluster.pm,
PVE/API2/Nodes.pm, PVE/API2/Version.pm, PVE/API2/Pool.pm and pve-container's
src/PVE/API2/LXC.pm and src/PVE/API2/LXC/Config.pm, as published in the API viewer
(pve-docs api-viewer/apidoc.js, https://pve.proxmox.com/pve-docs/api-viewer/).

Authentication: only API tokens, as pveproxy reads them: the header
`Authorization: PVEAPIToken=<user>@<realm>!<tokenid>=<secret>`. Anything else answers 401 with
the reason pveproxy gives ("No ticket" without the header, "invalid token value!" otherwise).

Writes: PUT /nodes/{node}/lxc/{vmid}/config takes `tags`, `delete=tags` and `digest` only
(form-encoded, as the API's clients send it); tags are normalized as pve-manager's
PVE::GuestHelpers::get_unique_tags does with the default tag-style (split on `;`, `,` and
spaces, lower-cased, sorted, once each, joined with `;`) and written to the config as
`tags: a;b`, as Proxmox VE keeps them.
"""

from __future__ import annotations

import argparse
import hashlib
import http.server
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import urllib.parse

# pve-common's PVE::JSONSchema pve-tag format.
TAG = re.compile(r"[a-z0-9_][a-z0-9_\-+.]*", re.IGNORECASE)
# Config keys whose schema type is integer (pve-container PVE::LXC::Config's $confdesc): the API
# answers them as JSON numbers; every other key is a string.
INT_KEYS = {"cores", "memory", "swap", "cpuunits", "tty", "onboot", "protection", "template", "unprivileged", "console"}
VMID = r"[1-9][0-9]{2,8}"


def split_tags(text):
    """PVE::Tools::split_list: the list separators `;`, `,` and white space."""
    return [t for t in re.split(r"[;,\s]+", text or "") if t]


def unique_tags(tags):
    """PVE::GuestHelpers::get_unique_tags with the default tag-style (not case-sensitive, sorted)."""
    seen, out = set(), []
    for tag in (t.lower() for t in sorted(tags, key=str.lower)):
        if tag not in seen:
            seen.add(tag)
            out.append(tag)
    return out


def set_conf_key(text, key, value):
    """The config text with ``key: value`` set (None: removed), keys kept sorted before the raw
    lxc.* keys, as PVE::LXC::Config writes a config."""
    lines = [ln for ln in text.splitlines() if not ln.startswith(key + ":")]
    if value is not None:
        new = "%s: %s" % (key, value)
        at = len(lines)
        for i, ln in enumerate(lines):
            k = ln.split(":", 1)[0]
            if k.startswith("lxc.") or k > key:
                at = i
                break
        lines.insert(at, new)
    return "\n".join(lines) + "\n"


class Fleet:
    """The simulated fleet's state, read on every request (tests change it between calls)."""

    def __init__(self, state):
        self.state = state
        self.lock = threading.Lock()

    def info(self):
        with open(os.path.join(self.state, "fleet.json")) as f:
            return json.load(f)

    def nodes(self):
        return [n["name"] for n in self.info()["nodes"]]

    def node(self, name):
        for n in self.info()["nodes"]:
            if n["name"] == name:
                return n
        return None

    def conf_dir(self, node):
        return os.path.join(self.state, "nodes", node, "pve", "lxc")

    def vmids(self, node):
        d = self.conf_dir(node)
        if not os.path.isdir(d):
            return []
        return sorted(int(n[:-5]) for n in os.listdir(d) if re.fullmatch(r"[0-9]+\.conf", n))

    def conf_path(self, node, vmid):
        return os.path.join(self.conf_dir(node), "%d.conf" % vmid)

    def conf_text(self, node, vmid):
        with open(self.conf_path(node, vmid)) as f:
            return f.read()

    def status(self, node, vmid):
        out = subprocess.run(["lxc-info", "-n", str(vmid), "-P", os.path.join(self.state, "nodes", node, "lxc"), "-s", "-H"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False, timeout=10).stdout
        return "running" if out.strip() == "RUNNING" else "stopped"

    def version(self):
        """pve-manager's version of the fleet: the first node's pve/version major (the pct stand-in's rule)."""
        for node in self.nodes():
            try:
                with open(os.path.join(self.state, "nodes", node, "pve", "version")) as f:
                    major = f.read().strip()
                    break
            except FileNotFoundError:
                continue
        else:
            major = "9"
        return {"8": "8.4.1", "9": "9.0.3"}.get(major, "9.0.3")


def parse_conf(text):
    """The config file as PVE::LXC::Config->parse_pct_config gives it to the API: PVE keys to
    values (integers where the schema says so), raw lxc.* keys as [[key, value], ...] under `lxc`."""
    conf, raw = {}, []
    for line in text.splitlines():
        if ":" not in line or line.startswith("#"):
            continue
        key, value = line.split(":", 1)
        key, value = key.strip(), value.strip()
        if key.startswith("lxc."):
            raw.append([key, value])
        elif key in INT_KEYS and re.fullmatch(r"-?[0-9]+", value):
            conf[key] = int(value)
        else:
            conf[key] = value
    if raw:
        conf["lxc"] = raw
    return conf


class ApiError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "pve-api-daemon/3.0 (stand-in)"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # one line a request on stderr, for the test's log
        sys.stderr.write("pve_api stand-in: %s\n" % (fmt % args))

    # ------------------------------------------------------------------ plumbing

    def _send(self, code, data, reason=None):
        body = json.dumps({"data": data}).encode()
        self.send_response(code, reason)
        self.send_header("Content-Type", "application/json;charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self):
        header = self.headers.get("Authorization")
        if not header:
            self._send(401, None, "No ticket")
            return False
        if header != "PVEAPIToken=" + self.server.token:
            self._send(401, None, "invalid token value!")
            return False
        return True

    def _route(self, method):
        url = urllib.parse.urlsplit(self.path)
        if not url.path.startswith("/api2/json/"):
            raise ApiError(501, "Method '%s %s' not implemented" % (method, url.path))
        path = url.path[len("/api2/json"):].rstrip("/")
        query = dict(urllib.parse.parse_qsl(url.query))
        fleet = self.server.fleet
        for pattern, handler in ROUTES.get(method, ()):
            m = re.fullmatch(pattern, path)
            if m:
                args = m.groupdict()
                if "node" in args and fleet.node(args["node"]) is None:
                    # pveproxy, asked to proxy to a node not in the cluster.
                    raise ApiError(595, "no such cluster node '%s'" % args["node"])
                if "vmid" in args:
                    args["vmid"] = int(args["vmid"])
                    if not os.path.isfile(fleet.conf_path(args["node"], args["vmid"])):
                        raise ApiError(500, "Configuration file 'nodes/%s/lxc/%d.conf' does not exist"
                                       % (args["node"], args["vmid"]))
                return handler(self, fleet, query, **args)
        raise ApiError(501, "Method '%s %s' not implemented" % (method, path))

    def _handle(self, method):
        if not self._authorized():
            return
        try:
            self._send(200, self._route(method))
        except ApiError as exc:
            self._send(exc.code, None, exc.message)

    def do_GET(self):  # noqa: N802 - BaseHTTPRequestHandler's name
        self._handle("GET")

    def do_PUT(self):  # noqa: N802 - BaseHTTPRequestHandler's name
        self._handle("PUT")

    def form(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if kind == "application/json":
            return {k: str(v) for k, v in (json.loads(body) if body else {}).items()}
        return dict(urllib.parse.parse_qsl(body, keep_blank_values=True))

    # ------------------------------------------------------------------ handlers

    def version(self, fleet, query):
        # pve-manager PVE/API2/Version.pm `version` returns {version, release, repoid}.
        version = fleet.version()
        return {"version": version, "release": version.rsplit(".", 1)[0], "repoid": "00000000"}

    def cluster_status(self, fleet, query):
        # pve-manager PVE/API2/Cluster.pm `get_status`: one {type: cluster} entry, then one
        # {type: node, id: "node/<name>", name, nodeid, ip, local, online, level} per member.
        info = fleet.info()
        out = [{"type": "cluster", "id": "cluster", "name": "gpufleet-sim", "nodes": len(info["nodes"]),
                "version": 1, "quorate": 1}]
        for i, node in enumerate(info["nodes"], 1):
            out.append({"type": "node", "id": "node/%s" % node["name"], "name": node["name"], "nodeid": i,
                        "ip": node["address"], "local": 1 if i == 1 else 0, "online": 1, "level": ""})
        return out

    def _node_entry(self, name):
        # pve-manager PVE/API2Tools.pm extract_node_stats (as /cluster/resources and /nodes give it).
        return {"id": "node/%s" % name, "type": "node", "node": name, "status": "online", "level": "",
                "cpu": 0.01, "maxcpu": 16, "mem": 8 << 30, "maxmem": 128 << 30, "disk": 0, "maxdisk": 64 << 30,
                "uptime": 3600}

    def _ct_entry(self, fleet, node, vmid):
        # pve-container PVE::LXC::vmstatus (GET /nodes/{node}/lxc): vmid, name (hostname, else
        # "CT<vmid>"), status, type "lxc", maxmem/maxswap/maxdisk in bytes, cpus, uptime, and
        # lock and tags when the config has them.
        conf = parse_conf(fleet.conf_text(node, vmid))
        status = fleet.status(node, vmid)
        entry = {"vmid": vmid, "name": conf.get("hostname") or "CT%d" % vmid, "status": status, "type": "lxc",
                 "maxmem": int(conf.get("memory", 512)) << 20, "maxswap": int(conf.get("swap", 0)) << 20,
                 "maxdisk": 64 << 30, "cpus": int(conf.get("cores", 1)), "uptime": 60 if status == "running" else 0,
                 "cpu": 0, "mem": 0, "disk": 0, "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}
        for key in ("lock", "tags"):
            if conf.get(key):
                entry[key] = conf[key]
        if conf.get("template"):
            entry["template"] = 1
        return entry

    def cluster_resources(self, fleet, query):
        # pve-manager PVE/API2/Cluster.pm `resources` (?type=vm|node|storage|sdn): each guest is
        # PVE/API2Tools.pm extract_vm_stats - id "lxc/<vmid>", type, vmid, name, node, status,
        # template, the usage figures - plus `lock` and `tags` from its config when set.
        kind = query.get("type")
        if kind not in (None, "vm", "node", "storage", "sdn"):
            raise ApiError(400, "Parameter verification failed. type: value '%s' does not have a value in the enumeration "
                           "'vm, storage, node, sdn'" % kind)
        out = []
        if kind in (None, "vm"):
            for node in fleet.nodes():
                for vmid in fleet.vmids(node):
                    ct = self._ct_entry(fleet, node, vmid)
                    entry = {"id": "lxc/%d" % vmid, "type": "lxc", "vmid": vmid, "name": ct["name"], "node": node,
                             "status": ct["status"], "template": ct.get("template", 0), "maxmem": ct["maxmem"],
                             "maxdisk": ct["maxdisk"], "maxcpu": ct["cpus"], "mem": 0, "cpu": 0, "disk": 0,
                             "uptime": ct["uptime"], "netin": 0, "netout": 0, "diskread": 0, "diskwrite": 0}
                    for key in ("lock", "tags"):
                        if key in ct:
                            entry[key] = ct[key]
                    out.append(entry)
        if kind in (None, "node"):
            out.extend(self._node_entry(n) for n in fleet.nodes())
        return out

    def nodes(self, fleet, query):
        # pve-manager PVE/API2/Nodes.pm NodeIndex `index`: node, status, cpu, maxcpu, mem, maxmem,
        # uptime, level, id, type, ssl_fingerprint.
        return [dict(self._node_entry(n), ssl_fingerprint=self.server.fingerprint) for n in fleet.nodes()]

    def node_network(self, fleet, query, node):
        # pve-manager PVE/API2/Network.pm `index`: the node's interfaces (iface, type, active,
        # address, netmask, cidr, gateway, families, method); its bridge holds the node's address.
        address = fleet.node(node)["address"]
        return [{"iface": "vmbr0", "type": "bridge", "active": 1, "autostart": 1, "address": address,
                 "netmask": "24", "cidr": "%s/24" % address, "gateway": address.rsplit(".", 1)[0] + ".254",
                 "families": ["inet"], "method": "static", "bridge_ports": "eno1", "priority": 3}]

    def node_lxc(self, fleet, query, node):
        # pve-container PVE/API2/LXC.pm `vmlist`.
        return [self._ct_entry(fleet, node, vmid) for vmid in fleet.vmids(node)]

    def node_qemu(self, fleet, query, node):
        # qemu-server PVE/API2/Qemu.pm `vmlist`: the simulated fleet has no VMs.
        return []

    def pools(self, fleet, query):
        # pve-manager PVE/API2/Pool.pm `index`: [{poolid, comment}]; the simulated fleet has none.
        return []

    def lxc_status(self, fleet, query, node, vmid):
        # pve-container PVE/API2/LXC/Status.pm `vm_status` (status/current): vmstatus's entry.
        return self._ct_entry(fleet, node, vmid)

    def lxc_config(self, fleet, query, node, vmid):
        # pve-container PVE/API2/LXC/Config.pm `vm_config`: the config's keys, `digest` (SHA1 of
        # the config file) and `lxc`: "Array of lxc low-level configurations ([[key1, value1], ...])".
        text = fleet.conf_text(node, vmid)
        conf = parse_conf(text)
        conf["digest"] = hashlib.sha1(text.encode()).hexdigest()
        return conf

    def lxc_config_put(self, fleet, query, node, vmid):
        # pve-container PVE/API2/LXC/Config.pm `update_vm` (returns null): the stand-in takes
        # `tags`, `delete` (tags only) and `digest`.
        form = self.form()
        unknown = set(form) - {"tags", "delete", "digest"}
        if unknown:
            raise ApiError(400, "stand-in: only tags, delete=tags and digest can be set, got %s" % ", ".join(sorted(unknown)))
        with fleet.lock:
            path = fleet.conf_path(node, vmid)
            text = fleet.conf_text(node, vmid)
            if form.get("digest") and form["digest"] != hashlib.sha1(text.encode()).hexdigest():
                raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
            if "tags" in form:
                tags = split_tags(form["tags"])
                bad = [t for t in tags if not TAG.fullmatch(t)]
                if bad:
                    raise ApiError(400, "Parameter verification failed. tags: invalid format - invalid tag '%s'" % bad[0])
                text = set_conf_key(text, "tags", ";".join(unique_tags(tags)) or None)
            if form.get("delete"):
                if split_tags(form["delete"]) != ["tags"]:
                    raise ApiError(400, "stand-in: only delete=tags is supported")
                text = set_conf_key(text, "tags", None)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".%d.conf." % vmid)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o640)
            os.replace(tmp, path)
        return None


ROUTES = {
    "GET": [
        (r"/version", Handler.version),
        (r"/cluster/status", Handler.cluster_status),
        (r"/cluster/resources", Handler.cluster_resources),
        (r"/nodes", Handler.nodes),
        (r"/pools", Handler.pools),
        (r"/nodes/(?P<node>[^/]+)/network", Handler.node_network),
        (r"/nodes/(?P<node>[^/]+)/lxc", Handler.node_lxc),
        (r"/nodes/(?P<node>[^/]+)/qemu", Handler.node_qemu),
        (r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>%s)/config" % VMID, Handler.lxc_config),
        (r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>%s)/status/current" % VMID, Handler.lxc_status),
    ],
    "PUT": [
        (r"/nodes/(?P<node>[^/]+)/lxc/(?P<vmid>%s)/config" % VMID, Handler.lxc_config_put),
    ],
}


def make_cert(cert_dir, listen):
    """A self-signed certificate for the listening address (openssl, as pve-cluster makes pve-ssl.pem)."""
    os.makedirs(cert_dir, mode=0o700, exist_ok=True)
    cert, key = os.path.join(cert_dir, "pve-ssl.pem"), os.path.join(cert_dir, "pve-ssl.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=pve-api-standin",
                    "-addext", "subjectAltName=IP:%s,DNS:localhost" % listen, "-keyout", key, "-out", cert],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return cert, key


def main(argv=None):
    p = argparse.ArgumentParser(description="Proxmox VE API STAND-IN over the simulated fleet")
    p.add_argument("--state", default=os.environ.get("GPUFLEET_SIM_STATE", "/var/tmp/gpufleet-sim"))
    p.add_argument("--listen", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8006)
    p.add_argument("--token", required=True, help="user@realm!tokenid=secret")
    p.add_argument("--cert-dir", default=None)
    # Not pveproxy's (it serves HTTPS only): an API reached over plain HTTP, to show that a client
    # refuses to send its token there.
    p.add_argument("--plain-http", action="store_true", help="serve plain HTTP, no TLS")
    args = p.parse_args(argv)
    if not re.fullmatch(r"[^@!=\s]+@[^@!=\s]+![A-Za-z][A-Za-z0-9._-]*=\S+", args.token):
        p.error("--token must read user@realm!tokenid=secret")
    server = http.server.ThreadingHTTPServer((args.listen, args.port), Handler)
    server.daemon_threads = True
    server.fleet = Fleet(args.state)
    server.token = args.token
    cert = server.fingerprint = None
    if not args.plain_http:
        cert, key = make_cert(args.cert_dir or os.path.join(args.state, "pve-api"), args.listen)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        with open(cert) as f:
            der = ssl.PEM_cert_to_DER_cert(f.read())
        digest = hashlib.sha256(der).hexdigest().upper()
        server.fingerprint = ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))
    print(json.dumps({"url": "%s://%s:%d" % ("http" if args.plain_http else "https", args.listen, server.server_address[1]),
                      "cafile": cert, "pid": os.getpid()}), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
