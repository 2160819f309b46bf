#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: readiness
short_description: Read everything a readiness check needs in one call - job processes, GPUs, venv, packages, caches
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Runs, in one process on the target, the reads of M(gpufleet.hygiene.processes),
    M(gpufleet.hygiene.gpu_state), M(gpufleet.hygiene.cuda_contamination),
    M(gpufleet.hygiene.pip_inventory) and M(gpufleet.hygiene.torch_cache), with the options the
    verify role gives them, and returns each one's result under that module's name, exactly as
    that module returns it.
  - One module call per container instead of five - one connection, one interpreter start, one
    payload - is what makes a preflight over a large fleet fast. The GPUs are read while the venv
    is scanned.
  - A read that fails does not stop the others - its result has C(failed=true) and C(msg), as the
    module's own failure would - so a caller can report everything wrong on a host at once. The
    module itself fails only on bad options.
  - Judges the reads as the verify role reports them - RV(checks), one line per check - so that the
    controller only records the verdict.
  - Reads only; changes nothing. The verify role (and so the preflight, remediate and hygiene
    playbooks) calls it.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.info_module
  - gpufleet.hygiene.gpu_read
  - gpufleet.hygiene.readiness_options
options:
  brief:
    description:
      - Return only what the verify role records - RV(ready), RV(running_job), RV(checks), RV(gpus),
        RV(contaminants), RV(caches) - instead of every read in full (RV(processes), RV(gpu_state),
        RV(cuda_contamination), RV(pip_inventory) and RV(torch_cache) are then left out).
      - Far less data to send back and for the controller to template when only the verdict is kept.
    type: bool
    default: false
    version_added: 0.1.0
  record:
    description:
      - Whose reading this is. The result is then the verify role's record of it - the C(verify_record)
        that docs/reports.md describes and M(gpufleet.hygiene.fleet_report) reads - so that the reading
        can be registered as the record itself - the keys of O(brief=true) and RV(host), RV(node),
        RV(vmid), RV(remediated), RV(error) and RV(repair_error). Implies O(brief=true).
      - Its action records a container it cannot reach as well - not ready, no check (nothing was
        read), RV(error) set to the connection's message - and returns that as the host's
        unreachable result, so that every host of the play registers a record. Being returned, not
        raised, the result meets the task's C(failed_when) and C(until) - a C(failed_when) that
        is true makes the host failed instead of unreachable.
      - With it, options that cannot be used (a wrong type, an unknown option) fail the task
        whatever its C(failed_when) says - a configuration error, not a reading - as ansible-core's
        validation of a role's variables would.
    type: dict
    suboptions:
      host:
        description: The host's inventory name.
        type: str
        required: true
      node:
        description: Its Proxmox VE node; empty or null for a plain host (recorded as null).
        type: raw
      vmid:
        description: Its container's VMID; empty or null for a plain host (recorded as null).
        type: raw
    version_added: 0.1.0
notes:
  - Its action runs the reads without Ansible's module transport when it can - the target's Python
    started over the task's connection with a small bootstrap that imports the collection's
    module_utils from stdin (the controller's bytecode; nothing is written on the target) and runs
    exactly this module's code - the way M(gpufleet.hygiene.node_readiness) reads each container.
    It saves the AnsiballZ payload, C(ansible.module_utils.basic) and the compilation of every
    shipped source on each call.
  - The module is sent as usual when pipelining is off or impossible, with C(async), while the
    interpreter is still to be discovered, under Mitogen (which runs modules in its own
    interpreters), or when the variable C(gpufleet_readiness_bootstrap) is V(false).
seealso:
  - module: gpufleet.hygiene.gpu_state
  - module: gpufleet.hygiene.cuda_contamination
  - module: gpufleet.hygiene.torch_cache
"""

EXAMPLES = r"""
- name: Everything a preflight judges, in one call
  gpufleet.hygiene.readiness:
    job_patterns: ['^\S*python3? \S*train_dflash\.py']
    venv: /root/venv
  register: state

- name: Say what is wrong
  ansible.builtin.debug:
    msg: "{{ state.cuda_contamination.contaminants | map(attribute='name') | list }}"
  when: not state.cuda_contamination.failed | default(false)

- name: Read and record, as the verify role does (one task per container)
  gpufleet.hygiene.readiness:
    venv: /root/venv
    record:
      host: "{{ inventory_hostname }}"
      node: "{{ pve_node | default(none) }}"
      vmid: "{{ ansible_pct_vmid | default(none) }}"
  register: verify_record
  # A container that is not ready is data here, not a failure: its verdict is in verify_record.ready
  # and verify_record.checks. Refused options still fail the task; an unreachable host stays unreachable.
  failed_when: false
"""

RETURN = r"""
processes:
  description:
    - M(gpufleet.hygiene.processes)' result (V(state=query)) for O(job_patterns) and O(job_users).
    - C(skipped=true) when O(job_patterns) is empty; C(failed=true) and C(msg) when the read failed.
  returned: unless O(brief=true) or O(record)
  type: dict
  sample: {changed: false, count: 1, processes: [{pid: 1731, ppid: 1, user: root, comm: python3, cmdline: python3 train_dflash.py,
           start_time: 8851230}]}
gpu_state:
  description:
    - M(gpufleet.hygiene.gpu_state)' result (V(state=query)); C(failed=true), C(msg), C(gpu_available),
      C(error_kind) and C(rc) when the GPUs could not be read.
  returned: unless O(brief=true) or O(record)
  type: dict
  sample: {changed: false, gpus: [], idle: true, gpu_available: true, vantage: container, backend: nvidia-smi, query_seconds: 0.05}
gpu_health:
  description:
    - M(gpufleet.hygiene.gpu_health)' result (its cheap read, no kernel log) when O(gpu_health=true);
      C(skipped=true) otherwise.
  returned: unless O(brief=true) or O(record)
  type: dict
  version_added: 0.3.0
job_libraries:
  description:
    - What the job's processes and the GPU holders map of CUDA - C(processes), each C(pid), C(comm) and
      C(libraries) (each C(path) as the process sees it, C(family) - V(cuda), V(cudnn), V(nccl), V(cublas),
      V(cusparselt), V(nvshmem), V(triton) or V(torch) - C(package) and C(package_version) whose RECORD lists it,
      C(owners), C(cuda_major) and its C(evidence), C(deleted), C(outside_venv) and C(venv_copy)) - with
      C(problems), C(reference) and C(read_s).
    - C(skipped=true) without O(venv) or O(job_patterns), or with O(job_libraries=false).
  returned: unless O(brief=true) or O(record)
  type: dict
  version_added: 0.3.0
cuda_contamination:
  description:
    - M(gpufleet.hygiene.cuda_contamination)' result (a scan, nothing removed).
    - C(skipped=true) without O(venv); C(failed=true) and C(msg) when the scan failed.
  returned: unless O(brief=true) or O(record)
  type: dict
  sample: {changed: false, scanned: 14, contaminants: [], clobbered: [], reference: {name: torch, version: 2.8.0+cu128, cuda_major: 12,
           cuda_version: "12.8"}}
pip_inventory:
  description:
    - M(gpufleet.hygiene.pip_inventory)' result.
    - C(skipped=true) without O(venv), or without O(baseline) and O(verify_files); C(failed=true) and C(msg) when it failed.
  returned: unless O(brief=true) or O(record)
  type: dict
  sample: {changed: false, count: 14, packages: [], site_dirs: [/root/venv/lib/python3.11/site-packages], shadowed: [], problems: []}
torch_cache:
  description:
    - M(gpufleet.hygiene.torch_cache)' result (V(state=present)).
    - C(skipped=true) without O(venv) or with O(caches=false); C(failed=true) and C(msg) when it failed.
  returned: unless O(brief=true) or O(record)
  type: dict
  sample: {changed: false, caches: []}
checks:
  description:
    - The verdicts, in this order - C(gpu_idle) (every GPU idle, or with O(allow_running_job) held only
      by the job), C(job_live) (with O(job_patterns) - the job, if one runs, makes progress, and no GPU
      holder outlived its job; docs/checks.md), C(job_libraries) (with O(job_patterns), O(venv) and
      O(job_libraries) - no process of the job maps a CUDA library of another major, from outside the venv, or
      deleted; docs/checks.md), C(venv_clean) (no package built for another CUDA major than torch), C(packages) (no
      drift from O(baseline), files as in RECORD), C(caches_fresh) (no compile cache built for other
      versions), C(gpu_healthy) (with O(gpu_health) - no GPU with a finding of severity C(fail); docs/gpu_health.md),
      C(job_config) (with O(venv), O(job_workdir), O(job_command) or O(job_log) - the job can be launched as these
      options describe it; its C(problems) name the inventory variable to fix). C(job_live) also fails a running job
      whose last throughput is below 90% of O(job_baseline_tokens_per_s) (its C(slow)).
      A check whose read was skipped is left out; a read that failed fails its check with the read's message.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: V(gpu_idle), V(job_live), V(job_libraries), V(venv_clean), V(packages), V(caches_fresh), V(gpu_healthy) or V(job_config).
      type: str
    severity:
      description: V(fail).
      type: str
    ok:
      description: The check passed.
      type: bool
    error:
      description:
        - The read behind the check failed (for V(gpu_idle) - nvidia-smi hung or failed, a GPU fell
          off the bus), so the check could not judge; RV(checks[].summary) carries the read's message.
        - For V(gpu_healthy), the message itself (null when the GPUs were read).
      type: raw
    summary:
      description: One line saying what was found.
      type: str
    state:
      description: For V(job_live), the job's state - V(none) (no process matches), V(running) or V(stalled).
      type: str
    leftovers:
      description:
        - For V(job_live), the GPU holders left by a job that is gone - processes of the job's users (O(job_users),
          the owners of its processes, or O(leftover_users)) that are neither a job process nor a descendant of one,
          their parent the container's init - each C(pid), C(start_time), C(cmdline).
      type: list
      elements: dict
    namespace_inits:
      description:
        - For V(job_live), such holders that are the init of their own PID namespace, which are never signalled - each
          C(pid), C(start_time), C(cmdline), C(user); the check fails and its summary says how to stop them.
      type: list
      elements: dict
      returned: when there are
      version_added: 0.3.0
    gpus:
      description:
        - For V(gpu_healthy), each GPU's C(index), C(uuid), C(name), C(healthy), C(findings) (C(code), C(severity),
          C(what), C(action)), C(ecc), C(remapped_rows), C(retired_pages), C(throttle), C(pcie), C(persistence_mode),
          C(mig) and C(xid_events); see M(gpufleet.hygiene.gpu_health).
      type: list
      elements: dict
      version_added: 0.3.0
    driver:
      description: For V(gpu_healthy), the driver's C(version) and the C(pin) it is held to.
      type: dict
      version_added: 0.3.0
    findings:
      description: For V(gpu_healthy), the host's own findings (the read's failure, the driver pin).
      type: list
      elements: dict
      version_added: 0.3.0
    libraries:
      description:
        - For V(job_libraries), each wrong mapping - C(pid), C(comm), C(path), C(package), C(package_version),
          C(cuda_major), C(deleted) and C(reasons) (why it is wrong, each a line).
      type: list
      elements: dict
      version_added: 0.3.0
    throughput:
      description:
        - For V(job_live) with O(job_log), the job's last throughput reading - C(tokens_per_s) (null when the
          log's end holds none), C(baseline) (O(job_baseline_tokens_per_s), null without one) and C(ratio) of the
          two (null unless both are known).
      type: dict
      version_added: 0.3.0
  sample:
    - {name: gpu_idle, severity: fail, ok: false, error: false, summary: "GPU 0: 40960 MiB used, held by pid 1731 python3"}
    - {name: venv_clean, severity: fail, ok: true, error: false, summary: 14 packages consistent with CUDA 12.8}
liveness:
  description:
    - Whether the job makes progress - C(state) (V(none), V(running), V(stalled)), C(pids), C(log)
      (C(path), C(exists), C(size), C(mtime), C(age_s)), C(reason) (why it is stalled), C(stall_after) -
      and C(leftovers), the GPU holders of the job's users whose job is gone (C(pid), C(start_time), C(name),
      C(cmdline), C(gpu), C(used_memory_mib), C(user)), and C(namespace_inits), those of them that are the init of
      a PID namespace. Skipped without O(job_patterns). With O(job_log), C(throughput) - its
      last reading (C(tokens_per_s), C(baseline), C(ratio), and C(problem) saying why there is none).
  returned: unless O(brief=true) or O(record)
  type: dict
  version_added: 0.2.0
  sample: {state: running, pids: [1731], log: {path: /var/log/train.log, exists: true, size: 48213, mtime: 1764600000.0, age_s: 0.4},
           reason: null, stall_after: 900, leftovers: [], namespace_inits: []}
gpus:
  description: With O(brief=true) or O(record), RV(gpu_state)'s C(gpus).
  returned: when O(brief=true) or with O(record)
  type: list
  elements: dict
contaminants:
  description:
    - With O(brief=true) or O(record), RV(cuda_contamination)'s C(contaminants) - the packages built
      for another CUDA major, each with its evidence.
  returned: when O(brief=true) or with O(record)
  type: list
  elements: dict
caches:
  description:
    - With O(brief=true) or O(record), RV(torch_cache)'s C(caches) - each compile cache's path, size
      and whether it was built for this venv.
  returned: when O(brief=true) or with O(record)
  type: list
  elements: dict
ready:
  description: Every check passed.
  returned: always
  type: bool
running_job:
  description: Some process of the job (O(job_patterns)) is running.
  returned: always
  type: bool
host:
  description: With O(record), O(record.host).
  returned: with O(record)
  type: str
  sample: train-100
node:
  description: With O(record), O(record.node); null when empty.
  returned: with O(record)
  type: str
  sample: pve1
vmid:
  description: With O(record), O(record.vmid); null when empty.
  returned: with O(record)
  type: int
  sample: 100
remediated:
  description: With O(record), V(false) (the remediate playbook sets it on the records it repaired).
  returned: with O(record)
  type: bool
error:
  description: With O(record), null; the connection's message when the container could not be reached.
  returned: with O(record)
  type: str
repair_error:
  description:
    - With O(record), null. The repair role sets it on the record of a host whose repair failed, when it is told not to fail
      the host (C(repair_fail_on_error=false), as the hygiene playbook runs it).
  returned: with O(record)
  type: str
  version_added: 0.3.0
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import (
    ARGUMENT_SPEC,
    BRIEF_OPTION,
    RECORD_OPTION,
    bad_option,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._readiness import read
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._record import brief, record


def main():
    module = AnsibleModule(argument_spec=dict(ARGUMENT_SPEC, brief=BRIEF_OPTION, record=RECORD_OPTION), supports_check_mode=True)
    options = dict(module.params)
    as_brief = options.pop("brief")
    record_of = options.pop("record")
    problem = bad_option(options)
    if problem:
        module.fail_json(msg=problem)
    result = read(options, module.run_command, module.get_bin_path, module.check_mode)
    if as_brief or record_of:
        result = brief(result, options)
    for warning in result.pop("warnings"):
        module.warn(warning)
    if record_of:
        result = record(result, record_of["host"], record_of["node"], record_of["vmid"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
