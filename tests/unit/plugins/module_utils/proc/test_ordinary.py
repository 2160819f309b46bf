# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""proc/_ordinary, the table of everyday processes no scope pattern may match and its daemons'
names: the rows are (comm, command line) as /proc shows them (a comm is at most 15 characters,
the kernel's TASK_COMM_LEN less its NUL), the broad patterns the module names match rows of it,
a job's anchored pattern matches none, the machines it names (Debian, Ubuntu, RHEL-likes,
Proxmox VE, LXC containers, Ansible's own run) have their rows, and DAEMONS holds daemons of the
table only, never a shell, interpreter or tool a job runs as."""

from __future__ import annotations

import collections
import re

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _ordinary, _scope

ORDINARY = _ordinary.ORDINARY
DAEMONS = _ordinary.DAEMONS
COMMS = [comm for comm, _cmdline in ORDINARY]
CMDLINES = [cmdline for _comm, cmdline in ORDINARY]

# /proc/PID/comm is cut to TASK_COMM_LEN (16) less the terminating NUL.
TASK_COMM_MAX = 15

# ----------------------------------------------------------------------------- the table's shape


def test_the_table_is_a_tuple_of_comm_and_command_line_pairs():
    assert isinstance(ORDINARY, tuple) and len(ORDINARY) > 0
    for row in ORDINARY:
        assert isinstance(row, tuple) and len(row) == 2, row
        assert all(isinstance(part, str) and part for part in row), row


def test_every_row_is_as_proc_shows_it():
    for comm, cmdline in ORDINARY:
        assert len(comm) <= TASK_COMM_MAX, (comm, "longer than the kernel keeps a comm")
        assert "\n" not in comm and "\0" not in comm, comm
        # cmdline's NULs are read as spaces; no row has a NUL, a newline or white space at its edges
        assert "\0" not in cmdline and "\n" not in cmdline, cmdline
        assert cmdline == cmdline.strip() and comm == comm.strip(), (comm, cmdline)


def test_no_row_is_there_twice():
    twice = [row for row, n in collections.Counter(ORDINARY).items() if n > 1]
    assert twice == []


@pytest.mark.parametrize("comm, program", [
    ("systemd-journal", "/lib/systemd/systemd-journald"),
    ("systemd-timesyn", "/lib/systemd/systemd-timesyncd"),
    ("systemd-resolve", "/lib/systemd/systemd-resolved"),
    ("systemd-network", "/lib/systemd/systemd-networkd"),
    ("nvidia-persiste", "/usr/bin/nvidia-persistenced"),
    ("containerd-shim", "/usr/bin/containerd-shim-runc-v2"),
])
def test_long_program_names_are_cut_as_the_kernel_cuts_their_comm(comm, program):
    assert comm == program.rsplit("/", 1)[1][:TASK_COMM_MAX]
    assert any(c == comm and cmdline.split(" ")[0] == program for c, cmdline in ORDINARY), (comm, program)


# ----------------------------------------------------------------------------- what it is for


@pytest.mark.parametrize("pattern", [r".", r"\S", r"^.", r"python"])
def test_the_broad_patterns_the_module_names_match_rows(pattern):
    rx = re.compile(pattern)
    assert any(rx.search(cmdline) for cmdline in CMDLINES)
    assert any(rx.search(comm) for comm in COMMS)


@pytest.mark.parametrize("pattern", [r"^python3?$", r"^bash$", r"^sh$", r"^sleep$", r"^tmux", r"^sshd$", r"^systemd$"])
def test_bare_names_of_shells_interpreters_and_daemons_match_rows(pattern):
    assert any(re.search(pattern, comm) for comm in COMMS)


@pytest.mark.parametrize("pattern", [
    r"^\S*python3? \S*train\.py",  # the anchored pattern _scope's refusal suggests
    r"train\.py",
    r"torchrun",
    r"torch\.distributed",
    r"deepspeed",
    r"accelerate launch",
    r"vllm",
    r"\bsglang\b",
    r"--nproc[-_]per[-_]node",
])
def test_a_job_s_own_pattern_matches_no_row(pattern):
    rx = re.compile(pattern)
    hits = [row for row in ORDINARY if rx.search(row[1]) or rx.search(row[0])]
    assert hits == []


def test_scope_refuses_patterns_by_this_very_table():
    assert _scope.ORDINARY is ORDINARY and _scope.DAEMONS is DAEMONS


# ----------------------------------------------------------------------------- the machines it names


@pytest.mark.parametrize("machine, pattern", [
    ("Debian/Ubuntu init", r"^/lib/systemd/systemd --system --deserialize=\d+$"),
    ("Ubuntu desktop-ish boot", r"^/sbin/init splash$"),
    ("RHEL-like init", r"^/usr/lib/systemd/systemd rhgb --switched-root --system"),
    ("RHEL-like cron", r"^/usr/sbin/crond -n$"),
    ("RHEL-like time", r"^/usr/sbin/chronyd\b"),
    ("Debian cron", r"^/usr/sbin/cron -f"),
    ("console login", r"^/sbin/agetty\b"),
    ("OpenSSH listener title", r"^sshd: /usr/sbin/sshd -D \[listener\] \d+ of \d+-\d+ startups$"),
    ("OpenSSH session", r"^sshd: root@(pts/\d+|notty)$"),
    ("Proxmox VE API", r"^pvedaemon worker$"),
    ("Proxmox VE proxy", r"^pveproxy$"),
    ("Proxmox VE cluster fs", r"^/usr/bin/pmxcfs$"),
    ("Proxmox VE containers", r"^/usr/bin/lxc-start -F -n \d+$"),
    ("LXC container init", r"^/usr/sbin/init\.lxc -- "),
    ("container init", r"^/usr/bin/(tini|dumb-init) -- "),
    ("login shell", r"^-(ba|z)sh$"),
    ("Ansible's module run", r"^/usr/bin/python3 /root/\.ansible/tmp/ansible-tmp-[^/]+/AnsiballZ_\w+\.py$"),
    ("Ansible's pipelined run", r"^/usr/bin/python3 -I -B -c import sys;exec\(sys\.stdin\.buffer\.read\(\)\)$"),
    ("Ansible's become wrapper", r"^/bin/sh -c /usr/bin/python3 && sleep 0$"),
])
def test_the_machines_named_have_their_rows(machine, pattern):
    assert any(re.search(pattern, cmdline) for cmdline in CMDLINES), machine


# ----------------------------------------------------------------------------- DAEMONS


def test_daemons_is_a_frozenset_of_comms_of_the_table():
    assert isinstance(DAEMONS, frozenset) and DAEMONS
    assert all(isinstance(name, str) and 0 < len(name) <= TASK_COMM_MAX for name in DAEMONS)
    assert DAEMONS - set(COMMS) == set()


@pytest.mark.parametrize("name", [
    "python3", "python", "bash", "sh", "zsh", "sleep", "tmux: server", "screen", "su", "sudo", "login",
    "vim", "less", "tail", "top",
    # PID 1 and its like: a one-process container's PID 1 may be the job
    "systemd", "init", "tini", "dumb-init", "init.lxc",
])
def test_no_shell_interpreter_tool_or_init_is_a_daemon(name):
    assert name not in DAEMONS


@pytest.mark.parametrize("name", [
    "sshd", "cron", "crond", "agetty", "dbus-daemon", "rsyslogd", "chronyd", "systemd-journal",
    "systemd-udevd", "dockerd", "containerd", "lxcfs", "pmxcfs", "pvedaemon", "pvedaemon worke",
    "pveproxy", "pvestatd", "pve-firewall", "nv-hostengine", "nvidia-persiste",
])
def test_the_daemons_a_node_runs_are_daemons(name):
    assert name in DAEMONS


def test_a_daemon_s_name_is_its_comm_not_its_program_s_full_name():
    # ordinary_processes() compares DAEMONS with /proc/PID/comm, which never holds more than 15 characters.
    for full in ("systemd-journald", "nvidia-persistenced", "systemd-timesyncd"):
        assert full not in DAEMONS and full[:TASK_COMM_MAX] in DAEMONS
