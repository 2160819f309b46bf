# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What playbooks/plan.yml checks once, on localhost, before any host is read: the run's options
(fleet_option_errors) and that its host pattern and --limit select a container at all
(fleet_empty_selection); docs: fleet_option_errors.yml, fleet_empty_selection.yml.

Each option is checked by the code that takes it, never by a copy of its range here: a readiness
option by the read's own argument spec and bad_option() (readiness/_options.py's table, ranges
included; the controller imports the table, never the read's code), the
lock's wait by host_lock's bad_wait(). Only the plays' own keywords (batch, failure budget, how
to read) are checked here, as nothing else takes them before ansible-core does.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping

from ansible.errors import AnsibleError, AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.hygiene.plugins.filter.fleet import READ_BY
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common import _hostlock, _waits
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options

_TYPES = {"int": "a whole number", "float": "a number", "bool": "true or false", "list": "a list", "dict": "a mapping",
          "str": "a string", "path": "a path", "raw": "a value"}


class Variable(object):
    """A playbook variable: its name (``gpufleet_job.log``: a key of gpufleet_job), the role
    variable that takes precedence over it (or None), whether it is the run's (a play keyword,
    read on localhost) or each container's, and check(value) -> what is wrong, or None."""

    def __init__(self, name, check, role=None, run=False):
        self.name, self.check, self.role, self.run = name, check, role, run

    def given(self, hv):
        """(the variable's name, its value) as the host's variables give it (a _Vars); (None, None)
        when unset; the value is the AnsibleError of a variable whose template fails."""
        if self.role and self.role in hv:
            return self.role, hv.get(self.role)
        top, _dot, key = self.name.partition(".")
        if top not in hv:
            return None, None
        value = hv.get(top)
        if isinstance(value, AnsibleError):
            return top, value
        if not key:
            return self.name, value
        if not isinstance(value, Mapping) or key not in value:
            return None, None
        return self.name, value[key]


class _Vars(object):
    """A host's variables, each templated once (hostvars templates a variable at every access)."""

    def __init__(self, hv):
        self.hv, self.values = hv, {}

    def __contains__(self, name):
        return name in self.hv

    def get(self, name):
        if name not in self.values:
            try:
                self.values[name] = self.hv[name]
            except AnsibleError as exc:  # its template fails: every later play would fail on it too
                self.values[name] = exc
        return self.values[name]


def _what(option):
    """The first sentence of a readiness option's description, without markup or asides."""
    text = re.sub(r"\b(?:RV|[COVMP])\(([^)]*)\)", r"\1", option.description[0])
    text = re.sub(r"\s*\([^()]*\)", "", text).split(". ")[0].rstrip(".")
    return text[:1].lower() + text[1:]


def _readiness_check(option):
    """The read's own validation of one readiness option: its type by the readiness argument spec,
    its range by the table's bad_option (looked up at each call: no copy of a range here)."""

    def check(value):
        outcome = ArgumentSpecValidator(_options.argument_spec()).validate({option.name: value})
        if outcome.error_messages:
            if option.type in ("int", "float"):
                return "must be %s (%s)" % (_TYPES[option.type], _what(option))
            return "must be %s" % _TYPES.get(option.type, option.type)
        words = _words(_options.bad_option(outcome.validated_parameters), option.name)
        return words and "%s (%s)" % (words, _what(option))

    return check


def _words(problem, name):
    """common/_errors.out_of_range's wording of option ``name`` without its name and value
    (``must be at least 1``); None for no problem, or another option's."""
    if not problem or not problem.startswith(name + " "):
        return None
    return re.sub(r" \(got .*\)$", "", problem[len(name) + 1:])


def _typed(kind):
    def check(value):
        if kind == "bool":
            try:
                boolean(value, strict=True)
            except TypeError:
                return "must be true or false"
            return None
        outcome = ArgumentSpecValidator({"v": {"type": kind}}).validate({"v": value})
        return "must be %s" % _TYPES[kind] if outcome.error_messages else None

    return check


def _progress_every(value):
    """The waits' own check of progress_every (common/_waits.Slice: looked up at each call)."""
    problem = _typed("int")(value)
    if not problem:
        try:
            _waits.Slice(0, every=int(value))
        except GpufleetError as exc:
            problem = _words(exc.msg, "progress_every")
    return problem and "%s (seconds between the progress lines of a wait; 0 for none)" % problem


def _lock_wait(value):
    """host_lock's own check of its timeout (looked up at each call: no copy of its range here)."""
    problem = _typed("int")(value)
    if not problem:
        problem = _words(_hostlock.bad_wait(int(value)), "timeout")
    return problem and "%s (seconds to wait for another run's lock on a container)" % problem


# Ansible's serial: a count of hosts or a percentage of the play's, or a list of them. Below 1 (or
# 0%) ansible-core takes every host at once: the canary would be skipped without a word.
_PERCENT = re.compile(r"^\s*([0-9]+)\s*%\s*$")


def _batch_item(item):
    if isinstance(item, bool):
        return False
    if isinstance(item, int):
        return item >= 1
    if isinstance(item, str):
        m = _PERCENT.match(item)
        if m:
            return 1 <= int(m.group(1)) <= 100
        return item.strip().isdigit() and int(item) >= 1
    return False


def _batch(value):
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not items or not all(_batch_item(i) for i in items):
        hint = ("; a list is given to -e as JSON: -e '{\"gpufleet_batch\": [1, \"10%\"]}'"
                if isinstance(value, str) and value.lstrip().startswith("[") else "")
        return ("must be a number of containers of at least 1, a percentage from 1% to 100%, or a list of them "
                "(remediate's batches: Ansible's serial)" + hint)
    return None


def _percentage(value):
    text = str(value).strip().rstrip("%") if not isinstance(value, bool) else ""
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is None or not 0 <= number <= 100:
        return ("must be a percentage from 0 to 100 (the share of a batch's containers that may fail before the run "
                "stops: Ansible's max_fail_percentage)")
    return None


def _read_by(value):
    if value not in READ_BY:
        return "must be one of %s (which hosts the read's play has)" % ", ".join(READ_BY)
    return None


def _mapping(value):
    return None if isinstance(value, Mapping) else "must be a mapping (command, workdir, log, patterns, ...)"


def variables():
    """Every variable checked, in the order the messages list them."""
    rows = [Variable("gpufleet_read_by", _read_by, run=True),
            Variable("gpufleet_batch", _batch, run=True),
            Variable("gpufleet_max_fail_percentage", _percentage, run=True),
            Variable("gpufleet_job", _mapping)]
    rows += [Variable(o.inventory, _readiness_check(o), role=o.role) for o in _options.role_options() if o.inventory]
    rows += [Variable("gpufleet_lock_timeout", _lock_wait, role="repair_lock_timeout"),
             Variable("gpufleet_progress_every", _progress_every, role="relaunch_progress_every")]
    rows += [Variable(name, _typed("bool")) for name in
             ("gpufleet_allow_running_job", "gpufleet_repair_stalled", "gpufleet_hygiene_remediate", "gpufleet_pve_tags",
              "gpufleet_allow_empty_selection")]
    return rows


def _shown(value):
    if isinstance(value, str):
        return value if value and not re.search(r"\s", value) else repr(str(value))
    if isinstance(value, Mapping):
        return "{%s}" % ", ".join("%s: %s" % (k, _shown(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(_shown(v) for v in value)
    return str(value)


def _hosts(names, most=5):
    shown = list(names)[:most]
    more = len(names) - len(shown)
    return ", ".join(shown) + (" and %d more" % more if more else "")


def fleet_option_errors(hostvars, selected=(), limit=None):
    """What is wrong with the run's options, one message each, naming the variable as the user set
    it (``gpufleet_stall_after=-5 must be at least 1 (seconds ...)``); [] when nothing is. The
    run's own (a play keyword) as localhost sees them (-e, the inventory's ``all``); each selected
    container's (``selected`` within ``limit``, None for no limit) as it sees them, its hosts named
    when the run's value is not the wrong one."""
    if not isinstance(hostvars, Mapping):
        raise AnsibleFilterError("fleet_option_errors: expects hostvars")
    if isinstance(selected, str) or (limit is not None and isinstance(limit, str)):
        raise AnsibleFilterError("fleet_option_errors: expects host names (query('ansible.builtin.inventory_hostnames', pattern))")
    allowed = None if limit is None else set(limit)
    hosts = [h for h in selected if (allowed is None or h in allowed) and h in hostvars]
    rows = variables()
    found = {}  # (name, shown value): [message, hosts, on localhost]
    order = []

    def look(hv, host, row):
        name, value = row.given(hv)
        if name is None or value is None:
            return
        key = (name, _shown(value) if not isinstance(value, AnsibleError) else "...")
        if key not in found:
            problem = ("cannot be resolved: %s" % value.message) if isinstance(value, AnsibleError) else row.check(value)
            found[key] = [None if problem is None else "%s=%s %s" % (name, key[1], problem), [], False]
            order.append(key)
        if host is None:
            found[key][2] = True
        else:
            found[key][1].append(host)

    here = _Vars(hostvars["localhost"] if "localhost" in hostvars else {})  # noqa: SIM401 - HostVars has no .get
    for row in rows:
        look(here, None, row)
    for host in hosts:
        hv = _Vars(hostvars[host])
        for row in rows:
            if not row.run:
                look(hv, host, row)
    out = []
    for key in order:
        msg, on_hosts, on_localhost = found[key]
        if msg is None:
            continue
        out.append(msg if on_localhost else "%s (set for %s)" % (msg, _hosts(on_hosts)))
    return out


def fleet_empty_selection(selected, limit=None, pattern="pve_containers", limit_text="", sources=(), groups=None):
    """Why a run that selects no container selects none, and what to do; "" when it selects one.
    ``selected``: the host pattern's hosts; ``limit``: the --limit's hosts (None: no limit, or one
    from a file); ``pattern``, ``limit_text``: as given (gpufleet_hosts, ansible_limit);
    ``sources``: ansible_inventory_sources; ``groups``: the groups magic variable."""
    if isinstance(selected, str) or (limit is not None and isinstance(limit, str)):
        raise AnsibleFilterError("fleet_empty_selection: expects host names (query('ansible.builtin.inventory_hostnames', pattern))")
    allowed = None if limit is None else set(limit)
    if any(allowed is None or h in allowed for h in selected):
        return ""
    groups = groups or {}
    everyone = list(groups.get("all") or ())
    named = sorted(g for g in groups if g not in ("all", "ungrouped"))
    shown_sources = ", ".join("%s%s" % (s, "" if not isinstance(s, str) or os.path.exists(s) or "," in s else " (no such file)")
                              for s in sources or ()) or "none"
    head = "nothing to do: no container selected by the host pattern gpufleet_hosts=%s" % pattern
    if limit is not None or limit_text:
        head += " within --limit %s" % limit_text
    head += " (inventory: %s)" % shown_sources
    if not everyone:
        return ("%s: the inventory has no hosts. Give the fleet's inventory with -i (inventory/example-proxmox.yml, "
                "inventory/example.proxmox_lxc.yml or inventory/example-community-proxmox.yml show how), then run again"
                % head)
    more = " and %d more" % (len(named) - 30) if len(named) > 30 else ""
    counts = ", ".join("%s (%d)" % (g, len(groups[g] or ())) for g in named[:30]) + more
    if selected:
        return ("%s: the pattern selects %d host(s) (%s), none of them in the limit. Give a --limit that names some of "
                "them (and localhost, to keep the fleet plan), or leave --limit out" % (head, len(selected), _hosts(selected)))
    close = difflib.get_close_matches(str(pattern), named, n=2, cutoff=0.75)
    return ("%s: the pattern matches no host of the inventory.%s Its groups (hosts): %s. Give -e gpufleet_hosts=<a group "
            "or a host pattern of them>, or the inventory of the fleet with -i"
            % (head, " Did you mean %s?" % " or ".join(close) if close else "", counts or "none"))


class FilterModule(object):
    def filters(self):
        return {"fleet_option_errors": fleet_option_errors, "fleet_empty_selection": fleet_empty_selection}
