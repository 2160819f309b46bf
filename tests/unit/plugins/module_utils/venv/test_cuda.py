# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_cuda: the CUDA evidence layers (version labels, name families, files, expected_cuda),
one input at a time. The RECORD and METADATA parsers these layers read through are tested in
test_dist.py, the ELF reader in test_elf.py."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil

import pytest
from wheelmaker import build_shared_object

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _cuda, _dist, _evcache


def _site(tmp_path):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    return str(site)


def _installed(site, name, version, files=None, requires=()):
    """A real installed distribution, as an installer leaves it, without a venv or an installer:
    the files, and a dist-info with METADATA and a RECORD of their digests."""
    info = os.path.join(site, "%s-%s.dist-info" % (name.replace("-", "_"), version))
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version))
        f.write("".join("Requires-Dist: %s\n" % r for r in requires))
    record = []
    for rel, content in (files or {}).items():
        path = os.path.join(site, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = content.encode() if isinstance(content, str) else content
        with open(path, "wb") as f:
            f.write(data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append("%s,sha256=%s,%d" % (rel, digest, len(data)))
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.write("\n".join(record) + "\n")
    return _dist.Distribution(site, info)


@pytest.mark.parametrize("version, expected", [
    ("2.8.0+cu128", (12, "12.8")),
    ("2.9.0+cu130", (13, "13.0")),
    ("2.1.0+cu118", (11, "11.8")),
    ("0.4.2.post2+cu130", (13, "13.0")),
    ("2.8.3+pt28cu128", (12, "12.8")),
    ("1.0+cu12torch2.8", (12, None)),
    ("1.13.1+cu92", (9, "9.2")),
    ("1.5.0+cu101", (10, "10.1")),
    ("2.8.0+cu08", None),   # no CUDA is numbered 0: it would flag the package in every venv
    ("2.8.0+cu00", None),
    ("2.8.0+local+cu128", (12, "12.8")),  # the label is all after the first '+'
    ("2.8.0+cpu", None),
    ("2.8.0+rocm6.4", None),
    ("2.8.0", None),
    ("", None),
])
def test_label(version, expected):
    assert _cuda.label_cuda(version) == expected


@pytest.mark.parametrize("name, version, major", [
    ("nvidia-cudnn-cu13", "9.19.0.56", 13),
    ("nvidia-nccl-cu12", "2.27.3", 12),
    ("nvidia-cuda-runtime-cu12", "12.8.90", 12),
    ("nixl-cu12", "0.6.0", 12),
    ("cupy-cuda12x", "13.6.0", 12),
    ("cupy-cuda13x", "13.6.0", 13),
    ("cupy-cuda117", "10.6.0", 11),
    ("jax-cuda13-plugin", "0.7.2", 13),
    ("jax-cuda12-pjrt", "0.7.2", 12),
    ("tensorrt-cu12-libs", "10.13.3.9", 12),
    ("nvidia-cublas", "13.0.0.19", 13),
    ("nvidia-cuda-runtime", "13.0.48", 13),
    ("cuda-bindings", "13.0.1", 13),
    ("cuda-python", "12.9.0", 12),
    ("nvidia-cublas", "9.0.176", 9),       # the oldest toolkit wheel major read: CUDA 9
    ("nvidia-cublas", "8.0.61", None),     # below 9 a toolkit wheel's version is not read as its CUDA
    ("nvidia-cufft", "12.0.0.15", None),   # cuFFT's version does not follow CUDA
    ("nvidia-cusparse", "12.6.2.49", None),
    ("cuda-pathfinder", "1.2.3", None),
    ("flashinfer-python", "0.6.11.post1", None),
    ("numba-cuda", "0.19.1", None),
    ("pycuda", "2025.1", None),
])
def test_name_family(name, version, major):
    found = _cuda.name_cuda(_dist.canonical_name(name), version)
    assert (found[0] if found else None) == major


@pytest.mark.parametrize("path, major", [
    ("nvidia/cu13/lib/libcufft.so.12", 13),
    ("nvidia/cuda_runtime/lib/libcudart.so.12", 12),
    ("nvidia/cublas/lib/libcublasLt.so.12", 12),
    ("nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8", 12),
    ("x/libnvJitLink.so.13", 13),
    ("libcudart.so.12", 12),  # at the top of site-packages: no directory in the path
    ("nvidia/cu13/include/cublas.h", 13),  # the layout alone, no shared object
    ("nvidia/cusparse/lib/libcusparse.so.12", None),
    ("nvidia/nccl/lib/libnccl.so.2", None),
    ("torch/lib/libtorch_cuda.so", None),
])
def test_file_layer(path, major):
    found = _cuda.file_cuda(path)
    assert (found[0] if found else None) == major


@pytest.mark.parametrize("value, expected", [("12.8", (12, "12.8")), ("13", (13, "13")), (" 12 ", (12, "12"))])
def test_expected_cuda_ok(value, expected):
    assert _cuda.parse_expected(value) == expected


@pytest.mark.parametrize("value", ["twelve", "12.x", "v12", "12.8.1", "", "0", "-1", "1e3", "12;rm -rf /"])
def test_expected_cuda_bad(value):
    with pytest.raises(_cuda.CudaError, match="expected_cuda"):
        _cuda.parse_expected(value)


@pytest.mark.parametrize("name", ["foo-cu08", "foo-cu00-libs", "cupy-cuda09x", "bar-cuda01"])
def test_a_name_numbered_cuda_0x_is_no_evidence_since_no_cuda_0_exists(name):
    # As a version label cu0x is none (test_label): a CUDA 0 would flag the package in every venv.
    assert _cuda.name_cuda(_dist.canonical_name(name), "1.0") is None


@pytest.mark.parametrize("version, cpu", [
    ("2.8.0+cpu", True), ("2.8.0+CPU", True), ("1.13.1+cpuonly", True),
    ("2.8.0", False), ("", False), (None, False), ("2.8.0+cu128", False), ("2.8.0+rocm6.4", False),
    ("2.8.0+cpu.cxx11.abi", False), ("1.0+cpu+x", False),
])
def test_a_cpu_build_is_told_by_its_local_label_alone(version, cpu):
    assert _cuda.is_cpu_label(version) is cpu


def test_a_cpu_labelled_package_is_judged_a_cpu_build_not_by_its_cuda_name_nor_unknown(tmp_path):
    site = _site(tmp_path)
    dist = _installed(site, "nvidia-nccl-cu13", "2.27.3+cpu", {"nvidia/cu13/lib/libnccl.so.2": "x"})
    assert _cuda.classify(dist) == (0, {})
    contaminants, unknown, _clobbered, _shared = _cuda.scan([dist], 12)
    assert contaminants == [] and unknown == []


@pytest.mark.parametrize("version, cuda_text", [("1.0+cu12torch2.8", "12"), ("2.8.0+cu128", "12.8")],
                         ids=["label_of_a_major_alone", "label_of_major_and_minor"])
def test_a_version_label_s_evidence_names_its_cuda_never_none(tmp_path, version, cuda_text):
    dist = _installed(_site(tmp_path), "flash-attn", version)
    layer, majors = _cuda.classify(dist)
    assert layer == 1
    assert majors == {12: ["version %s carries the local label for CUDA %s" % (version, cuda_text)]}


def _torch_site(tmp_path, version, version_py):
    site = _site(tmp_path)
    files = {"torch/__init__.py": ""}
    if version_py is not None:
        files["torch/version.py"] = version_py
    return site, _installed(site, "torch", version, files)


@pytest.mark.parametrize("version_py, cuda", [
    ("__version__ = '2.8.0'\ncuda = None\n", "None"),
    ("__version__ = '2.8.0'\ncuda: Optional[str] = None\n", "None"),
    ("__version__ = '2.8.0+cu128'\ncuda: Optional[str] = '12.8'\n", "12.8"),
    ("__version__ = '2.8.0'\n", None),
], ids=["cpu_only", "cpu_only_annotated", "cuda_12_8", "says_nothing"])
def test_torch_version_py_tells_a_cpu_only_build_from_one_that_says_nothing(tmp_path, version_py, cuda):
    site, _torch = _torch_site(tmp_path, "2.8.0", version_py)
    problems = []
    info = _cuda.read_torch_version_py(site, problems)
    assert info["cuda"] == cuda
    assert info["version"] == version_py.split("'")[1]
    assert problems == []


def test_an_unreadable_torch_version_py_is_reported_once_not_lost(tmp_path):
    site, _torch = _torch_site(tmp_path, "2.8.0", None)
    outside = tmp_path / "elsewhere.py"
    outside.write_text("cuda = '13.0'\n")
    os.symlink(str(outside), os.path.join(site, "torch", "version.py"))  # never followed
    problems = []
    assert _cuda.read_torch_version_py(site, problems) is None
    assert _cuda.read_torch_version_py(site, problems) is None
    assert len(problems) == 1 and "torch/version.py" in problems[0], problems
    # a caller that keeps no problems gets the same answer
    assert _cuda.read_torch_version_py(site) is None


@pytest.mark.parametrize("cuda", ["None", "'None'"], ids=["none", "the_text_none"])
def test_torch_whose_version_py_says_cuda_none_is_a_cpu_build_and_asks_for_expected_cuda(tmp_path, cuda):
    _site_dir, torch = _torch_site(tmp_path, "2.8.0", "__version__ = '2.8.0'\ncuda = %s\n" % cuda)
    assert _cuda.torch_reference([torch]) == "cpu"
    with pytest.raises(_cuda.CudaError, match="torch here is a CPU-only build; set expected_cuda"):
        _cuda.reference([torch], None)


@pytest.mark.parametrize("version, reference", [("2.8.0+cpu", "cpu"), ("2.8.0", None)])
def test_torch_without_version_py_is_a_cpu_build_by_its_cpu_label_alone(tmp_path, version, reference):
    _site_dir, torch = _torch_site(tmp_path, version, None)
    assert _cuda.torch_reference([torch]) == reference


def test_torch_whose_version_py_names_no_cuda_version_gives_no_reference(tmp_path):
    _site_dir, torch = _torch_site(tmp_path, "2.8.0", "__version__ = '2.8.0'\ncuda = 'twelve'\n")
    assert _cuda.torch_reference([torch]) is None
    with pytest.raises(_cuda.CudaError, match="no reference CUDA: torch is not installed in this environment .or says no CUDA version"):
        _cuda.reference([torch], None)


def test_torch_without_a_label_is_judged_by_its_version_py(tmp_path):
    _site_dir, torch = _torch_site(tmp_path, "2.8.0", "__version__ = '2.8.0+cu128'\ncuda = '12.8'\n")
    assert _cuda.torch_reference([torch]) == (12, "12.8", "torch 2.8.0 (torch/version.py: cuda = '12.8')")


@pytest.mark.parametrize("expected_cuda, warned", [("12.8", False), ("12", False), ("13.0", True), ("11.8", True)])
def test_expected_cuda_warns_only_when_torch_is_built_for_another_major(tmp_path, expected_cuda, warned):
    torch = _installed(_site(tmp_path), "torch", "2.8.0+cu128")
    ref, warnings = _cuda.reference([torch], expected_cuda)
    assert ref["cuda_major"] == int(expected_cuda.split(".")[0]) and ref["source"] == "expected_cuda"
    if warned:
        assert warnings == ["expected_cuda is %s but torch 2.8.0+cu128 is built for CUDA 12.8: torch itself does not match" % expected_cuda]
    else:
        assert warnings == []


def test_without_expected_cuda_the_reference_is_torch_s_cuda(tmp_path):
    torch = _installed(_site(tmp_path), "torch", "2.8.0+cu128")
    assert _cuda.reference([torch], None) == (
        {"cuda_major": 12, "cuda_version": "12.8", "source": "torch 2.8.0+cu128 (local version label)"}, [])


def test_a_name_s_evidence_names_the_package_and_its_family(tmp_path):
    dist = _installed(_site(tmp_path), "nvidia-nccl-cu13", "2.27.3")
    assert _cuda.classify(dist) == (2, {13: ["name nvidia-nccl-cu13: name suffix -cu13"]})


def test_the_files_layer_reads_a_package_of_headers_alone(tmp_path):
    dist = _installed(_site(tmp_path), "headers-only", "1.0", {"nvidia/cu13/include/cublas.h": "h"})
    assert _cuda.classify(dist) == (3, {13: ["installs nvidia/cu13/include/cublas.h (the CUDA 13 layout)"]})


def test_the_files_layer_names_three_files_of_a_major_not_every_one(tmp_path):
    files = dict(("nvidia/cu13/lib/libk%d.so" % i, "k") for i in range(5))
    files["nvidia/cu12/lib/libk.so"] = "k"
    layer, majors = _cuda.classify(_installed(_site(tmp_path), "many-files", "1.0", files))
    assert layer == 3
    assert majors == {13: ["installs nvidia/cu13/lib/libk%d.so (the CUDA 13 layout)" % i for i in range(3)],
                      12: ["installs nvidia/cu12/lib/libk.so (the CUDA 12 layout)"]}


@pytest.fixture(scope="module")
def links_cudart(tmp_path_factory):
    """Real shared objects whose DT_NEEDED names libcudart.so.12, or .13 (compiled once)."""
    work = str(tmp_path_factory.mktemp("so"))
    built = dict((major, build_shared_object(os.path.join(work, str(major)), "_ops.so", ["libcudart.so.%d" % major], symbol="ops"))
                 for major in (12, 13))
    built["12 twice"] = build_shared_object(os.path.join(work, "2"), "_ops.so", ["libcudart.so.12", "libcublas.so.12"], symbol="ops")
    return built


def test_the_binaries_layer_reads_no_more_shared_objects_once_three_link_cuda(tmp_path, links_cudart):
    files = {"many_ops/_ops%d.so" % i: links_cudart[12] for i in range(5)}
    dist = _installed(_site(tmp_path), "many-ops", "1.0", files)
    read = []
    layer, majors = _cuda.classify(dist, before_read=read.append)
    assert layer == 4
    assert majors == {12: ["many_ops/_ops%d.so links libcudart.so.12 (DT_NEEDED)" % i for i in range(3)]}
    assert [os.path.basename(p) for p in read] == ["_ops0.so", "_ops1.so", "_ops2.so"]


def test_the_binaries_layer_counts_every_cuda_library_an_object_links_towards_three(tmp_path, links_cudart):
    # Each object links two: after the second, four linked CUDA libraries are enough.
    files = {"dual_ops/_ops%d.so" % i: links_cudart["12 twice"] for i in range(4)}
    read = []
    layer, majors = _cuda.classify(_installed(_site(tmp_path), "dual-ops", "1.0", files), before_read=read.append)
    assert layer == 4 and len(majors[12]) == 4
    assert [os.path.basename(p) for p in read] == ["_ops0.so", "_ops1.so"]


def test_only_shared_objects_are_read_for_the_binaries_layer(tmp_path, links_cudart):
    files = {"ops/resort.py": "", "ops/notes.so.txt": "", "ops/_ops.so": links_cudart[13], "ops/_ops.so.1": links_cudart[13]}
    read = []
    layer, majors = _cuda.classify(_installed(_site(tmp_path), "ops", "1.0", files), before_read=read.append)
    assert (layer, list(majors)) == (4, [13])
    assert [os.path.basename(p) for p in read] == ["_ops.so", "_ops.so.1"]


def test_a_requirement_of_an_extra_is_no_evidence_even_with_a_semicolon_in_its_marker(tmp_path):
    # PEP 508: the marker follows the first ';' and a quoted value in it may hold one too.
    extra = 'nvidia-nccl-cu13>=2 ; extra == "gpu" and platform_version != "a;b"'
    plain = 'nvidia-cudnn-cu13 ; platform_version != "a;b"'
    site = _site(tmp_path)
    assert _cuda.classify(_installed(site, "only-extra", "1.0", requires=[extra])) == (None, {})
    layer, majors = _cuda.classify(_installed(site, "plain", "1.0", requires=[extra, plain]))
    assert (layer, list(majors)) == (5, [13])
    assert majors[13] == ["requires %s (weak evidence: a requirement, not an installed file)" % plain]


def test_a_requirement_asking_for_the_dependency_s_own_extra_is_evidence(tmp_path):
    # "[extras]" asks the dependency for its extra; only a marker naming this package's extra
    # ("extra == ...") leaves the requirement out.
    req = 'nvidia-cudnn-cu13[extras] ; sys_platform == "linux"'
    layer, majors = _cuda.classify(_installed(_site(tmp_path), "wants-extras", "1.0", requires=[req]))
    assert (layer, list(majors)) == (5, [13])


def test_a_requirement_that_names_no_project_does_not_hide_those_after_it(tmp_path):
    requires = ["_not_a_project_name", "nvidia-nccl-cu13>=2"]
    layer, majors = _cuda.classify(_installed(_site(tmp_path), "odd-metadata", "1.0", requires=requires))
    assert (layer, list(majors)) == (5, [13])


def test_torch_is_found_wherever_it_is_in_the_list_of_packages(tmp_path):
    # Packages are listed by name: triton, typing-extensions, xformers sort after torch.
    site = _site(tmp_path)
    dists = [_installed(site, name, version) for name, version in (
        ("triton", "3.4.0"), ("numpy", "2.3.2"), ("torch", "2.8.0+cu128"), ("xformers", "0.0.32"))]
    assert _cuda.torch_reference(dists) == (12, "12.8", "torch 2.8.0+cu128 (local version label)")


def test_a_path_only_one_package_keeps_beside_bytecode_does_not_end_the_search_for_shared_files(tmp_path):
    """A RECORD row through __pycache__ is set aside (bytecode is rewritten freely); the same
    file listed plainly by one other package is then shared by no one, and the files after it
    are still judged: here y.py, which b overwrote in a."""
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/x.py": "x", "pkg/y.py": "a's y"})
    shutil.rmtree(os.path.join(site, "pkg"))
    b = _installed(site, "b", "1.0", {"pkg/x.py": "x", "pkg/y.py": "b's y"})
    with open(b.info_dir + "/RECORD") as f:
        rows = f.read().replace("pkg/x.py,", "pkg/__pycache__/../x.py,")
    with open(b.info_dir + "/RECORD", "w") as f:
        f.write(rows)
    b = _dist.Distribution(site, b.info_dir)
    clobbered, shared = _cuda.find_clobbered([a, b])
    assert list(shared) == [os.path.join(site, "pkg", "y.py")]
    assert [(c["path"], c["owner"], c["state"], c["overwritten_by"]) for c in clobbered] == [("pkg/y.py", "a", "overwritten", ["b"])]


def test_a_file_one_package_lists_twice_is_not_shared_and_not_judged_clobbered(tmp_path):
    """Only paths of two or more packages are shared (and hashed): a RECORD naming one file
    twice does not make its own package a clobberer of itself. (Whether a package's own file
    was changed is pip_inventory's RECORD check.)"""
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/x.py": "x"})
    with open(a.info_dir + "/RECORD") as f:
        rows = f.read()
    with open(a.info_dir + "/RECORD", "w") as f:
        f.write(rows + rows)
    with open(os.path.join(site, "pkg", "x.py"), "w") as f:
        f.write("changed")
    b = _installed(site, "b", "1.0", {"pkg_b/y.py": "y"})
    a = _dist.Distribution(site, a.info_dir)
    assert _cuda.find_clobbered([a, b]) == ([], {})


def test_what_a_shared_file_s_reading_found_is_told_again_when_taken_from_the_evidence_cache(tmp_path, monkeypatch):
    """The paths shared by packages are kept in the evidence cache with the problems their
    reading found (here a's RECORD, read in full because pkg/x.py is shared): a scan that takes
    them from the cache tells those problems as the scan that read them did."""
    monkeypatch.setattr(_evcache, "RACY_SECONDS", 0)  # keep entries at once
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/x.py": "x"})
    with open(a.info_dir + "/RECORD", "a") as f:
        f.write("pkg/bad.py,md5,x\n")
    _installed(site, "b", "1.0", {"pkg/x.py": "x"})

    def scanned():
        dists, _shadowed = _dist.iter_distributions([site])
        cache = _evcache.EvidenceCache.open(str(tmp_path / "cache" / "evidence"), str(tmp_path / "venv"))
        try:
            _cuda.scan(dists, 12, True, cache)
        finally:
            cache.close()
        return dict((d.name, d.problems) for d in dists), cache.hits

    fresh, hits = scanned()
    assert hits == 0 and any("malformed hash" in p for p in fresh["a"]), fresh
    kept, hits = scanned()
    assert hits == 2 and kept == fresh


@pytest.mark.parametrize("call, reason", [
    (lambda: _cuda.name_cuda("nvidia-cublas", "13.0.0.19"), "toolkit wheel whose version is the CUDA version (13.0.0.19)"),
    (lambda: _cuda.file_cuda("nvidia/cu13/lib/libx.so"), "installs nvidia/cu13/lib/libx.so (the CUDA 13 layout)"),
    (lambda: _cuda.file_cuda("x/libnvJitLink.so.13"), "ships x/libnvJitLink.so.13"),
], ids=["toolkit_wheel", "cu13_layout", "soname"])
def test_each_piece_of_evidence_names_what_was_found(call, reason):
    assert call() == (13, reason)


def test_a_contaminant_names_the_layer_that_judged_it(tmp_path, links_cudart):
    site = _site(tmp_path)
    dists = [
        _installed(site, "fits", "1.0", {"fits/_ops.so": links_cudart[12]}),  # judged, then the rest still are
        _installed(site, "by-label", "1.0+cu130"),
        _installed(site, "nvidia-nccl-cu13", "2.27.3"),
        _installed(site, "by-files", "1.0", {"by_files/nvidia/cu13/lib/libk.so": "k"}),
        _installed(site, "by-binaries", "1.0", {"by_binaries/_ops.so": links_cudart[13]}),
        _installed(site, "by-requirements", "1.0", requires=["nvidia-cublas-cu13"]),
    ]
    contaminants, unknown, _clobbered, _shared = _cuda.scan(dists, 12)
    assert unknown == []
    layers = {c["name"]: (c["cuda_major"], c["layer"], c["evidence"][0].rsplit(" (", 1)[1]) for c in contaminants}
    assert layers == {
        "by-label": (13, "version label", "version label evidence)"),
        "nvidia-nccl-cu13": (13, "name", "name evidence)"),
        "by-files": (13, "files", "files evidence)"),
        "by-binaries": (13, "binaries", "binaries evidence)"),
        "by-requirements": (13, "requirements", "requirements evidence)"),
    }


def test_a_shared_file_is_judged_by_each_owner_s_own_record_row(tmp_path):
    """a's RECORD lists pkg/z.py before the shared pkg/x.py: x is checked against x's digest
    (unchanged, so not clobbered), never against the digest of a row beside it."""
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/z.py": "z", "pkg/x.py": "x"})
    b = _installed(site, "b", "1.0", {"pkg/x.py": "x"})
    clobbered, shared = _cuda.find_clobbered([a, b])
    assert list(shared) == [os.path.join(site, "pkg", "x.py")] and clobbered == []


def test_a_record_row_of_an_unknown_hash_is_no_match_and_no_crash(tmp_path):
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/x.py": "x"})
    b = _installed(site, "b", "1.0", {"pkg/x.py": "x"})
    with open(a.info_dir + "/RECORD") as f:
        rows = f.read().replace(",sha256=", ",nosuchhash=")
    with open(a.info_dir + "/RECORD", "w") as f:
        f.write(rows)
    a = _dist.Distribution(site, a.info_dir)
    clobbered, _shared = _cuda.find_clobbered([a, b])
    assert [(c["owner"], c["state"], c["overwritten_by"]) for c in clobbered] == [("a", "overwritten", ["b"])]


def test_a_clobbered_file_listed_twice_by_its_owner_is_reported_once(tmp_path):
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/x.py": "a's x"})
    with open(a.info_dir + "/RECORD") as f:
        rows = f.read()
    with open(a.info_dir + "/RECORD", "w") as f:
        f.write(rows + rows)
    b = _installed(site, "b", "1.0", {"pkg/x.py": "b's x"})
    a = _dist.Distribution(site, a.info_dir)
    clobbered, _shared = _cuda.find_clobbered([a, b])
    assert [(c["owner"], c["state"], c["overwritten_by"]) for c in clobbered] == [("a", "overwritten", ["b"])]


def test_a_contaminant_that_overwrote_another_package_s_file_says_so_in_its_evidence(tmp_path):
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"a/_impl.py": "a's"})
    nccl = _installed(site, "nvidia-nccl-cu13", "2.27.3", {"a/_impl.py": "nccl's"})
    contaminants, _unknown, clobbered, _shared = _cuda.scan([a, nccl], 12)
    assert [c["owner"] for c in clobbered] == ["a"]
    assert contaminants[0]["evidence"] == ["name nvidia-nccl-cu13: name suffix -cu13 (name evidence)", "overwrote a/_impl.py of a 1.0"]


def test_the_evidence_cache_keys_a_package_on_the_shared_objects_it_read(tmp_path, monkeypatch, links_cudart):
    """What the binaries layer read is kept with each file's identity as read (fstat), and an
    unchanged venv is then judged from the cache without reading them again."""
    monkeypatch.setattr(_evcache, "RACY_SECONDS", 0)
    site = _site(tmp_path)
    _installed(site, "ops", "1.0", {"ops/_ops.so": links_cudart[13]})
    so = os.path.join(site, "ops", "_ops.so")

    def scanned():
        dists, _shadowed = _dist.iter_distributions([site])
        cache = _evcache.EvidenceCache.open(str(tmp_path / "cache" / "evidence"), str(tmp_path / "venv"))
        try:
            contaminants = _cuda.scan(dists, 12, True, cache)[0]
        finally:
            cache.close()
        return [c["name"] for c in contaminants], cache

    names, cache = scanned()
    assert names == ["ops"] and cache.hits == 0
    assert [entry["read"] for entry in cache.packages.values()] == [[[so, _dist.file_identity(os.stat(so))]]]
    names, cache = scanned()
    assert names == ["ops"] and cache.hits == 1


def test_every_owner_of_a_file_another_overwrote_is_named_whatever_their_order(tmp_path):
    site = _site(tmp_path)
    a = _installed(site, "a", "1.0", {"pkg/x.py": "a's"})
    c = _installed(site, "c", "1.0", {"pkg/x.py": "c's"})
    b = _installed(site, "b", "1.0", {"pkg/x.py": "b's"})  # installed last: the file is b's
    clobbered, shared = _cuda.find_clobbered([b, a, c])
    assert [len(group) for group in shared.values()] == [3]
    assert [(x["owner"], x["state"], x["overwritten_by"]) for x in clobbered] == [("a", "overwritten", ["b"]), ("c", "overwritten", ["b"])]
