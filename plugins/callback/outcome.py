# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
name: outcome
type: aggregate
short_description: Ends a repair run with one line per container it changed, or would change under --check
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - After the recap of a run of the C(repair) role (C(remediate.yml), C(hygiene.yml)), one line per container the run
    changed - or, under C(--check), would change - saying what, from the modules' own results, the rest counted.
  - Each line lists the processes stopped (PID and the start of the command line), the packages removed and restored,
    the compile caches cleared (only those whose content goes), the job relaunched (its command) and the throughput
    gate's verdict (median, floor, readings counted and skipped); a container whose repair failed, the task and its
    message.
  - It prints nothing for a run in which no container was decided on (preflight, a run that stopped in its plan). It
    changes no result and no exit status.
  - With O(outcome_file), it also writes the same lines as JSON, for the C(phases) of a later
    M(gpufleet.hygiene.fleet_report) (the incident page - what preflight found, what remediate did, the verdict
    after).
requirements:
  - enabled in C(ansible.cfg) - C(callbacks_enabled = gpufleet.hygiene.outcome) - or with
    C(ANSIBLE_CALLBACKS_ENABLED=gpufleet.hygiene.outcome)
options:
  outcome_file:
    description:
      - Also write the outcome here as JSON - C(kind) V(gpufleet.hygiene.outcome), C(version) 1, C(check),
        C(playbook), C(finished) (UTC) and C(hosts) - every container of the run, each with C(host), C(actions) (the
        parts of its line; none for a container with nothing to do) and C(failed) (the task and message of a repair
        that failed, or null).
      - Written at the end of a run that decided on at least one container (through a temporary file and a rename;
        the directory must exist). Not written otherwise, so an earlier run's file stays as it was.
    type: path
    version_added: 0.3.0
    env:
      - name: GPUFLEET_OUTCOME_FILE
    ini:
      - section: gpufleet_outcome
        key: outcome_file
"""

import datetime
import json
import os
from collections.abc import Mapping

from ansible import constants as C
from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._atomic import write_atomic
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._plan import run_plan

COMMAND_CHARS = 60  # of a command line shown
LISTED = 3  # items of a kind shown before "(+N more)"
PREFIX = "gpufleet.hygiene."


def _short(text, width=COMMAND_CHARS):
    text = " ".join(str(text or "").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _some(items):
    items = list(items)
    return ", ".join(items[:LISTED]) + (" (+%d more)" % (len(items) - LISTED) if len(items) > LISTED else "")


def _size(n):
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024.0
    return ("%d %s" if unit == "B" else "%.1f %s") % (n, unit)


class Host(object):
    """What the run did (or would do) on one container, from its modules' results."""

    def __init__(self):
        self.plan = None
        self.relaunch = []
        self.stopped = {}
        self.removed = []
        self.restored = []
        self.cleared = []
        self.launched = None
        self.gate = None
        self.failed = None

    def take(self, action, result, task_name):
        """Note one task's result (``action``: the module's short name, or None for set_fact)."""
        facts = result.get("ansible_facts") or {}
        if isinstance(facts.get("repair__plan"), Mapping):
            self.plan = facts["repair__plan"]
            self.relaunch = list(facts.get("repair__relaunch_command") or [])
        if action in ("processes", "gpu_state"):
            for t in result.get("terminated") or ():
                if isinstance(t, Mapping) and t.get("pid") is not None:
                    self.stopped.setdefault(t["pid"], t.get("cmdline") or "")
        elif action == "cuda_contamination":
            self.removed += ["%s %s" % (p.get("name"), p.get("version")) for p in result.get("removed") or () if isinstance(p, Mapping)]
            self.restored += ["%s %s" % (p.get("name"), p.get("version")) for p in result.get("restored") or () if isinstance(p, Mapping)]
        elif action == "torch_cache":
            for c in result.get("caches") or ():
                # What a clear removed (removed, freed), or under --check would remove (entries, size).
                if not isinstance(c, Mapping) or c.get("action") not in ("clear", "clear_and_record"):
                    continue
                count, size = (c.get("removed"), c.get("freed")) if c.get("removed") else (c.get("entries"), c.get("size"))
                if count:
                    self.cleared.append("%s %s (%d entries, %s)" % (c.get("name"), c.get("path"), count, _size(size or 0)))
        elif action == "throughput" and "median" in result:
            self.gate = result  # with the task's skip (its readings not counted), which the result leaves out
        elif action == "command" and task_name.startswith("Launch"):
            # The launch's own command line carries the job's environment (no_log: censored): the
            # job's command is the one the inventory gives it.
            self.launched = self.relaunch or result.get("cmd") or "the job"

    def fail(self, task_name, result):
        self.failed = "%s: %s" % (task_name, _short(result.get("msg") or "failed", 240))

    def changes(self, check):
        """The parts of this container's line, or [] when nothing changed (or would)."""
        parts = []
        if self.stopped:
            parts.append(("would stop " if check else "stopped ") + _some("pid %s %s" % (pid, _short(cmd, 40)) for pid, cmd in sorted(self.stopped.items())))
        if self.removed:
            parts.append(("would remove " if check else "removed ") + _some(self.removed))
        if self.restored:
            parts.append(("would restore " if check else "restored ") + _some(self.restored))
        if self.cleared:
            parts.append(("would clear " if check else "cleared ") + _some(self.cleared))
        if check and self.plan and (self.plan.get("repair") or self.plan.get("start")) and self.relaunch:
            parts.append("would relaunch `%s`" % _short(" ".join(str(a) for a in self.relaunch)))
        elif self.launched:
            launched = self.launched if isinstance(self.launched, str) else " ".join(str(a) for a in self.launched)
            parts.append("relaunched `%s`" % _short(launched))
        if self.gate:
            g = self.gate
            parts.append(
                "throughput %s tok/s against a floor of %s (%d readings%s)%s"
                % (
                    g.get("median"),
                    g.get("floor"),
                    len(g.get("readings") or ()),
                    ", %s skipped" % g["skip"] if g.get("skip") else "",
                    "" if g.get("passed", True) else ": below it",
                )
            )
        return parts


def outcome(hosts, plan_hosts, check):
    """(name, what it did, its failure or None) for each container of the run, in the plan's order."""
    rows = []
    for name in plan_hosts:
        host = hosts.get(name)
        rows.append((name, host.changes(check) if host is not None else [], host.failed if host is not None else None))
    return rows


def summary(hosts, plan_hosts, check):
    """The lines printed at the end: one a container that changed (or would), the rest counted."""
    rows = [row for row in outcome(hosts, plan_hosts, check) if row[1] or row[2]]
    quiet = len(plan_hosts) - len(rows)
    lines = ["  %s: %s" % (name, "; ".join(parts + (["FAILED at %s" % failed] if failed else []))) for name, parts, failed in rows]
    head = ("PLAN (check mode: nothing was changed): %d of %d container(s) would change" if check else "OUTCOME: %d of %d container(s) changed") % (
        len(lines),
        len(plan_hosts),
    )
    return [head] + lines + (["  %d container(s): nothing to do" % quiet] if quiet else [])


def _name(task):
    """The task's own name (get_name() puts its role's in front: ``gpufleet.hygiene.relaunch : Launch ...``)."""
    return str(task.name or task.action or "")


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "gpufleet.hygiene.outcome"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hosts = {}
        self._variables = None
        self._playbook = None

    def v2_playbook_on_start(self, playbook):
        self._playbook = getattr(playbook, "_file_name", None)

    def v2_playbook_on_play_start(self, play):
        self._variables = play.get_variable_manager()

    def _take(self, result, failed=False):
        action = result._task.action or ""
        short = action[len(PREFIX) :] if action.startswith(PREFIX) else action.rsplit(".", 1)[-1]
        name = result._host.get_name()
        host = self._hosts.get(name)
        if failed:
            if host is not None and host.plan is not None:  # a container the repair decided on
                if short == "throughput":
                    host.take(short, dict(result._result, skip=result._task.args.get("skip")), _name(result._task))
                host.fail(_name(result._task), result._result)
            return
        if short not in ("set_fact", "processes", "gpu_state", "cuda_contamination", "torch_cache", "throughput", "command"):
            return
        if host is None:
            host = self._hosts[name] = Host()
        extra = {"skip": result._task.args.get("skip")} if short == "throughput" else {}
        host.take(short, dict(result._result, **extra), _name(result._task))

    def v2_runner_on_ok(self, result, **_kwargs):
        self._take(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not ignore_errors:
            self._take(result, failed=True)

    def v2_playbook_on_stats(self, stats):
        decided = sorted(name for name, host in self._hosts.items() if host.plan is not None)
        if not decided:
            return
        # The run's containers, from its fleet plan (plan.yml): those never decided on were ready.
        everyone = decided
        plan = run_plan(self._variables)
        if plan is not None and isinstance(plan.get("containers"), (list, tuple)):
            everyone = list(plan["containers"]) + [n for n in decided if n not in plan["containers"]]
        check = bool(context.CLIARGS.get("check"))
        for line in summary(self._hosts, everyone, check):
            self._display.display(line, color=C.COLOR_CHANGED if line.startswith("  ") else C.COLOR_OK, stderr=False)
        path = self.get_option("outcome_file")
        if path:
            self._write(path, everyone, check)

    def _write(self, path, everyone, check):
        rows = outcome(self._hosts, everyone, check)
        data = {
            "kind": "gpufleet.hygiene.outcome",
            "version": 1,
            "check": check,
            "playbook": os.path.basename(self._playbook or ""),
            "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "hosts": [{"host": name, "actions": parts, "failed": failed} for name, parts, failed in rows],
        }
        try:
            write_atomic(path, json.dumps(data, indent=2) + "\n")
        except OSError as exc:
            self._display.warning("gpufleet.hygiene.outcome: cannot write outcome_file %s: %s" % (path, exc.strerror or exc))
