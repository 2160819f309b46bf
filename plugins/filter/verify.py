# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The verify role's record and verdict of a readiness reading (docs: verify_record.yml, verify_verdict.yml).

Python rather than Jinja in the role's vars: every task of the role runs once per container
host, and ansible-core compiles each template again in each forked worker, so a large
expression in a role variable costs every host its compilation (measured in docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._readiness import brief_of_failure, record


def verify_record(reading, host, node=None, vmid=None, args=None):
    """The verify role's verify_result (docs/reports.md) of one host's readiness reading."""
    if not isinstance(reading, Mapping):
        raise AnsibleFilterError("verify_record: the reading must be a readiness result (a dict), got %s" % type(reading).__name__)
    if not host:
        raise AnsibleFilterError("verify_record: host (the inventory name) is required")
    if args is not None and not isinstance(args, Mapping):
        raise AnsibleFilterError("verify_record: args must be the readiness options (a dict), got %s" % type(args).__name__)
    # A reading whose checks and GPUs are there is a brief one (readiness or node_readiness with
    # brief=true); anything else is a call that failed before reading (no Python in the container,
    # the node unreachable, bad options): every check these options would have made fails with its message.
    short = reading if "checks" in reading and "gpus" in reading else brief_of_failure({"msg": reading.get("msg")}, args)
    return record(short, host, node, vmid)


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
        raise AnsibleFilterError("verify_verdict: expects a verify_result (with its checks)")
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
    ready = bool(record.get("ready"))
    if ready:
        line = "ready: " + "; ".join(c["summary"] for c in checks) if checks else "ready"
    elif record.get("error") and not checks:
        line = "NOT READY, not read: " + record["error"]
    else:
        line = "NOT READY: " + problems
    return dict(flags, ready=ready, lines=lines, problems=problems, line="%s - %s" % (record.get("host"), line))


class FilterModule(object):
    def filters(self):
        return {"verify_record": verify_record, "verify_verdict": verify_verdict}
