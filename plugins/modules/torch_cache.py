#!/usr/bin/python
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: torch_cache
short_description: Find, measure, clear and keep fresh the compile caches of torch, Triton, CUDA and FlashInfer
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Finds the TorchInductor, Triton, torch_extensions, CUDA JIT, FlashInfer JIT and TVM FFI caches
    of an account the way torch, Triton, the CUDA driver, FlashInfer and TVM FFI place them, with
    the training job's environment variables when given, and reports each one's path, size and
    number of entries.
  - TorchInductor uses E(TORCHINDUCTOR_CACHE_DIR), else C(<tmp>/torchinductor_<user>), where
    C(<tmp>) is what Python's C(tempfile.gettempdir) returns (E(TMPDIR), E(TEMP), E(TMP), then C(/tmp)). When
    E(TRITON_CACHE_DIR) is not set, the Triton kernels Inductor compiles live under it (C(triton/<device>)).
  - Triton uses E(TRITON_CACHE_DIR), else C(<TRITON_HOME or ~>/.triton/cache).
  - torch_extensions uses E(TORCH_EXTENSIONS_DIR), else C(<XDG_CACHE_HOME or ~/.cache>/torch_extensions).
    torch builds into a C(py<ver>_cu<ver>) folder under that default root, but not under the
    variable; the whole root is measured and cleared, and the folder is returned as RV(caches[].build_dir).
  - The CUDA JIT cache (PTX compiled by the driver) uses E(CUDA_CACHE_PATH), else C(~/.nv/ComputeCache).
  - FlashInfer's JIT workspace (the kernels it compiles with the CUDA toolkit and torch, under
    C(<version>/<archs>/cached_ops) and C(generated)) is C(<FLASHINFER_WORKSPACE_BASE or ~>/.cache/flashinfer).
    Its C(cubins) folder (prebuilt kernels FlashInfer downloads) is neither measured nor cleared.
  - TVM FFI, whose C(load_inline) builds sglang's JIT kernels against the CUDA runtime, uses
    E(TVM_FFI_CACHE_DIR) (C(~) expanded), else C(~/.cache/tvm-ffi).
  - O(state=absent) clears the caches; O(state=fresh) clears one only when the environment
    fingerprint recorded in it (torch, triton, CUDA and flashinfer versions) differs from that of O(venv),
    then records the new fingerprint; O(state=present) only reports.
  - The fingerprint is recorded in C(.gpufleet-hygiene-fingerprint.json) inside the cache root
    (the libraries that write the caches ignore it). It is removed first when a cache is cleared, so an
    interrupted clear is never taken for a fresh cache, and written again afterwards.
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
attributes:
  check_mode:
    support: full
    details:
      - Reports what would be cleared or recorded; changes nothing.
  diff_mode:
    support: full
    details:
      - Each changed cache's path, entries, size and recorded fingerprint before and after.
  idempotent:
    support: full
    details:
      - A second run with O(state=absent) or O(state=fresh) finds nothing to do.
options:
  state:
    description:
      - V(present) reports the caches and changes nothing.
      - V(absent) clears every selected cache (its contents; the root directory stays).
      - V(fresh) clears a cache only when its recorded fingerprint differs from the one of
        O(venv), or none is recorded while it holds something, then records the current one.
        A missing cache root is created (owned by O(user) when given) to hold the record.
    type: str
    choices: [present, absent, fresh]
    default: present
  caches:
    description:
      - Which caches to handle, each found as the description above says.
    type: list
    elements: str
    choices: [inductor, triton, torch_extensions, cuda, flashinfer, tvm_ffi]
    default: [inductor, triton, torch_extensions, cuda, flashinfer, tvm_ffi]
  venv:
    description:
      - The training virtual environment. Its torch, triton (or pytorch-triton), CUDA and flashinfer
        (C(flashinfer-python)) versions are read from C(*.dist-info) and C(torch/version.py) on disk,
        without importing anything;
        a venv made with C(--system-site-packages) also sees the base interpreter's packages.
      - Required with O(state=fresh). With O(state=present), RV(caches[].stale) is reported.
    type: path
  user:
    description:
      - The account the training job runs as. Its home directory comes from the password
        database, and its name is the C(<user>) of the Inductor default.
      - When given without O(environment), the module's own environment variables are not
        used (they belong to the account running Ansible).
      - Defaults to the account the module runs as.
    type: str
  home:
    description: The job's home directory, when it differs from E(HOME) and the password database.
    type: path
  environment:
    description:
      - The training job's environment variables (only those named above matter).
      - When given, these alone are used; a variable not in it is unset for the job. When left
        out, the module's own environment is used, unless O(user) is given.
      - A variable set but empty is refused with O(state=absent) or O(state=fresh), because
        deleting C($VAR/) with an empty variable is how C(/) gets cleared.
    type: dict
  force:
    description:
      - Clear a cache even while a running process has a file in it open, mapped, or as its
        working directory. Without it such a cache is refused, naming the process.
    type: bool
    default: false
notes:
  - 'Safety: a cache root is opened from C(/) one directory at a time without following symbolic
    links; a link anywhere in its path is refused and named (a link can be swapped to point
    anywhere). C(/), a top-level directory, a system directory (or one holding it), any home
    directory (or a directory holding one), O(venv) and any virtual environment (or anything
    inside one) are refused.'
  - 'Only caches are cleared: a root that is not where its kind puts its cache (C(~/.triton/cache),
    C(~/.cache/torch_extensions), C(~/.nv/ComputeCache), C(<tmp>/torchinductor_<user>), C(.cache/flashinfer),
    C(~/.cache/tvm-ffi)) must hold
    what that kind''s cache holds (see docs/torch_cache.md), else it is refused, saying which rule
    refused it.'
  - 'Clearing works on directory handles opened without following symbolic links, and removes
    relative to them: a symbolic link inside the cache is removed, never followed, so the file it
    points to survives; another file system mounted inside the cache is left alone.'
  - Running processes are found by reading C(/proc/*/fd), C(/proc/*/maps) and C(/proc/*/cwd).
    Run with C(become) to see every process.
seealso:
  - module: gpufleet.hygiene.cuda_contamination
  - module: gpufleet.hygiene.pip_inventory
"""

EXAMPLES = r"""
- name: Report the compile caches of the training account
  gpufleet.hygiene.torch_cache:
    user: trainer
    venv: /home/trainer/venv
  register: caches

- name: Clear the caches built against the contaminated venv before relaunching
  gpufleet.hygiene.torch_cache:
    state: absent
    caches: [inductor, torch_extensions]
    user: trainer

- name: Keep the caches only while torch, triton, CUDA and flashinfer are unchanged (job's own variables)
  gpufleet.hygiene.torch_cache:
    state: fresh
    venv: /root/venv
    environment:
      TORCHINDUCTOR_CACHE_DIR: /scratch/inductor
      TRITON_CACHE_DIR: /scratch/triton
      FLASHINFER_WORKSPACE_BASE: /scratch

- name: Fail when a cache is stale
  ansible.builtin.assert:
    that: caches.caches | selectattr('stale') | list | length == 0
"""

RETURN = r"""
caches:
  description: One entry per selected cache, in the order of O(caches).
  returned: success, and with a failure once the caches were inspected
  type: list
  elements: dict
  contains:
    name:
      description: V(inductor), V(triton), V(torch_extensions), V(cuda), V(flashinfer) or V(tvm_ffi).
      type: str
    path:
      description: The cache root, C(.) and C(..) resolved (a path through a symbolic link is refused).
      type: str
    configured:
      description: The cache root as the job computes it, before resolving.
      type: str
    source:
      description: The variable the path came from, or the default used.
      type: str
    exists:
      description: Whether the root is an existing directory.
      type: bool
    size:
      description:
        - Bytes in regular files (a hard-linked file once; symbolic links not followed).
        - For V(flashinfer), its C(cubins) folder left out.
      type: int
    entries:
      description: Files and symbolic links in the tree (directories and the marker not counted).
      type: int
    fingerprint:
      description: The fingerprint recorded in the cache (C(torch), C(triton), C(cuda), C(flashinfer)), or null.
      type: dict
    stale:
      description:
        - Whether O(state=fresh) would clear it. Null without O(venv).
      type: bool
    marker:
      description: Path of the fingerprint record.
      type: str
    holders:
      description: Running processes using the cache (C(pid), C(command), C(paths)).
      type: list
      elements: dict
    action:
      description:
        - V(none), V(clear), V(record) or V(clear_and_record); in check mode what would be done.
      type: str
    removed:
      description: Files and symbolic links removed (0 unless RV(caches[].action) cleared it).
      type: int
      sample: 912
    freed:
      description: Bytes of regular files removed.
      type: int
      sample: 48213504
    build_dir:
      description: For torch_extensions, the C(py<ver>_cu<ver>) folder torch uses with O(venv).
      type: str
    problems:
      description: What could not be read or was skipped, and why.
      type: list
      elements: str
  sample:
    - name: inductor
      path: /tmp/torchinductor_root
      configured: /tmp/torchinductor_root
      source: "default: <tmp>/torchinductor_<user> (tmp from /tmp)"
      exists: true
      size: 48213504
      entries: 912
      fingerprint: {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": null}
      stale: false
      marker: /tmp/torchinductor_root/.gpufleet-hygiene-fingerprint.json
      holders: []
      action: none
      removed: 0
      freed: 0
      problems: []
fingerprint:
  description:
    - The current fingerprint of O(venv) (C(torch), C(triton), C(cuda), C(flashinfer)); null without O(venv).
    - A package the venv does not hold is null.
  returned: success
  type: dict
  sample: {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": "0.6.11.post1"}
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import (
    CACHE_NAMES,
    TorchCache,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, fail
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._results import diff_only_in_diff_mode


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", default="present", choices=["present", "absent", "fresh"]),
            caches=dict(type="list", elements="str", default=list(CACHE_NAMES), choices=list(CACHE_NAMES)),
            venv=dict(type="path"),
            user=dict(type="str"),
            home=dict(type="path"),
            environment=dict(type="dict"),
            force=dict(type="bool", default=False),
        ),
        required_if=[("state", "fresh", ("venv",))],
        supports_check_mode=True,
    )
    p = module.params
    job = None
    try:
        job = TorchCache(
            p["caches"], state=p["state"], venv=p["venv"], user=p["user"], home=p["home"],
            environment=p["environment"], force=p["force"], check_mode=module.check_mode,
            run=module.run_command)
        result = job.execute()
    except GpufleetError as exc:
        fail(module, exc, job.warnings if job else ())
    for warning in job.warnings:
        module.warn(warning)
    module.exit_json(**diff_only_in_diff_mode(module, result))


if __name__ == "__main__":
    main()
