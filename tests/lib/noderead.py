# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""node_readiness against a simulated fleet: the read of a node's containers from the node
(read_from=node) or inside each (read_from=container), and the comparison of two records field
by field, what differs between two readings a moment apart left out.

A ``fleet`` is simfleet.running()'s fleet.json with ``env`` (the environment to run against it),
``inventory`` (its fleet.yml), ``hostvars`` (that file's JSON), ``state`` and ``scenario_name``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
# What differs between two readings a moment apart, whoever reads: the time each read took, and
# how long ago the running job's log last grew.
VOLATILE = {"seconds", "query_seconds", "age_s", "read_s"}
GROWING = {"mtime", "size"}  # of the running job's log (liveness.log)


def load(fleet, inventory, state, scenario, env):
    """``fleet`` (fleet.json) with what the helpers here read of it."""
    fleet["env"] = dict(env, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    fleet["inventory"] = os.path.join(str(inventory), "fleet.yml")
    with open(fleet["inventory"]) as f:
        fleet["hostvars"] = json.loads(f.read().split("\n", 1)[1])
    fleet["state"] = state
    fleet["scenario_name"] = scenario
    return fleet


def host_vars(fleet, name):
    for group in fleet["hostvars"]["all"]["children"]["pve_containers"]["children"].values():
        if name in group["hosts"]:
            return group["hosts"][name]
    raise KeyError(name)


def readiness_args(fleet, ct):
    """The options the verify role gives the readiness read of this container."""
    hv = host_vars(fleet, ct["name"])
    args = {"venv": "/opt/venv", "caches": True, "verify_files": True, "evidence_cache": False}
    if hv.get("gpufleet_require_gpu") is False:
        args["require_gpu"] = False
        return args
    job = hv["gpufleet_job"]
    args.update(job_patterns=job["patterns"], job_log=job["log"], job_baseline_tokens_per_s=job["baseline_tokens_per_s"],
                nvidia_smi=hv["gpufleet_nvidia_smi"], gpu_health=fleet["scenario_name"] == "gpubox")
    return args


def node_read(fleet, node, read_from, containers, args_of=None, timeout=300, **extra):
    """node_readiness on ``node`` over the fleet's SSH: {host: result}."""
    lxc = os.path.join(fleet["state"], "nodes", node["name"], "lxc")
    args_of = args_of or {}
    entries = [{"host": ct["name"], "vmid": ct["vmid"], "method": "lxc-attach", "lxc_path": lxc,
                "args": args_of.get(ct["name"]) or readiness_args(fleet, ct)} for ct in containers]
    # The GPUs read on the node for both, as the verify role does on a node that has nvidia-smi
    # (gpu_read=auto), so that both fold the node's kernel log alike.
    args = dict({"containers": entries, "read_from": read_from, "gpu_read": "node" if nvidia_smi_of(fleet, node) else "container"}, **extra)
    nvidia = nvidia_smi_of(fleet, node)
    if nvidia:
        args["nvidia_smi"] = nvidia
    res = subprocess.run([os.path.join(VENV_BIN, "ansible"), "-i", fleet["inventory"], node["name"], "-m",
                          "gpufleet.hygiene.node_readiness", "-a", json.dumps(args)], cwd=REPO, env=fleet["env"], text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    assert " | SUCCESS => " in res.stdout, res.stdout
    out = json.loads(res.stdout.split(" => ", 1)[1])
    assert out["read"]["from"] == read_from
    return out["containers"]


def nvidia_smi_of(fleet, node):
    """The node's nvidia-smi (the simulated fleet's node stand-in)."""
    return host_vars_node(fleet, node["name"]).get("gpufleet_nvidia_smi")


def host_vars_node(fleet, name):
    return fleet["hostvars"]["all"]["children"]["pve_nodes"]["hosts"][name]


def steady(value):
    """``value`` without what differs between two readings a moment apart (VOLATILE, and a
    process's scheduler state: running or sleeping at the instant it was read)."""
    if isinstance(value, dict) and "pid" in value and value.get("state") in tuple("RSD"):
        value = dict((k, v) for k, v in value.items() if k != "state")
    if isinstance(value, dict):
        return dict((k, steady(v) if k != "log" else steady(dict((n, x) for n, x in v.items() if n not in GROWING)))
                    for k, v in value.items() if k not in VOLATILE)
    if isinstance(value, list):
        return [steady(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"grew [0-9.]+s ago", "grew (age)s ago", value)
    return value


def differences(a, b, path=""):
    """Every field where two records differ, by its path: a readable assertion."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            out.extend(differences(a.get(key, "<absent>"), b.get(key, "<absent>"), "%s.%s" % (path, key)))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out.extend(differences(x, y, "%s[%d]" % (path, i)))
        return out
    return [] if a == b else ["%s: %r != %r" % (path, a, b)]
