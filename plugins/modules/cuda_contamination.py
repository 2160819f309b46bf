#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: cuda_contamination
short_description: Find, and optionally remove, packages built for another CUDA major than the venv's torch
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Decides for every installed package which CUDA major it was built for, from evidence read
    on disk, strongest first - the local version label (C(+cu130)), the name family
    (C(nvidia-cudnn-cu13), C(cupy-cuda12x), C(jax-cuda13-plugin)), the files it installed
    (C(nvidia/cu13/lib/), C(libcudart.so.13)), the C(DT_NEEDED) entries of its ELF objects,
    and (weakest) its requirements. A package with no evidence is reported as unknown, never as a match.
  - The reference is torch's own CUDA (its local label, or C(cuda) in C(torch/version.py), read
    without importing torch) unless O(expected_cuda) is given.
  - Reports files that one package overwrote in another (wheels of two CUDA majors share
    paths such as C(nvidia/nccl/lib/libnccl.so.2)).
  - With O(remove=true), uninstalls the contaminants and O(also_remove) with uv (when the
    target has it) or pip, keeps the files that remaining packages share with them, and
    reinstalls at their recorded versions the packages whose files had been overwritten.
  - The shared files wait out the uninstall in root's C(/var/lib/gpufleet-hygiene/stash), copied with
    their holes, at most 1 GiB a file (a larger one is not kept, and its package is recorded to be
    reinstalled) and 2 GiB of data in all. Past that the removal is refused before anything is removed,
    in check mode too.
  - A reinstall that fails is remembered outside the venv; the venv is not clean (RV(restore_pending))
    until the files are back.
  - Removes only from a virtual environment (C(pyvenv.cfg)) or a conda environment (C(conda-meta)),
    never from a system prefix such as C(/usr); uv and pip run without their cache and the lock is
    an C(flock) on the venv directory, so nothing outside the venv changes. A package whose metadata
    does not give a package name and version (a name such as C(--python=...)) is listed in RV(kept),
    never handed to the installer.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what would be removed and restored; changes nothing.
  diff_mode:
    support: full
    details:
      - The package list (C(name==version) lines) before and after.
  idempotent:
    support: full
options:
  venv:
    description: Path of the virtual environment to scan.
    type: path
    required: true
  expected_cuda:
    description:
      - The CUDA the environment should hold, as a major or major.minor (V(12.8), V(13)).
      - Required when torch is absent or CPU-only. Overrides torch's CUDA when given.
    type: str
  remove:
    description: Uninstall the contaminants and O(also_remove), then restore what they overwrote.
    type: bool
    default: false
  protect:
    description:
      - Names never removed, whatever the evidence. Compared after PEP 503 normalisation.
    type: list
    elements: str
    default: [torch]
  also_remove:
    description:
      - Names to remove together with the contaminants (a leftover serving stack such as
        V(sglang) or V(flashinfer-python)). Names that are not installed are ignored; a value that is
        not a package name (letters, digits, C(.), C(_), C(-)) is refused.
    type: list
    elements: str
    default: []
  find_links:
    description:
      - A directory of wheels to reinstall overwritten packages from, besides the configured index.
    type: path
  no_index:
    description: Reinstall only from O(find_links), never from a package index.
    type: bool
    default: false
  installer:
    description: Which tool removes and reinstalls. V(auto) takes uv when the target has it, else pip.
    type: str
    choices: [auto, uv, pip]
    default: auto
  scan_binaries:
    description: Read C(DT_NEEDED) of the ELF objects of packages that nothing else identifies.
    type: bool
    default: true
  lock_timeout:
    description: Seconds to wait for another run that is changing the same venv.
    type: int
    default: 60
  evidence_cache:
    description:
      - Keep each package's evidence (what its RECORD, METADATA and shared objects say) between
        reads, so that an unchanged venv is not read again. V(true) keeps it in
        C(/var/cache/gpufleet-hygiene/evidence), an absolute path in that directory instead, V(false) nowhere.
      - A package is read again when its dist-info, RECORD, METADATA or a shared object read for it
        changed (inode, size, mtime or ctime); files shared by several packages are hashed on every read.
      - Used only when the module runs as root and the directory and every directory above it are
        root's and writable by no one else; otherwise the venv is read in full, as with V(false).
        See docs/contamination.md.
    type: raw
    default: true
    version_added: 0.3.0
notes:
  - Packages visible through C(--system-site-packages) are scanned, but only packages inside
    the venv are removed; the others are listed in RV(kept) with the reason.
seealso:
  - module: gpufleet.hygiene.pip_inventory
"""

EXAMPLES = r"""
- name: Is the training venv consistent with its torch?
  gpufleet.hygiene.cuda_contamination:
    venv: /root/venv
  register: cuda

- name: Show the evidence
  ansible.builtin.debug:
    msg: "{{ item.name }} {{ item.version }} is CUDA {{ item.cuda_major }}: {{ item.evidence | join('; ') }}"
  loop: "{{ cuda.contaminants }}"

- name: Remove the CUDA 13 wheels and the leftover serving stack, restoring clobbered cu12 files
  gpufleet.hygiene.cuda_contamination:
    venv: /root/venv
    remove: true
    also_remove: [sglang, flashinfer-python, flashinfer-cubin]
    find_links: /srv/wheels
"""

RETURN = r"""
reference:
  description: The CUDA the venv is checked against.
  returned: success
  type: dict
  contains:
    cuda_major:
      description: Major version.
      type: int
    cuda_version:
      description: Version as known (V(12.8), or V(13) when only the major is known).
      type: str
    source:
      description: Where it came from (torch's label, C(torch/version.py), or O(expected_cuda)).
      type: str
  sample: {"cuda_major": 12, "cuda_version": "12.8", "source": "torch 2.8.0+cu128 (local version label)"}
contaminants:
  description: Packages built for another CUDA major, as found before any removal.
  returned: success
  type: list
  elements: dict
  contains:
    name:
      description: Package name.
      type: str
    version:
      description: Installed version.
      type: str
    cuda_major:
      description: The CUDA major the evidence names.
      type: int
    evidence:
      description: Human-readable reasons, each naming its evidence layer.
      type: list
      elements: str
    layer:
      description: The strongest evidence layer that decided (version label, name, files, binaries, requirements).
      type: str
  sample: [{"name": "nvidia-nccl-cu13", "version": "2.28.9", "cuda_major": 13, "layer": "name",
            "evidence": ["name nvidia-nccl-cu13: name suffix -cu13 (name evidence)",
                         "overwrote nvidia/nccl/lib/libnccl.so.2 of nvidia-nccl-cu12 2.27.3"]}]
clobbered:
  description: Files of one package overwritten by another (or gone), found before any removal.
  returned: success
  type: list
  elements: dict
  contains:
    path:
      description: Path relative to the site directory, as in RECORD.
      type: str
    owner:
      description: The package whose RECORD no longer matches.
      type: str
    owner_version:
      description: Its version.
      type: str
    state:
      description: V(overwritten) (another owner's content), V(modified), or V(missing).
      type: str
    overwritten_by:
      description: Owners whose RECORD hash the file now matches.
      type: list
      elements: str
unknown:
  description: Packages with no CUDA evidence at all (not a match, not a contaminant).
  returned: success
  type: list
  elements: str
clean:
  description:
    - No contaminant is installed and no package waits for a failed restore (RV(restore_pending))
      (after removal, when O(remove=true) and not in check mode).
  returned: success
  type: bool
restore_pending:
  description:
    - Packages that lost files when the packages that had overwritten them were removed, and whose
      reinstall failed. A removal records them in C(/var/lib/gpufleet-hygiene/restore/) on the target
      (root's, outside the venv, so the venv's owner can neither forge nor erase it); every later
      read checks only these packages against their RECORD and reports them here, with RV(clean=false),
      until their files are back, then drops the record.
    - The fix is a reinstall from a wheel directory - O(remove=true) with O(find_links) reinstalls them
      even when nothing else is removed.
  returned: success
  type: list
  elements: dict
  version_added: 0.2.0
  contains:
    name:
      description: The package.
      type: str
    version:
      description: Its version (the one installed, or the one recorded when it is not installed).
      type: str
    installed:
      description: Whether it is still installed (its files checked against RECORD) or gone altogether.
      type: bool
    missing:
      description: Its files that are missing.
      type: list
      elements: str
    modified:
      description: Its files that differ from their RECORD hash.
      type: list
      elements: str
    problem:
      description: What is wrong and how to fix it, in words (also in RV(problems)).
      type: str
scanned:
  description: Number of packages scanned.
  returned: success
  type: int
problems:
  description: Unreadable or malformed metadata met during the scan, and the packages in RV(restore_pending).
  returned: success
  type: list
  elements: str
removed:
  description: Packages removed (in check mode, those that would be).
  returned: when O(remove=true)
  type: list
  elements: dict
restored:
  description: Packages reinstalled at their recorded version because their files had been overwritten.
  returned: when O(remove=true)
  type: list
  elements: dict
kept:
  description: Contaminants not removed, with the reason (protected, outside the venv, or metadata that is no package name and version).
  returned: when O(remove=true)
  type: list
  elements: dict
installer:
  description: The tool that removed and reinstalled (V(uv) or V(pip)).
  returned: when something was removed
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._results import diff_only_in_diff_mode, warnings_to_module
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._removal import Removal


def main():
    module = AnsibleModule(
        argument_spec=dict(
            venv=dict(type="path", required=True),
            expected_cuda=dict(type="str"),
            remove=dict(type="bool", default=False),
            protect=dict(type="list", elements="str", default=["torch"]),
            also_remove=dict(type="list", elements="str", default=[]),
            find_links=dict(type="path"),
            no_index=dict(type="bool", default=False),
            installer=dict(type="str", default="auto", choices=["auto", "uv", "pip"]),
            scan_binaries=dict(type="bool", default=True),
            lock_timeout=dict(type="int", default=60),
            evidence_cache=dict(type="raw", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        job = Removal(
            p["venv"], module.run_command, expected_cuda=p["expected_cuda"], protect=p["protect"],
            also_remove=p["also_remove"], find_links=p["find_links"], no_index=p["no_index"],
            installer=p["installer"], scan_binaries=p["scan_binaries"], lock_timeout=p["lock_timeout"],
            check_mode=module.check_mode, evidence_cache=p["evidence_cache"])
        result = job.run(remove=p["remove"])
    except GpufleetError as exc:
        fail(module, exc)
    warnings_to_module(module, result)
    module.exit_json(**diff_only_in_diff_mode(module, result))


if __name__ == "__main__":
    main()
