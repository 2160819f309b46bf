#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_health
short_description: Read GPU health (ECC, row remapping, throttling, PCIe, persistence, MIG, driver, Xid) with what to do
version_added: 0.3.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Reads every GPU's health - uncorrectable ECC errors (volatile and aggregate), retired pages and
    row remapping (pending, failed), active clock event (throttle) reasons, PCIe link generation and
    width against their maximum, persistence mode, MIG mode with its instances - and the driver
    version against a fleet-wide pin.
  - Each problem is a finding with a C(code), a C(severity) (V(fail) makes the GPU unhealthy,
    V(warn), V(info)), C(what) was seen and the C(action) to take (reset, drain, reboot, RMA).
    docs/gpu_health.md lists every finding.
  - Reads NVML through C(libnvidia-ml.so.1) where it loads (in-process, no command run), else
    C(nvidia-smi --query-gpu); O(source=xml) reads C(nvidia-smi -q -x), which also names the
    processes of each MIG instance.
  - With O(kernel_log=true), Xid events since O(since) (by default the last 24 hours) are read from
    C(/dev/kmsg) (else C(dmesg --time-format iso --facility kern)) and tied to their GPU by PCI address,
    with the common codes explained. A kernel log that cannot be read (C(kernel.dmesg_restrict), an unprivileged
    container) is the finding C(kernel_log_unreadable), not a failure.
  - A C(Driver/library version mismatch) is diagnosed as such (the user-space
    C(libnvidia-ml.so.<version>) against the kernel module's version in
    C(/proc/driver/nvidia/version)) and returned as the finding C(driver_library_mismatch).
  - The module fails only on bad options; a GPU or driver in trouble is RV(healthy=false) with RV(error) and findings.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.info_module
options:
  source:
    description:
      - Where to read. V(auto) is NVML when C(libnvidia-ml.so.1) loads, else C(nvidia-smi --query-gpu).
      - V(xml) reads C(nvidia-smi -q -x), the costliest and the only one that names each MIG instance's processes.
    type: str
    default: auto
    choices: [auto, nvml, query, xml]
  nvidia_smi:
    description: Path of nvidia-smi; by default it is looked up on C(PATH).
    type: path
  command_timeout:
    description: Seconds one nvidia-smi or dmesg run may take.
    type: float
    default: 15
  driver_pin:
    description:
      - The driver version the fleet pins (V(580.159.04), or a prefix such as V(580)); another version is the
        finding C(driver_pin_mismatch). Unset, the version is only reported.
    type: str
  kernel_log:
    description:
      - Read Xid events from the kernel log (costs a read of the ring buffer).
      - 'Only the driver''s own lines count - C(NVRM: Xid (PCI:dddd:bb:dd): <code>, ...), or its MIG form
        C(NVRM: Xid (PCI:dddd:bb:dd GPU-I:nn GPU-CI:nn): <code>, ...), at the start of a kernel message, from the
        kernel facility; a line that only holds that text (quoted in another message, or written to C(/dev/kmsg) by a
        process) is no event. See docs/gpu_health.md.'
    type: bool
    default: false
  since:
    description:
      - With O(kernel_log), only the Xid events at or after this time - an ISO 8601 timestamp, a number of
        seconds before now, or V(boot) for every event still in the ring buffer.
      - Unset, the last 24 hours (V(86400)).
    type: str
    aliases: [xid_since]
notes:
  - Standard library only; NVML is called through C(ctypes), no Python binding is needed.
seealso:
  - module: gpufleet.hygiene.gpu_state
  - module: gpufleet.hygiene.readiness
"""

EXAMPLES = r"""
- name: Read the GPUs' health on a node, with the Xid events of the last day
  gpufleet.hygiene.gpu_health:
    kernel_log: true
    since: "86400"
    driver_pin: "580.159.04"
  register: health

- name: The full read, with each MIG instance's processes
  gpufleet.hygiene.gpu_health:
    source: xml
"""

RETURN = r"""
healthy:
  description: No finding of severity C(fail) on any GPU nor on the host, and the read did not fail.
  returned: always
  type: bool
error:
  description: Why the GPUs could not be read (also a finding in RV(findings)); null when they were.
  returned: always
  type: str
source:
  description: What was read - V(nvml), V(query) or V(xml).
  returned: always
  type: str
driver:
  description: C(version) (as the driver reports it) and C(pin) (O(driver_pin)).
  returned: always
  type: dict
findings:
  description: The host's own findings (C(code), C(severity), C(what), C(action)) - the read's failure, the driver pin, an unreadable kernel log.
  returned: always
  type: list
  elements: dict
gpus:
  description:
    - Per GPU - C(index), C(uuid), C(name), C(pci), C(healthy), C(findings), C(ecc) (C(mode), C(volatile_uncorrected),
      C(aggregate_uncorrected), C(volatile_corrected), C(aggregate_corrected)), C(retired_pages) (C(single_bit),
      C(double_bit), C(pending)), C(remapped_rows) (C(correctable), C(uncorrectable), C(pending), C(failed)),
      C(throttle) (the active reasons), C(pcie) (C(gen), C(max_gen), C(width), C(max_width)), C(persistence_mode),
      C(mig) (C(current), C(pending), C(instances) with their memory and C(holders)), C(memory_faults)
      (C(sram_threshold_exceeded), C(unrepairable_memory), C(channel_repair_pending), C(tpc_repair_pending),
      C(sram_uncorrectable_sources), C(row_remapper_histogram); read by O(source=xml) only), C(xid) (the events),
      C(not_reported) (field - why). A value the source does not report is null.
  returned: always
  type: list
  elements: dict
kernel_log:
  description: C(read) (bool), C(problem) (why it could not be read) and C(events) (every Xid event read).
  returned: always
  type: dict
check:
  description: The verify role's C(gpu_healthy) check of this read, as the reports take it.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._findings import check_record
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import read_health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._xid import parse_since
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness._options import BY_NAME


def main():
    module = AnsibleModule(
        argument_spec=dict(
            source=dict(type="str", default="auto", choices=["auto", "nvml", "query", "xml"]),
            # As the readiness read's (readiness/_options.py's table).
            nvidia_smi=BY_NAME["nvidia_smi"].spec(),
            command_timeout=BY_NAME["command_timeout"].spec(),
            driver_pin=dict(type="str"),
            kernel_log=dict(type="bool", default=False),
            since=dict(type="str", aliases=["xid_since"]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    problem = BY_NAME["command_timeout"].out_of_range(p["command_timeout"])
    if problem:
        module.fail_json(msg=problem)
    try:
        since = parse_since(p["since"])
    except ValueError:
        module.fail_json(msg="since must be an ISO 8601 timestamp (2026-12-01T03:00:00Z), a number of seconds or boot, "
                         "got %r" % p["since"])
    health = read_health(source=p["source"], nvidia_smi=p["nvidia_smi"] or module.get_bin_path("nvidia-smi"),
                         timeout=p["command_timeout"], pin=p["driver_pin"], kernel_log=p["kernel_log"], since=since,
                         dmesg=module.get_bin_path("dmesg"))
    health["check"] = check_record(health)
    module.exit_json(changed=False, **health)


if __name__ == "__main__":
    main()
