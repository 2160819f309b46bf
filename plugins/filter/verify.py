# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role's filters: the record and verdict of a readiness reading, and its node entry
point's plan and readings, and the deprecated old names of the records (docs: verify_record.yml,
verify_verdict.yml, verify_node_job.yml, verify_node_reading.yml, verify_alias.yml).

Python rather than Jinja in the role: every task of the role runs once per container host, and
ansible-core compiles each template again in each forked worker, so a large expression costs
every host its compilation (docs/benchmarks.md). The record itself is built by
module_utils.readiness._record, the one builder the readiness action and module use too.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.datatag import deprecate_value
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _record
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import role_options

# The connection that means "a container behind its Proxmox VE node".
PCT_CONNECTIONS = ("gpufleet.hygiene.pct",)

# The role's outputs renamed in 0.3.0 (a host's record, the records a node keeps): the old name
# stays for one release, a deprecated alias, removed in 0.4.0 (verify_alias).
RENAMED = {"verify_result": "verify_record", "verify_results": "verify_records"}


def verify_record(reading, host, node=None, vmid=None, args=None):
    """The verify role's verify_record (docs/reports.md) of one host's readiness reading."""
    if not isinstance(reading, Mapping):
        raise AnsibleFilterError("verify_record: the reading must be a readiness result (a dict), got %s" % type(reading).__name__)
    if not host:
        raise AnsibleFilterError("verify_record: host (the inventory name) is required")
    if args is not None and not isinstance(args, Mapping):
        raise AnsibleFilterError("verify_record: args must be the readiness options (a dict), got %s" % type(args).__name__)
    return _record.of_reading(reading, host, node, vmid, args)


def verify_alias(value, old):
    """value (the record, or a node's records) under its old name ``old``: tagged deprecated, so
    that a template reading it warns, naming the new name; the value itself is the same."""
    new = RENAMED.get(old)
    if new is None:
        raise AnsibleFilterError("verify_alias: %r is no old name of the verify role's outputs; one of: %s" % (old, ", ".join(sorted(RENAMED))))
    if not isinstance(value, Mapping):
        raise AnsibleFilterError("verify_alias: expects the %s (a dict), got %s" % (new, type(value).__name__))
    return deprecate_value(value, "The verify role's %s is renamed %s." % (old, new), version="0.4.0",
                           collection_name="gpufleet.hygiene", help_text="Read %s instead." % new)


def _flag(name, value):
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise AnsibleFilterError("verify_verdict: %s must be true or false, got %r" % (name, value)) from None


def verify_verdict(record, fail=False, show=False):
    """What the verify role shows of a record: the verdict and one line per check, and the
    one-line summary of what is wrong; fail and show (the role's verify_fail and verify_show)
    come back as booleans, refused unless they are true or false."""
    if not isinstance(record, Mapping) or "checks" not in record:
        raise AnsibleFilterError("verify_verdict: expects a verify_record (with its checks)")
    flags = {"fail": _flag("verify_fail", fail), "show": _flag("verify_show", show)}
    checks = record["checks"]
    lines = ["READY" if record.get("ready") else "NOT READY"]
    lines.extend("%s | %s | %s" % (c["name"], "ok" if c["ok"] else "FAIL", c["summary"]) for c in checks)
    # Checks that failed for one reason (a call that failed before reading fails them all with its
    # message) share one entry: [gpu_idle, venv_clean] message.
    reasons = {}
    for c in checks:
        if not c["ok"]:
            reasons.setdefault(c["summary"], []).append(c["name"])
    problems = " | ".join("[%s] %s" % (", ".join(names), summary) for summary, names in reasons.items())
    if not problems and not record.get("ready") and record.get("error"):
        problems = "not read: %s" % record["error"]
    ready = bool(record.get("ready"))
    if ready:
        line = "ready: " + "; ".join(c["summary"] for c in checks) if checks else "ready"
    elif record.get("error") and not checks:
        line = "NOT READY, not read: " + record["error"]
    else:
        line = "NOT READY: " + problems
    return dict(flags, ready=ready, lines=lines, problems=problems, line="%s - %s" % (record.get("host"), line))


def verify_node_job(args, host, node=None, vmid=None, connection="", node_user="root", node_host="", node_port=22,
                    interpreter="", discovered="", node_python="/usr/bin/python3", container_python="/usr/bin/python3",
                    method=None, pct_path=None, lxc_path=None):
    """How the verify role's read reads one host: its node (user|address|port, or the host itself
    when it is not reached through pct), the group of that node's hosts, the Python the node's
    reader runs, the record's label and the host's entry of node_readiness's containers."""
    if not isinstance(args, Mapping):
        raise AnsibleFilterError("verify_node_job: expects the readiness options (a dict), got %s" % type(args).__name__)
    via_pct = connection in PCT_CONNECTIONS
    key = "|".join(str(part) for part in (node_user, node_host, node_port)) if via_pct else "self|%s" % host
    entry = {"host": host, "args": dict(args)}
    if via_pct:
        if vmid is None or vmid == "":
            raise AnsibleFilterError("verify_node_job: %s is reached through its node but has no ansible_pct_vmid" % host)
        if _pct.parse_vmid(vmid) is None:
            raise AnsibleFilterError("gpufleet.hygiene.pct: %s" % _pct.bad_vmid("vmid", vmid, "ansible_pct_vmid of %s" % host))
        # A container's Python is named by path: the node's reader starts it directly, nothing discovers it there.
        entry.update(vmid=vmid, python=interpreter if re.match(r"/[^ ]*$", interpreter or "") else container_python)
        entry.update((name, value) for name, value in (("method", method), ("pct_path", pct_path), ("lxc_path", lxc_path)) if value)
    return {"node": key, "group": "gpufleet_node_" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:16],
            "python": node_python if via_pct else (interpreter or discovered or "auto_silent"),
            "label": {"host": host, "node": node, "vmid": vmid}, "entry": entry}


def verify_node_reading(reader, host):
    """``host``'s reading as its reader (the first of its node's hosts reading now, whose
    variables ``reader`` are) brought it back from the node (verify__node_read), or the reader's
    failure naming the node and the reader."""
    if not isinstance(reader, Mapping):
        raise AnsibleFilterError("verify_node_reading: expects the reader's variables (hostvars[reader]), got %s" % type(reader).__name__)
    read = reader.get("verify__node_read")
    read = read if isinstance(read, Mapping) else {}
    readings = read.get("containers")
    if isinstance(readings, Mapping) and host in readings:
        return readings[host]
    job = reader.get("verify__node_job") or {}
    name = reader.get("inventory_hostname") or ""
    node = str(job.get("node") or "").split("|")
    out = {"failed": True, "msg": "reading through node %s failed%s: %s" % (
        node[1] if len(node) > 1 else node[0], " (by %s)" % name if name and name != host else "", read.get("msg") or "no result")}
    if read.get("unreachable"):
        out["unreachable"] = True  # recorded as not read: a network outage is not a held GPU
    return out


# The verify role's defaults for a host read by its node, from the readiness options' table (as
# the role's defaults/main.yml and verify__readiness_args are): the readiness option, the role
# variable, the inventory variable it defaults to (a key of gpufleet_job when dotted), the default
# and the conversion verify__readiness_args applies. A list or path is given as it is: the node
# validates it as readiness's options would.
_KINDS = {"bool": "bool", "int": int, "float": float, "str": str, "dict": dict}
_EMPTY = {"str": "", "path": "", "list": [], "dict": {}, "float": 0, "int": 0}


def _row(option):
    default = option.default if option.given == "always" else _EMPTY[option.type]
    kind = "positive" if option.given == "positive" else _KINDS.get(option.type)
    return (option.name, option.role, option.inventory, default, kind)


ALWAYS_GIVEN = tuple(_row(o) for o in role_options() if o.given == "always")
# Left out when empty, so that the module's defaults apply; "positive": given only above 0.
GIVEN_WHEN_SET = tuple(_row(o) for o in role_options() if o.given != "always")
ROLE_DEFAULTS = ALWAYS_GIVEN + GIVEN_WHEN_SET
_ROWS = {row[0]: row for row in ROLE_DEFAULTS}
_ALWAYS = frozenset(row[0] for row in ALWAYS_GIVEN)


def _convert(value, kind):
    """The value as the read takes it; one it cannot be is given as it is, and the read refuses
    it for that container alone, naming the option (node_readiness validates each container's
    options as the readiness module would)."""
    try:
        if kind == "bool":
            return boolean(value, strict=True)
        if kind == "positive":
            return float(value)
        if kind is int and isinstance(value, float) and not value.is_integer():
            return value  # 1.5 is no int: int() would cut it to 1
        if kind is dict and not isinstance(value, Mapping):
            return value
        return kind(value) if kind else value
    except (TypeError, ValueError):
        return value


def _role_value(hv, overrides, role_var, inventory_var, default):
    if role_var in overrides:
        return overrides[role_var]
    if role_var in hv:
        return hv[role_var]
    if inventory_var is None:
        return default
    name, _dot, key = inventory_var.partition(".")
    if not key:
        return hv.get(name, default)
    value = hv.get(name, {})
    return value.get(key, default) if isinstance(value, Mapping) else default


def verify_readiness_args(values, cache_vars=None):
    """The readiness options that the values of a role's variables give the read (values: {option:
    value}, every option the role gives; verify__readiness_args, relaunch__readiness_args and
    verify_container_args make it), by the table's rule for each: an option given always is given,
    converted; one given when set only when not empty (the read's default applies otherwise); a
    positive one only above 0; of cache_environment only the variables in cache_vars. The one place
    these rules are applied, for a host that reads itself and for a container its node reads."""
    if not isinstance(values, Mapping):
        raise AnsibleFilterError("verify_readiness_args: expects {option: value}, got %s" % type(values).__name__)
    args = {}
    for option, value in values.items():
        row = _ROWS.get(option)
        if row is None:
            raise AnsibleFilterError("verify_readiness_args: %r is no option a role gives the read; one of: %s"
                                     % (option, ", ".join(sorted(_ROWS))))
        _name, _role_var, _inventory_var, _default, kind = row
        given = value
        if kind == "positive" and value not in (None, ""):
            given = _convert(value, kind)
            given = given if not isinstance(given, float) or given > 0 else None
        if option in _ALWAYS or given:
            args[option] = _convert(given, kind)
    if isinstance(args.get("cache_environment"), Mapping):
        if cache_vars is None:
            raise AnsibleFilterError("verify_readiness_args: cache_environment needs cache_vars, the variables that place the caches")
        args["cache_environment"] = {k: v for k, v in args["cache_environment"].items() if k in cache_vars}
    return args


def verify_container_args(hv, cache_vars, overrides=None):
    """The readiness options of one container from its variables, as the verify role's
    verify__readiness_args gives them on the container itself: overrides (the role's variables
    the playbook sets), then the container's verify_* variables, then the gpufleet_* they default
    to - the precedence a node cannot leave to Ansible, since the containers are not its hosts."""
    overrides = overrides or {}
    values = {option: _role_value(hv, overrides, role_var, inventory_var, default)
              for option, role_var, inventory_var, default, _kind in ROLE_DEFAULTS}
    return verify_readiness_args(values, cache_vars)


def verify_node_entries(containers, cache_vars, overrides=None, container_python="/usr/bin/python3"):
    """node_readiness's containers for a node that is the play's host: one entry per container
    (its hostvars), with its readiness options (verify_container_args)."""
    entries = []
    for hv in containers:
        job = verify_node_job(verify_container_args(hv, cache_vars, overrides), hv["inventory_hostname"], hv.get("pve_node"),
                              hv.get("ansible_pct_vmid"), connection=hv.get("ansible_connection", ""),
                              interpreter=hv.get("ansible_python_interpreter", ""), container_python=container_python, method=hv.get("ansible_pct_method"),
                              pct_path=hv.get("ansible_pct_path"), lxc_path=hv.get("ansible_pct_lxc_path"))
        entries.append(job["entry"])
    return entries


def verify_node_records(read, entries, node):
    """{container: record} of a node's node_readiness run (read: its registered result) over
    entries (verify_node_entries): each container's reading, or the run's failure (a node that
    could not be reached too), which fails every check the container's options ask for, as the
    verify role's read (read_nodes.yml) records it. node is the node's inventory name, each container's pve_node."""
    if not isinstance(read, Mapping):
        raise AnsibleFilterError("verify_node_records: expects node_readiness's registered result")
    readings = read.get("containers") or {}
    out = {}
    for entry in entries:
        host = entry["host"]
        why = "could not be reached" if read.get("unreachable") else "failed"
        reading = readings.get(host) or {"failed": True, "unreachable": bool(read.get("unreachable")),
                                         "msg": "reading through node %s %s: %s" % (node, why, read.get("msg") or "no result")}
        out[host] = verify_record(reading, host, node, entry.get("vmid"), entry["args"])
    return out


class FilterModule(object):
    def filters(self):
        return {"verify_record": verify_record, "verify_verdict": verify_verdict,
                "verify_node_job": verify_node_job, "verify_node_reading": verify_node_reading,
                "verify_node_entries": verify_node_entries, "verify_node_records": verify_node_records,
                "verify_alias": verify_alias, "verify_readiness_args": verify_readiness_args}
