#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: pip_inventory
short_description: List the Python packages of a venv from its dist-info, compare with a baseline, verify files
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Reads every C(*.dist-info) (and legacy C(*.egg-info)) directory on disk of a virtual
    environment or interpreter and returns the installed packages. pip is never run to list.
  - With O(baseline), compares the inventory with a requirements or lock file and returns the drift.
  - With O(verify_files), checks every installed file against the hash in its package's
    C(RECORD), as C(debsums) does for Debian packages.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - gpufleet.hygiene.attributes.INFO_MODULE
options:
  venv:
    description:
      - Path of a virtual environment. Its C(site-packages) are found on disk; when the venv
        was made with C(--system-site-packages) its interpreter is asked once for C(sys.path).
      - Exactly one of O(venv) and O(python) is required.
    type: path
  python:
    description:
      - A Python interpreter; the packages are those on its C(sys.path) (asked once, with C(-E)).
    type: path
  baseline:
    description:
      - A requirements or lock file on the target - C(pip freeze), C(uv pip freeze), C(uv export) or
        C(uv pip compile) output (hashes, C(--hash) continuation lines, markers, C(name @ url), C(-e ...#egg=name)),
        or a PEP 751 C(pylock.toml) (its C([[packages]]) names and versions; read by a small parser of its own, the
        same on every target Python). Pinned entries (C(==)) are compared by version; unpinned ones only for presence.
      - A line that is no requirement, or a malformed C(pylock.toml), fails with the file and the line. uv's own
        C(uv.lock) is refused with how to export it.
    type: path
  verify_files:
    description:
      - Verify every installed file against its C(RECORD) hash (size first, then the hash).
    type: bool
    default: false
notes:
  - Names are normalised as packaging does (PEP 503), so C(Flash_Attn) and C(flash-attn) are one package.
seealso:
  - module: gpufleet.hygiene.cuda_contamination
"""

EXAMPLES = r"""
- name: List the training venv
  gpufleet.hygiene.pip_inventory:
    venv: /root/venv
  register: inv

- name: Compare it with the lock file and verify every file
  gpufleet.hygiene.pip_inventory:
    venv: /root/venv
    baseline: /root/train/requirements.lock
    verify_files: true
  register: inv

- name: Fail on drift
  ansible.builtin.assert:
    that:
      - inv.drift.extra | length == 0
      - inv.integrity.ok
"""

RETURN = r"""
packages:
  description: Installed packages, first on the path first; a shadowed copy is not listed.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: Project name as its METADATA spells it.
      type: str
    version:
      description: Installed version, local label included (V(2.8.0+cu128)).
      type: str
    location:
      description: The site directory it is installed in.
      type: str
    installer:
      description: The tool that installed it (its C(INSTALLER) file), when known.
      type: str
  sample:
    - {"name": "torch", "version": "2.8.0+cu128", "location": "/root/venv/lib/python3.11/site-packages", "installer": "uv"}
count:
  description: Number of packages.
  returned: success
  type: int
  sample: 412
site_dirs:
  description: The directories read.
  returned: success
  type: list
  elements: str
shadowed:
  description: Packages present twice on the path; the later copy is shadowed.
  returned: success
  type: list
  elements: dict
problems:
  description: Unreadable or malformed metadata found (non-UTF-8, garbled RECORD rows).
  returned: success
  type: list
  elements: str
drift:
  description: Differences from O(baseline).
  returned: when O(baseline) is given
  type: dict
  contains:
    extra:
      description: Installed but not in the baseline.
      type: list
      elements: dict
    missing:
      description: In the baseline but not installed.
      type: list
      elements: dict
    changed:
      description: Installed at another version than pinned (C(name), C(baseline), C(installed)).
      type: list
      elements: dict
integrity:
  description: Files that are missing or differ from their RECORD hash.
  returned: when O(verify_files=true)
  type: dict
  contains:
    ok:
      description:
        - No file is missing or differs from its RECORD hash; RV(integrity.packages) lists the
          packages where one does.
      type: bool
    files_checked:
      description: Number of hashed files compared.
      type: int
      sample: 1834
    packages:
      description: One entry per package with a problem (C(name), C(version), C(missing), C(modified)).
      type: list
      elements: dict
  sample:
    ok: false
    files_checked: 1834
    packages:
      - {"name": "nvidia-nccl-cu12", "version": "2.27.3", "missing": [], "modified": ["nvidia/nccl/lib/libnccl.so.2"]}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._inventory import inventory


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path"),
            python=dict(type="path"),
            baseline=dict(type="path"),
            verify_files=dict(type="bool", default=False),
        ),
        mutually_exclusive=[("venv", "python")],
        required_one_of=[("venv", "python")],
        supports_check_mode=True,
    )
    try:
        p = module.params
        result = inventory(p["venv"], p["python"], p["baseline"], p["verify_files"], module.run_command)
    except GpufleetError as exc:
        fail(module, exc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
