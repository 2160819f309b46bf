# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Unit tests of the pct connection plugin, loaded through connection_loader.

ssh is replaced by a recorder that keeps the argv and runs a real local process giving the
stdout/stderr/exit status wanted, so pipes, stdin streaming and become handling are real.
Quoting is proven by running the remote command string through /bin/sh, as the node's
login shell would, with a pct that prints the argv it received.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import time
import types

import pytest
from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound, AnsibleOptionsError
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import become_loader, connection_loader, init_plugin_loader

COLLECTIONS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".ansible", "collections"))
HOSTILE = [
    "a b",
    "it's",
    'say "hi"',
    "x; rm -rf /tmp/nothing",
    "$(touch /tmp/pwned) `id` ${HOME}",
    "line1\nline2",
    "back\\slash | & > < * ? ~ #",
    "-n",
    "",
]


# The collection loader must be in place before anything imports ansible_collections as a
# plain package (pytest imports every test module first; this one is collected early).
init_plugin_loader([COLLECTIONS])


def make_conn(**options):
    opts = {"ansible_pct_node_host": "pve1.example.com", "ansible_pct_vmid": 101}
    opts.update(options)
    conn = connection_loader.get("gpufleet.hygiene.pct", PlayContext(), None)
    conn.set_options(var_options=opts)
    return conn


class Recorder:
    """Stands in for subprocess.Popen inside the plugin: records argv, runs a real process."""

    def __init__(self, rc=0, stdout=b"", stderr=b"", echo_stdin=False, master_ok=True, master_delay=0.0):
        self.calls = []
        self.rc, self.stdout, self.stderr, self.echo_stdin = rc, stdout, stderr, echo_stdin
        # The node's shared master (subprocess.run of `ssh … true`): made (its socket appears
        # after master_delay seconds) or not (the node does not answer).
        self.masters, self.master_ok, self.master_delay = [], master_ok, master_delay

    def run(self, argv, **kwargs):
        self.masters.append(list(argv))
        time.sleep(self.master_delay)
        if self.master_ok:
            socket = next(a for a in argv if a.startswith("ControlPath=")).split("=", 1)[1]
            open(socket, "w").close()
        return subprocess.CompletedProcess(argv, 0 if self.master_ok else 255)

    def __call__(self, argv, **kwargs):
        self.calls.append((list(argv), kwargs))
        script = (
            "import sys\n"
            "sys.stdout.buffer.write(%r); sys.stdout.flush()\n"
            "sys.stdout.buffer.write(sys.stdin.buffer.read() if %r else b''); sys.stdout.flush()\n"
            "sys.stderr.buffer.write(%r); sys.exit(%d)\n" % (self.stdout, self.echo_stdin, self.stderr, self.rc)
        )
        return subprocess.Popen([sys.executable, "-c", script], **kwargs)

    @property
    def argv(self):
        return self.calls[-1][0]


@pytest.fixture
def popen(monkeypatch):
    def install(**kw):
        rec = Recorder(**kw)
        patch_popen(monkeypatch, rec)
        return rec
    return install


def patch_popen(monkeypatch, rec):
    """Replace subprocess.Popen as the plugin module (loaded by connection_loader) sees it."""
    module = sys.modules[type(make_conn()).__module__]
    fake = types.SimpleNamespace(PIPE=subprocess.PIPE, DEVNULL=subprocess.DEVNULL, TimeoutExpired=subprocess.TimeoutExpired, Popen=rec,
                                 run=getattr(rec, "run", None))
    monkeypatch.setattr(module, "subprocess", fake)


# Every command starts in the container under env -i with these only (PVE 8 and 9 alike).
ENV = ["/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]
ENV_LINE = " ".join(ENV)


def expected_ssh(remote, cp, extra=()):
    return [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "-o", "ControlMaster=auto",
        "-o", "ControlPersist=60s", "-o", "ControlPath=%s" % cp, "-o", "StrictHostKeyChecking=yes",
        "-p", "22", "-l", "root", *extra, "--", "pve1.example.com", remote,
    ]


def node_shell_argv(remote, tmp_path):
    """Run the remote string through /bin/sh with `pct` replaced by an argv printer."""
    printer = tmp_path / "pct"
    printer.write_text("#!%s\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n" % sys.executable)
    printer.chmod(0o755)
    env = dict(os.environ, PATH="%s:%s" % (tmp_path, os.environ["PATH"]))
    out = subprocess.run(["/bin/sh", "-c", remote], env=env, stdout=subprocess.PIPE, check=True).stdout
    return json.loads(out)


def test_plugin_identity_and_defaults():
    conn = make_conn()
    assert type(conn).__name__ == "Connection"
    assert conn.transport == "gpufleet.hygiene.pct"
    assert type(conn).has_pipelining is True
    assert conn.get_option("pipelining") is True
    assert conn.is_pipelining_enabled() is True
    assert conn.get_option("host_key_checking") is True
    assert conn.get_option("method") == "pct"
    assert conn.get_option("node_port") == 22 and conn.get_option("node_user") == "root"


def test_pipelining_can_be_turned_off():
    conn = make_conn(ansible_pct_pipelining=False)
    assert conn.is_pipelining_enabled() is False


@pytest.mark.parametrize("good, want", [(100, 100), ("101", 101), (999999999, 999999999), ("4242", 4242)])
def test_vmid_accepts_integers(good, want):
    conn = make_conn(ansible_pct_vmid=good)
    conn._connect()
    assert conn._vmid == want


@pytest.mark.parametrize("bad", [
    "100; rm -rf /", "1e2", 100.0, True, -1, 99, 1000000000, "abc", "0x64", " 100", "100\n", "$(id)", [100], "",
])
def test_vmid_refuses_everything_else(bad):
    conn = make_conn(ansible_pct_vmid=bad)
    with pytest.raises(AnsibleOptionsError, match="vmid must be an integer"):
        conn._connect()


@pytest.mark.parametrize("names, want", [
    ({"pve_vmid": 102}, 102),
    ({"gpufleet_vmid": "103"}, 103),
    ({"pve_vmid": 102, "gpufleet_vmid": 103, "ansible_pct_vmid": 104}, 104),  # the connection's own name wins
])
def test_vmid_aliases_of_older_inventories(names, want):
    opts = {"ansible_pct_node_host": "pve1.example.com"}
    opts.update(names)
    conn = connection_loader.get("gpufleet.hygiene.pct", PlayContext(), None)
    conn.set_options(var_options=opts)
    conn._connect()
    assert conn._vmid == want


@pytest.mark.parametrize("bad", ["root -oProxyCommand=touch\\ /tmp/x", "-oProxyCommand=id", "root;id", "$(id)", "ro ot",
                                 "root\n", "", "`id`"])
def test_node_user_refuses_what_is_no_user_name(bad):
    conn = make_conn(ansible_pct_vmid=100, ansible_pct_node_user=bad)
    with pytest.raises(AnsibleOptionsError, match="node_user must be a user name"):
        conn._connect()


@pytest.mark.parametrize("good", ["root", "svc-pve", "ci_runner", "user.name", "admin@pam", "machine$"])
def test_node_user_accepts_user_names(good):
    conn = make_conn(ansible_pct_vmid=100, ansible_pct_node_user=good)
    conn._connect()


def test_exec_argv_exact(popen, tmp_path):
    rec = popen(stdout=b"ok\n")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    rc, out, err = conn.exec_command("echo hi")
    assert (rc, out, err) == (0, b"ok\n", b"")
    cp = rec.argv[rec.argv.index("-o", 9) + 1].split("=", 1)[1]
    assert os.path.dirname(cp) == str(tmp_path)
    assert rec.argv == expected_ssh("pct exec 101 -- %s /bin/sh -c 'echo hi'" % ENV_LINE, cp)
    assert rec.calls[-1][1]["stdin"] == subprocess.PIPE


@pytest.mark.parametrize("cmd", HOSTILE)
def test_exec_quotes_hostile_commands(popen, tmp_path, cmd):
    rec = popen()
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    conn.exec_command(cmd)
    remote = rec.argv[-1]
    assert shlex.split(remote) == ["pct", "exec", "101", "--", *ENV, "/bin/sh", "-c", cmd]
    # what the node's shell really makes of it: exactly one argv, nothing executed
    assert node_shell_argv(remote, tmp_path) == ["exec", "101", "--", *ENV, "/bin/sh", "-c", cmd]
    assert not os.path.exists("/tmp/pwned")


@pytest.mark.parametrize("path", HOSTILE[:-1] + ["/tmp/dir with space/it's \"q\".bin"])
def test_put_file_streams_stdin_with_quoted_path(popen, tmp_path, path):
    rec = popen()
    src = tmp_path / "payload.bin"
    src.write_bytes(os.urandom(4096))
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    conn.put_file(str(src), path)
    argv, kwargs = rec.calls[-1]
    assert node_shell_argv(argv[-1], tmp_path) == ["exec", "101", "--", *ENV, "/bin/sh", "-c", "cat > %s" % shlex.quote(path)]
    # the target shell sees exactly the path, as one word
    assert shlex.split(shlex.split(argv[-1])[-1]) == ["cat", ">", path]
    # streamed: ssh's stdin is the open file itself, not a pipe fed from memory
    assert getattr(kwargs["stdin"], "name", None) == str(src).encode()


def test_put_file_missing_local_file(popen, tmp_path):
    popen()
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleFileNotFound, match="cannot read local file"):
        conn.put_file(str(tmp_path / "nope"), "/tmp/x")


@pytest.mark.parametrize("path", ["/tmp/a b/c", "/tmp/it's", "/tmp/$(id)", "-rf"])
def test_fetch_file_writes_stdout_to_file(popen, tmp_path, path):
    rec = popen(stdout=b"\x00\x01binary\xff")
    dest = tmp_path / "out.bin"
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    conn.fetch_file(path, str(dest))
    argv, kwargs = rec.calls[-1]
    assert node_shell_argv(argv[-1], tmp_path) == ["exec", "101", "--", *ENV, "cat", "--", path]
    assert kwargs["stdout"] is not subprocess.PIPE
    assert dest.read_bytes() == b"\x00\x01binary\xff"


def test_fetch_missing_remote_file(popen, tmp_path):
    popen(rc=1, stderr=b"cat: /tmp/nope: No such file or directory\n")
    dest = tmp_path / "out"
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleFileNotFound, match="/tmp/nope"):
        conn.fetch_file("/tmp/nope", str(dest))
    assert not dest.exists()


def test_control_path_shared_per_node_not_per_container(popen, tmp_path):
    rec = popen()
    paths = []
    for host, vmid in (("pve1", 100), ("pve1", 101), ("pve2", 100)):
        conn = make_conn(ansible_pct_node_host=host, ansible_pct_vmid=vmid, ansible_pct_control_path_dir=str(tmp_path))
        conn._connect()
        conn.exec_command("true")
        paths.append([a for a in rec.argv if a.startswith("ControlPath=")][0])
    assert paths[0] == paths[1] != paths[2]


def test_containers_of_one_node_starting_together_open_one_master(popen, tmp_path):
    """A cold start: four containers of pve1 connect at once; one opens the node's master (ssh …
    true, kept by ControlPersist) while the others wait for it, then all use it. pve2 gets its own."""
    rec = popen(master_delay=0.3)
    conns = [make_conn(ansible_pct_vmid=vmid, ansible_pct_control_path_dir=str(tmp_path)) for vmid in (101, 102, 103, 104)]
    conns.append(make_conn(ansible_pct_node_host="pve2.example.com", ansible_pct_control_path_dir=str(tmp_path)))
    threads = [threading.Thread(target=c._connect) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(c._connected for c in conns)
    hosts = sorted(argv[-2] for argv in rec.masters)
    assert hosts == ["pve1.example.com", "pve2.example.com"], rec.masters
    [pve1] = [argv for argv in rec.masters if argv[-2] == "pve1.example.com"]
    cp = next(a for a in pve1 if a.startswith("ControlPath=")).split("=", 1)[1]
    assert pve1 == expected_ssh("true", cp) and os.path.dirname(cp) == str(tmp_path)
    # Warm: a later connection finds the socket and opens nothing.
    make_conn(ansible_pct_vmid=105, ansible_pct_control_path_dir=str(tmp_path))._connect()
    assert len(rec.masters) == 2


def test_a_master_that_cannot_be_opened_leaves_each_connection_its_own(popen, tmp_path):
    """The node does not answer: no socket; each later connection tries again (none waits on a
    failed one), and the command's own failure says what is wrong."""
    rec = popen(master_ok=False, rc=255, stderr=b"ssh: connect to host pve1.example.com port 22: Connection refused\r\n")
    for vmid in (101, 102):
        conn = make_conn(ansible_pct_vmid=vmid, ansible_pct_control_path_dir=str(tmp_path))
        conn._connect()
        with pytest.raises(AnsibleConnectionFailure, match="is unreachable"):
            conn.exec_command("true")
    assert len(rec.masters) == 2


def test_options_reach_ssh(popen, tmp_path):
    rec = popen()
    conn = make_conn(
        ansible_pct_node_port=2222, ansible_pct_node_user="ops", ansible_pct_private_key_file="/keys/id ed25519",
        ansible_pct_known_hosts_file="/keys/known hosts", ansible_pct_connect_timeout=3, ansible_pct_control_persist=5,
        ansible_pct_ssh_extra_args="-o 'ProxyJump=bastion one' -v", ansible_pct_control_path_dir=str(tmp_path),
    )
    conn._connect()
    conn.exec_command("true")
    argv = rec.argv
    assert argv[argv.index("-p") + 1] == "2222" and argv[argv.index("-l") + 1] == "ops"
    assert argv[argv.index("-i") + 1] == "/keys/id ed25519"
    assert "UserKnownHostsFile=/keys/known hosts" in argv and "IdentitiesOnly=yes" in argv
    assert "ConnectTimeout=3" in argv and "ControlPersist=5s" in argv
    assert argv[argv.index("--") - 3:argv.index("--")] == ["-o", "ProxyJump=bastion one", "-v"]
    assert "-tt" not in argv and "-t" not in argv


def test_host_key_checking_off(popen, tmp_path):
    rec = popen()
    conn = make_conn(ansible_pct_host_key_checking=False, ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    conn.exec_command("true")
    assert "StrictHostKeyChecking=no" in rec.argv and "UserKnownHostsFile=/dev/null" in rec.argv


def test_lxc_attach_method(popen, tmp_path):
    rec = popen()
    conn = make_conn(ansible_pct_method="lxc-attach", ansible_pct_lxc_path="/var/lib/my lxc",
                     ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    conn.exec_command("echo $HOME")
    assert shlex.split(rec.argv[-1]) == ["lxc-attach", "-n", "101", "-P", "/var/lib/my lxc", "--", *ENV, "/bin/sh", "-c", "echo $HOME"]


@pytest.mark.parametrize("rc, stderr, match", [
    (255, b"ssh: connect to host pve1.example.com port 22: Connection refused\r\n", "node root@pve1.example.com:22 is unreachable"),
    (255, b"ssh: Could not resolve hostname pve1.example.com: Name or service not known\r\n", "is unreachable"),
    (255, b"root@pve1.example.com: Permission denied (publickey).\r\n", "SSH authentication to node root@pve1.example.com:22 failed"),
    (255, b"Host key verification failed.\r\n", "host key of node .* does not match"),
    (255, b"container '101' not running!\n", "container 101 on node .* is not running"),
    (255, b"Configuration file 'nodes/pve1/lxc/101.conf' does not exist\n", "container 101 does not exist on node"),
    (127, b"bash: line 1: pct: command not found\n", "pct not found on node"),
    (127, b"sh: 1: pct: not found\n", "pct not found on node"),
])
def test_distinct_errors(popen, tmp_path, rc, stderr, match):
    popen(rc=rc, stderr=stderr)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match=match):
        conn.exec_command("true")


@pytest.mark.parametrize("rc, stdout, stderr", [
    (255, b"", b"my tool failed\n"),                          # the user's command exits 255
    (1, b"", b"container '999' not running!\n"),              # another container's message, printed by a command
    (127, b"", b"/bin/sh: 1: frobnicate: not found\n"),       # a command missing in the container
    (255, b"partial output", b"Connection refused\n"),        # output came: the transport worked
])
def test_command_failures_are_not_transport_errors(popen, tmp_path, rc, stdout, stderr):
    popen(rc=rc, stdout=stdout, stderr=stderr)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    assert conn.exec_command("x") == (rc, stdout, stderr)


def test_put_file_on_stopped_container(popen, tmp_path):
    popen(rc=255, stderr=b"container '101' not running!\n")
    src = tmp_path / "f"
    src.write_bytes(b"x")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match="not running"):
        conn.put_file(str(src), "/tmp/f")


def test_ssh_binary_missing(tmp_path):
    conn = make_conn(ansible_pct_ssh_executable=str(tmp_path / "no-ssh"), ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match="cannot run") as exc:
        conn.exec_command("true")
    assert isinstance(exc.value.__cause__, OSError)


@pytest.mark.parametrize("missing, var_options", [
    ("node_host", {"ansible_pct_vmid": 100}),
    ("vmid", {"ansible_pct_node_host": "pve1"}),
])
def test_required_options(missing, var_options):
    conn = connection_loader.get("gpufleet.hygiene.pct", PlayContext(), None)
    with pytest.raises(AnsibleError, match="Required config '%s'" % missing):
        conn.set_options(var_options=var_options)


def test_become_success_marker_is_stripped_and_stdin_follows(monkeypatch, tmp_path):
    become = become_loader.get("sudo")
    become.set_options(direct={"become_user": "trainer"})
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn.set_become_plugin(become)
    conn._connect()
    cmd = become.build_become_command("cat", conn._shell)
    assert become.success in cmd
    rec = Recorder(stdout=("%s\n" % become.success).encode(), echo_stdin=True)
    patch_popen(monkeypatch, rec)
    rc, out, err = conn.exec_command(cmd, in_data=b"module payload")
    assert (rc, out, err) == (0, b"module payload", b"")
    assert shlex.split(rec.argv[-1])[-1] == cmd


def test_reset_stops_the_node_master(popen, tmp_path):
    rec = popen()
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    conn.reset()
    assert rec.argv[-4:] == ["-O", "exit", "--", "pve1.example.com"]
    assert conn.connected is False


class Sequence(Recorder):
    """A Recorder whose calls answer in turn: [(rc, stdout, stderr), ...]."""

    def __init__(self, answers):
        super().__init__()
        self.answers = list(answers)

    def __call__(self, argv, **kwargs):
        self.rc, self.stdout, self.stderr = self.answers.pop(0)
        return super().__call__(argv, **kwargs)


def test_connection_lost_under_a_command(monkeypatch, tmp_path):
    """ssh exits 255 with no output at all and the node no longer answers: unreachable, said so."""
    rec = Sequence([(255, b"", b""), (255, b"", b"ssh: connect to host pve1.example.com port 22: Connection refused\r\n")])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match=r"connection to node root@pve1\.example\.com:22 was lost during a "
                       r"command in container 101 .* does not answer now: ssh: connect to host .*Connection refused\. .*run again"):
        conn.exec_command("true")
    assert shlex.split(rec.calls[-1][0][-1]) == ["pct", "status", "101"]  # the probe


def test_container_stopped_under_a_command(monkeypatch, tmp_path):
    """lxc-attach killed by the container's stop (137, no output): the container is named as stopped."""
    rec = Sequence([(137, b"", b""), (0, b"status: stopped\n", b"")])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match=r"container 101 on node root@pve1\.example\.com:22 stopped during a "
                       r"command \(exit status 137, no output\).*start it \(pct start 101\) and run again"):
        conn.exec_command("true")


@pytest.mark.parametrize("rc", [1, 137, 255])
def test_silent_failure_of_the_command_itself(monkeypatch, tmp_path, rc):
    """The same silent failure while the node answers and the container runs is the command's own."""
    rec = Sequence([(rc, b"", b""), (0, b"status: running\n", b"")])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    assert conn.exec_command("exit %d" % rc) == (rc, b"", b"")


@pytest.mark.parametrize("status, match", [
    ((0, b"status: stopped\n", b""), r"container 101 on node root@pve1\.example\.com:22 is not running \(stopped\)"),
    ((255, b"", b"Configuration file 'nodes/pve1/lxc/101.conf' does not exist\n"), r"container 101 does not exist on node"),
    ((0, b"status: running\n", b""), r"lxc-attach to container 101 on node .* failed: lxc-attach: 101: Failed to get init pid"),
])
def test_lxc_attach_refusal_is_told_apart_by_pct_status(monkeypatch, tmp_path, status, match):
    """lxc-attach says the same of a stopped and of a missing container: `pct status` tells which."""
    rec = Sequence([(1, b"", b"lxc-attach: 101: Failed to get init pid\n"), status])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_method="lxc-attach", ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match=match):
        conn.exec_command("true")
    assert shlex.split(rec.calls[-1][0][-1]) == ["pct", "status", "101"]


def on_node(conn):
    """What node_readiness's action does before its module run."""
    conn.set_option("run_on", "node")
    conn._connect()
    return conn


def test_run_on_node_is_no_variable_and_runs_on_the_node_only_when_set(popen, tmp_path):
    """Only node_readiness's action switches to the node: a variable cannot (or every task of a
    play would run on the node as root)."""
    rec = popen(stdout=b"ok\n")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_run_on="node")
    assert conn.get_option("run_on") == "container"
    on_node(conn).exec_command("echo hi")
    cp = rec.argv[rec.argv.index("-o", 9) + 1].split("=", 1)[1]
    assert rec.argv == expected_ssh("/bin/sh -c 'echo hi'", cp)  # no pct exec: the node itself


def test_run_on_node_refuses_become(popen, tmp_path):
    from ansible.plugins.loader import become_loader

    popen(stdout=b"ok\n")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn.set_become_plugin(become_loader.get("ansible.builtin.sudo"))
    on_node(conn)
    with pytest.raises(AnsibleConnectionFailure, match=r"privilege escalation \(become\) is not done on the node"):
        conn.exec_command("echo hi")
