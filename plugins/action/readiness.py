# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""readiness's action: run the reads on the target without Ansible's module transport.

The readiness module's work is _readiness.read(). Sent as a module, every call pays, on the
target, the AnsiballZ payload, ansible.module_utils.basic and the compilation of every shipped
source (most of the call's CPU on a small container; docs/benchmarks.md). This action instead
starts the target's Python, over the task's own connection, with the small bootstrap of
_bootstrap (the one node_readiness starts in each container) and sends it, over stdin, the
module_utils the reads need with the controller's bytecode; the bootstrap imports them from
memory (nothing is written on the target) and runs read() exactly as the module does. The
options are validated here against the module's own argument spec; the path options are
expanded on the target, as AnsibleModule would expand them there.

The module runs as usual (this action hands over to it) when the bootstrap cannot be used the
way a module would be: pipelining off or impossible (the connection, become, keep_remote_files),
async, an interpreter still to be discovered (the module's run discovers it; later tasks then
take the bootstrap), Mitogen (which runs modules in its own interpreters), or the variable
gpufleet_readiness_bootstrap set to false.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shlex
import tempfile

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import ARGUMENT_SPEC, BRIEF_OPTION, RECORD_OPTION, bad_option
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record import (
    RECORD_KEYS,
    brief,
    brief_of_failure,
    nothing_read,
    record,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.transport import _bootstrap

MODULE = "gpufleet.hygiene.readiness"
SWITCH = "gpufleet_readiness_bootstrap"
AUTO = ("auto", "auto_legacy", "auto_silent", "auto_legacy_silent")
MODULE_UTILS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "module_utils")
# Validated here; the options of type path are expanded on the target (_bootstrap.container_main).
PATH_OPTIONS = tuple(sorted(name for name, spec in ARGUMENT_SPEC.items() if spec.get("type") == "path"))
CONTROLLER_SPEC = dict({name: dict(spec, type="str") if name in PATH_OPTIONS else spec for name, spec in ARGUMENT_SPEC.items()},
                       brief=BRIEF_OPTION, record=RECORD_OPTION)


def _source(name):
    """A module_util's source, read from this collection's files."""
    rel = name[len(_bootstrap.PACKAGE) + 1:].split(".")
    with open(os.path.join(MODULE_UTILS, *rel) + ".py", encoding="utf-8") as handle:
        return handle.read()


def modules_part():
    """The modules part of the bootstrap's stdin: (index entries, bytes). Compiling them is
    costly, so each ansible-playbook run compiles them once, into its local
    temporary directory (shared by its workers, removed at its end), keyed by the sources and the
    Python; the workers that start together wait on a lock for the first one's result instead of
    all compiling at once."""
    sources = _bootstrap.module_sources(_source)
    digest = hashlib.sha1(repr(sorted(sources.items())).encode("utf-8") + importlib.util.MAGIC_NUMBER)
    path = os.path.join(C.DEFAULT_LOCAL_TMP, "gpufleet-bootstrap-%s" % digest.hexdigest()[:20])
    cached = _read_cache(path)
    if cached:
        return cached
    try:
        with open(path + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
            cached = _read_cache(path)
            if cached:
                return cached
            entries, blob = _bootstrap.module_blobs(sources)
            fd, tmp = tempfile.mkstemp(dir=C.DEFAULT_LOCAL_TMP, prefix=".gpufleet-bootstrap-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(json.dumps(entries).encode("utf-8") + b"\n" + blob)
            os.replace(tmp, path)
            return entries, blob
    except OSError:
        return _bootstrap.module_blobs(sources)  # no cache here: this worker compiles them


def _read_cache(path):
    try:
        with open(path, "rb") as handle:
            head, blob = handle.read().split(b"\n", 1)
        return json.loads(head), blob
    except (OSError, ValueError):
        return None


class ActionModule(ActionBase):
    _supports_check_mode = True
    _supports_async = True  # handed over to the module

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars if task_vars is not None else {}
        result = super().run(tmp, task_vars)
        validated = self._validated()
        record_of = self._record_of(*validated)
        try:
            python = self._bootstrap_python(task_vars)
            if python is None:
                reading = self._execute_module(module_name=MODULE, module_args=dict(self._task.args), task_vars=task_vars,
                                               wrap_async=self._task.async_val)
            else:
                reading = self._read(python, task_vars.get("inventory_hostname"), *validated)
        except AnsibleConnectionFailure as exc:
            if not record_of:
                raise  # ansible-core makes the host unreachable
            # Recorded as well: the host is still unreachable (no "failed" here, which would
            # count first), and what it registers is a record like every other host's. Returned,
            # not raised, so the task's failed_when and until see it (the verify role's
            # failed_when: false leaves it unreachable).
            reading = {"unreachable": True, "changed": False, "msg": str(exc)}
        result.update(self._recorded(self._briefly_failed(reading, record_of), record_of))
        return result

    def _record_of(self, params, problem):
        """The record option (a dict with host, node, vmid), or None; params and problem are
        _validated()'s. With it, options that cannot be used fail the task, whatever its failed_when
        says: a configuration error, not a reading of the container (the verify role's read has
        failed_when: false, and the playbooks leave ansible-core's validation of the role's
        variables out because this one stands in for it)."""
        if self._task.args.get("record") is None:
            return None
        if problem:
            raise AnsibleActionFail(problem)
        return params["record"]

    def _validated(self):
        """(the task's options validated against the module's spec, None) or (None, what is wrong)."""
        validated = ArgumentSpecValidator(CONTROLLER_SPEC).validate(dict(self._task.args))
        if validated.error_messages:
            return None, "%s: %s" % (MODULE, "; ".join(validated.error_messages))
        params = dict(validated.validated_parameters)
        return params, bad_option(params)

    def _briefly_failed(self, reading, record_of):
        """A brief call that failed before reading (bad options without record; sent as a module:
        no Python there, ...) comes back as every check it would have made, failed with its
        message, as the bootstrap's failures do. A container that could not be reached (with
        record) comes back with no check at all: nothing was read; the record's error says why."""
        if not (reading.get("failed") or reading.get("unreachable")) or "checks" in reading:
            return reading
        args = dict(self._task.args)
        if not record_of:
            try:
                if not boolean(args.get("brief", False), strict=True):
                    return reading
            except TypeError:
                return reading
        if reading.get("unreachable"):
            # Nothing was read: no check is failed (reports would count a network outage as GPUs
            # held), the record's error says why.
            return dict(reading, **nothing_read())
        return dict(reading, **brief_of_failure(reading, args))

    @staticmethod
    def _recorded(reading, record_of):
        """With record: the verify role's record of the (brief) reading, with the result's own
        keys (failed, msg, unreachable, invocation, ...). The module already made it when it ran."""
        if not record_of or "host" in reading or "checks" not in reading:
            return reading
        out = {key: value for key, value in reading.items() if key not in RECORD_KEYS}
        out.update(record(reading, record_of["host"], record_of["node"], record_of["vmid"], error=reading["msg"] if reading.get("unreachable") else None))
        return out

    def _bootstrap_python(self, task_vars):
        """The target's Python when the bootstrap can run the reads as the module would; else None."""
        # Under Mitogen (its mixin wraps every action) modules already run in a persistent
        # interpreter, and its actions have no pipelining to ask about: the module is sent.
        if any(cls.__module__.partition(".")[0] == "ansible_mitogen" for cls in type(self).__mro__):
            return None
        if self._task.async_val or not self._is_pipelining_enabled("new"):
            return None
        if not boolean(self._templar.template(task_vars.get(SWITCH, True)), strict=False):
            return None
        # The interpreter as the module would get it: a delegated task's is the delegate's.
        use_vars = task_vars.get("ansible_delegated_vars", {}).get(self._task.delegate_to, task_vars) if self._task.delegate_to else task_vars
        python = self._templar.template(C.config.get_config_value("INTERPRETER_PYTHON", variables=use_vars))
        if not python or python in AUTO:
            python = use_vars.get("ansible_facts", {}).get("discovered_interpreter_python")
        return python or None

    def _read(self, python, host, params, problem):
        if problem:
            return {"failed": True, "changed": False, "msg": problem}
        params = dict(params)
        asked = {"brief": params.pop("brief"), "record": params.pop("record")}
        as_brief = asked["brief"] or asked["record"] is not None
        entries, blob = modules_part()
        data = _bootstrap.payload(entries, blob, params, self._task.check_mode, expand=PATH_OPTIONS, brief=as_brief)
        env = self._compute_environment_string()  # the task's environment, as a module would have it
        cmd = (env + " " if env else "") + " ".join(shlex.quote(a) for a in _bootstrap.launcher_argv(python))
        res = self._low_level_execute_command(cmd, in_data=data)
        where = self._task.delegate_to or host or "the target"
        reading = _bootstrap.outcome(
            where, res["rc"], res.get("stdout", ""),
            lambda: _bootstrap.explain_exit(where, python, res["rc"], res.get("stdout", ""), res.get("stderr", "")),
            as_brief=as_brief)
        if as_brief and reading.get("failed") and "checks" not in reading:
            reading = dict(brief(reading, params), rc=reading.get("rc"))
        # As a module reports it (shown at -v and beyond): the options as validated here.
        reading["invocation"] = {"module_args": dict(params, **asked)}
        if not reading.get("warnings"):
            reading.pop("warnings", None)
        return reading
