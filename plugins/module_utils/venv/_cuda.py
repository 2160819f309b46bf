# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Which CUDA major each installed package was built for, and the evidence.

Layers, strongest first (see docs/contamination.md):

1. the local version label (``+cu128`` is 12.8, ``+cu130`` is 13.0);
2. the name family (``nvidia-cudnn-cu13``, ``cupy-cuda12x``, ``jax-cuda13-plugin``), or a
   toolkit wheel whose version is the CUDA version (``nvidia-cublas`` 13.x);
3. the files the package installed (``nvidia/cu13/lib/``, ``libcudart.so.13``);
4. DT_NEEDED of the package's ELF objects;
5. requirements naming another major's packages (weak).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_optional
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import canonical_name, file_digest, file_identity, path_identity
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._elf import dt_needed

# Name families, kept as data: (regular expression on the canonical name, what it is).
# Group ``cuda``: "12" is CUDA 12, "128" is 12.8; never "0x" (a CUDA 0 would flag it in every venv).
NAME_FAMILIES = (
    (r"^cupy-cuda(?P<cuda>[1-9]\d{1,2})x?$", "CuPy build for CUDA {cuda}"),
    (r"^jax-cuda(?P<cuda>[1-9]\d)-(plugin|pjrt)$", "JAX CUDA {cuda} plugin"),
    (r"^jaxlib-cuda(?P<cuda>[1-9]\d)$", "jaxlib CUDA {cuda} build"),
    (r"^tensorrt-cu(?P<cuda>[1-9]\d)(-.+)?$", "TensorRT for CUDA {cuda}"),
    (r"^(?:.+-)?cu(?P<cuda>[1-9]\d{1,2})(?:-.+)?$", "name suffix -cu{cuda_digits}"),
    (r"^(?P<base>.+)-cuda(?P<cuda>[1-9]\d{1,2})x?$", "name suffix -cuda{cuda_digits}"),
)
_NAME_FAMILIES = tuple((re.compile(p), text) for p, text in NAME_FAMILIES)

# Unsuffixed toolkit wheels whose version major is the CUDA major (CUDA 13 dropped the
# -cuNN suffix). Not cuFFT, cuRAND, cuSOLVER or cuSPARSE: their versions do not follow CUDA.
VERSION_IS_CUDA = frozenset((
    "nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-cuda-cupti", "nvidia-cuda-nvcc",
    "nvidia-cuda-cccl", "nvidia-nvjitlink", "nvidia-cublas", "nvidia-nvtx",
    "cuda-bindings", "cuda-python", "cuda-toolkit",
))

# Sonames whose major is the CUDA major (libcudart.so.12 is CUDA 12). Not libcufft,
# libcusparse, libcusolver or libcurand: their sonames do not follow CUDA.
CUDA_SONAMES = ("libcudart", "libcublas", "libcublasLt", "libnvrtc", "libnvrtc-builtins", "libnvJitLink")
_SONAME_RE = re.compile(r"^(%s)\.so\.(\d+)" % "|".join(re.escape(s) for s in CUDA_SONAMES))
_CU_DIR_RE = re.compile(r"(?:^|/)nvidia/cu(\d{2})/")
_LABEL_RE = re.compile(r"cu(\d{2,3})(?!\d)")
_SHARED_OBJECT_RE = re.compile(r"\.so(\.\d+)*$")
_REQ_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_EXPECTED_RE = re.compile(r"^(\d{1,2})(?:\.(\d{1,2}))?$")
_TORCH_CUDA_RE = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*(None|['\"]([^'\"]*)['\"])", re.MULTILINE)
_TORCH_VERSION_RE = re.compile(r"^__version__\s*(?::[^=\n]*)?=\s*['\"]([^'\"]*)['\"]", re.MULTILINE)

LAYERS = {1: "version label", 2: "name", 3: "files", 4: "binaries", 5: "requirements"}


class CudaError(GpufleetError):
    """Bad input, or no reference CUDA: the message says what to fix."""


def digits_to_cuda(digits):
    """``"12"`` → (12, None); ``"128"`` → (12, "12.8"); ``"92"`` → (9, "9.2")."""
    if len(digits) == 3:
        return int(digits[:2]), "%s.%s" % (digits[:2], digits[2])
    if digits[0] == "1":
        return int(digits), None
    return int(digits[0]), "%s.%s" % (digits[0], digits[1])


def parse_expected(value):
    """``expected_cuda`` ("12.8", "13") → (major, version text)."""
    text = str(value).strip()
    match = _EXPECTED_RE.match(text)
    if not match or int(match.group(1)) == 0:
        raise CudaError(
            "expected_cuda %r is not a CUDA version: give a major or major.minor such as "
            "'12.8' or '13'" % (value,))
    return int(match.group(1)), text


def label_cuda(version):
    """CUDA named by a local version label, or None. ``2.8.0+cu128`` → (12, "12.8")."""
    if not version or "+" not in version:
        return None
    label = version.split("+", 1)[1].lower()
    match = _LABEL_RE.search(label)
    if not match or match.group(1)[0] == "0":
        return None  # cu00..cu09x: no CUDA is numbered 0, and a CUDA 0 would flag the package in every venv
    return digits_to_cuda(match.group(1))


def is_cpu_label(version):
    return bool(version) and "+" in version and version.split("+", 1)[1].lower() in ("cpu", "cpuonly")


def name_cuda(key, version):
    """(major, reason) from the name family, or None."""
    for regex, text in _NAME_FAMILIES:
        match = regex.match(key)
        if match:
            digits = match.group("cuda")
            major, _minor = digits_to_cuda(digits)
            return major, text.format(cuda=major, cuda_digits=digits)
    if key in VERSION_IS_CUDA and version:
        head = version.split(".", 1)[0]
        if head.isdigit() and int(head) >= 9:
            return int(head), "toolkit wheel whose version is the CUDA version (%s)" % version
    return None


def file_cuda(rel_path):
    """(major, reason) from one installed file's path, or None."""
    if "/cu" not in rel_path and ".so." not in rel_path:
        return None  # the common case, decided without a regular expression
    match = _CU_DIR_RE.search(rel_path)
    if match:
        return int(match.group(1)), "installs %s (the CUDA %s layout)" % (rel_path, match.group(1))
    base = rel_path.rsplit("/", 1)[-1]
    match = _SONAME_RE.match(base)
    if match:
        return int(match.group(2)), "ships %s" % rel_path
    return None


def soname_cuda(soname):
    match = _SONAME_RE.match(soname)
    return int(match.group(2)) if match else None


def read_torch_version_py(site_dir, problems=None):
    """``torch/version.py`` of an installed torch, read as text, never imported.

    Returns ``{"version": ..., "cuda": ...}`` (each None when absent; ``cuda`` is "None" for
    a CPU-only build), or None when the file cannot be read (why is added to ``problems``,
    once). ``version`` is what ``torch.__version__`` says (``2.11.0+cu130``), which the
    dist-info may not (``2.11.0``).
    """
    found = []
    data = read_optional(os.path.join(site_dir, "torch", "version.py"), "torch_version", found, what="torch/version.py")
    if problems is not None:
        problems.extend(p for p in found if p not in problems)
    if data is None:
        return None
    text = data.decode("utf-8", "replace")
    version = _TORCH_VERSION_RE.search(text)
    cuda = _TORCH_CUDA_RE.search(text)
    return {
        "version": version.group(1) if version else None,
        "cuda": None if not cuda else ("None" if cuda.group(1) == "None" else cuda.group(2)),
    }


def torch_reference(dists):
    """The reference CUDA from torch: (major, version, source) or None; 'cpu' if CPU-only."""
    torch = None
    for dist in dists:
        if dist.key == "torch":
            torch = dist
            break
    if torch is None:
        return None
    found = label_cuda(torch.version)
    if found:
        major, version = found
        return major, version or str(major), "torch %s (local version label)" % torch.version
    info = read_torch_version_py(torch.site_dir, torch.problems)
    if info is None:
        return "cpu" if is_cpu_label(torch.version) else None
    if not info["cuda"] or info["cuda"] == "None":
        return "cpu"
    try:
        major, version = parse_expected(info["cuda"])
    except CudaError:
        return None
    return major, version, "torch %s (torch/version.py: cuda = '%s')" % (torch.version, info["cuda"])


def reference(dists, expected_cuda):
    """Decide the reference: expected_cuda if given, else torch's CUDA.

    Returns ``(ref_dict, warnings)``; raises CudaError naming expected_cuda when neither.
    """
    warnings = []
    from_torch = torch_reference(dists)
    if expected_cuda not in (None, ""):
        major, version = parse_expected(expected_cuda)
        if isinstance(from_torch, tuple) and from_torch[0] != major:
            warnings.append(
                "expected_cuda is %s but %s is built for CUDA %s: torch itself does not match"
                % (version, from_torch[2].split(" (")[0], from_torch[1]))
        return {"cuda_major": major, "cuda_version": version, "source": "expected_cuda"}, warnings
    if from_torch is None:
        raise CudaError(
            "no reference CUDA: torch is not installed in this environment (or says no CUDA "
            "version); set expected_cuda (for example '12.8' or '13')")
    if from_torch == "cpu":
        raise CudaError(
            "no reference CUDA: torch here is a CPU-only build; set expected_cuda (for example "
            "'12.8' or '13') to say which CUDA the environment should hold")
    major, version, source = from_torch
    return {"cuda_major": major, "cuda_version": version, "source": source}, warnings


def classify(dist, scan_binaries=True, before_read=None):
    """Evidence for one distribution: ``(layer, {major: [reasons]})``.

    ``layer`` is the strongest layer that said anything (None: unknown). Only that layer
    decides; weaker layers are not read once a stronger one has spoken. ``before_read(path)``
    is called before each shared object's DT_NEEDED is read (the evidence cache keys on them); it
    may return ``opened(stat_result)``, called with the fstat of the file then read.
    """
    found = label_cuda(dist.version)
    if found:
        return 1, {found[0]: ["version %s carries the local label for CUDA %s" % (dist.version, found[1] or found[0])]}
    if is_cpu_label(dist.version):
        return 0, {}
    found = name_cuda(dist.key, dist.version)
    if found:
        return 2, {found[0]: ["name %s: %s" % (dist.name, found[1])]}
    majors = {}
    shared_objects = []
    paths = dist.paths
    # Most packages name no CUDA directory, versioned soname or shared object at all: one
    # search of all their paths at once decides that without a loop per file.
    blob = "\n".join(rel for _abs, rel in paths)
    if "/cu" not in blob and ".so" not in blob:
        paths = ()
    for abs_path, rel in paths:
        hit = file_cuda(rel)
        if hit:
            reasons = majors.setdefault(hit[0], [])
            if len(reasons) < 3:
                reasons.append(hit[1])
        elif ".so" in rel and _SHARED_OBJECT_RE.search(rel):
            shared_objects.append((abs_path, rel))
    if majors:
        return 3, majors
    if scan_binaries:
        # Three linked CUDA libraries are evidence enough: torch alone ships hundreds of
        # shared objects, and reading them all would make one package most of the scan.
        found = 0
        for abs_path, rel in shared_objects:
            opened = None
            if before_read is not None:
                opened = before_read(abs_path)
            for soname in dt_needed(abs_path, dist.problems, rel, opened) or ():
                major = soname_cuda(soname)
                if major is not None:
                    majors.setdefault(major, []).append("%s links %s (DT_NEEDED)" % (rel, soname))
                    found += 1
            if found >= 3:
                break
        if majors:
            return 4, majors
    for req in dist.requires_dist:
        if "extra" in req.split(";", 1)[-1] and ";" in req:
            continue  # an optional extra is not installed because of this package
        match = _REQ_NAME_RE.match(req)
        if not match:
            continue
        hit = name_cuda(canonical_name(match.group(1)), None)
        if hit:
            majors.setdefault(hit[0], []).append(
                "requires %s (weak evidence: a requirement, not an installed file)" % req.strip())
    if majors:
        return 5, majors
    return None, {}


def _cached_digest(cache, path, algo):
    if algo not in cache:
        try:
            cache[algo] = file_digest(path, algo)
        except (IOError, OSError, ValueError):
            cache[algo] = None
    return cache[algo]


def shared_paths(dists):
    """Paths listed by two or more packages, with each owner's RECORD row:
    ``{abs_path: [(dist, rel, algo, digest)]}``. Only RECORD is read (no installed file)."""
    # Paths in two or more packages, found with set operations (no loop per file in Python).
    seen, twice = set(), set()
    for dist in dists:
        mine = {abs_path for abs_path, _rel in dist.paths}
        twice |= mine & seen
        seen |= mine
    owners = {}
    if twice:
        for dist in dists:
            for abs_path, rel in dist.paths:
                if abs_path in twice and not (rel.endswith(".pyc") or "/__pycache__/" in rel):
                    owners.setdefault(abs_path, {})[dist] = dist  # once, if RECORD names it twice
    shared = {}
    for abs_path, group in owners.items():
        if len(group) < 2:
            continue
        # Only now are these packages' hashes read (their full RECORD parse is cached).
        entries = []
        for dist in group:
            for row in dist.record:
                if row[0] == abs_path:
                    entries.append((dist, row[1], row[2], row[3]))
                    break
        shared[abs_path] = entries
    return shared


def judge_shared(shared):
    """Of the shared paths, those whose content no longer matches an owner's RECORD: each
    file is hashed now, on every read (a clobbering is never taken from a cache)."""
    clobbered = []
    for abs_path, group in sorted(shared.items()):
        actual = {}
        exists = _root.lexists(abs_path)
        matching = [d for d, _rel, algo, digest in group
                    if digest and exists and _cached_digest(actual, abs_path, algo) == digest]
        for dist, rel, _algo, digest in group:
            if not digest or dist in matching:
                continue
            if not exists:
                state = "missing"
            elif matching:
                state = "overwritten"
            else:
                state = "modified"
            clobbered.append({
                "path": rel,
                "file": abs_path,
                "owner": dist.name,
                "owner_version": dist.version,
                "state": state,
                "overwritten_by": [d.name for d in matching],
            })
    return clobbered


def find_clobbered(dists):
    """Files owned by several packages whose content no longer matches an owner's RECORD.

    Only paths listed by two or more packages are hashed, so a large venv costs little.
    Returns ``(clobbered, shared)``: ``clobbered`` is a list of dicts; ``shared`` maps each
    shared absolute path to its owners as ``[(dist, rel, algo, digest)]``.
    """
    shared = shared_paths(dists)
    return judge_shared(shared), shared


def _kept_shared(dists, cache, keys):
    """shared_paths(), taken from the evidence cache when no package and no site directory
    changed, else read and kept."""
    key = cache.shared_key(dists, keys)
    kept = cache.shared_paths(key)
    if kept is not None:
        entries, problems = kept
        for dist, told in zip(dists, problems):
            dist.replay(told)
        return dict((abs_path, [(dists[i], rel, algo, digest) for i, rel, algo, digest in group])
                    for abs_path, group in entries)
    starts = [len(d.problems) for d in dists]
    shared = shared_paths(dists)
    index = dict((id(d), i) for i, d in enumerate(dists))
    entries = [[abs_path, [[index[id(d)], rel, algo, digest] for d, rel, algo, digest in group]]
               for abs_path, group in shared.items()]
    cache.keep_shared(key, entries, [d.problems[n:] for d, n in zip(dists, starts)], dists)
    return shared


def _kept_classify(dist, key, scan_binaries, cache):
    """classify(), taken from the evidence cache when the package and every shared object
    read for it are unchanged, else derived and kept."""
    kept = cache.package(dist, key, scan_binaries)
    if kept is not None:
        layer, majors, problems = kept
        dist.replay(problems)
        return layer, majors
    read = []

    def before_read(path):
        # The identity before the read (a file that cannot be opened is keyed on that), then
        # that of the file actually read (fstat), so that what is kept is keyed on what was read.
        entry = [path, path_identity(path)]
        read.append(entry)
        return lambda st: entry.__setitem__(1, file_identity(st))

    start = len(dist.problems)
    layer, majors = classify(dist, scan_binaries, before_read)
    cache.keep_package(dist, key, scan_binaries, layer, majors, dist.problems[start:], read)
    return layer, majors


def scan(dists, ref_major, scan_binaries=True, cache=None):
    """Classify every distribution against the reference major; with ``cache`` (an open
    _evcache.EvidenceCache) what an unchanged package says is taken from it.

    Returns ``(contaminants, unknown, clobbered, shared)``.
    """
    contaminants = []
    unknown = []
    if cache is None:
        keys = None
        shared = shared_paths(dists)
    else:
        keys = [cache.package_key(d) for d in dists]
        shared = _kept_shared(dists, cache, keys)
    clobbered = judge_shared(shared)
    by_victim_overwriter = {}
    for item in clobbered:
        for name in item["overwritten_by"]:
            by_victim_overwriter.setdefault(canonical_name(name), []).append(item)
    for i, dist in enumerate(dists):
        if cache is None:
            layer, majors = classify(dist, scan_binaries)
        else:
            layer, majors = _kept_classify(dist, keys[i], scan_binaries, cache)
        if layer is None:
            unknown.append(dist.name)
            continue
        if not majors or ref_major in majors:
            continue
        major = max(majors)
        evidence = []
        for m in sorted(majors):
            evidence.extend(majors[m])
        evidence = ["%s (%s evidence)" % (e, LAYERS[layer]) for e in evidence]
        for item in by_victim_overwriter.get(dist.key, []):
            evidence.append("overwrote %s of %s %s" % (item["path"], item["owner"], item["owner_version"]))
        contaminants.append({
            "name": dist.name,
            "version": dist.version,
            "cuda_major": major,
            "evidence": evidence,
            "layer": LAYERS[layer],
            "location": dist.site_dir,
        })
    return contaminants, unknown, clobbered, shared
