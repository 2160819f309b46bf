# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: pct
short_description: Run tasks inside a Proxmox VE LXC container through its node
description:
  - Connects to the Proxmox VE node with OpenSSH and runs every command inside the container
    with C(pct exec <vmid> -- ...), or with C(lxc-attach -n <vmid> -- ...) as a faster path.
  - One SSH master connection per node (ControlMaster/ControlPersist), shared by all the
    containers of that node and by every task; no PTY; pipelining on by default. When many
    containers of a node connect at once, the first opens the master (under a lock file beside
    the socket) while the others wait for it, so a cold start costs one SSH handshake per node.
  - At most O(max_sessions) sessions of one node's master are open at once, across every fork of the
    run (a lock file per session slot beside the socket), below the node's sshd C(MaxSessions); a
    command that sshd refused before it started (a connection dropped past C(MaxStartups)) is tried
    again after a pause, at most O(refusal_retries) times. A command that may have started is never
    run again.
  - Files are streamed over stdin (C(put_file)) and stdout (C(fetch_file)), never held in memory.
  - Every argument that reaches the node's shell is quoted; the vmid must be an integer.
  - Commands start in the container under C(env -i) with C(PATH), C(HOME=/root) and
    C(LANG=C.UTF-8) only, so they meet the same environment on Proxmox VE 8 (whose C(pct exec)
    passes the node's login environment on) and 9 (which clears it), with either O(method).
  - Privilege escalation (C(become)) happens inside the container. Commands start there as
    root, so C(become_method=su) needs no password; C(sudo) with a password works without a
    TTY (it reads the password from stdin).
author: gpufleet.hygiene maintainers (@gpufleet)
version_added: 0.1.0
extends_documentation_fragment:
  - gpufleet.hygiene.ssh_options.CONNECTION
options:
  node_host:
    description:
      - Address or name of the Proxmox VE node the container lives on.
      - For a host of community.proxmox's C(proxmox) inventory (it names the node, O(node_name), and its
        C(ansible_host) is the guest's own address, if any) without C(ansible_pct_node_host), the node's
        address in O(node_addresses), else the node's name.
    type: string
    required: true
    vars:
      - name: ansible_host
      - name: ansible_pct_node_host
    env:
      - name: GPUFLEET_PCT_NODE_HOST
  node_name:
    description:
      - Name of the container's Proxmox VE node, as community.proxmox's C(proxmox) inventory gives it
        (C(proxmox_node)). Used to find the node's address (O(node_host)) when none is given.
    type: string
    vars:
      - name: proxmox_node
    version_added: 0.3.0
  node_addresses:
    description:
      - Address of each Proxmox VE node by node name, given once for the whole inventory (for example in
        C(group_vars/all.yml)), for hosts that name their node (O(node_name)) but not its address.
    type: dict
    default: {}
    vars:
      - name: gpufleet_pve_node_addresses
    version_added: 0.3.0
  vmid:
    description:
      - Proxmox VE ID of the container, an integer from 100 to 999999999.
      - Anything else (text that is not only digits, a float, a boolean) is refused.
      - The inventory variable is C(ansible_pct_vmid), which the P(gpufleet.hygiene.proxmox_lxc#inventory) inventory
        plugin sets; C(pve_vmid) and C(gpufleet_vmid) are read too, as aliases that older inventories use, and
        C(proxmox_vmid), which community.proxmox's C(proxmox) inventory sets.
        When several are set, C(ansible_pct_vmid) wins.
    type: raw
    required: true
    vars:
      - name: proxmox_vmid
      - name: gpufleet_vmid
      - name: pve_vmid
      - name: ansible_pct_vmid
  method:
    description:
      - V(pct) runs C(pct exec <vmid> -- ...), as an operator would.
      - V(lxc-attach) runs C(lxc-attach -n <vmid> -- ...) directly, skipping pct's start-up
        cost (what C(pct exec) runs underneath).
    type: string
    default: pct
    choices: [pct, lxc-attach]
    vars:
      - name: ansible_pct_method
    env:
      - name: GPUFLEET_PCT_METHOD
    ini:
      - section: gpufleet_pct
        key: method
  pct_path:
    description: Name or path of the C(pct) command on the node.
    type: string
    default: pct
    vars:
      - name: ansible_pct_path
    env:
      - name: GPUFLEET_PCT_PATH
    ini:
      - section: gpufleet_pct
        key: pct_path
  lxc_path:
    description:
      - LXC path (C(lxc-attach -P)) of the node's containers, for O(method=lxc-attach).
      - Leave unset on Proxmox VE, whose containers are in LXC's default path.
    type: string
    vars:
      - name: ansible_pct_lxc_path
    env:
      - name: GPUFLEET_PCT_LXC_PATH
    ini:
      - section: gpufleet_pct
        key: lxc_path
  command_timeout:
    description:
      - Seconds one command (or one file transfer) may run before it is killed and the
        connection reported as failed. V(0) means no limit.
      - The default bounds a container that never answers (frozen, its file system stalled) so
        that it cannot hold a play forever; it is longer than any task of this collection takes
        (a reinstall from a slow index included). Raise it for longer tasks of your own.
    type: int
    default: 1800
    vars:
      - name: ansible_pct_command_timeout
    env:
      - name: GPUFLEET_PCT_COMMAND_TIMEOUT
    ini:
      - section: gpufleet_pct
        key: command_timeout
  max_sessions:
    description:
      - Most sessions (commands, file transfers) open at once over one node's master connection,
        counted across every fork of the run and every run that shares O(control_path_dir). Each
        holds one of this many slot lock files (C(<control_path_dir>/pct-<hash>.slots/)) for as
        long as it runs; the others wait for a free slot.
      - Keep it below the node's sshd C(MaxSessions) (OpenSSH's default is 10), since the master's own
        session and sessions still closing on the node count there too.
      - A command waits for a slot at most O(command_timeout) seconds (no limit when that is V(0)),
        then fails as unreachable. V(0) turns the limit off.
    type: int
    default: 8
    vars:
      - name: ansible_pct_max_sessions
    env:
      - name: GPUFLEET_PCT_MAX_SESSIONS
    ini:
      - section: gpufleet_pct
        key: max_sessions
  refusal_retries:
    description:
      - How many times a command that the node's sshd refused before it started is tried again,
        after a pause that doubles each time (a quarter of a second, then half, ... at most 4 s,
        with jitter). V(0) never tries again.
      - Tried again only when ssh exited 255 with no output and its identification exchange with the
        node failed (C(kex_exchange_identification:) or C(ssh_exchange_identification:), as when
        sshd drops connections past C(MaxStartups)); nothing was authenticated, so nothing ran.
        That line is read from ssh's own log of the try (C(ssh -E), a new 0600 file in
        O(control_path_dir)), which only ssh writes; what the remote command prints on its stderr,
        whatever it says, never makes a command run again. A
        session the master refused (C(Session open refused by peer)) makes ssh fall back to a
        connection of its own (C(ControlSocket ... already exists, disabling multiplexing)), which
        runs the command or meets that same refusal; any other failure, the command's own exit
        status included, is never tried again.
    type: int
    default: 5
    vars:
      - name: ansible_pct_refusal_retries
    env:
      - name: GPUFLEET_PCT_REFUSAL_RETRIES
    ini:
      - section: gpufleet_pct
        key: refusal_retries
  pipelining:
    description:
      - Send modules over stdin instead of copying them into the container first.
      - On by default for this connection; set V(false) to copy modules as files.
    type: bool
    default: true
    vars:
      - name: ansible_pipelining
      - name: ansible_pct_pipelining
    env:
      - name: ANSIBLE_PIPELINING
    ini:
      - section: defaults
        key: pipelining
      - section: connection
        key: pipelining
  run_on:
    description:
      - V(container) runs every command inside the container (what this connection is for).
      - V(node) runs them on the container's Proxmox VE node itself, over the same SSH master. Only
        the M(gpufleet.hygiene.node_readiness) action sets it, for its own module run, and sets it
        back; no variable, setting or environment variable can, so that no other task can be sent
        to the node by mistake. Privilege escalation is refused there.
    type: string
    default: container
    choices: [container, node]
  become_success_timeout:
    description: Seconds to wait for privilege escalation inside the container to succeed.
    type: int
    default: 10
    vars:
      - name: ansible_pct_become_success_timeout
notes:
  - Errors are distinct AnsibleConnectionFailure messages for an unreachable node, a failed SSH
    login, a node host key that does not match, a missing container, a stopped container and a
    missing C(pct) (or C(lxc-attach)) on the node; those of SSH also say what to fix.
  - The P(gpufleet.hygiene.proxmox_lxc#inventory) inventory reaches the nodes with the same C(ssh) command line,
    built from the same settings (the same C([gpufleet_pct]) keys and environment variables), so that one
    host-key policy holds for both.
seealso:
  - plugin: gpufleet.hygiene.proxmox_lxc
    plugin_type: inventory
"""

EXAMPLES = r"""
# inventory (YAML): one container reached through its node
# all:
#   hosts:
#     train-101:
#       ansible_connection: gpufleet.hygiene.pct
#       ansible_pct_node_host: pve1.example.com
#       ansible_pct_vmid: 101
#       ansible_pct_method: lxc-attach   # optional fast path

- name: Check a container's venv through its Proxmox node
  hosts: train-101
  gather_facts: false
  tasks:
    - name: List the venv's packages
      gpufleet.hygiene.pip_inventory:
        venv: /opt/venv
"""

import contextlib
import fcntl
import itertools
import os
import random
import re
import selectors
import shlex
import subprocess
import tempfile
import time

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound, AnsibleOptionsError
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils import _ssh
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._ssh import control_path, private_directory

display = Display()


def validate_vmid(value):
    """Return the vmid as an int; refuse anything that is not an integer in Proxmox's range."""
    vmid = _pct.parse_vmid(value)
    if vmid is None:
        raise AnsibleOptionsError("gpufleet.hygiene.pct: %s" % _pct.bad_vmid("vmid", value, "ansible_pct_vmid"))
    return vmid


def validate_user(value):
    """The node user as given; refuse what ssh would read as an option or refuse itself
    ("remote username contains invalid characters"), so that it is a clear error, not a
    failed module."""
    user = str(value) if value is not None else ""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\$?", user):
        raise AnsibleOptionsError(
            "gpufleet.hygiene.pct: node_user must be a user name (letters, digits, '_', '.', '-', not starting with "
            "'-'), got %r (ansible_pct_node_user, ansible_user)" % user)
    return user


# ssh's words when the node's sshd closed the connection before the identification exchange
# (MaxStartups drops it there): before authentication, so no command can have started.
_NOT_STARTED = ("kex_exchange_identification:", "ssh_exchange_identification:")
# The most of ssh's own log (ssh -E) read after a try: its last lines say how the try ended.
SSH_LOG_MAX = 65536


def refused_before_start(rc, stdout, ssh_log):
    """True when ssh provably never started the command: it exited 255 with no output and its own
    log (ssh -E: what ssh itself says, which the remote command's stderr never reaches) ends its
    connection to the node in the identification exchange. A session refused by the master alone
    proves nothing: ssh then runs the command over a connection of its own. Text the command
    printed on its stderr is never read here: a command can print anything."""
    if rc != 255 or stdout:
        return False
    text = to_text(ssh_log or b"", errors="surrogate_or_replace")
    return any(line.strip().startswith(_NOT_STARTED) for line in text.splitlines())


def with_log(argv, path):
    """ssh's argv with its own messages sent to path (-E, placed last of the options so that it wins
    over one in ssh_extra_args)."""
    at = argv.index("--")
    return argv[:at] + ["-E", path] + argv[at:]


def retry_delay(attempt, base=0.25, cap=4.0):
    """Seconds before try number attempt + 1: doubling from base up to cap, with jitter so that the
    forks refused together do not come back together."""
    return min(cap, base * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


# Every lock and slot file: never through a link planted in its place, never left to a child.
LOCK_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def acquire_slot(directory, limit, timeout=None, poll=0.01):
    """Hold one of limit slot files in directory (flock, exclusive); return its descriptor, or None
    when none came free within timeout seconds (None: no limit). The lock goes with the descriptor:
    on close, or when the process dies. Close-on-exec, so that no ssh (a master forked into the
    background above all) keeps a slot."""
    deadline = None if not timeout else time.monotonic() + timeout
    first = os.getpid() % limit  # the forks start on different slots
    while True:
        for i in range(limit):
            fd = os.open(os.path.join(directory, str((first + i) % limit)), LOCK_FLAGS, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(poll)
        poll = min(poll * 2, 0.1)


class Connection(ConnectionBase):
    """Run commands in a Proxmox VE container through its node (ssh + pct exec)."""

    transport = "gpufleet.hygiene.pct"
    has_pipelining = True
    has_tty = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._vmid = None

    def set_options(self, task_keys=None, var_options=None, direct=None):
        if var_options and var_options.get("proxmox_node") and not (
                var_options.get("ansible_host") or var_options.get("ansible_pct_node_host")):
            # ansible-core gives no ansible_host to a host without one: the node's name stands in
            # for it (node_host is required), and is resolved below like a guest's ansible_host.
            var_options = dict(var_options, ansible_host=var_options["proxmox_node"])
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        # A host of community.proxmox's inventory names its node (proxmox_node); its ansible_host,
        # when set, is the guest's own address, never the node's.
        node = self.get_option("node_name")
        if node:
            _value, origin = self.get_option_and_origin("node_host")
            if origin is None or origin.startswith(("var: ansible_host", "default")):
                addresses = self.get_option("node_addresses") or {}
                self.set_option("node_host", str(addresses.get(node) or node))

    # ------------------------------------------------------------------ argv

    def _ssh_argv(self, remote_command, *ssh_opts):
        """Full ssh argv for one remote command string (already quoted for the node's shell)."""
        host = self.get_option("node_host")
        if not host:
            raise AnsibleOptionsError("gpufleet.hygiene.pct: node_host is required (ansible_pct_node_host)")
        return _ssh.argv(host, remote_command, user=self.get_option("node_user"), port=self.get_option("node_port"),
                         executable=self.get_option("ssh_executable"), connect_timeout=self.get_option("connect_timeout"),
                         host_key_checking=self.get_option("host_key_checking"),
                         known_hosts_file=self.get_option("known_hosts_file"),
                         private_key_file=self.get_option("private_key_file"), extra_args=self.get_option("ssh_extra_args"),
                         control_path=self._control_path(), control_persist=self.get_option("control_persist"), opts=ssh_opts)

    def _control_path(self):
        cpdir = os.path.expanduser(self.get_option("control_path_dir"))
        return control_path(cpdir, self.get_option("node_user"), self.get_option("node_host"), self.get_option("node_port"))

    def _in_container(self, argv):
        """ssh argv running argv in the container (or, with run_on=node, on the node itself); the
        single remote string is quoted per argument."""
        if self.get_option("run_on") != "node":
            argv = _pct.exec_argv(self._vmid, argv, self.get_option("method"), self.get_option("pct_path"), self.get_option("lxc_path"))
        return self._ssh_argv(_pct.shell_line(argv))

    def _on_node(self, argv):
        return self._ssh_argv(_pct.shell_line(argv))

    def _shell_executable(self):
        return getattr(self._play_context, "executable", None) or "/bin/sh"

    # ------------------------------------------------------------------ connection

    def _connect(self):
        if not self._connected:
            on_node = self.get_option("run_on") == "node"
            # On the node the vmid is not used: node_readiness checks every container's own.
            self._vmid = None if on_node else validate_vmid(self.get_option("vmid"))
            validate_user(self.get_option("node_user"))
            cpdir = private_directory(os.path.expanduser(self.get_option("control_path_dir")))
            display.vvv("PCT CONNECT node=%s:%s vmid=%s method=%s run_on=%s" % (
                self.get_option("node_host"), self.get_option("node_port"), self._vmid, self.get_option("method"),
                self.get_option("run_on")),
                host=self.get_option("node_host"))
            self._share_master(cpdir)
            self._connected = True
        return self

    def _share_master(self, cpdir):
        """One SSH handshake per node, also when the first tasks of many containers of that node
        start at once: with ControlMaster=auto each of them would open a master of its own (the
        socket does not exist yet). The first one to take the node's lock opens the master (a
        `true` on the node, kept by ControlPersist) while the others wait for it; when that fails
        they go on each with its own connection, and their commands report why. A cold start
        pays one handshake and one round trip per node instead of a handshake per container."""
        user, host, port = self.get_option("node_user"), self.get_option("node_host"), self.get_option("node_port")
        socket = control_path(cpdir, user, host, port)
        if os.path.exists(socket):
            return
        try:
            with os.fdopen(os.open(socket + ".lock", LOCK_FLAGS, 0o600), "rb") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    fcntl.flock(lock, fcntl.LOCK_EX)  # another connection opens the master: wait for it
                    return
                if os.path.exists(socket):
                    return
                display.vvv("PCT MASTER %s@%s:%s" % (user, host, port), host=host)
                self._with_session(self._open_master)
        except OSError:
            return  # no lock (or no ssh): each connection opens its own master, as ssh would

    def _open_master(self, log):
        # The task's own command meets any problem of this one and says what it is. Its stderr is a
        # file, not a pipe: a master that keeps it (ssh -v) must not hold this call until it exits.
        with tempfile.TemporaryFile() as err:
            try:
                res = subprocess.run(with_log(self._ssh_argv("true"), log), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                     timeout=self.get_option("connect_timeout") + 5, check=False)
            except subprocess.TimeoutExpired:
                return None, b"", b""
            err.seek(0)
            return res.returncode, b"", err.read(65536)

    @contextlib.contextmanager
    def _session(self):
        """Hold one of the node's max_sessions session slots (shared by every fork) for the block."""
        limit = self.get_option("max_sessions")
        if limit <= 0:
            yield
            return
        directory = self._control_path() + ".slots"
        wait = self.get_option("command_timeout") or None
        private_directory(directory, "control_path_dir's session slots")
        try:
            fd = acquire_slot(directory, limit, wait)
        except OSError as exc:
            raise AnsibleConnectionFailure("gpufleet.hygiene.pct: cannot take a session slot in %s: %s" % (directory, exc)) from exc
        if fd is None:
            raise AnsibleConnectionFailure(
                "gpufleet.hygiene.pct: waited %ss for one of the %d sessions (max_sessions) of %s; every one stayed busy"
                % (wait, limit, self._node_label()))
        try:
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _ssh_log(self):
        """A new file for ssh's own messages of one try (ssh -E): (its path, a function returning what
        ssh wrote there, at most SSH_LOG_MAX bytes from its end). Made 0600 and exclusively in the
        private control-path directory; removed after the try (a master forked by the try keeps
        writing to the removed file, never to another try's)."""
        fd, path = tempfile.mkstemp(prefix=".ssh-", suffix=".log", dir=os.path.dirname(self._control_path()))

        def read():
            size = os.fstat(fd).st_size
            return os.pread(fd, SSH_LOG_MAX, max(0, size - SSH_LOG_MAX))

        try:
            yield path, read
            self._copy_log(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _copy_log(self, fd):
        """ssh's messages of a try, appended to the -E file that ssh_extra_args names, if one: ours
        comes last and wins, the user's still gets what ssh said."""
        extra = shlex.split(self.get_option("ssh_extra_args") or "")
        wanted = [extra[i + 1] for i, arg in enumerate(extra[:-1]) if arg == "-E"]
        wanted += [arg[2:] for arg in extra if arg.startswith("-E") and len(arg) > 2]
        if not wanted:
            return
        try:
            with open(os.path.expanduser(wanted[-1]), "ab") as out:
                offset = 0
                while True:
                    chunk = os.pread(fd, 1 << 16, offset)
                    if not chunk:
                        break
                    out.write(chunk)
                    offset += len(chunk)
        except OSError as exc:
            display.warning("gpufleet.hygiene.pct: cannot append ssh's messages to %s (ssh_extra_args -E): %s" % (wanted[-1], exc))

    def _with_session(self, attempt):
        """attempt(ssh_log_path) -> (rc, stdout, stderr), run holding one of the node's sessions; run
        again after a pause while the node's sshd refused it before the command started, as ssh's
        own log of the try says (never the command's stderr). Returns (rc, stdout, stderr and then
        ssh's own messages), the way ssh without -E would have printed both on its stderr."""
        retries = max(0, self.get_option("refusal_retries"))
        for tried in itertools.count(1):
            with self._session(), self._ssh_log() as (path, read):
                rc, out, err = attempt(path)
                log = read()
            if tried > retries or not refused_before_start(rc, out, log):
                return rc, out, (err or b"") + log
            delay = retry_delay(tried)
            display.vvv("PCT RETRY %d/%d in %.2fs, refused by %s before the command started: %s" % (
                tried, retries, delay, self._node_label(), to_text(log, errors="surrogate_or_replace").strip()),
                host=self.get_option("node_host"))
            time.sleep(delay)
        return None  # not reached: itertools.count never ends

    def _popen(self, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE):
        display.vvv("PCT EXEC %s" % _pct.shell_line(argv), host=self.get_option("node_host"))
        try:
            return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, bufsize=0)
        except OSError as exc:
            raise AnsibleConnectionFailure("gpufleet.hygiene.pct: cannot run %s: %s" % (argv[0], exc)) from exc

    def _communicate(self, proc, in_data=None):
        timeout = self.get_option("command_timeout") or None
        try:
            return proc.communicate(in_data, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.communicate()
            raise AnsibleConnectionFailure("gpufleet.hygiene.pct: command in container %s timed out after %ss" % (self._vmid, timeout)) from exc

    def exec_command(self, cmd, in_data=None, sudoable=True):
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        if self.get_option("run_on") == "node" and self.become and sudoable:
            raise AnsibleConnectionFailure(
                "gpufleet.hygiene.pct: privilege escalation (become) is not done on the node; the node's login reads "
                "the containers (set become: false on that task)")
        argv = self._in_container([self._shell_executable(), "-c", cmd])

        def attempt(log):
            proc = self._popen(with_log(argv, log))
            b_out, b_err = self._ensure_become_success(proc, sudoable)
            stdout, stderr = self._communicate(proc, in_data)
            return proc.returncode, b_out + (stdout or b""), b_err + (stderr or b"")

        rc, stdout, stderr = self._with_session(attempt)
        if rc:
            self._raise_for_failure(rc, stdout, stderr)
        return rc, stdout, stderr

    def _ensure_become_success(self, proc, sudoable):
        """Wait for the become plugin's success marker (sending a password if prompted); strip it."""
        become = self.become
        if not become or not sudoable or not getattr(become, "_id", None):
            return b"", b""
        expect_prompt = become.expect_prompt()
        out, err = bytearray(), bytearray()
        sent_password = False
        deadline = time.monotonic() + max(1, self.get_option("become_success_timeout"))
        os.set_blocking(proc.stdout.fileno(), False)
        os.set_blocking(proc.stderr.fileno(), False)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(proc.stdout, selectors.EVENT_READ, out)
                sel.register(proc.stderr, selectors.EVENT_READ, err)
                while not become.check_success(bytes(out)):
                    if not sel.get_map():
                        # The command ended before escalating: give its output back as it was.
                        return bytes(out), bytes(err)
                    if expect_prompt and not sent_password and (
                            become.check_password_prompt(bytes(out)) or become.check_password_prompt(bytes(err))):
                        proc.stdin.write(to_bytes(become.get_option("become_pass") or "") + b"\n")
                        proc.stdin.flush()
                        sent_password = True
                    left = deadline - time.monotonic()
                    events = sel.select(left) if left > 0 else []
                    if not events:
                        proc.kill()
                        raise AnsibleConnectionFailure(
                            "gpufleet.hygiene.pct: timed out waiting for privilege escalation in container %s:\n%s"
                            % (self._vmid, to_text(bytes(out + err))))
                    for key, _mask in events:
                        chunk = key.fileobj.read()
                        if chunk:
                            key.data.extend(chunk)
                        elif chunk is not None:
                            sel.unregister(key.fileobj)
        finally:
            os.set_blocking(proc.stdout.fileno(), True)
            os.set_blocking(proc.stderr.fileno(), True)
        return become.strip_become_success(become.strip_become_prompt(bytes(out))), become.strip_become_prompt(bytes(err))

    # ------------------------------------------------------------------ errors

    def _node_label(self):
        return "node %s@%s:%s" % (self.get_option("node_user"), self.get_option("node_host"), self.get_option("node_port"))

    def _fail(self, kind, fix="", **details):
        msg = _pct.message(kind, vmid=self._vmid, node=self._node_label(), **details)
        raise AnsibleConnectionFailure("gpufleet.hygiene.pct: " + msg + ("; to fix: " + fix if fix else ""))

    def _raise_for_failure(self, rc, stdout, stderr):
        """Turn the failures of the transport (not of the user's command) into distinct errors."""
        err = to_text(stderr, errors="surrogate_or_replace")
        # With run_on=node nothing ran through pct or lxc-attach: only ssh's own failures apply.
        in_container = self.get_option("run_on") != "node"
        method, pct_path = self.get_option("method"), self.get_option("pct_path")
        kind = _pct.enter_failure(self._vmid, rc, stdout, err, method, pct_path) if in_container else None
        if kind == _pct.ATTACH_REFUSED:
            kind, said = self._attach_refused()
            if kind == _pct.NO_CONTAINER:
                err = said  # pct's words name the Proxmox VE node
        fix = ""
        if not kind:
            # Named as the inventory names it (plugin_utils/_ssh.py), with the same fix.
            ssh_kind = _ssh.failure(rc, stdout, err)
            fix = _ssh.fix(ssh_kind, self.get_option("node_host"), self.get_option("node_port"),
                           self.get_option("known_hosts_file"), self.get_option("private_key_file"))
            kind = _pct.HOST_KEY if ssh_kind == _pct.HOST_KEY_UNKNOWN else ssh_kind
        if kind:
            self._fail(kind, fix=fix, tool=_pct.enter_tool(method, pct_path), detail=err)
        if not stdout and not err.strip() and in_container:
            self._explain_silent_failure(rc)

    def _status(self, timeout):
        """(what `pct status` says of the container, its kind of failure, its exit status, its text)."""
        argv = self._on_node(_pct.status_argv(self._vmid, self.get_option("pct_path")))

        def attempt(log):
            proc = self._popen(with_log(argv, log))
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                out, err = b"", b"no answer"
            return proc.returncode, out, err

        rc, out, err = self._with_session(attempt)
        text = to_text(out + err, errors="surrogate_or_replace").strip()
        return _pct.parse_status(text), _pct.enter_failure(self._vmid, rc, out, to_text(err)), rc, text

    def _explain_silent_failure(self, rc):
        """A command failed with no output at all: its transport may have died under it (the
        node's sshd killed, the node down: ssh exits 255; the container stopped: lxc-attach is
        killed), or the command failed quietly. Ask the node whether the container runs."""
        status, _kind, status_rc, text = self._status(max(5, self.get_option("connect_timeout") * 2))
        if status == "stopped":
            self._fail(_pct.STOPPED_DURING, rc=rc)
        if status_rc != 0 and rc == 255:
            self._fail(_pct.CONNECTION_LOST, detail=text)
        # The node answers and the container runs: the command's own exit status.

    def _attach_refused(self):
        """lxc-attach says the same for a stopped and a missing container; ask pct which it is."""
        status, kind, _rc, text = self._status(self.get_option("command_timeout") or None)
        if status == "stopped":
            return _pct.NOT_RUNNING, text
        return (kind if kind == _pct.NO_CONTAINER else _pct.ATTACH_FAILED), text

    # ------------------------------------------------------------------ files

    def put_file(self, in_path, out_path):
        super().put_file(in_path, out_path)
        display.vvv("PUT %s TO %s" % (in_path, out_path), host=self.get_option("node_host"))
        try:
            with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as src:
                argv = self._in_container(["/bin/sh", "-c", "cat > %s" % shlex.quote(out_path)])

                def attempt(log):
                    src.seek(0)  # a refused try read nothing; start the stream over all the same
                    # The file descriptor is ssh's stdin: the file streams through, never read whole here.
                    proc = self._popen(with_log(argv, log), stdin=src)
                    stdout, stderr = self._communicate(proc)
                    return proc.returncode, stdout, stderr

                rc, stdout, stderr = self._with_session(attempt)
        except OSError as exc:
            raise AnsibleFileNotFound("gpufleet.hygiene.pct: cannot read local file %s: %s" % (in_path, exc.strerror)) from exc
        if rc:
            self._raise_for_failure(rc, stdout, stderr)
            raise AnsibleError("gpufleet.hygiene.pct: failed to write %s in container %s: %s" % (out_path, self._vmid, to_text(stderr).strip()))

    def fetch_file(self, in_path, out_path):
        super().fetch_file(in_path, out_path)
        display.vvv("FETCH %s TO %s" % (in_path, out_path), host=self.get_option("node_host"))
        b_out = to_bytes(out_path, errors="surrogate_or_strict")
        try:
            with open(b_out, "wb") as dst:
                argv = self._in_container(["cat", "--", in_path])

                def attempt(log):
                    dst.seek(0)
                    dst.truncate()
                    proc = self._popen(with_log(argv, log), stdout=dst)
                    _stdout, stderr = self._communicate(proc)
                    # What reached the file is the command's output: none, when ssh never started it.
                    return proc.returncode, b"x" if os.fstat(dst.fileno()).st_size else b"", stderr

                rc, _written, stderr = self._with_session(attempt)
        except OSError as exc:
            raise AnsibleError("gpufleet.hygiene.pct: cannot write local file %s: %s" % (out_path, exc.strerror)) from exc
        if rc:
            os.unlink(b_out)
            self._raise_for_failure(rc, b"", stderr)
            msg = "gpufleet.hygiene.pct: failed to read %s in container %s: %s" % (in_path, self._vmid, to_text(stderr).strip())
            if "No such file or directory" in to_text(stderr):
                raise AnsibleFileNotFound(msg)
            raise AnsibleError(msg)

    # ------------------------------------------------------------------ lifecycle

    def reset(self):
        """Stop the node's SSH master (meta: reset_connection); the next task opens a new one."""
        if self.get_option("node_host"):
            proc = self._popen(self._ssh_argv(None, "-O", "exit"))
            self._communicate(proc)
        self.close()

    def close(self):
        # The node's master connection is shared with other containers and tasks: keep it.
        self._connected = False
