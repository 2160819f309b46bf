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

import contextlib
import fcntl
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
from ansible.plugins.loader import become_loader, connection_loader
from loopback import loopback_server  # tests/lib, on pytest's pythonpath

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


def make_conn(**options):
    opts = {"ansible_pct_node_host": "pve1.example.com", "ansible_pct_vmid": 101}
    opts.update(options)
    conn = connection_loader.get("gpufleet.hygiene.pct", PlayContext(), None)
    conn.set_options(var_options=opts)
    return conn


class Recorder:
    """Stands in for subprocess.Popen inside the plugin: records argv, runs a real process."""

    def __init__(self, rc=0, stdout=b"", stderr=b"", echo_stdin=False, master_ok=True, master_delay=0.0, ssh_log=b""):
        self.calls, self.logs = [], []
        self.rc, self.stdout, self.stderr, self.echo_stdin = rc, stdout, stderr, echo_stdin
        # What ssh itself says (its -E file, as the real ssh writes it): apart from the command's stderr.
        self.ssh_log = ssh_log
        # The node's shared master (subprocess.run of `ssh … true`): made (its socket appears
        # after master_delay seconds) or not (the node does not answer).
        self.masters, self.master_ok, self.master_delay = [], master_ok, master_delay

    def take_log(self, argv, text=b""):
        """argv without ssh's -E FILE (recorded in self.logs), text written to that file as ssh would."""
        argv = list(argv)
        if "-E" not in argv:  # ssh -O exit: no command, no retry
            return argv
        at = argv.index("-E")
        path = argv[at + 1]
        self.logs.append(path)
        with open(path, "ab") as f:
            f.write(text)
        return argv[:at] + argv[at + 2:]

    def run(self, argv, **kwargs):
        argv = self.take_log(argv)
        self.masters.append(list(argv))
        time.sleep(self.master_delay)
        if self.master_ok:
            socket = next(a for a in argv if a.startswith("ControlPath=")).split("=", 1)[1]
            open(socket, "w").close()
        return subprocess.CompletedProcess(argv, 0 if self.master_ok else 255)

    def __call__(self, argv, **kwargs):
        self.calls.append((self.take_log(argv, self.ssh_log), kwargs))
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
def test_node_user_accepts_user_names(popen, tmp_path, good):
    rec = popen(stdout=b"ok\n")
    conn = make_conn(ansible_pct_vmid=100, ansible_pct_node_user=good, ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    assert conn.exec_command("true")[0] == 0
    # the name reaches ssh as one argument of -l, before the "--" that ends ssh's options
    argv = rec.argv
    assert argv[argv.index("-l") + 1] == good and argv.index("-l") < argv.index("--")
    assert argv[argv.index("--") + 1:] == ["pve1.example.com", "pct exec 100 -- %s /bin/sh -c true" % ENV_LINE]


@pytest.mark.parametrize("extra, refused", [(0, False), (1, True)])
def test_a_control_path_dir_too_deep_for_ssh_s_socket_is_refused_with_what_to_set(popen, tmp_path, extra, refused):
    """ssh listens on the control path plus 17 bytes, in a sun_path of 107: a socket path of 90
    bytes works, one of 91 would make ssh fail with `unix_listener: ... too long` (rc 255, empty
    output). 91 is refused before ssh runs, naming the option."""
    rec = popen(stdout=b"ok\n")
    deep = str(tmp_path) + "/" + "d" * (90 + extra - len(str(tmp_path)) - len("/") - len("/pct-0123456789abcdef"))
    os.mkdir(deep, 0o700)
    conn = make_conn(ansible_pct_control_path_dir=deep)
    if not refused:
        conn._connect()
        assert conn.exec_command("true")[0] == 0
        assert len(rec.argv[rec.argv.index("-o", 9) + 1].split("=", 1)[1]) == 90
        return
    with pytest.raises(AnsibleConnectionFailure) as exc:
        conn._connect()
        conn.exec_command("true")
    assert str(exc.value).startswith("control_path_dir %s is too long for ssh's control sockets: their paths (%s/pct-" % (deep, deep))
    assert "would be 91 bytes, and ssh takes at most 90; set a shorter directory (the connection's ansible_pct_control_path_dir" in str(exc.value)
    assert rec.calls == [] and rec.masters == []  # ssh never ran


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
    (255, b"Configuration file 'nodes/pve1/lxc/101.conf' does not exist\n",
     r"container 101 does not exist on node pve1 \(root@pve1\.example\.com:22\): check the vmid \(ansible_pct_vmid\)"),
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
    """A Recorder whose calls answer in turn: [(rc, stdout, stderr[, what ssh itself logs]), ...]."""

    def __init__(self, answers):
        super().__init__()
        self.answers = list(answers)

    def __call__(self, argv, **kwargs):
        self.rc, self.stdout, self.stderr, self.ssh_log = (tuple(self.answers.pop(0)) + (b"",))[:4]
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
    ((255, b"", b"Configuration file 'nodes/pve1/lxc/101.conf' does not exist\n"),
     r"container 101 does not exist on node pve1 \(root@pve1\.example\.com:22\): check the vmid"),
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


# ------------------------------------------------------------------ the node's sshd limits

def plugin_module():
    return sys.modules[type(make_conn()).__module__]


KEX_CLOSED = b"kex_exchange_identification: Connection closed by remote host\r\nConnection closed by 127.0.1.1 port 22\r\n"
KEX_RESET = b"kex_exchange_identification: read: Connection reset by peer\r\nConnection reset by 127.0.1.1 port 22\r\n"
MUX_REFUSED = b"mux_client_request_session: session request failed: Session open refused by peer\r\n"
FALLBACK = b"ControlSocket /root/.ansible/cp/pct-0123 already exists, disabling multiplexing\r\n"


@pytest.mark.parametrize("rc, stdout, stderr, want", [
    # Past MaxStartups sshd drops the connection before the identification exchange: nothing ran.
    (255, b"", KEX_CLOSED, True),
    (255, b"", KEX_RESET, True),
    (255, b"", b"ssh_exchange_identification: read: Connection reset by peer\r\n", True),
    # The master refused the session; ssh fell back to its own connection, which MaxStartups dropped.
    (255, b"", MUX_REFUSED + FALLBACK + KEX_CLOSED, True),
    # The fallback connection ran the command: whatever it did is its own.
    (255, b"", MUX_REFUSED + FALLBACK, False),
    (0, b"ok\n", MUX_REFUSED + FALLBACK, False),
    (1, b"", MUX_REFUSED + FALLBACK, False),
    # Output means the command ran; any other exit status is the command's.
    (255, b"partial", KEX_CLOSED, False),
    (1, b"", KEX_CLOSED, False),
    # A reset after the session opened, a login or host key failure, a node that is down: never again.
    (255, b"", b"Read from remote host pve1: Connection reset by peer\r\nclient_loop: send disconnect: Broken pipe\r\n", False),
    (255, b"", b"Connection reset by 127.0.1.1 port 22\r\n", False),
    (255, b"", b"root@pve1: Permission denied (publickey).\r\n", False),
    (255, b"", b"Host key verification failed.\r\n", False),
    (255, b"", b"ssh: connect to host pve1 port 22: Connection refused\r\n", False),
    (255, b"", b"", False),
    (255, b"", None, False),
])
def test_refused_before_start_only_when_nothing_can_have_run(rc, stdout, stderr, want):
    assert plugin_module().refused_before_start(rc, stdout, stderr) is want


def test_retry_delay_doubles_up_to_its_cap_with_jitter():
    delay = plugin_module().retry_delay
    for attempt, top in [(1, 0.25), (2, 0.5), (3, 1.0), (4, 2.0), (5, 4.0), (9, 4.0)]:
        seen = [delay(attempt) for _n in range(50)]
        assert all(top / 2 <= d <= top for d in seen), (attempt, seen)
        assert len(set(seen)) > 1  # jitter: forks refused together do not come back together


def test_slots_are_shared_by_descriptors_and_freed_on_close(tmp_path):
    acquire = plugin_module().acquire_slot
    held = [acquire(str(tmp_path), 2, timeout=1) for _n in range(2)]
    assert None not in held
    assert sorted(os.listdir(tmp_path)) == ["0", "1"]
    started = time.monotonic()
    assert acquire(str(tmp_path), 2, timeout=0.3) is None
    assert time.monotonic() - started >= 0.3
    os.close(held.pop())
    again = acquire(str(tmp_path), 2, timeout=1)
    assert again is not None
    # No ssh started while a slot is held keeps it (a ControlPersist master lives on in the background).
    assert fcntl.fcntl(again, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    for fd in held + [again]:
        os.close(fd)


def test_a_slot_held_by_another_process_is_busy_until_it_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fds = [os.open(os.path.join(sys.argv[1], n), os.O_RDWR | os.O_CREAT) for n in ('0', '1')]\n"
        "[fcntl.flock(fd, fcntl.LOCK_EX) for fd in fds]\n"
        "print('held', flush=True); time.sleep(60)\n"), str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == b"held\n"
        assert plugin_module().acquire_slot(str(tmp_path), 2, timeout=0.2) is None
    finally:
        holder.kill()
        holder.wait()
    fd = plugin_module().acquire_slot(str(tmp_path), 2, timeout=2)
    assert fd is not None
    os.close(fd)


def _hold_a_slot(directory, limit, log, seconds):
    fd = plugin_module().acquire_slot(directory, limit, timeout=30)
    with open(log, "a") as f:
        f.write("+ %f\n" % time.monotonic())
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write("- %f\n" % time.monotonic())
    os.close(fd)


def test_forked_workers_never_hold_more_slots_than_the_limit(tmp_path):
    """Twelve forks (as ansible's workers are), three slots: never more than three at once, and
    three at once indeed (the limit is a limit, not a lock)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    slots, log = tmp_path / "slots", tmp_path / "log"
    slots.mkdir()
    workers = [ctx.Process(target=_hold_a_slot, args=(str(slots), 3, str(log), 0.2)) for _n in range(12)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0] * 12
    events = sorted((float(t), sign) for sign, t in (line.split() for line in log.read_text().splitlines()))
    assert len(events) == 24
    # A release logged at the same instant as the next take sorts first ("+" > "-" is false): count honestly.
    level, peak = 0, 0
    for _t, sign in sorted(events, key=lambda e: (e[0], e[1] == "+")):
        level += 1 if sign == "+" else -1
        peak = max(peak, level)
    assert peak == 3


def test_a_command_holds_one_of_the_node_sessions_while_it_runs(monkeypatch, tmp_path):
    seen = []

    class Probe(Recorder):
        def __call__(self, argv, **kwargs):
            cp = next(a for a in argv if a.startswith("ControlPath=")).split("=", 1)[1]
            seen.append(plugin_module().acquire_slot(cp + ".slots", 1, timeout=0.05))
            return super().__call__(argv, **kwargs)

    patch_popen(monkeypatch, Probe(stdout=b"ok\n"))
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_max_sessions=1)
    conn._connect()
    assert conn.exec_command("true")[1] == b"ok\n"
    assert seen == [None]  # the one slot was the command's
    fd = plugin_module().acquire_slot(str(tmp_path / os.path.basename(conn._control_path())) + ".slots", 1, timeout=0.05)
    assert fd is not None  # and it is free again
    os.close(fd)


def test_no_limit_with_max_sessions_0(popen, tmp_path):
    popen(stdout=b"ok\n")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_max_sessions=0)
    conn._connect()
    assert conn.exec_command("true")[1] == b"ok\n"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".slots")]


def test_waiting_for_a_session_is_bounded(popen, tmp_path):
    rec = popen(stdout=b"ok\n")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_max_sessions=1, ansible_pct_command_timeout=1)
    conn._connect()
    busy = plugin_module().acquire_slot(conn._control_path() + ".slots", 1)
    try:
        with pytest.raises(AnsibleConnectionFailure, match=r"waited 1s for one of the 1 sessions \(max_sessions\) of node "
                                                           r"root@pve1\.example\.com:22"):
            conn.exec_command("true")
    finally:
        os.close(busy)
    assert rec.calls == []  # ssh never ran


@pytest.fixture
def no_pause(monkeypatch):
    pauses = []
    monkeypatch.setattr(plugin_module(), "retry_delay", lambda attempt: pauses.append(attempt) or 0.0)
    return pauses


def test_a_command_refused_before_it_started_is_tried_again(monkeypatch, tmp_path, no_pause):
    rec = Sequence([(255, b"", b"", KEX_CLOSED), (255, b"", b"", MUX_REFUSED + FALLBACK + KEX_RESET), (0, b"ran once\n", b"")])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    assert conn.exec_command("echo ran once", in_data=b"module") == (0, b"ran once\n", b"")
    assert len(rec.calls) == 3 and no_pause == [1, 2]
    assert len({tuple(argv) for argv, _kw in rec.calls}) == 1  # the same command each time


def test_refusals_past_the_retries_are_reported(monkeypatch, tmp_path, no_pause):
    rec = Sequence([(255, b"", b"", KEX_CLOSED)] * 3)
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_refusal_retries=2)
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match=r"node root@pve1\.example\.com:22 is unreachable: "
                                                       r"kex_exchange_identification: Connection closed by remote host"):
        conn.exec_command("true")
    assert len(rec.calls) == 3 and no_pause == [1, 2]


@pytest.mark.parametrize("answer", [
    (255, b"", MUX_REFUSED + FALLBACK),                      # the fallback connection may have run it
    (255, b"", b"Read from remote host pve1: Connection reset by peer\r\n"),
    (255, b"half", KEX_CLOSED),
])
def test_a_command_that_may_have_started_is_never_run_again(monkeypatch, tmp_path, no_pause, answer):
    rec = Sequence([answer, (0, b"status: running\n", b"")])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    try:
        assert conn.exec_command("true")[0] == 255
    except AnsibleConnectionFailure as exc:  # a reset after the session opened: the connection was lost
        assert "Connection reset by peer" in str(exc)
    assert [shlex.split(argv[-1])[:2] for argv, _kw in rec.calls][0] == ["pct", "exec"]
    assert all("exec" not in shlex.split(argv[-1]) for argv, _kw in rec.calls[1:])  # at most the status probe
    assert no_pause == []


def test_refusal_retries_0_tries_once(monkeypatch, tmp_path, no_pause):
    rec = Sequence([(255, b"", b"", KEX_CLOSED)])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_refusal_retries=0)
    conn._connect()
    with pytest.raises(AnsibleConnectionFailure, match="is unreachable"):
        conn.exec_command("true")
    assert len(rec.calls) == 1 and no_pause == []


def test_file_transfers_are_tried_again_from_the_start(monkeypatch, tmp_path, no_pause):
    """The refused try consumed its stdin all the same: the next one still streams the whole file."""
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(300000))
    received = tmp_path / "received.bin"
    calls = []

    def popen(argv, **kwargs):
        calls.append(argv)
        log = argv[argv.index("-E") + 1]  # ssh's own messages: where the refusal is said
        script = ("import shutil, sys\n"
                  "shutil.copyfileobj(sys.stdin.buffer, open(%r, 'wb') if %r else open('/dev/null', 'wb'))\n"
                  "open(%r, 'ab').write(%r); sys.exit(%d)\n") % (
            str(received), len(calls) == 2, log, KEX_CLOSED if len(calls) == 1 else b"", 255 if len(calls) == 1 else 0)
        return subprocess.Popen([sys.executable, "-c", script], **kwargs)

    patch_popen(monkeypatch, popen)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    open(conn._control_path(), "w").close()  # the node's master is up
    conn._connect()
    conn.put_file(str(src), "/tmp/dst.bin")
    assert len(calls) == 2 and no_pause == [1]
    assert received.read_bytes() == src.read_bytes()
    rec = Sequence([(255, b"", b"", KEX_RESET), (0, b"whole file\n", b"")])
    patch_popen(monkeypatch, rec)
    conn.fetch_file("/etc/hostname", str(tmp_path / "back"))
    assert (tmp_path / "back").read_bytes() == b"whole file\n"
    assert len(rec.calls) == 2 and no_pause == [1, 1]


def test_opening_the_master_is_tried_again_when_refused(monkeypatch, tmp_path, no_pause):
    rec = Recorder(stdout=b"ok\n")
    answers = [255, 255, 0]

    def run(argv, **kwargs):
        rc = answers.pop(0)
        rec.masters.append(rec.take_log(argv, KEX_CLOSED if rc else b""))
        if rc == 0:
            open(next(a for a in argv if a.startswith("ControlPath=")).split("=", 1)[1], "w").close()
        return subprocess.CompletedProcess(argv, rc)

    rec.run = run
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    conn._connect()
    assert len(rec.masters) == 3 and no_pause == [1, 2]
    assert os.path.exists(conn._control_path())


# ------------------------------------------------------------------ the control-path directory

@pytest.fixture
def shared_tmp():
    """A directory every user can write, as /tmp (pytest's own are root's, 0700), removed afterwards."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="pct-cp-", dir="/tmp")
    os.chmod(d, 0o1777)
    yield d
    shutil.rmtree(d)


def as_nobody(*argv):
    subprocess.run(["runuser", "-u", "nobody", "--", *argv], check=True)


@pytest.mark.parametrize("planted", ["slot", "master lock"])
def test_a_control_path_directory_of_another_user_is_refused(popen, shared_tmp, planted):
    """An unprivileged user makes the control-path directory before root's run and plants a link
    where a slot file or the master's lock file will be created: root must refuse the directory
    and create nothing where the link points."""
    rec = popen(stdout=b"ok\n")
    cpdir = os.path.join(shared_tmp, "cp")
    target = os.path.join(shared_tmp, "root-only", "planted")
    os.mkdir(os.path.dirname(target), 0o700)  # root's, as /etc is
    as_nobody("mkdir", "-m", "0700", cpdir)
    conn = make_conn(ansible_pct_control_path_dir=cpdir)
    link = conn._control_path() + (".slots/0" if planted == "slot" else ".lock")
    if planted == "slot":
        as_nobody("mkdir", "-m", "0700", os.path.dirname(link))
    as_nobody("ln", "-s", target, link)
    with pytest.raises(AnsibleConnectionFailure, match=r"control_path_dir %s belongs to uid 65534, not to this user \(uid 0\)"
                                                       r".*Remove it \(or chown 0 it\) or choose another control_path_dir"
                                                       % cpdir):
        conn._connect()
        conn.exec_command("true")
    assert not os.path.lexists(target)
    assert rec.calls == [] and rec.masters == []  # no ssh ran


@pytest.mark.parametrize("mode", [0o755, 0o733, 0o1777])
def test_a_control_path_directory_others_can_enter_is_refused(popen, tmp_path, mode):
    rec = popen(stdout=b"ok\n")
    cpdir = tmp_path / "cp"
    cpdir.mkdir()
    cpdir.chmod(mode)
    with pytest.raises(AnsibleConnectionFailure, match=r"control_path_dir %s has mode %04o: others can enter or write it\. "
                                                       r"chmod 0700 it" % (cpdir, mode)):
        make_conn(ansible_pct_control_path_dir=str(cpdir))._connect()
    assert rec.calls == [] and rec.masters == []


def test_a_control_path_directory_that_is_a_link_is_refused(popen, tmp_path):
    popen(stdout=b"ok\n")
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "cp").symlink_to(tmp_path / "real")
    with pytest.raises(AnsibleConnectionFailure, match=r"control_path_dir .*/cp is not a directory of its own"):
        make_conn(ansible_pct_control_path_dir=str(tmp_path / "cp"))._connect()


def test_a_missing_control_path_directory_is_made_private(popen, tmp_path):
    popen(stdout=b"ok\n")
    cpdir = tmp_path / "a" / "cp"
    conn = make_conn(ansible_pct_control_path_dir=str(cpdir))
    conn._connect()
    assert conn.exec_command("true")[1] == b"ok\n"
    for d in (cpdir, cpdir / (os.path.basename(conn._control_path()) + ".slots")):
        st = os.lstat(d)
        assert st.st_uid == os.geteuid() and (st.st_mode & 0o777) == 0o700, (d, oct(st.st_mode))


@pytest.mark.parametrize("planted", ["slot", "master lock"])
def test_lock_files_are_never_opened_through_a_link(popen, tmp_path, planted):
    """Inside a private directory too, a link in a lock file's place is not followed (O_NOFOLLOW):
    no file appears where it points, and the descriptors are close-on-exec."""
    rec = popen(stdout=b"ok\n")
    cpdir = tmp_path / "cp"
    cpdir.mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    conn = make_conn(ansible_pct_control_path_dir=str(cpdir), ansible_pct_max_sessions=1)
    slots = conn._control_path() + ".slots"
    os.mkdir(slots, 0o700)
    os.symlink(target, os.path.join(slots, "0") if planted == "slot" else conn._control_path() + ".lock")
    if planted == "slot":
        with pytest.raises(AnsibleConnectionFailure, match=r"cannot take a session slot in .*\.slots: .*Too many levels of symbolic links"):
            conn._connect()  # opening the node's master takes a slot
            conn.exec_command("true")
    else:
        conn._connect()  # no master lock: each connection opens its own master, as ssh would
        assert conn.exec_command("true")[1] == b"ok\n"
        assert rec.masters == []
    assert not os.path.lexists(target)


# ------------------------------------------------------------------ refusals: ssh's word, not the command's

def test_a_command_that_prints_ssh_s_refusal_itself_is_not_run_again(monkeypatch, tmp_path, no_pause):
    """The remote command exits 255 with no output and prints sshd's refusal line on its stderr:
    ssh's own log (-E) says nothing of the kind, so it ran, and it is never run again."""
    rec = Sequence([(255, b"", KEX_CLOSED, b""), (0, b"status: running\n", b"")])
    patch_popen(monkeypatch, rec)
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path))
    open(conn._control_path(), "w").close()  # the node's master is up
    conn._connect()
    # What the failure is reported as is not the point here: how often the command ran is.
    with contextlib.suppress(AnsibleConnectionFailure):
        conn.exec_command("echo 'kex_exchange_identification: Connection closed by remote host' >&2; exit 255")
    execs = [argv for argv, _kw in rec.calls if shlex.split(argv[-1])[:2] == ["pct", "exec"]]
    assert len(execs) == 1 and no_pause == []


def test_ssh_s_own_messages_go_to_a_log_of_each_try(popen, tmp_path):
    rec = popen(stdout=b"ok\n", stderr=b"from the command\n", ssh_log=b"Warning: Permanently added 'pve1' to the list\r\n")
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path), ansible_pct_ssh_extra_args="-o ServerAliveInterval=5")
    open(conn._control_path(), "w").close()
    conn._connect()
    rc, out, err = conn.exec_command("true")
    assert (rc, out) == (0, b"ok\n")
    # The command's stderr, then what ssh said: as ssh alone would have printed both on its stderr.
    assert err == b"from the command\nWarning: Permanently added 'pve1' to the list\r\n"
    argv = rec.calls[-1][0]
    [log] = rec.logs
    assert os.path.dirname(log) == str(tmp_path) and os.path.basename(log).startswith(".ssh-")
    # -E comes after ssh_extra_args, so that one there cannot take ssh's messages away from it.
    raw = argv[:argv.index("--")] + ["-E", log] + argv[argv.index("--"):]
    assert raw[raw.index("ServerAliveInterval=5") + 1:raw.index("--")] == ["-E", log]
    assert not os.path.exists(log)  # removed after the try
    assert [n for n in os.listdir(tmp_path) if n.startswith(".ssh-")] == []


def test_a_user_s_own_ssh_log_still_gets_ssh_s_messages(popen, tmp_path):
    popen(stdout=b"ok\n", ssh_log=b"debug1: said by ssh\r\n")
    mine = tmp_path / "mine.log"
    conn = make_conn(ansible_pct_control_path_dir=str(tmp_path / "cp"), ansible_pct_ssh_extra_args="-v -E %s" % mine)
    conn._connect()
    open(conn._control_path(), "w").close()
    conn.exec_command("true")
    conn.exec_command("true")
    assert mine.read_bytes() == b"debug1: said by ssh\r\n" * 2


@pytest.fixture
def refusing_node():
    """A TCP port that closes every connection at once, as sshd past MaxStartups does before the
    identification exchange; yields (port, connections seen)."""
    seen = []

    def refuse(client):
        seen.append(1)
        client.close()

    with loopback_server(refuse) as port:
        yield port, seen


def test_the_real_ssh_says_a_refusal_in_its_own_log_and_it_is_tried_again(refusing_node, tmp_path, no_pause):
    """The real OpenSSH client: the refusal reaches its -E file (not its stderr), which the retry
    reads; the master's opening and the command are each tried 1 + refusal_retries times."""
    port, seen = refusing_node
    conn = make_conn(ansible_pct_node_host="127.0.0.1", ansible_pct_node_port=port, ansible_pct_host_key_checking=False,
                     ansible_pct_refusal_retries=2, ansible_pct_control_path_dir=str(tmp_path / "cp"))
    conn._connect()
    assert len(seen) == 3 and no_pause == [1, 2]  # the master, refused three times
    with pytest.raises(AnsibleConnectionFailure, match=r"is unreachable: kex_exchange_identification: "):
        conn.exec_command("true")
    assert len(seen) == 6 and no_pause == [1, 2, 1, 2]
    assert [n for n in os.listdir(tmp_path / "cp") if n.startswith(".ssh-")] == []
