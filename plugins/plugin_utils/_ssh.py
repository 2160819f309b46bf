# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way this collection's controller plugins reach a Proxmox VE node: OpenSSH.

The pct connection (every command in a container) and the proxmox_lxc inventory (``pct list`` and
``pct config`` on every node, with source=ssh) build their ssh command line here, from the same
settings, so that a node one of them reaches the other reaches too, a host key is checked the same
way (StrictHostKeyChecking, UserKnownHostsFile), and both share one master connection per node
(ControlPath). Failures are named once (``failure``) with what to fix (``fix``).

The settings, their sources (variables, ``[gpufleet_pct]`` in ansible.cfg, environment) and their
documentation are one table, _ssh_options.py, which both plugins' docs are made from (the
``gpufleet.hygiene.ssh_options`` doc fragment); how to set them once for both plugins: docs/fleet.md,
"One SSH policy".
"""

from __future__ import annotations

import hashlib
import os
import re
import selectors
import shlex
import stat
import subprocess
import tempfile
import time

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_bytes, to_text

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct


def argv(host, remote_command, *, user, port, executable="ssh", connect_timeout=10, host_key_checking=True,
         known_hosts_file=None, private_key_file=None, extra_args="", control_path=None, control_persist=60, opts=()):
    """ssh's argv running remote_command (one string, already quoted for the node's shell; None for
    none) on host. BatchMode: never a prompt. Host keys: StrictHostKeyChecking=yes against
    known_hosts_file (ssh's own known hosts when unset), or, with host_key_checking off, neither
    checked nor recorded. extra_args is split like a shell would and passed as separate arguments
    after these options (ssh takes the first value of an option: the ones here win over a -o in
    extra_args, except where these set none)."""
    out = [executable, "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=%d" % connect_timeout]
    if control_path:
        out += ["-o", "ControlMaster=auto", "-o", "ControlPersist=%ds" % control_persist, "-o", "ControlPath=%s" % control_path]
    if host_key_checking:
        out += ["-o", "StrictHostKeyChecking=yes"]
        if known_hosts_file:
            out += ["-o", "UserKnownHostsFile=%s" % known_hosts_file]
    else:
        out += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    if private_key_file:
        out += ["-o", "IdentitiesOnly=yes", "-i", private_key_file]
    out += ["-p", str(port), "-l", user]
    out += shlex.split(extra_args or "")
    out += list(opts)
    out += ["--", host]
    if remote_command is not None:
        out.append(remote_command)
    return out


# A Unix socket's path holds at most 107 bytes (sun_path is 108 with its NUL), and the ssh that opens
# a master first listens on the control path plus "." and 16 random characters, then renames it.
CONTROL_PATH_MAX = 107 - 17


def control_path(directory, user, host, port):
    """One socket per node: the hash covers user, address and port, not the container. A directory
    too deep for the socket's path is refused here, with what to do, rather than by ssh's
    `unix_listener: ... too long for Unix domain socket`, which reaches a task as a module's empty
    output."""
    digest = hashlib.sha1(to_bytes("%s@%s:%s" % (user, host, port))).hexdigest()[:16]
    path = os.path.join(directory, "pct-%s" % digest)
    if len(to_bytes(path)) > CONTROL_PATH_MAX:
        raise AnsibleConnectionFailure(
            "control_path_dir %s is too long for ssh's control sockets: their paths (%s) would be %d bytes, and "
            "ssh takes at most %d; set a shorter directory (the connection's ansible_pct_control_path_dir, the "
            "proxmox_lxc inventory's control_path_dir; the default is ~/.ansible/cp)"
            % (directory, path, len(to_bytes(path)), CONTROL_PATH_MAX))
    return path


def private_directory(path, option="control_path_dir", who="gpufleet.hygiene.pct"):
    """Make path (0700, its missing parents too) or take the one there when it is a directory of
    this user that nobody else can enter or write; refuse anything else with what to fix. The
    master sockets, their lock files and the session slots live here: another user able to plant a
    link in it would make this process create or lock a file where the link points."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise AnsibleConnectionFailure("%s: cannot create %s %s: %s" % (who, option, path, exc)) from exc
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise AnsibleConnectionFailure(
            "%s: %s %s is not a directory of its own (a symbolic link or another file: %s); remove it "
            "or choose another %s" % (who, option, path, exc.strerror, option)) from exc
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    uid = os.geteuid()
    if st.st_uid != uid:
        raise AnsibleConnectionFailure(
            "%s: %s %s belongs to uid %d, not to this user (uid %d): another user could plant links "
            "in it. Remove it (or chown %d it) or choose another %s" % (who, option, path, st.st_uid, uid, uid, option))
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise AnsibleConnectionFailure(
            "%s: %s %s has mode %04o: others can enter or write it. chmod 0700 it or choose another %s"
            % (who, option, path, stat.S_IMODE(st.st_mode), option))
    return path


# ------------------------------------------------------------------ failures

# OpenSSH's words for a host key it has no entry for (StrictHostKeyChecking=yes), as against one
# that differs from its entry ("REMOTE HOST IDENTIFICATION HAS CHANGED").
_UNKNOWN_KEY = re.compile(r"No \S+ host key is known for ")


def failure(rc, stdout, stderr):
    """The kind of ssh's own failure to reach the node (exit status 255, nothing printed; _pct's
    kinds, with an unknown host key, HOST_KEY_UNKNOWN, told apart from one that does not match,
    HOST_KEY), or None when ssh reached the node (the remote command's own failure)."""
    text = to_text(stderr, errors="surrogate_or_replace")
    kind = _pct.ssh_failure(rc, stdout, text)
    if kind == _pct.HOST_KEY and _UNKNOWN_KEY.search(text) and "REMOTE HOST IDENTIFICATION HAS CHANGED" not in text:
        return _pct.HOST_KEY_UNKNOWN
    return kind


def fix(kind, host, port, known_hosts_file=None, private_key_file=None):
    """What to do about a failure kind, in a sentence; "" for the kinds that have no fix here."""
    where = known_hosts_file or "~/.ssh/known_hosts"
    node = "[%s]:%s" % (host, port) if str(port) != "22" else host
    if kind == _pct.HOST_KEY_UNKNOWN:
        return ("add the node's host key to %s (compare `ssh-keyscan -p %s %s` with the node's own "
                "/etc/ssh/ssh_host_*_key.pub first), or set known_hosts_file to a file that holds it" % (where, port, host))
    if kind == _pct.HOST_KEY:
        return ("if the node was reinstalled, check its new key on the node (/etc/ssh/ssh_host_*_key.pub), then "
                "`ssh-keygen -R '%s' -f %s` and add the new one; otherwise do not connect: the key may be another machine's"
                % (node, where))
    if kind == _pct.AUTH:
        key = private_key_file or "the key ssh offers by default"
        return "add the public key of %s to the node user's ~/.ssh/authorized_keys, or set private_key_file" % key
    if kind == _pct.UNREACHABLE:
        return "check the node's address and port (%s), that its sshd runs, and the network in between" % node
    return ""


# ------------------------------------------------------------------ running

def run(cmd, idle_timeout):
    """Run ssh's argv cmd; (exit status, stdout, stderr) as bytes. stdout is read as it comes, and
    the run is killed when it gives nothing for idle_timeout seconds (a node that stops answering),
    exit status None then. stderr goes to a file, not a pipe: a master connection forked into the
    background (ControlPersist) may keep it open long after this command ends."""
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        except OSError as exc:
            return 255, b"", to_bytes("cannot run %s: %s" % (cmd[0], exc))
        out = bytearray()
        timed_out = False
        with proc, selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                if not sel.select(idle_timeout):
                    timed_out = True
                    proc.kill()
                    break
                chunk = os.read(proc.stdout.fileno(), 1 << 16)
                if not chunk:
                    break
                out += chunk
            deadline = time.monotonic() + idle_timeout
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            if proc.poll() is None:
                timed_out = True
                proc.kill()
            proc.wait()
        err.seek(0)
        text = err.read(65536)
    if timed_out:
        return None, bytes(out), text + to_bytes("no answer for %ss (connect_timeout)" % idle_timeout)
    return proc.returncode, bytes(out), text
