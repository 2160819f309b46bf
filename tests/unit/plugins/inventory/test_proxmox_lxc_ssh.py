# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One SSH policy: the proxmox_lxc inventory (source=ssh) reaches a node as the pct connection
does. The same options give the same ssh command line; the real OpenSSH client, run by each of
them against one SSH server (paramiko's server side, holding a host key of its own), refuses an
unknown or changed host key in the same words, with the same fix."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys

import paramiko
import pytest
import yaml
from ansible import constants as C
from ansible.errors import AnsibleConnectionFailure
from ansible.inventory.data import InventoryData
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, inventory_loader
from loopback import loopback_server  # tests/lib, on pytest's pythonpath

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils import _ssh, _ssh_options

LISTING = "%-10s %-10s %-12s %-20s\n" * 2 % ("VMID", "Status", "Lock", "Name", 100, "running", "", "train-100")
CONFIG = "@@gpufleet-pct-config 100\nhostname: train-100\ndev0: /dev/nvidia0\n"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
TABLE = "plugins/plugin_utils/_ssh_options.py"
FRAGMENT = "plugins/doc_fragments/ssh_options.py"


def inventory_plugin(**options):
    plugin = inventory_loader.get("gpufleet.hygiene.proxmox_lxc")
    plugin.inventory = InventoryData()
    plugin.set_options(direct=dict({"plugin": "gpufleet.hygiene.proxmox_lxc"}, **options))
    return plugin


def connection_for(hostvars):
    """The pct connection of a discovered container, given the variables the inventory set on it."""
    conn = connection_loader.get("gpufleet.hygiene.pct", PlayContext(), None)
    conn.set_options(var_options=dict(hostvars))
    return conn


def test_the_containers_connection_runs_the_ssh_the_inventory_ran(monkeypatch, tmp_path):
    """Every SSH option of the inventory's file reaches ssh, and the connection of a container it
    found, given nothing but that container's variables, builds the very same command line for its
    node: same user, port, key, known hosts, host-key rule, extra arguments, and the same master
    socket (the inventory's master serves the play's first tasks)."""
    ran = []

    def fake_run(argv, idle_timeout):
        ran.append((list(argv), idle_timeout))
        return 0, (LISTING if "list" in argv[-1] else CONFIG).encode(), b""

    monkeypatch.setattr(_ssh, "run", fake_run)
    plugin = inventory_plugin(
        nodes=[{"name": "pve1", "host": "10.0.0.11", "port": 2201, "user": "ops"}], private_key_file="/keys/id ed25519",
        known_hosts_file="/keys/known hosts", connect_timeout=4, ssh_extra_args="-o 'ProxyJump=bastion one' -v",
        control_path_dir=str(tmp_path / "cp"), control_persist=90, ssh_executable="/usr/bin/ssh")
    results = plugin._discover()
    plugin._populate(results)
    assert results["failed"] == [] and [r["vmid"] for r in results["nodes"]["pve1"]["containers"]] == [100]
    (argv, idle), _configs = ran
    assert idle == 4
    remote = argv[-1]
    assert argv == [
        "/usr/bin/ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=4", "-o", "ControlMaster=auto",
        "-o", "ControlPersist=90s", "-o", "ControlPath=%s" % _ssh.control_path(str(tmp_path / "cp"), "ops", "10.0.0.11", 2201),
        "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=/keys/known hosts", "-o", "IdentitiesOnly=yes",
        "-i", "/keys/id ed25519", "-p", "2201", "-l", "ops", "-o", "ProxyJump=bastion one", "-v", "--", "10.0.0.11", remote]
    assert oct(os.stat(tmp_path / "cp").st_mode & 0o777) == "0o700"  # the connection's own rule for its sockets
    hostvars = plugin.inventory.get_host("train-100").get_vars()
    assert connection_for(hostvars)._ssh_argv(remote) == argv


def test_ansible_s_host_key_checking_off_is_off_for_both(monkeypatch, tmp_path):
    """ANSIBLE_HOST_KEY_CHECKING=False (ansible's own setting) turns host-key checking off for the
    inventory's ssh, as it does for the connection's, and the containers are told so."""
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    ran = []
    monkeypatch.setattr(_ssh, "run", lambda argv, idle: ran.append(argv) or (0, LISTING.encode() if len(ran) == 1 else CONFIG.encode(), b""))
    plugin = inventory_plugin(nodes=["pve1"], control_path_dir=str(tmp_path))
    plugin._populate(plugin._discover())
    assert "StrictHostKeyChecking=no" in ran[0] and "UserKnownHostsFile=/dev/null" in ran[0]
    hostvars = plugin.inventory.get_host("train-100").get_vars()
    assert hostvars["ansible_pct_host_key_checking"] is False
    assert connection_for(hostvars)._ssh_argv(ran[0][-1]) == ran[0]


def test_a_setting_of_container_vars_is_the_inventory_s_too(monkeypatch, tmp_path):
    """An ansible_pct_* of container_vars naming an SSH setting is what the containers' connection
    uses: the inventory reaches the node with it too (one master socket directory, here)."""
    ran = []
    monkeypatch.setattr(_ssh, "run", lambda argv, idle: ran.append(argv) or (0, b"", b""))
    plugin = inventory_plugin(nodes=["pve1"], control_path_dir=str(tmp_path / "mine"),
                              container_vars={"ansible_pct_control_path_dir": str(tmp_path / "theirs"),
                                              "ansible_pct_connect_timeout": "3"})
    plugin._discover()
    assert "ControlPath=%s" % _ssh.control_path(str(tmp_path / "theirs"), "root", "pve1", 22) in ran[0]
    assert "ConnectTimeout=3" in ran[0]
    assert not os.path.exists(tmp_path / "mine")


def test_settings_left_at_their_defaults_are_not_given_to_the_containers(monkeypatch, tmp_path):
    """Only what was set reaches the containers' variables: a connection's other sources
    (ansible_host_key_checking, ansible_ssh_private_key_file in group_vars) keep working."""
    monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    monkeypatch.setattr(_ssh, "run", lambda argv, idle: (0, LISTING.encode() if "list" in argv[-1] else CONFIG.encode(), b""))
    plugin = inventory_plugin(nodes=["pve1"], known_hosts_file="/keys/kh", container_vars={"ansible_pct_control_path_dir": str(tmp_path)})
    plugin._populate(plugin._discover())
    hostvars = plugin.inventory.get_host("train-100").get_vars()
    assert sorted(k for k in hostvars if k.startswith("ansible_pct_")) == [
        "ansible_pct_control_path_dir", "ansible_pct_known_hosts_file", "ansible_pct_node_host", "ansible_pct_node_port",
        "ansible_pct_node_user", "ansible_pct_vmid"]


def generator(root):
    """scripts/ssh_options.py, pointed at the checkout (or a copy of its table and fragment) in root."""
    spec = importlib.util.spec_from_file_location("ssh_options_script", os.path.join(REPO, "scripts", "ssh_options.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.ROOT = str(root)
    script.TABLE = os.path.join(str(root), TABLE)
    script.FRAGMENT = os.path.join(str(root), FRAGMENT)
    return script


def test_the_ssh_options_fragment_is_the_one_the_table_makes(capsys):
    """plugins/doc_fragments/ssh_options.py is what scripts/ssh_options.py writes from the table
    (plugin_utils/_ssh_options.py): a hand edit of the fragment, or a row changed without running
    the script, fails here with the diff."""
    assert generator(REPO).main(["--check"]) == 0, capsys.readouterr().out


def test_the_check_names_a_fragment_edited_by_hand_and_the_script_puts_it_back(tmp_path, capsys):
    """In a copy of the table, the script writes the fragment; a default then edited there by hand
    fails --check, which names the file and prints the diff; the script writes the table's text back."""
    os.makedirs(os.path.dirname(str(tmp_path / TABLE)))
    os.makedirs(os.path.dirname(str(tmp_path / FRAGMENT)))
    shutil.copy(os.path.join(REPO, TABLE), str(tmp_path / TABLE))
    script = generator(tmp_path)
    assert script.main([]) == 0
    fragment = tmp_path / FRAGMENT
    text = fragment.read_text()
    block = text.index('CONNECTION = r"""')
    assert text[block:].count("    default: 60\n") == 1  # control_persist's
    fragment.write_text(text[:block] + text[block:].replace("    default: 60\n", "    default: 90\n"))
    capsys.readouterr()
    assert script.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert FRAGMENT in err and "-    default: 90\n+    default: 60\n" in out, (out, err)
    assert script.main([]) == 0
    assert fragment.read_text() == text
    assert script.main(["--check"]) == 0


@pytest.mark.parametrize("plugin", _ssh_options.PLUGINS)
def test_each_plugin_takes_every_ssh_option_of_the_table(plugin):
    """The options ansible loads for each plugin (its documentation with the fragment merged in,
    what get_option reads) hold every row of the table with the table's type, default, ansible.cfg
    keys, environment variables and, for the connection, host variables; the inventory takes no
    host variables. Neither plugin documents one of these options itself: its own would replace
    the fragment's whole."""
    loader, name = {"connection": (connection_loader, "gpufleet.hygiene.pct"),
                    "inventory": (inventory_loader, "gpufleet.hygiene.proxmox_lxc")}[plugin]
    cls = loader.get(name, class_only=True)
    loaded = C.config.get_configuration_definitions(plugin, cls._load_name)
    for row in _ssh_options.OPTIONS:
        option = row.name_in(plugin)
        assert option in loaded, (plugin, option)
        got = {key: loaded[option].get(key) for key in ("type", "default", "ini", "env", "vars")}
        want = {"type": row.type, "default": row.default, "ini": [{"section": s, "key": k} for s, k in row.ini],
                "env": [{"name": n} for n in row.env],
                "vars": [{"name": n} for n in row.vars] if plugin == "connection" else None}
        assert got == want, (plugin, option, got, want)
    own = yaml.safe_load(sys.modules[cls.__module__].DOCUMENTATION)["options"]
    assert sorted(set(own) & {row.name_in(plugin) for row in _ssh_options.OPTIONS}) == []


def test_the_sources_that_win_are_the_plugins_own_named_after_the_option():
    """Where several are set, ansible takes the last of an option's host variables, ansible.cfg keys
    and environment variables: for every option those are the plugins' own, named after the
    connection's option - ansible_pct_<name> (which the inventory also gives the containers and
    reads from container_vars), [gpufleet_pct] <name>, GPUFLEET_PCT_<NAME>. ansible's own
    (ansible_user, [defaults] host_key_checking, ...) apply only where these are unset."""
    for row in _ssh_options.OPTIONS:
        assert row.vars[-1] == row.container_var == "ansible_pct_" + row.name, row.name
        assert row.ini[-1] == ("gpufleet_pct", row.name) and row.env[-1] == "GPUFLEET_PCT_" + row.name.upper(), row.name


def test_no_ssh_client_fails_the_inventory_with_what_to_install(tmp_path):
    from ansible.errors import AnsibleError

    plugin = inventory_plugin(nodes=["pve1"], ssh_executable=str(tmp_path / "no-ssh"), control_path_dir=str(tmp_path))
    with pytest.raises(AnsibleError, match=r"OpenSSH client, and '.*no-ssh' \(ssh_executable\) is not found on this controller: "
                                           r"install it \(openssh-client"):
        plugin._discover()


@pytest.fixture(scope="module")
def ssh_server(tmp_path_factory):
    """An SSH server on 127.0.0.1 (paramiko's server side) with an ed25519 host key of its own; it
    accepts no login. Yields (port, its known_hosts line)."""
    d = tmp_path_factory.mktemp("server")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "host")], check=True)
    host_key = paramiko.Ed25519Key(filename=str(d / "host"))

    class Refuse(paramiko.ServerInterface):
        def get_allowed_auths(self, username):
            return "publickey"

        def check_auth_publickey(self, username, key):
            return paramiko.AUTH_FAILED

    transports = []

    def serve(client):
        transport = paramiko.Transport(client)
        transport.add_server_key(host_key)
        transports.append(transport)
        try:
            transport.start_server(server=Refuse())
        except (paramiko.SSHException, EOFError, OSError):
            transport.close()

    with loopback_server(serve) as port:
        with open(str(d / "host.pub")) as f:
            line = "[127.0.0.1]:%d %s" % (port, " ".join(f.read().split()[:2]))
        yield port, line
    for transport in transports:
        transport.close()


def both_refuse(ssh_server, tmp_path, monkeypatch, known_hosts):
    """(the inventory's warning for the node, the connection's error for a container of it), both
    with this known_hosts file, the real ssh client and a control path directory of their own."""
    port, _line = ssh_server
    key = tmp_path / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    kh = tmp_path / "known_hosts"
    kh.write_text(known_hosts)
    warnings = []
    module = __import__(type(inventory_plugin(nodes=["x"])).__module__, fromlist=["display"])
    monkeypatch.setattr(module.display, "warning", warnings.append)
    plugin = inventory_plugin(nodes=[{"name": "pve1", "host": "127.0.0.1", "port": port}], known_hosts_file=str(kh),
                              private_key_file=str(key), control_path_dir=str(tmp_path / "inv-cp"))
    results = plugin._discover()
    assert results["failed"] == ["pve1"] and results["nodes"] == {}
    conn = connection_for({"ansible_pct_node_host": "127.0.0.1", "ansible_pct_node_port": port, "ansible_pct_vmid": 100,
                           "ansible_pct_known_hosts_file": str(kh), "ansible_pct_private_key_file": str(key),
                           "ansible_pct_control_path_dir": str(tmp_path / "conn-cp"), "ansible_pct_refusal_retries": 0})
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure) as exc:
        conn.exec_command("true")
    [warning] = warnings
    return warning, str(exc.value)


def test_an_unknown_node_key_is_refused_by_both_with_one_fix(ssh_server, tmp_path, monkeypatch):
    port, _line = ssh_server
    warning, error = both_refuse(ssh_server, tmp_path, monkeypatch, "")
    fix = _ssh.fix(_pct.HOST_KEY_UNKNOWN, "127.0.0.1", port, str(tmp_path / "known_hosts"))
    assert warning.startswith("proxmox_lxc: node pve1 (root@127.0.0.1:%d) skipped: host key unknown (host key checking is on): "
                              "No ED25519 host key is known for [127.0.0.1]:%d" % (port, port)), warning
    assert warning.endswith("; to fix: " + fix), warning
    assert error.startswith("gpufleet.hygiene.pct: host key of node root@127.0.0.1:%d is unknown or does not match" % port), error
    assert "No ED25519 host key is known for [127.0.0.1]:%d" % port in error and error.endswith("; to fix: " + fix), error
    assert "ssh-keyscan -p %d 127.0.0.1" % port in fix and str(tmp_path / "known_hosts") in fix


def test_a_changed_node_key_is_refused_by_both_with_one_fix(ssh_server, tmp_path, monkeypatch):
    port, line = ssh_server
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with open(str(other) + ".pub") as f:
        wrong = "[127.0.0.1]:%d %s\n" % (port, " ".join(f.read().split()[:2]))
    warning, error = both_refuse(ssh_server, tmp_path, monkeypatch, wrong)
    fix = _ssh.fix(_pct.HOST_KEY, "127.0.0.1", port, str(tmp_path / "known_hosts"))
    assert "skipped: host key does not match: " in warning and "REMOTE HOST IDENTIFICATION HAS CHANGED" in warning, warning
    assert "is unknown or does not match" in error and "REMOTE HOST IDENTIFICATION HAS CHANGED" in error, error
    assert warning.endswith("; to fix: " + fix) and error.endswith("; to fix: " + fix), (warning, error)
    assert "ssh-keygen -R '[127.0.0.1]:%d'" % port in fix


def test_a_known_node_key_passes_both_and_the_login_is_what_fails(ssh_server, tmp_path, monkeypatch):
    """With the node's key in known_hosts, both go past the host key: the server's refusal of the
    login is what each reports, again in the same words."""
    port, line = ssh_server
    warning, error = both_refuse(ssh_server, tmp_path, monkeypatch, line + "\n")
    fix = _ssh.fix(_pct.AUTH, "127.0.0.1", port, private_key_file=str(tmp_path / "id"))
    assert "skipped: SSH authentication failed: " in warning and "Permission denied (publickey)" in warning, warning
    assert "SSH authentication to node root@127.0.0.1:%d failed" % port in error, error
    assert warning.endswith("; to fix: " + fix) and error.endswith("; to fix: " + fix), (warning, error)


def test_an_unreachable_node_is_named_by_both_with_one_fix(tmp_path, monkeypatch):
    """Nothing listens on the port: ssh's own "Connection refused", unreachable for both."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    warning, error = both_refuse((port, ""), tmp_path, monkeypatch, "")
    fix = _ssh.fix(_pct.UNREACHABLE, "127.0.0.1", port)
    assert "skipped: unreachable: " in warning and "Connection refused" in warning and warning.endswith("; to fix: " + fix), warning
    assert "node root@127.0.0.1:%d is unreachable" % port in error and error.endswith("; to fix: " + fix), error


def test_a_node_that_stops_answering_is_given_up_after_the_timeout():
    """The inventory's runs of ssh end when no output came for connect_timeout seconds (what
    paramiko's channel timeout did), with what came before."""
    import sys
    import time

    started = time.monotonic()
    rc, out, err = _ssh.run([sys.executable, "-c", "import time; print('x', flush=True); time.sleep(30)"], 0.5)
    assert (rc, out) == (None, b"x\n") and b"no answer for 0.5s" in err
    assert time.monotonic() - started < 5


def test_a_master_left_in_the_background_does_not_hold_the_run():
    """ssh's master connection, forked into the background by ControlPersist, keeps its stderr: the
    command's run ends with the command all the same."""
    import time

    started = time.monotonic()
    rc, out, _err = _ssh.run(["/bin/sh", "-c", "(sleep 5 >/dev/null </dev/null &); echo ok"], 10)
    assert (rc, out) == (0, b"ok\n")
    assert time.monotonic() - started < 3
