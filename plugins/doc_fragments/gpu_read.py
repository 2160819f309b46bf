# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment(object):

    # How the GPUs are read: the options gpu_state and readiness share.
    DOCUMENTATION = r"""
options:
  threshold_mib:
    description: A GPU is idle when its memory used is at most this many MiB and no process holds it.
    type: int
    default: 64
  nvidia_smi:
    description: Path of nvidia-smi. Searched on C(PATH) (and the usual sbin directories) when unset.
    type: path
  command_timeout:
    description:
      - Seconds one nvidia-smi call may take before it is killed and the module fails (a GPU or
        driver in trouble can make nvidia-smi hang).
    type: float
    default: 15
  device_patterns:
    description:
      - Shell patterns of the device files whose open handles make a process a holder (in a
        container). A file whose name ends in C(nvidia<N>) belongs to the GPU with device minor N
        (from C(/proc/driver/nvidia/gpus/*/information), else index N).
    type: list
    elements: str
    default: ['/dev/nvidia*']
  require_gpu:
    description:
      - When V(false), a host without a usable GPU (no nvidia-smi, no devices, the driver not
        loaded, NVML missing) passes with C(gpu_available=false) instead of failing, so one
        preflight runs on CPU hosts too. A GPU fallen off the bus or a hanging nvidia-smi still fails.
    type: bool
    default: true
"""
