#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_state
short_description: Report GPU memory and its holders, wait for drain, and terminate scoped holders
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Reads every GPU (index, UUID, model, memory used and total, utilisation) and the processes
    that hold it, in one call, from nvidia-smi's query interface or from NVML.
  - On a Proxmox VE node (O(vantage=node)) the holders are the processes nvidia-smi reports, each
    mapped to its LXC container (the vmid from C(/proc/<pid>/cgroup)) and its PID inside the
    container (C(NSpid) in C(/proc/<pid>/status)).
  - Inside a container (O(vantage=container)), where nvidia-smi cannot name the holders, they are
    the processes with an open handle on a device file matching O(device_patterns), found in
    C(/proc/*/fd).
  - With O(state=drained), polls until every selected GPU is idle (memory used at most
    O(threshold_mib) and no holder), instead of a fixed sleep; fails on O(timeout) naming the GPU,
    its holders (a holder stuck in the kernel, state D, is named as such) and what to do.
  - With O(state=idle), terminates the holders of the selected GPUs that match O(scope) (SIGTERM,
    O(grace_period), SIGKILL), then waits for drain as O(state=drained) does. Holders outside the
    scope are reported in RV(out_of_scope) and never signalled.
  - With O(progress_every), the drain's wait is waited in slices (the O(timeout) is the whole wait's, since
    O(started)); a slice that ends with a GPU still busy returns RV(pending) and what it waits for. A pending
    O(state=idle) result names the holders it signalled (RV(terminated)); wait for the rest of the drain with
    O(state=drained) in an C(until) loop (see the examples) - O(state=idle) again would signal the holders still in
    scope again.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.gpu_read
  - gpufleet.hygiene.progress
attributes:
  check_mode:
    support: full
    details:
      - With O(state=idle), lists in RV(terminated) what would be signalled; signals nothing.
  diff_mode:
    support: full
    details:
      - With O(state=idle), the GPU holders in scope (PID, user, command line) before and those still running
        after; in check mode, after is what would be left.
  idempotent:
    support: full
    details:
      - A second O(state=idle) run finds nothing to terminate and reports no change.
options:
  state:
    description:
      - V(query) reads the GPUs and their holders.
      - V(drained) also waits until the selected GPUs are idle.
      - V(idle) terminates the holders in O(scope), then waits until the selected GPUs are idle.
    type: str
    choices: [query, drained, idle]
    default: query
  gpus:
    description:
      - The GPUs to act on and report, by index (V(0)) or UUID. All GPUs when empty.
    type: list
    elements: str
    default: []
  scope:
    description:
      - Which holders O(state=idle) may terminate. Every criterion given must match; within one
        criterion any item may match. Required with O(state=idle).
      - The init of a PID namespace (PID 1 of the node, or a process whose C(NSpid) ends in 1, the init
        of a container) and the module's own process and its ancestors are never signalled, whatever the
        scope; the holders among them that the scope matches are listed in RV(protected) with the reason.
      - A O(scope.name) or O(scope.cmdline) pattern that matches an ordinary system process is refused
        unless O(scope.allow_broad) - see there.
    type: dict
    suboptions:
      name:
        description: Python regular expressions searched in the process name (C(comm), the name nvidia-smi reports, the basename of C(argv[0])).
        type: list
        elements: str
      cmdline:
        description:
          - Python regular expressions searched in the command line (arguments joined by spaces).
          - A pattern that matches the empty string (V(''), V(.*), V(train|)) would match every process and is refused.
        type: list
        elements: str
      users:
        description:
          - User names or numeric UIDs, as seen from where the module runs (on a node, the UIDs of an
            unprivileged container are shifted, for example V(100000)).
        type: list
        elements: str
      vmids:
        description: Containers whose processes are in scope (O(vantage=node) only).
        type: list
        elements: int
      pids:
        description:
          - Processes named as they were read, each by its C(pid) and its C(start_time) (clock ticks since
            boot, field 22 of C(/proc/<pid>/stat), as the C(start_time) of RV(gpus[].processes) and the
            M(gpufleet.hygiene.processes) module return it).
          - A listed PID is in scope only while its start time is the listed one - a PID reused since the
            read names another process and is left alone (in RV(out_of_scope), with the reason).
          - The protection rule applies as to every scope - the init of a PID namespace and kernel threads
            are never signalled.
        type: list
        elements: dict
        version_added: 0.2.0
        suboptions:
          pid:
            description: The process ID, as seen from where the module runs.
            type: int
            required: true
          start_time:
            description: Its start time when it was read.
            type: int
            required: true
      tmux_session:
        description:
          - The processes of this tmux session's panes and their descendants.
          - A name with C(:), C(.) or a control character is refused; tmux reads C(=notes:0) as the session C(notes).
        type: str
      tmux_socket:
        description: The tmux server socket to ask (C(tmux -S)); the module user's default server when unset.
        type: path
      allow_broad:
        description:
          - Accept O(scope.name) and O(scope.cmdline) patterns that match ordinary system processes.
          - By default each pattern is tried on a table of everyday processes (init and systemd, sshd, a
            login shell, cron, agetty, dbus-daemon, a tmux server, this module's own Python as Ansible
            starts it, ...) and on this module's own process as it runs on the target; one
            that matches any of them (V(.), V(\\S), V(^.), V(python)) would put every such process in
            scope and is refused, naming the process it matched.
          - V(true) accepts such patterns; a pattern that matches the empty string is refused even then,
            and protected processes are never signalled.
        type: bool
        default: false
  timeout:
    description: Seconds to wait for drain with O(state=drained) or O(state=idle).
    type: float
    default: 60
  poll_interval:
    description: Seconds between two readings while waiting for drain.
    type: float
    default: 0.25
  grace_period:
    description: Seconds a holder has to exit after SIGTERM before it gets SIGKILL.
    type: float
    default: 10
  vantage:
    description:
      - Where the module runs. V(auto) takes V(container) when the target is a container (systemd's
        C(/run/systemd/container), C(container=) in PID 1's environment, Docker's or Podman's
        marker file), else V(node); when every PID nvidia-smi names is missing from C(/proc), it
        falls back to V(container) and says so in a warning.
    type: str
    choices: [auto, node, container]
    default: auto
  backend:
    description:
      - How GPUs are read. V(auto) uses NVML through the C(pynvml) module (nvidia-ml-py) when the
        target's Python can import it and NVML initialises, else nvidia-smi. NVML is never required.
      - When O(nvidia_smi) is given, V(auto) means V(nvidia-smi), so that the named program is asked.
    type: str
    choices: [auto, nvidia-smi, nvml]
    default: auto
notes:
  - Signals are sent through a pidfd where the kernel provides them, after checking that the PID
    still has the start time (field 22 of C(/proc/<pid>/stat)) it had when it was chosen, so a
    reused PID is never signalled.
  - The driver frees a dead process's memory a moment after it exits; O(state=drained) waits for
    the memory, not only for the process.
seealso:
  - module: gpufleet.hygiene.cuda_contamination
"""

EXAMPLES = r"""
- name: What holds the GPUs on this node?
  gpufleet.hygiene.gpu_state:
  register: gpu

- name: Show each holder with its container
  ansible.builtin.debug:
    msg: "GPU {{ item.0.index }}: pid {{ item.1.pid }} in CT {{ item.1.vmid }} ({{ item.1.used_memory_mib }} MiB)"
  loop: "{{ gpu.gpus | subelements('processes') }}"

- name: Preflight that also passes on CPU hosts
  gpufleet.hygiene.gpu_state:
    require_gpu: false
  register: gpu
  failed_when: not gpu.idle

- name: Wait until GPUs 0 and 1 are really free instead of sleep 5
  gpufleet.hygiene.gpu_state:
    state: drained
    gpus: ["0", "1"]
    timeout: 120

- name: Stop the stale training run of container 200, then wait for its memory to be freed
  gpufleet.hygiene.gpu_state:
    state: idle
    scope:
      vmids: [200]
      cmdline: ['train_dflash\.py']
    grace_period: 30
    timeout: 120
  register: stopped

- name: The same, saying every 10 s what the drain waits for (the gpufleet.hygiene.progress callback prints it)
  ansible.builtin.set_fact:
    drain_started: "{{ now().timestamp() }}"

- name: Stop the stale run; wait for the drain at most 10 s in this call
  gpufleet.hygiene.gpu_state:
    state: idle
    scope:
      vmids: [200]
      cmdline: ['train_dflash\.py']
    timeout: 120
    progress_every: 10
    started: "{{ drain_started }}"
  register: stopped

- name: Wait for the rest of the drain, a line every 10 s
  gpufleet.hygiene.gpu_state:
    state: drained
    timeout: 120
    progress_every: 10
    started: "{{ drain_started }}"
  register: drained
  until: not drained.pending | default(false)
  retries: 14
  delay: 0
  when: stopped.pending | default(false)

- name: Inside a container, stop what runs in the tmux session "train"
  gpufleet.hygiene.gpu_state:
    state: idle
    vantage: container
    scope:
      tmux_session: train
"""

RETURN = r"""
gpus:
  description: The selected GPUs (all when O(gpus) is empty), as last read.
  returned: success, and on drain timeout
  type: list
  elements: dict
  contains:
    index:
      description: nvidia-smi's index.
      type: int
    uuid:
      description: The GPU's UUID.
      type: str
    name:
      description: The GPU model.
      type: str
    memory_used_mib:
      description: Memory used, MiB; null when the driver does not say.
      type: int
    memory_total_mib:
      description: Memory total, MiB.
      type: int
    utilization_pct:
      description: GPU utilisation, percent; null when not supported.
      type: int
    idle:
      description: Memory used at most O(threshold_mib) (or unknown) and no holder.
      type: bool
    processes:
      description:
        - The holders. C(pid), C(name), C(used_memory_mib) (null when unknown, as inside a
          container), C(vmid) and C(container_pid) (the container and the PID inside it, on a node;
          null on the node itself), C(user), C(uid), C(cmdline), C(start_time) (clock ticks after boot,
          field 22 of C(/proc/<pid>/stat); null when the PID is not visible in this C(/proc)), C(state)
          (the process state letter, C(D) for one stuck in the kernel that no signal ends), and
          with O(vantage=container) C(devices), the device files it holds open.
      type: list
      elements: dict
  sample:
    - index: 0
      uuid: GPU-5d3c1f7e-8a8b-4c6e-9f0e-0c1a2b3c4d5e
      name: NVIDIA H200
      memory_used_mib: 41498
      memory_total_mib: 143771
      utilization_pct: 0
      idle: false
      processes:
        - {pid: 48211, name: python3, used_memory_mib: 41488, vmid: 200, container_pid: 1731, user: "100000",
           uid: 100000, cmdline: python3 train_dflash.py, start_time: 8851230}
idle:
  description: Every selected GPU is idle.
  returned: success, and on drain timeout
  type: bool
gpu_available:
  description: GPUs could be read. V(false) only with O(require_gpu=false) on a host without a usable GPU.
  returned: always
  type: bool
reason:
  description: Why no GPU could be read.
  returned: when RV(gpu_available=false)
  type: str
vantage:
  description: The vantage used, V(node) or V(container).
  returned: when RV(gpu_available=true)
  type: str
backend:
  description: What read the GPUs, V(nvidia-smi) or V(nvml).
  returned: when RV(gpu_available=true)
  type: str
query_seconds:
  description: Seconds the last reading of the GPUs took (both nvidia-smi queries, run concurrently, or NVML).
  returned: when RV(gpu_available=true)
  type: float
pending:
  description:
    - With O(progress_every), V(true) when this call's slice of the drain ran out with a selected GPU still busy and
      the whole wait not over; C(msg) says which GPUs, their memory and holders, and how long of the wait has passed.
  returned: with O(progress_every), while the wait goes on
  type: bool
  sample: true
waited:
  description: Seconds of the whole drain's wait behind (since O(started)).
  returned: when RV(pending)
  type: float
msg:
  description: What the wait is waiting for, for the progress line.
  returned: when RV(pending)
  type: str
  sample: "waiting for the GPUs to drain, 10 of 120 s: GPU 0 (NVIDIA H200, GPU-5e1c...): 40960 MiB used (threshold 1024 MiB), held by pid 9 python3"
drain_seconds:
  description:
    - Seconds until the selected GPUs were seen idle, from the first signal (O(state=idle)) or from
      the start of the wait (O(state=drained)). V(0.0)-ish when they were idle at once.
  returned: when O(state) is V(drained) or V(idle), outside check mode
  type: float
terminate_seconds:
  description: Seconds from the first SIGTERM until every signalled holder was gone.
  returned: when O(state=idle), outside check mode
  type: float
terminated:
  description:
    - The holders in scope, with C(gpu), C(signals) (names sent) and C(outcome) - V(terminated) (gone
      after SIGTERM), V(killed) (gone after SIGKILL), V(already_gone), V(pid_reused) (the PID names
      another process now; nothing sent), V(survived) (alive after SIGKILL), or V(would_signal) in
      check mode.
  returned: when O(state=idle)
  type: list
  elements: dict
out_of_scope:
  description: Holders of the selected GPUs that the scope does not cover, with the C(reason); never signalled.
  returned: when O(state=idle)
  type: list
  elements: dict
protected:
  description:
    - Holders in scope that are never signalled, with the C(reason) - the init of a PID namespace (PID 1, or
      C(NSpid) ending in 1), the module itself or one of its ancestors.
  returned: when O(state=idle)
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail, out_of_range
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._results import diff_only_in_diff_mode, stopped_diff
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import OPTIONS as WAIT_OPTIONS
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._waits import Slice
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state import GpuState
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._scope import Scope, scope_options
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import argument_spec, bad_option


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="query", choices=["query", "drained", "idle"]),
            gpus=dict(type="list", elements="str", default=[]),
            scope=dict(type="dict", options=scope_options(vmids=True)),
            timeout=dict(type="float", default=60),
            poll_interval=dict(type="float", default=0.25),
            grace_period=dict(type="float", default=10),
            vantage=dict(type="str", default="auto", choices=["auto", "node", "container"]),
            backend=dict(type="str", default="auto", choices=["auto", "nvidia-smi", "nvml"]),
            # threshold_mib, nvidia_smi, command_timeout, device_patterns, require_gpu: as the readiness read's
            **dict(argument_spec("gpu_read"), **WAIT_OPTIONS)
        ),
        required_if=[("state", "idle", ("scope",))],
        supports_check_mode=True,
    )
    p = module.params
    for key in ("timeout", "poll_interval", "grace_period"):
        problem = out_of_range(key, p[key], least=0)
        if problem:
            module.fail_json(msg=problem)
    problem = bad_option(p)  # command_timeout: the readiness table's range
    if problem:
        module.fail_json(msg=problem)
    if p["scope"] and p["scope"]["vmids"] and p["vantage"] == "container":
        module.fail_json(msg="scope.vmids needs vantage=node: a container does not see other containers")
    nvidia_smi = p["nvidia_smi"] or module.get_bin_path("nvidia-smi")
    backend = p["backend"]
    if p["nvidia_smi"] and backend == "auto":
        backend = "nvidia-smi"  # an explicit nvidia-smi is what the user wants asked, not NVML
    state = GpuState(backend=backend, nvidia_smi=nvidia_smi, command_timeout=p["command_timeout"],
                     vantage=p["vantage"], device_patterns=p["device_patterns"], threshold_mib=p["threshold_mib"])
    try:
        window = Slice(p["timeout"], p["started"], p["progress_every"]) if p["progress_every"] else None
        scope = Scope(**p["scope"]) if p["scope"] else None
        result = state.run(state=p["state"], wanted=p["gpus"], scope=scope, grace=p["grace_period"],
                           timeout=p["timeout"], interval=p["poll_interval"], check_mode=module.check_mode,
                           require_gpu=p["require_gpu"], window=window)
    except GpufleetError as exc:
        fail(module, exc, state.notes)
    for note in state.notes:
        module.warn(note)
    result["diff"] = stopped_diff("GPU holders in scope", result.get("terminated"))
    module.exit_json(**diff_only_in_diff_mode(module, result))


if __name__ == "__main__":
    main()
