# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Proxmox VE's container CLI as this collection speaks it: the vmid, the argv of ``pct exec``,
``lxc-attach``, ``pct list``, ``pct config`` and ``pct status``, the parsers of their output, and
what their failures (and ssh's, on the way to the node) mean, worded once.

Used on the controller by the pct connection and the proxmox_lxc inventory plugin, and on the node
by node_readiness. The formats are pct's own (docs/fleet.md; the simulated fleet's pct prints the
same).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import re
import shlex

VMID_MIN = 100
VMID_MAX = 999999999
METHODS = ("pct", "lxc-attach")

# ----------------------------------------------------------------------------- vmid


def parse_vmid(value):
    """The vmid as an int when value is an integer in Proxmox's range or its digits as text
    (at most nine); None for anything else (a bool, a float, other text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        vmid = value
    elif isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value):
        vmid = int(value)
    else:
        return None
    return vmid if VMID_MIN <= vmid <= VMID_MAX else None


def bad_vmid(subject, value, source=None):
    """The refusal of a vmid that parse_vmid() does not take; subject names whose it is, source
    the variable it came from."""
    # str() of a str subclass (Ansible's tagged text) so that its repr is the text's own.
    shown = str(value) if isinstance(value, str) else value
    return "%s must be an integer from %d to %d%s, got %r" % (subject, VMID_MIN, VMID_MAX, " (%s)" % source if source else "", shown)


# ----------------------------------------------------------------------------- argv


# What a command in a container starts with, whatever the node passes on: PVE 8's ``pct exec``
# (and lxc-attach by default) hand the node's login environment to the container, PVE 9's clears
# it. PATH: where the readers find nvidia-smi, tmux and the venvs' tools; HOME: pct enters as
# root and Ansible expands ``~``; LANG: the readers and their tools speak UTF-8 (Python coerces
# the C locale to it anyway, the others do not).
EXEC_ENV = (
    ("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
    ("HOME", "/root"),
    ("LANG", "C.UTF-8"),
)
# An absolute path: under a cleared environment there is no PATH to find it by.
ENV_TOOL = "/usr/bin/env"


def exec_argv(vmid, argv, method="pct", pct_path="pct", lxc_path=None):
    """The node's argv that runs argv inside container vmid: ``pct exec`` or, with
    method="lxc-attach", what pct runs underneath (``lxc-attach -n``, ``-P lxc_path`` when set).
    argv starts under ``env -i`` with EXEC_ENV only, so that it meets the same environment on
    PVE 8 and 9 and through either method."""
    inner = [ENV_TOOL, "-i"] + ["%s=%s" % pair for pair in EXEC_ENV] + list(argv)
    if method == "lxc-attach":
        head = ["lxc-attach", "-n", str(vmid)]
        if lxc_path:
            head += ["-P", lxc_path]
        return head + ["--"] + inner
    return [pct_path, "exec", str(vmid), "--"] + inner


def enter_tool(method, pct_path="pct"):
    """The program on the node that enters a container with this method."""
    return "lxc-attach" if method == "lxc-attach" else pct_path


def list_argv(pct_path="pct"):
    return [pct_path, "list"]


def config_argv(vmid, pct_path="pct"):
    return [pct_path, "config", str(vmid)]


def status_argv(vmid, pct_path="pct"):
    return [pct_path, "status", str(vmid)]


def shell_line(argv):
    """argv as one command line for the node's login shell (ssh sends a string): every word quoted."""
    return " ".join(shlex.quote(a.decode("utf-8", "surrogateescape") if isinstance(a, bytes) else str(a)) for a in argv)


# Between the configs of several containers read in one round trip (configs_line / split_configs).
_CONFIG_MARK = "@@gpufleet-pct-config"


def configs_line(vmids, pct_path="pct"):
    """One shell line printing ``pct config`` of every vmid, each after a mark line naming it."""
    return "; ".join("%s; %s" % (shell_line(["echo", _CONFIG_MARK, str(int(v))]), shell_line(config_argv(int(v), pct_path)))
                     for v in vmids)


def split_configs(text):
    """{vmid: that container's ``pct config`` text} from configs_line()'s output."""
    configs, current = {}, None
    for line in text.splitlines():
        if line.startswith(_CONFIG_MARK + " "):
            current = int(line.split()[1])
            configs[current] = []
        elif current is not None:
            configs[current].append(line)
    return {vmid: "\n".join(lines) for vmid, lines in configs.items()}


# ----------------------------------------------------------------------------- output


def parse_list(text):
    """Rows of ``pct list`` ({vmid, status, lock, name}). The header, blank lines and what is no row
    are skipped: an empty node prints no header at all, Lock may be blank. A container without a
    hostname is listed as ``CT<vmid>`` (pve-container's vmstatus); its name here is "", as for a
    blank Name."""
    rows = []
    for line in text.splitlines():
        fields = line.split()
        # A vmid is at most nine digits (Proxmox's 100-999999999); a longer run is no row.
        if not fields or not (fields[0].isascii() and fields[0].isdigit() and len(fields[0]) <= 9):
            continue
        row = {"vmid": int(fields[0]), "status": fields[1] if len(fields) > 1 else "unknown", "lock": "", "name": ""}
        if len(fields) == 3:
            row["name"] = fields[2]
        elif len(fields) >= 4:
            row["lock"], row["name"] = fields[2], fields[3]
        if row["name"] == "CT%d" % row["vmid"]:
            row["name"] = ""
        rows.append(row)
    return rows


def parse_config(text):
    """``pct config`` as a dict: PVE keys to values, raw lxc.* keys (which repeat) to lists of values."""
    conf = {}
    for line in text.splitlines():
        if ":" not in line or line.startswith("#"):
            continue
        key, value = line.split(":", 1)
        key, value = key.strip(), value.strip()
        if key.startswith("lxc."):
            conf.setdefault(key, []).append(value)
        else:
            conf[key] = value
    return conf


def nvidia_devices(conf):
    """NVIDIA device paths passed through, in order, once each: ``devN:`` entries (PVE 8.1+, bare or
    ``path=``) and the sources of ``lxc.mount.entry`` binds."""
    devices = []
    for key, value in conf.items():
        if re.fullmatch(r"dev\d+", key):
            devices.append(value.split(",")[0].removeprefix("path="))
    for entry in conf.get("lxc.mount.entry", []):
        words = entry.split()
        devices.append(words[0] if words else "")
    seen = []
    for dev in devices:
        if dev.startswith("/dev/nvidia") and dev not in seen:
            seen.append(dev)
    return seen


_GPU = re.compile(r"^/dev/nvidia(\d+)$")


def gpu_indices(devices):
    """The GPU indices among device paths (/dev/nvidiaN; nvidiactl and nvidia-uvm are no GPU)."""
    return sorted(int(m.group(1)) for m in (_GPU.match(d) for d in devices) if m)


# The device cgroup rules of a container (cgroup v2 since PVE 7, v1 before), and NVIDIA's
# character major: /dev/nvidiaN is 195:N; 254 (nvidia-modeset) and 255 (nvidiactl) are no GPU.
_ALLOW_KEYS = ("lxc.cgroup2.devices.allow", "lxc.cgroup.devices.allow")
NVIDIA_MAJOR = 195
_GPU_MINOR_MAX = 253
_RULE = re.compile(r"^(?:a|c\s+(\d+|\*):(\d+|\*)(?:\s+[rwm]+)?)$")


def cgroup_gpus(conf):
    """What the device cgroup rules let the container open of NVIDIA's GPUs: "all" (``c 195:*``,
    ``c *:*`` or ``a``), else the sorted GPU minors named (``c 195:N``), [] for none."""
    minors = set()
    for rule in (r.strip() for key in _ALLOW_KEYS for r in conf.get(key, [])):
        m = _RULE.match(rule)
        if not m:
            continue
        major, minor = m.group(1), m.group(2)
        if major is None or (major in ("*", str(NVIDIA_MAJOR)) and minor == "*"):
            return "all"
        if major == str(NVIDIA_MAJOR) and int(minor) <= _GPU_MINOR_MAX:
            minors.add(int(minor))
    return sorted(minors)


def gpu_passthrough(conf):
    """A container's GPUs from its ``pct config``, in every style Proxmox VE writes: ``devN:``
    entries, ``lxc.mount.entry`` binds of /dev/nvidiaN with ``lxc.cgroup2.devices.allow``, or the
    cgroup rules alone (device nodes made in the container). {devices, indices, all}: ``all`` is
    True when the container may open every GPU of its node (``c 195:*``) while no /dev/nvidiaN is
    passed through: its indices are then unknown (empty), only the node sees which it uses."""
    devices = nvidia_devices(conf)
    indices = gpu_indices(devices)
    allowed = cgroup_gpus(conf)
    if not indices and allowed != "all":
        indices = list(allowed)
    return {"devices": devices, "indices": indices, "all": not indices and allowed == "all"}


def parse_status(text):
    """``pct status``'s answer: "running", "stopped" (or another status pct names), or None."""
    for line in text.splitlines():
        m = re.fullmatch(r"status:\s*(\S+)", line.strip())
        if m:
            return m.group(1)
    return None


# ----------------------------------------------------------------------------- failures

# What went wrong on the way into a container; message() words each.
NOT_RUNNING = "not_running"
NO_CONTAINER = "no_container"
NO_TOOL = "no_tool"
# lxc-attach says the same for a stopped and a missing container: `pct status` tells which.
ATTACH_REFUSED = "attach_refused"
HOST_KEY = "host_key"
AUTH = "auth"
UNREACHABLE = "unreachable"
STOPPED_DURING = "stopped_during"
CONNECTION_LOST = "connection_lost"
ATTACH_FAILED = "attach_failed"
# What the inventory tells apart besides: an unknown host key from one that does not match
# (plugin_utils/_ssh.py's failure(), from OpenSSH's words), and pct failing on the node.
HOST_KEY_UNKNOWN = "host_key_unknown"
PCT_FAILED = "pct_failed"

_SSH = (
    (HOST_KEY, ("Host key verification failed", "REMOTE HOST IDENTIFICATION HAS CHANGED", "No ED25519 host key is known",
                "host key is known for")),
    (AUTH, ("Permission denied (", "Too many authentication failures", "No more authentication methods")),
    (UNREACHABLE, ("Connection refused", "Connection timed out", "No route to host", "Network is unreachable",
                   "Could not resolve hostname", "Connection closed by", "Connection reset by", "kex_exchange_identification",
                   "Operation timed out")),
)

_MESSAGES = {
    NOT_RUNNING: "container {vmid}{on} is not running (stopped); start it (pct start {vmid}) and run again, or leave it out of the run (--limit)",
    NO_CONTAINER: ("container {vmid} does not exist on {node}: check the vmid (ansible_pct_vmid) and the node (pve_node, "
                   "ansible_pct_node_host) the inventory gives it; pct list on that node lists its containers, and a "
                   "container migrated to another node is listed there"),
    NO_TOOL: "{tool} not found on {node} (is it a Proxmox VE node?)",
    ATTACH_FAILED: "lxc-attach to container {vmid} on {node} failed: {detail}",
    HOST_KEY: "host key of {node} is unknown or does not match (host key checking is on): {detail}",
    AUTH: "SSH authentication to {node} failed: {detail}",
    UNREACHABLE: "{node} is unreachable: {detail}",
    STOPPED_DURING: ("container {vmid}{on} stopped during a command (exit status {rc}, no output); what the command had done "
                     "there is unknown: start it (pct start {vmid}) and run again"),
    CONNECTION_LOST: ("the SSH connection to {node} was lost during a command in container {vmid} (ssh exited 255 with no "
                      "output), and the node does not answer now: {detail}. What the command had done in the container is "
                      "unknown: bring the node's sshd (or the node) back, then run again"),
}

# A node's SSH refusal in a few words (the inventory's warning for a node it skips).
REASONS = {HOST_KEY: "host key does not match", AUTH: "SSH authentication failed", UNREACHABLE: "unreachable",
           HOST_KEY_UNKNOWN: "host key unknown (host key checking is on)", PCT_FAILED: "pct failed"}


def message(kind, vmid=None, node=None, tool=None, rc=None, detail=""):
    """The one wording of a failure kind. node: "node user@host:port"; None where the message is
    read on the node itself ("this node"). A container that does not exist is placed on the
    Proxmox VE node pct's own words name (``detail``), where they name one."""
    where = node or "this node"
    if kind == NO_CONTAINER and pve_node_named(detail):
        where = "node %s" % pve_node_named(detail) + (" (%s)" % node.replace("node ", "", 1) if node else "")
    return _MESSAGES[kind].format(vmid=vmid, on=" on %s" % node if node else "", node=where, tool=tool, rc=rc,
                                  detail=(detail or "").strip() or "no output")


# pct's words for a vmid its node has no config of; the path names the node (pmxcfs's nodes/<node>/lxc).
_NO_CONFIG = re.compile(r"Configuration file 'nodes/([^/']+)/lxc/([0-9]+)\.conf' does not exist")


def pve_node_named(text):
    """The Proxmox VE node that pct's "Configuration file 'nodes/<node>/lxc/<vmid>.conf' does not
    exist" names, or None."""
    m = _NO_CONFIG.search(text or "")
    return m.group(1) if m else None


def _lines(stderr):
    return [line.strip() for line in stderr.splitlines()]


def enter_failure(vmid, rc, stdout, stderr, method="pct", pct_path="pct"):
    """The kind of failure of entering container vmid (``pct exec`` / ``lxc-attach``), from what
    they print; None when the failure is not theirs (the command in the container failed)."""
    lines = _lines(stderr)
    if "container '%s' not running!" % vmid in lines:
        return NOT_RUNNING
    if any(re.fullmatch(r"Configuration file '[^']*/%s\.conf' does not exist" % vmid, line) for line in lines):
        return NO_CONTAINER
    tool = enter_tool(method, pct_path)
    missing = re.compile(r"(^|: )%s: (command not found|not found|No such file or directory)$" % re.escape(tool))
    if rc == 127 and not stdout and any(missing.search(line) for line in lines):
        return NO_TOOL
    if method == "lxc-attach" and any("Failed to get init pid" in line for line in lines):
        return ATTACH_REFUSED
    return None


def ssh_failure(rc, stdout, stderr):
    """The kind of ssh's own failure to reach the node (exit status 255, nothing printed), or None."""
    if rc != 255 or stdout:
        return None
    lines = _lines(stderr)
    for kind, marks in _SSH:
        if any(any(mark in line for mark in marks) for line in lines):
            return kind
    return None
