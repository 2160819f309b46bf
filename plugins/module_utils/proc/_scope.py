# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The scopes that choose processes: a module's ``scope`` option, checked and matched.

- A scope whose patterns match everyday processes (_ordinary.ORDINARY, root's daemons running
  here and this process's own command line) is refused unless ``allow_broad``.
- A tmux session is named exactly: a name tmux would read as another target is refused.
- The processes are read through proc/_proc.py, which applies a Scope (find_processes()) and
  the protection no scope can lift.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._ordinary import DAEMONS, ORDINARY
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import PROC, _read, all_pids, descendants, describe


class ProcError(GpufleetError):
    """A scope that cannot be applied (a bad pattern, tmux missing): the message says what."""


def tmux_pane_pids(session, socket=None, timeout=10):
    """PIDs of the panes of a tmux session, or raise ProcError."""
    argv = ["tmux"]
    if socket:
        argv += ["-S", socket]
    argv += ["list-panes", "-s", "-t", "=" + session, "-F", "#{pane_pid}"]
    try:
        res = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ProcError("scope.tmux_session is set but tmux is not installed on the target") from exc
    except subprocess.TimeoutExpired as exc:
        raise ProcError("tmux did not answer within %ss" % timeout) from exc
    if res.returncode != 0:
        return None  # no server, no such session: nothing is in it
    return set(int(x) for x in res.stdout.decode("ascii", "replace").split() if x.isdigit())


def tmux_name_problem(session):
    """Why ``session`` cannot name a tmux session exactly, or None.

    tmux stores ``:`` and ``.`` in a new session's name as ``_`` and control characters
    escaped, and reads them in a target as window and pane separators: ``=train:0`` or
    ``=train.1`` target the session ``train``, whatever else follows. Such a name would
    reach another session than the one given."""
    if not session:
        return "is empty: give the job's tmux session name"
    bad = sorted(set(c for c in session if c in ":." or ord(c) < 32 or ord(c) == 127))
    if bad:
        return ("contains %s, which tmux reads as a window or pane separator or escapes in names: no session "
                "is named that way (use letters, digits, - and _)" % ", ".join(repr(c) for c in bad))
    return None


def _names(info, smi_name=None):
    """The names scope.name is searched in: comm, nvidia-smi's name, their basenames, argv[0]'s."""
    names = [n for n in (info.get("comm"), smi_name) if n]
    names += [os.path.basename(n) for n in names]
    if info.get("cmdline"):
        names.append(os.path.basename(info["cmdline"].split(" ")[0]))
    return names


def ordinary_processes(proc=PROC):
    """``(comm, cmdline)`` of the everyday processes no scope pattern may match: the table, the
    root's processes running here under one of its daemons' names (DAEMONS: a real sshd's title
    names its own config path, which no table foresees) and this module's own process. Not PID 1 nor the
    ancestors: they are protected anyway, and in a one-process container PID 1 may be the job,
    which a pattern names rightly."""
    rows = list(ORDINARY)
    own = os.getpid()
    for pid in all_pids(proc):
        try:
            if pid in (1, own) or _read("%s/%d/comm" % (proc, pid)).rstrip("\n") not in DAEMONS:
                continue
        except (IOError, OSError):
            continue  # gone meanwhile
        info = describe(pid, proc)
        # Root's only: a user's process that calls itself sshd must not make the job's scope refused.
        if info is not None and info["uid"] == 0 and info["cmdline"]:
            rows.append((info["comm"], info["cmdline"]))
    info = describe(own, proc)
    if info is not None and info["cmdline"]:
        rows.append((info["comm"], info["cmdline"]))
    return rows


def broad_problem(key, rx, rows):
    """Why pattern ``rx`` of scope.<key> is too broad, or None: it matches the empty string, or
    one of ``rows`` (ordinary_processes())."""
    if rx.search("") is not None:
        return ("scope.%s pattern %r matches the empty string, so it matches every process: anchor it on the "
                "job, for example ^\\S*python3? \\S*train\\.py" % (key, rx.pattern))
    for comm, cmdline in rows:
        hit = any(rx.search(n) for n in _names({"comm": comm, "cmdline": cmdline})) if key == "name" \
            else rx.search(cmdline)
        if hit:
            return ("scope.%s pattern %r matches ordinary system processes (%r, for one), so it would put them in "
                    "scope: anchor it on the job, for example ^\\S*python3? \\S*train\\.py, or set "
                    "scope.allow_broad to true if every such process is meant" % (key, rx.pattern, cmdline))
    return None


def scope_options(vmids=False):
    """The argument_spec options of a module's ``scope`` (each module documents them)."""
    options = dict(
        name=dict(type="list", elements="str"),
        cmdline=dict(type="list", elements="str"),
        users=dict(type="list", elements="str"),
        tmux_session=dict(type="str"),
        tmux_socket=dict(type="path"),
        allow_broad=dict(type="bool", default=False),
        pids=dict(type="list", elements="dict", options=dict(
            pid=dict(type="int", required=True),
            start_time=dict(type="int", required=True),
        )),
    )
    if vmids:
        options["vmids"] = dict(type="list", elements="int")
    return options


class Scope(object):
    """Which processes may be terminated. Every criterion given must match (AND);
    within one criterion any item may match (OR). An empty scope matches nothing.

    A pattern that matches the empty string is refused; one that matches an ordinary system
    process (ordinary_processes()) is refused unless ``allow_broad``.

    ``pids`` names processes as they were read ({pid, start_time}): a listed PID is in scope only
    while it names the process that was read (its start time, field 22 of /proc/<pid>/stat), so a
    PID reused since is not."""

    def __init__(self, name=None, cmdline=None, users=None, vmids=None, tmux_session=None,
                 tmux_socket=None, proc=PROC, allow_broad=False, pids=None):
        try:
            self.name = [re.compile(p) for p in (name or [])]
            self.cmdline = [re.compile(p) for p in (cmdline or [])]
        except re.error as exc:
            raise ProcError("scope has an invalid regular expression: %s" % exc) from exc
        rows = None
        for key, compiled in (("name", self.name), ("cmdline", self.cmdline)):
            for rx in compiled:
                if rows is None:
                    rows = [] if allow_broad else ordinary_processes(proc)
                why = broad_problem(key, rx, rows)
                if why:
                    raise ProcError(why)
        why = tmux_name_problem(tmux_session) if tmux_session is not None else None
        if why:
            raise ProcError("scope.tmux_session %r %s" % (tmux_session, why))
        self.users = [str(u) for u in (users or [])]
        self.vmids = [int(v) for v in (vmids or [])]
        self.pids = {}
        for entry in pids or []:
            try:
                pid, started = int(entry["pid"]), int(entry["start_time"])
            except (KeyError, TypeError, ValueError) as exc:
                raise ProcError("scope.pids: each entry needs an integer pid and start_time, got %r" % (entry,)) from exc
            if pid < 1 or started < 0:
                raise ProcError("scope.pids: pid must be at least 1 and start_time at least 0, got %r" % (entry,))
            self.pids[pid] = started
        self.tmux_session = tmux_session
        self.tmux_socket = tmux_socket
        self.allow_broad = allow_broad
        self.proc = proc
        self._tmux = None
        self.notes = []

    def empty(self):
        return not (self.name or self.cmdline or self.users or self.vmids or self.tmux_session or self.pids)

    def user_matches(self, info):
        return str(info.get("uid")) in self.users or info.get("user") in self.users

    def _tmux_members(self):
        if self._tmux is None:
            panes = tmux_pane_pids(self.tmux_session, self.tmux_socket)
            if panes is None:
                self.notes.append("tmux session %r was not found: nothing is in it" % self.tmux_session)
                panes = set()
            self._tmux = descendants(panes, self.proc) if panes else set()
        return self._tmux

    def matches(self, proc_info, smi_name=None):
        """(bool, reason) for a dict from describe()."""
        if self.empty():
            return False, "the scope is empty"
        if self.pids:
            pid = proc_info.get("pid")
            if pid not in self.pids:
                return False, "pid %s is not in scope.pids" % pid
            if proc_info.get("start_time") != self.pids[pid]:
                return False, "pid %s started at %s, not at the listed %s: the PID was reused" % (
                    pid, proc_info.get("start_time"), self.pids[pid])
        if self.name and not any(rx.search(n) for rx in self.name for n in _names(proc_info, smi_name)):
            return False, "name does not match scope.name"
        if self.cmdline and not any(rx.search(proc_info.get("cmdline") or "") for rx in self.cmdline):
            return False, "command line does not match scope.cmdline"
        if self.users and not self.user_matches(proc_info):
            return False, "user %s is not in scope.users" % proc_info.get("user")
        if self.vmids and proc_info.get("vmid") not in self.vmids:
            return False, "vmid %s is not in scope.vmids" % proc_info.get("vmid")
        if self.tmux_session and proc_info["pid"] not in self._tmux_members():
            return False, "not in tmux session %s" % self.tmux_session
        return True, "in scope"
