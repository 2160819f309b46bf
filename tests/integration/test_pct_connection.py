# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpufleet.hygiene.pct over the simulated fleet, with ansible-playbook and ansible.

The connection test playbook runs with pipelining on and off and with both methods;
then the failure modes: stopped and missing containers, a node that is down, a failed
login, an unknown or wrong host key, no pct on the node, a vmid that is not an integer.
Last, sixteen containers of one node at once against sshd's default limits.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import subprocess

import pytest
import simfleet  # tests/lib, on pytest's pythonpath (pytest.ini)
from conftest import INVENTORY, PORT, REPO, STATE, VENV_BIN

PLAYBOOK = os.path.join(REPO, "tests", "integration", "targets", "connection_pct", "test_connection.yml")
LARGE = 32 * 1024 * 1024


def sha1(path):
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def local_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("pct-files")
    (d / "binary.bin").write_bytes(bytes(range(256)) * 64 + b"\x00\r\n\x1b\xff")
    with open(d / "large.bin", "wb") as f:
        f.writelines(os.urandom(1 << 20) for _block in range(LARGE // (1 << 20)))
    for name in ("binary", "large"):
        (d / ("%s.sha1" % name)).write_text(sha1(d / ("%s.bin" % name)))
    return d


def recap(output):
    return dict(re.findall(r"^(\S+)\s+:\s+(ok=\d+\s+changed=\d+\s+unreachable=\d+\s+failed=\d+)", output, re.MULTILINE))


@pytest.mark.parametrize("method, pipelining, become_method", [
    ("pct", True, "sudo"),
    ("pct", False, "su"),
    ("lxc-attach", True, "sudo"),
    ("lxc-attach", False, "su"),
])
def test_connection_playbook(ansible_cli, local_dir, method, pipelining, become_method):
    extra = {"target_hosts": "train-100,train-200", "local_dir": str(local_dir), "large_size": LARGE,
             "ansible_pct_method": method, "become_method_under_test": become_method}
    if not pipelining:
        extra["ansible_pct_pipelining"] = False
    res = ansible_cli("ansible-playbook", "-i", INVENTORY, PLAYBOOK, "-vvv", "-e", json.dumps(extra))
    assert res.returncode == 0, res.stdout[-6000:]
    rc = recap(res.stdout)
    assert set(rc) == {"train-100", "train-200"}
    assert all("unreachable=0" in v and "failed=0" in v for v in rc.values()), rc
    for host in ("train-100", "train-200"):
        assert sha1(local_dir / host / "binary back.bin") == (local_dir / "binary.sha1").read_text()
        assert sha1(local_dir / host / "large back.bin") == (local_dir / "large.sha1").read_text()
    # Modules travel over stdin with pipelining; as files (put_file of AnsiballZ_*) without.
    # (become_method su never pipelines, in ansible-core itself: it is tested without.)
    module_puts = [line for line in res.stdout.splitlines() if re.search(r"\bPUT .*AnsiballZ_", line)]
    if pipelining:
        assert module_puts == []
    else:
        assert module_puts
    assert ("pct exec 100 --" in res.stdout) == (method == "pct")
    assert ("lxc-attach -n 100 -P" in res.stdout) == (method == "lxc-attach")


def command_env(res, host):
    """{name: value} from an ad hoc `ansible HOST -m command -a /usr/bin/env` run."""
    assert res.returncode == 0, res.stdout
    out = res.stdout.split("%s | CHANGED | rc=0 >>\n" % host, 1)[1]
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.mark.parametrize("method", ["pct", "lxc-attach"])
def test_same_environment_on_pve_8_and_9(ansible_cli, node_ssh, method):
    """PVE 8's pct exec passes the node's login environment to the container, PVE 9's clears it
    (the stand-in follows pve2's pve/version): a task meets the same few variables on both."""
    version = os.path.join(STATE, "nodes", "pve2", "pve", "version")
    seen = {}
    try:
        for pve in ("8", "9"):
            with open(version, "w") as f:
                f.write(pve + "\n")
            # The stand-in really behaves as that version: the node session's SSH_CONNECTION reaches
            # a bare `pct exec` on 8 only.
            raw = node_ssh("pve2", "pct exec 200 -- /usr/bin/env").stdout.decode()
            assert ("SSH_CONNECTION=" in raw) == (pve == "8"), raw
            res = ansible_cli("ansible", "-i", INVENTORY, "train-200", "-m", "ansible.builtin.command", "-a", "/usr/bin/env",
                              "-e", "ansible_pct_method=%s" % method)
            seen[pve] = command_env(res, "train-200")
    finally:
        os.unlink(version)
    assert seen["8"] == seen["9"]
    env = seen["9"]
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["HOME"] == "/root"
    assert not [k for k in env if k.startswith(("SSH_", "GPUFLEET_SIM_"))], env


def test_one_master_per_node(ansible_cli, tmp_path):
    cp = tmp_path / "cp"
    try:
        res = ansible_cli("ansible", "-i", INVENTORY, "train-100,train-200,train-201", "-m", "ansible.builtin.ping",
                          "-e", "ansible_pct_control_path_dir=%s" % cp, "-f", "5")
        assert res.returncode == 0, res.stdout
        res = ansible_cli("ansible", "-i", INVENTORY, "train-200,train-201", "-m", "ansible.builtin.command",
                          "-a", "true", "-e", "ansible_pct_control_path_dir=%s" % cp)
        assert res.returncode == 0, res.stdout
        sockets = sorted(n for n in os.listdir(cp) if "." not in n)
        assert len(sockets) == 2          # pve1 and pve2: two nodes, three containers, two runs
        # Each node's lock, taken by the connection that opened its master (the others waited), and
        # its session slots (max_sessions).
        assert sorted(os.listdir(cp)) == sorted(sockets + [s + ".lock" for s in sockets] + [s + ".slots" for s in sockets])
        procs = subprocess.run(["ps", "-ww", "-eo", "args"], stdout=subprocess.PIPE, text=True, check=True).stdout
        masters = [line for line in procs.splitlines() if line.startswith("ssh: %s/" % cp) and "[mux]" in line]
        assert len(masters) == 2, procs
    finally:
        close_masters(cp)


def close_masters(cp):
    for sock in glob.glob(str(cp / "pct-*")):
        if "." in os.path.basename(sock):
            continue  # a node's .lock file or .slots directory
        subprocess.run(["ssh", "-o", "ControlPath=%s" % sock, "-O", "exit", "x"], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def bad_inventory(fleet, tmp_path_factory):
    """Hosts that must fail, each in its own way, next to the fleet's inventory."""
    d = tmp_path_factory.mktemp("bad-inv")
    client = fleet["client"]
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / "stranger")], check=True)
    with open(os.path.join(client, "known_hosts")) as f:
        keys = f.read().splitlines()
    # pve1's address with pve2's host key: a host key that does not match
    (d / "wrong_known_hosts").write_text(keys[1].replace("[127.0.1.2]", "[127.0.1.1]") + "\n")
    (d / "empty_known_hosts").write_text("")
    pve1 = {"ansible_pct_node_host": "127.0.1.1", "ansible_pct_node_port": PORT}
    hosts = {
        "ghost-999": dict(pve1, ansible_pct_vmid=999),
        "ghost-999-attach": dict(pve1, ansible_pct_vmid=999, ansible_pct_method="lxc-attach"),
        "stopped-attach": dict(pve1, ansible_pct_vmid=101, ansible_pct_method="lxc-attach"),
        "node-down": {"ansible_pct_node_host": "127.0.1.250", "ansible_pct_node_port": 2222, "ansible_pct_vmid": 100},
        "bad-key": dict(pve1, ansible_pct_vmid=100, ansible_pct_private_key_file=str(d / "stranger")),
        "wrong-hostkey": dict(pve1, ansible_pct_vmid=100, ansible_pct_known_hosts_file=str(d / "wrong_known_hosts")),
        "unknown-hostkey": dict(pve1, ansible_pct_vmid=100, ansible_pct_known_hosts_file=str(d / "empty_known_hosts")),
        "no-pct": dict(pve1, ansible_pct_vmid=100, ansible_pct_path="/usr/local/bin/no-such-pct"),
        "bad-vmid": dict(pve1, ansible_pct_vmid="100; touch /tmp/gpufleet-pwned"),
    }
    inv = {"pve_containers": {"hosts": hosts}}
    path = d / "bad.yml"
    path.write_text(json.dumps(inv))
    return path


DISTINCT_FAILURES = [
    ("train-101", "UNREACHABLE", r"container 101 on node root@127\.0\.1\.1:%d is not running \(stopped\)" % PORT),
    ("stopped-attach", "UNREACHABLE", r"container 101 on node root@127\.0\.1\.1:%d is not running \(stopped\)" % PORT),
    ("ghost-999", "UNREACHABLE", r"container 999 does not exist on node pve1 \(root@127\.0\.1\.1:%d\): check the vmid" % PORT),
    ("ghost-999-attach", "UNREACHABLE", r"container 999 does not exist on node pve1 \(root@127\.0\.1\.1:%d\): check the vmid" % PORT),
    ("node-down", "UNREACHABLE", r"node root@127\.0\.1\.250:2222 is unreachable: .*Connection refused"),
    ("bad-key", "UNREACHABLE", r"SSH authentication to node root@127\.0\.1\.1:%d failed: .*Permission denied" % PORT),
    ("wrong-hostkey", "UNREACHABLE", r"host key of node root@127\.0\.1\.1:%d is unknown or does not match" % PORT),
    ("unknown-hostkey", "UNREACHABLE", r"host key of node root@127\.0\.1\.1:%d is unknown or does not match" % PORT),
    ("no-pct", "UNREACHABLE", r"/usr/local/bin/no-such-pct not found on node root@127\.0\.1\.1:%d" % PORT),
    ("bad-vmid", "FAILED", r"vmid must be an integer from 100 to 999999999"),
]


# Named by the host alone: the messages hold the port, which is another in each pytest-xdist worker.
@pytest.mark.parametrize("host, status, message", DISTINCT_FAILURES, ids=[case[0] for case in DISTINCT_FAILURES])
def test_distinct_failures(ansible_cli, bad_inventory, tmp_path, host, status, message):
    # A fresh control path directory: an existing master to the node would carry the
    # connection past a wrong key or host key, as ControlMaster does for any ssh client.
    try:
        res = ansible_cli("ansible", "-i", INVENTORY, "-i", str(bad_inventory), host, "-m", "ansible.builtin.ping",
                          "-e", "ansible_pct_control_path_dir=%s" % (tmp_path / "cp"))
    finally:
        close_masters(tmp_path / "cp")
    assert res.returncode in (2, 4), res.stdout
    assert re.search(r"^%s \| %s!" % (re.escape(host), status), res.stdout, re.MULTILINE), res.stdout
    assert re.search(message, res.stdout), res.stdout
    assert not os.path.exists("/tmp/gpufleet-pwned")


def test_started_container_becomes_reachable(ansible_cli):
    """pct start through the node (ssh to the pve_nodes host), then the container answers."""
    try:
        res = ansible_cli("ansible", "-i", INVENTORY, "pve1", "-m", "ansible.builtin.command", "-a", "pct start 101")
        assert res.returncode == 0, res.stdout
        res = ansible_cli("ansible", "-i", INVENTORY, "train-101", "-m", "ansible.builtin.command", "-a", "cat /etc/hostname")
        assert res.returncode == 0 and "train-101" in res.stdout, res.stdout
    finally:
        res = ansible_cli("ansible", "-i", INVENTORY, "pve1", "-m", "ansible.builtin.command", "-a", "pct stop 101")
        assert res.returncode == 0, res.stdout


def test_a_command_printing_ssh_s_refusal_runs_once(ansible_cli, tmp_path):
    """A command in the container that exits 255 with no output and prints sshd's refusal line on
    its stderr, over the real sshd of a node: it ran, so it is not run again (only ssh's own log
    says whether sshd refused)."""
    runs = "/root/gpufleet-refusal-runs"
    line = "kex_exchange_identification: Connection closed by remote host"
    try:
        ansible_cli("ansible", "-i", INVENTORY, "train-100", "-m", "ansible.builtin.raw", "-a", "rm -f %s" % runs)
        res = ansible_cli("ansible", "-i", INVENTORY, "train-100", "-m", "ansible.builtin.raw",
                          "-a", "echo ran >> %s; echo '%s' >&2; exit 255" % (runs, line),
                          "-e", "ansible_pct_control_path_dir=%s" % (tmp_path / "cp"))
        assert res.returncode != 0, res.stdout
        res = ansible_cli("ansible", "-i", INVENTORY, "train-100", "-m", "ansible.builtin.command", "-a", "cat %s" % runs)
        assert res.returncode == 0, res.stdout
        assert res.stdout.split(">>\n", 1)[1].split() == ["ran"], res.stdout
    finally:
        ansible_cli("ansible", "-i", INVENTORY, "train-100", "-m", "ansible.builtin.raw", "-a", "rm -f %s" % runs)
        close_masters(tmp_path / "cp")


# ------------------------------------------------------------------ sshd's default limits

BUSY_STATE = os.path.abspath(os.environ.get("GPUFLEET_SESSIONS_STATE", "/var/tmp/gpufleet-sim-sessions"))
BUSY_PORT = os.environ.get("GPUFLEET_SESSIONS_PORT", "2895")  # 2890 is test_job_libraries.py's
BUSY_PLAY = """
- name: Every container of one node at once
  hosts: pve_containers
  gather_facts: false
  tasks:
    - name: Hold a session on the node for a while, in all of them together
      ansible.builtin.command:
        argv: [/bin/sh, -c, "sleep {{ hold }}; cat /etc/hostname"]
      register: held
      changed_when: false
    - name: Each answered from inside itself
      ansible.builtin.assert:
        that: held.stdout == inventory_hostname
"""


@pytest.fixture(scope="module")
def busy_node(tmp_path_factory):
    """One node, sixteen containers, the node's sshd at OpenSSH's defaults."""
    work = tmp_path_factory.mktemp("sessions")
    (work / "play.yml").write_text(BUSY_PLAY)
    with simfleet.running(BUSY_STATE, nodes=1, containers=16, scenario="basic", inventory=work / "inventory",
                          port=BUSY_PORT) as (info, env):
        yield {"info": info, "env": env, "work": work, "inventory": str(work / "inventory" / "fleet.yml")}


def busy_play(node, name, forks, hold, **options):
    """Run the play over all sixteen containers with a fresh master; every ssh client's own
    messages (refusals included) go to a log of this run (ssh -E). (output, log text)"""
    cp, log = node["work"] / ("cp-" + name), node["work"] / ("ssh-%s.log" % name)
    extra = dict({"hold": hold, "ansible_pct_control_path_dir": str(cp), "ansible_pct_ssh_extra_args": "-E %s" % log}, **options)
    env = dict(node["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    try:
        res = subprocess.run([os.path.join(VENV_BIN, "ansible-playbook"), "-i", node["inventory"], str(node["work"] / "play.yml"),
                              "-f", str(forks), "-e", json.dumps(extra)], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, check=False)
    finally:
        close_masters(cp)
    return res, log.read_text() if log.exists() else ""


def test_sshd_runs_with_openssh_default_limits(busy_node):
    config = os.path.join(BUSY_STATE, "nodes", "pve1", "sshd_config")
    effective = subprocess.run(["/usr/sbin/sshd", "-T", "-f", config], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "maxsessions 10\n" in effective and "maxstartups 10:30:100\n" in effective, effective
    assert len(busy_node["info"]["nodes"][0]["containers"]) == 16


def test_sixteen_forks_on_one_node_stay_within_its_sessions(busy_node):
    """Sixteen containers of one node through one master at once, with the default max_sessions:
    every one succeeds, and the node's sshd never refused a session nor dropped a connection."""
    res, log = busy_play(busy_node, "limited", forks=16, hold=2)
    assert res.returncode == 0, res.stdout[-6000:]
    rc = recap(res.stdout)
    assert len(rc) == 16 and all(v.startswith("ok=2 ") and "unreachable=0" in v and "failed=0" in v for v in rc.values()), rc
    assert "Session open refused" not in log and "disabling multiplexing" not in log, log
    assert "exchange_identification" not in log, log


def test_without_the_limit_the_node_refuses_sessions(busy_node):
    """The control: the same play with the limit above sshd's MaxSessions and no retries meets
    the node's refusals (ssh then falls back to connections of its own), so the test above
    would fail without max_sessions."""
    _res, log = busy_play(busy_node, "unlimited", forks=16, hold=5, ansible_pct_max_sessions=16, ansible_pct_refusal_retries=0)
    assert "mux_client_request_session: session request failed: Session open refused by peer" in log, log
