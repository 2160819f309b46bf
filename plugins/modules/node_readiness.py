#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: node_readiness
short_description: On a Proxmox VE node, read the readiness of several of its containers in one module run
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Runs on a Proxmox VE node. For each container listed in O(containers) it makes exactly the reads and
    verdicts of M(gpufleet.hygiene.readiness) with that container's options, and returns each container's
    result under its inventory name.
  - By default (O(read_from=node)) every container is read in this module's own process on the node, nothing
    of the container run, and the node's C(nvidia-smi) runs once for all of them. With O(read_from=container)
    each container is entered with C(pct exec <vmid> --) (or C(lxc-attach -n <vmid> --)) as the
    P(gpufleet.hygiene.pct#connection) connection would, and its own Python runs the reads there; the code and
    options travel over stdin and nothing is written in the container.
  - Over the P(gpufleet.hygiene.pct#connection) connection, where the task's host is a container, the module's
    action runs it on that container's node (the connection's O(gpufleet.hygiene.pct#connection:run_on=node)
    for this one run, over the same SSH master, never with C(become)), and a container's O(containers[].method),
    O(containers[].pct_path) and O(containers[].lxc_path) left out are the connection's own settings. Over any other
    connection it runs on the host itself.
  - One module run per node instead of one per container, the containers read concurrently - what
    makes the preflight, remediate and hygiene playbooks fast on large fleets. The verify role's
    C(read) and C(nodes) entry points call it - it is how every Proxmox VE container is read.
  - A container that cannot be read (stopped, bad options, no Python with O(read_from=container)) gets C(failed=true) and
    C(msg) in its own result; the others are still read. The module itself fails only on bad
    top-level options.
  - Reads only; changes nothing.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.info_module
options:
  containers:
    description:
      - The containers to read.
    type: list
    elements: dict
    required: true
    suboptions:
      host:
        description: The container's inventory name, the key of its result in RV(containers).
        type: str
        required: true
      vmid:
        description:
          - The container's Proxmox VE ID (an integer from 100 to 999999999, or its digits as text); anything
            else fails this container only.
          - Left out, the reads run on the machine the module runs on (a host that is its own node,
            reached without P(gpufleet.hygiene.pct#connection)).
        type: raw
      python:
        description: The container's Python 3 interpreter.
        type: str
        default: /usr/bin/python3
      method:
        description:
          - How to enter the container, as the connection's O(gpufleet.hygiene.pct#connection:method) - V(pct) or
            V(lxc-attach); anything else fails this container only.
        type: str
        default: pct
      pct_path:
        description: Name or path of C(pct) on the node.
        type: str
        default: pct
      lxc_path:
        description:
          - LXC path (C(lxc-attach -P)) for O(containers[].method=lxc-attach); unset on Proxmox VE.
          - With O(read_from=node), also which container is meant where containers of the same vmid run from
            several LXC paths on the node; when none of this path runs, the container is stopped and not read.
        type: str
      args:
        description:
          - The options of M(gpufleet.hygiene.readiness) for this container, as that module takes them
            and validated the same way (an unknown or ill-typed option fails this container only).
        type: dict
        default: {}
  brief:
    description:
      - Return of each container only what the verify role records (C(ready), C(running_job), C(checks), C(gpus),
        C(contaminants), C(caches), C(warnings)) instead of every read in full; a container that could not be read
        then has every check it would have made, failed with its C(msg).
      - Much less data for the controller to template when it only records verdicts.
    type: bool
    default: false
  max_parallel:
    description:
      - How many containers are read at once. V(0) means as many as the node has CPUs.
    type: int
    default: 0
  container_timeout:
    description: Seconds one container's reading may take before it is stopped and reported as failed.
    type: float
    default: 300
  gpu_read:
    description:
      - Where the GPUs are read. V(container) - each container runs its own C(nvidia-smi), as
        M(gpufleet.hygiene.readiness) does.
      - V(node) - C(nvidia-smi) runs once on the node; each holder it names (a host PID) is mapped to its
        container by C(/proc/<pid>/cgroup) and to its PID there by C(NSpid), and each container is given the
        GPUs whose device file it has (numbered from 0, in the node's order) and its own holders, instead of
        running C(nvidia-smi) itself; it still finds the holders of its device files in its own C(/proc).
        A container that has none of the node's GPUs, and every container when the node's reading fails
        (with a warning), reads its own.
      - With V(node), for the containers whose options ask for C(gpu_health), the node also reads its kernel log
        once (as root there, where a container's root seldom may) and folds its Xid events into each such
        container's C(gpu_healthy) check, matched by GPU UUID (M(gpufleet.hygiene.gpu_health) explains every code);
        a container whose check then fails is not ready. A log the node cannot read is a warning.
      - V(auto) - V(node) when the node has C(nvidia-smi) (O(nvidia_smi), else on C(PATH)), else V(container).
    type: str
    choices: [container, node, auto]
    default: container
  read_from:
    description:
      - Where each container with a O(containers[].vmid) is read.
      - V(node) - in this module's own process on the node, nothing of the container run - the node read. The node's
        C(/proc) is scanned once for the containers' processes (by their cgroup C(.../lxc/<vmid>/...), with their
        PID inside by C(NSpid)); each container's root (C(/proc/<init pid>/root)) is opened once as a directory
        handle and read in a thread whose root it is, so that every path, absolute link and C(..) resolves inside
        the container and never reaches the node's files. Processes come from the node's C(/proc), users and homes
        from the container's C(/etc/passwd) read as a file, owners and process users as the container sees them
        (its C(lxc.idmap)). No program, library or module of the container is run or loaded; C(nvidia-smi) runs once,
        on the node (O(gpu_read) is V(node)); a node without it gives its containers no GPUs. The health read, when
        asked (C(gpu_health)), is the node's, once, each container given its own GPUs. The evidence cache is not
        used (nothing is written in a container). O(containers[].python), O(containers[].method),
        O(containers[].pct_path) and O(containers[].lxc_path) are not used.
      - V(container) - each container reads itself in its own Python, entered with C(pct exec) or C(lxc-attach);
        for a node that cannot read its containers itself. This trusts the container's Python and its
        C(/etc/ld.so.preload).
    type: str
    choices: [node, container]
    default: node
    version_added: 0.3.0
  nvidia_smi:
    description: Path of C(nvidia-smi) on the node for O(gpu_read=node); found on C(PATH) when left out.
    type: path
  command_timeout:
    description: Seconds the node's C(nvidia-smi) may take (O(gpu_read=node)).
    type: float
    default: 15
  xid_since:
    description:
      - With O(gpu_read=node), how far back the node's kernel log is read for Xid events - an ISO 8601 timestamp, a
        number of seconds before now, or V(boot) for every event still in the ring buffer.
      - Unset, the last 24 hours (V(86400)). Only the driver's own kernel lines count (see M(gpufleet.hygiene.gpu_health)).
    type: str
notes:
  - The container's Python runs with C(-I -B) (isolated from C(PYTHON*) variables and the user site, no bytecode
    written) and needs only its standard library (and, for the NVML backend, the NVML bindings where it has them).
  - When the container's Python is the node's version the bytecode compiled on the node is used; otherwise it
    compiles the sources itself.
seealso:
  - module: gpufleet.hygiene.readiness
"""

EXAMPLES = r"""
- name: Read two containers of this node at once
  gpufleet.hygiene.node_readiness:
    containers:
      - host: train-101
        vmid: 101
        args:
          venv: /opt/venv
          job_patterns: ['train\.py']
          cache_user: trainer
      - host: train-102
        vmid: 102
        method: lxc-attach
        args:
          venv: /opt/venv
  register: node_read

- name: Show train-101's verdicts
  ansible.builtin.debug:
    msg: "{{ node_read.containers['train-101'].checks }}"
"""

RETURN = r"""
containers:
  description:
    - Each container's result under its O(containers[].host), the result of M(gpufleet.hygiene.readiness)
      for it (C(processes), C(gpu_state), C(cuda_contamination), C(pip_inventory), C(torch_cache), C(checks),
      C(ready), C(running_job)), plus C(warnings), that module's warnings as a list.
    - A container that could not be read has C(failed=true), C(msg) saying why, and C(rc) (the exit status of
      C(pct exec), or null).
    - With O(brief=true), only the keys listed there.
  returned: always
  type: dict
  sample:
    train-101: {changed: false, ready: true, running_job: false, warnings: [],
                checks: [{name: gpu_idle, severity: fail, ok: true, error: false, summary: 1 GPU(s) idle}]}
    train-102: {changed: false, failed: true, rc: 255, msg: container 102 is not running (stopped); start it (pct start 102) and run again}
read:
  description:
    - How many containers were read, how many of them could not be, the seconds taken, where the GPUs
      were read (C(gpus) - V(node) or V(container), see O(gpu_read)) and where the containers were read
      (C(from) - V(node) or V(container), see O(read_from)).
    - With the GPUs read on the node, C(xid_events) - the Xid events in the node's kernel log, or null when it was
      not read (no container asked for C(gpu_health), or the log could not be read).
  returned: always
  type: dict
  sample: {containers: 2, failed: 0, seconds: 0.41, gpus: node, from: node, xid_events: 0}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import out_of_range
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xid import parse_since
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox._node import (
    GPU_READS,
    READ_FROM,
    asks_health,
    fold_node_health,
    gpu_reading,
    node_health,
    read_node,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import BY_NAME


def main():
    module = AnsibleModule(
        argument_spec=dict(
            containers=dict(type="list", elements="dict", required=True, options=dict(
                host=dict(type="str", required=True),
                vmid=dict(type="raw"),
                python=dict(type="str", default="/usr/bin/python3"),
                method=dict(type="str", default="pct"),
                pct_path=dict(type="str", default="pct"),
                lxc_path=dict(type="str"),
                args=dict(type="dict", default={}),
            )),
            brief=dict(type="bool", default=False),
            max_parallel=dict(type="int", default=0),
            container_timeout=dict(type="float", default=300),
            gpu_read=dict(type="str", choices=list(GPU_READS), default="container"),
            # As the readiness read's (readiness/_options.py's table), once for all the containers.
            nvidia_smi=BY_NAME["nvidia_smi"].spec(),
            command_timeout=BY_NAME["command_timeout"].spec(),
            xid_since=dict(type="str"),
            read_from=dict(type="str", choices=list(READ_FROM), default="node"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = (out_of_range("max_parallel", p["max_parallel"], least=0)
               or out_of_range("container_timeout", p["container_timeout"], more_than=0)
               or BY_NAME["command_timeout"].out_of_range(p["command_timeout"]))
    if problem:
        module.fail_json(msg=problem)
    hosts = [c["host"] for c in p["containers"]]
    twice = sorted(set(h for h in hosts if hosts.count(h) > 1))
    if twice:
        module.fail_json(msg="containers: each host may be listed once; listed more than once: %s" % ", ".join(twice))
    try:
        xid_since = parse_since(p["xid_since"])
    except ValueError:
        module.fail_json(msg="xid_since must be an ISO 8601 timestamp (2026-12-01T03:00:00Z), a number of seconds or boot, "
                         "got %r" % p["xid_since"])
    gpu_read = "node" if p["read_from"] == "node" else p["gpu_read"]
    gpus = gpu_reading(module, gpu_read, p["nvidia_smi"], p["command_timeout"], containers_read_own=p["read_from"] != "node")
    # The node's GPU health, once for the containers that ask for it and for its kernel log's Xid events.
    health = None
    if p["read_from"] == "node" and gpus is not None and not gpus[0].get("error") and any(asks_health(c) for c in p["containers"]):
        health = node_health(p["nvidia_smi"] or module.get_bin_path("nvidia-smi"), p["command_timeout"])
    results, summary = read_node(module, p["containers"], p["max_parallel"], p["container_timeout"], as_brief=p["brief"], gpus=gpus,
                                 read_from=p["read_from"], nvidia_smi=p["nvidia_smi"], command_timeout=p["command_timeout"],
                                 health=health)
    if gpus is not None and not gpus[0].get("error"):
        summary["xid_events"] = fold_node_health(module, results, p["containers"], p["nvidia_smi"], p["command_timeout"],
                                                 since=xid_since, reading=health)
    module.exit_json(changed=False, containers=results, read=summary)


if __name__ == "__main__":
    main()
