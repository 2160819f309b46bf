# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Property-based tests of every parser: arbitrary input never crashes or hangs, what the
real tools write is read back exactly, and input that cannot be read is a clear error.

The parsers: nvidia-smi's CSV (module_utils/gpu/_query), `pct list` / `pct config` and what the
inventory makes of them (inventory/proxmox_lxc), dist-info directory names, METADATA,
RECORD, requirements and lock files, version labels and CUDA name families (_dist, _cuda),
ELF DT_NEEDED (_elf), /proc's stat, status and cgroup files and the driver's information
files (_proc), pyvenv.cfg and .pth files, the lock file (_hostlock), the cache
fingerprint marker (cache/_marker), the training log's throughput lines (throughput), and
the scope's patterns and tmux session names (_scope).

No hang: every example runs under a deadline far above what it takes (milliseconds), so a
parser that loops or backtracks catastrophically fails instead of stalling the suite; the
pathological inputs below (hundreds of kilobytes of one character) are the classic way to
find such a parser. The examples each test tried are counted (tests/lib/inputcounts.py).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import re

import inputcounts
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache import _fingerprint, _marker, _roots
from ansible_collections.gpufleet.hygiene.plugins.module_utils.common import _hostlock
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _files
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _query
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job import _throughput as throughput
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc, _scope
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _cuda, _dist, _elf, _inventory, _venv
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _cgroup

# A hang bound, not a speed check: an example takes milliseconds.
NO_HANG = datetime.timedelta(seconds=10)
SETTINGS = settings(max_examples=300, deadline=NO_HANG, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)
NAME = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9._-]{0,30}[A-Za-z0-9])?\Z")
VERSION = st.from_regex(r"\A[0-9]{1,3}(\.[0-9]{1,3}){0,3}(\+[a-z0-9]{1,8})?\Z")
# Text a hostile or broken tool could print: shell metacharacters, quotes, newlines, NULs,
# path tricks and option look-alikes mixed into arbitrary text.
HOSTILE_BITS = st.sampled_from([";", "$(touch /tmp/PWNED)", "`id`", "'", '"', "\n", "\r\n", "\x00", "..", "../",
                                "/", "--", "-e", "--python=/usr/bin/python3", ",", ":", "=", "\\", "\t", " ", "\u00e9",
                                "\u202e", "\ufeff", "*", "?", "[", "]", "{", "}", "#"])
HOSTILE = st.lists(st.one_of(HOSTILE_BITS, st.text(max_size=8)), max_size=30).map("".join)
ANY_TEXT = st.one_of(TEXT, HOSTILE)
# Hundreds of kilobytes of one character or one short pattern: what makes a quadratic parser hang.
PATHOLOGICAL = st.sampled_from([c * 200000 for c in ("1", " ", ",", '"', "\n", "(", ")", "[", "a", ".", "-", "/", ":", "\t")]
                               + ["1 " * 100000, "1." * 100000, "cu" * 100000, "-cu1" * 50000, "a-" * 100000,
                                  "1" + " " * 200000 + "x", "Uid:\n" * 50000, "/lxc/" * 40000, "nvidia" * 30000,
                                  "[" * 70000, "{\"a\":" * 30000])

COUNTS = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _record_counts():
    yield
    for test, count in sorted(COUNTS.items()):
        inputcounts.record("parser-properties", test, count)


@SETTINGS
@given(st.one_of(st.binary(max_size=2000), PATHOLOGICAL.map(str.encode)))
def test_metadata_any_bytes(data):
    problems = []
    fields = _dist.parse_metadata(data, "M", problems)
    assert isinstance(fields["requires_dist"], list)
    assert all(isinstance(p, str) for p in problems)


@SETTINGS
@given(NAME, VERSION, st.lists(NAME, max_size=5), TEXT)
def test_metadata_round_trip(name, version, requires, body):
    text = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    text += "".join("Requires-Dist: %s\n" % r for r in requires) + "\n" + body
    fields = _dist.parse_metadata(text.encode("utf-8"))
    assert (fields["name"], fields["version"], fields["requires_dist"]) == (name, version, requires)


@SETTINGS
@given(st.one_of(st.binary(max_size=3000), PATHOLOGICAL.map(str.encode)))
def test_record_any_bytes(data):
    problems = []
    for row in _dist.parse_record(data, "R", problems, site_dir="/site"):
        abs_path, rel, algo, digest, size = row
        assert abs_path.startswith("/site/") and rel  # never a file outside the environment
        assert (algo is None) == (digest is None)
        assert size is None or size >= 0


PATH_PART = st.from_regex(r"\A[A-Za-z0-9_ ,\"'.+-]{1,12}\Z")


@SETTINGS
@given(st.lists(st.tuples(st.lists(PATH_PART, min_size=1, max_size=4), st.binary(max_size=20), st.integers(0, 10**9)),
                min_size=1, max_size=20))
def test_record_round_trip_with_quoting(entries):
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    expected = []
    for parts, raw, size in entries:
        path = "/".join(parts)
        if path in (".", "..") or "/../" in "/" + path + "/" or "/./" in "/" + path + "/":
            continue
        digest = re.sub(r"[^A-Za-z0-9_-]", "", raw.hex()) or "x"
        writer.writerow([path, "sha256=" + digest, size])
        expected.append((path, "sha256", digest, size))
    rows = _dist.parse_record(buf.getvalue().encode("utf-8"))
    assert rows == expected


@SETTINGS
@given(ANY_TEXT)
def test_canonical_name_matches_the_reference_rule(name):
    assert _dist.canonical_name(name) == re.sub(r"[-_.]+", "-", name).lower()


@SETTINGS
@given(st.one_of(ANY_TEXT, PATHOLOGICAL))
def test_requirements_any_text(text):
    try:
        wanted = _inventory.parse_requirements(text.encode("utf-8"), "req.txt")
    except _dist.DistError as exc:
        assert "req.txt" in str(exc) or "UTF-8" in str(exc)
        return
    assert all(isinstance(k, str) and "spec" in v for k, v in wanted.items())


@SETTINGS
@given(st.one_of(ANY_TEXT, PATHOLOGICAL))
def test_cuda_evidence_functions_any_text(text):
    found = _cuda.label_cuda(text)
    assert found is None or (isinstance(found[0], int) and found[0] > 0)
    found = _cuda.name_cuda(_dist.canonical_name(text), text)
    assert found is None or isinstance(found[0], int)
    found = _cuda.file_cuda(text)
    assert found is None or isinstance(found[0], int)
    try:
        major, version = _cuda.parse_expected(text)
        assert major > 0 and version
    except _cuda.CudaError as exc:
        assert "expected_cuda" in str(exc)


@SETTINGS
@given(st.integers(10, 13), st.integers(0, 9))
def test_label_round_trip(major, minor):
    assert _cuda.label_cuda("2.8.0+cu%d%d" % (major, minor)) == (major, "%d.%d" % (major, minor))


@SETTINGS
@given(st.binary(max_size=4096))
def test_elf_any_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("elf") / "x.so"
    path.write_bytes(b"\x7fELF" + data)
    result = _elf.dt_needed(str(path))
    assert result is None or all(isinstance(n, str) for n in result)


@SETTINGS
@given(st.one_of(ANY_TEXT, PATHOLOGICAL))
def test_nvidia_smi_any_text(text):
    for parse in (_query.parse_gpus, _query.parse_apps):
        try:
            rows = parse(text)
        except _query.GpuParseError as exc:
            assert str(exc).startswith("nvidia-smi returned")  # says what it got, and in which line
            continue
        assert isinstance(rows, list)


GPU_NAME = st.from_regex(r"\A[A-Za-z0-9 ,()_-]{1,40}\Z").map(str.strip).filter(bool).filter(lambda n: n.upper() != "NA")


@SETTINGS
@given(st.lists(st.tuples(GPU_NAME, st.integers(0, 200000), st.integers(0, 200000),
                          st.one_of(st.integers(0, 100), st.just("[N/A]"))), min_size=1, max_size=8))
def test_nvidia_smi_gpu_rows_round_trip(gpus):
    lines = ["%d, GPU-%08d, %s, %d, %d, %s" % (i, i, name, used, total, util)
             for i, (name, used, total, util) in enumerate(gpus)]
    parsed = _query.parse_gpus("\n".join(lines) + "\n")
    assert [g["name"] for g in parsed] == [name for name, _u, _t, _p in gpus]
    assert [g["utilization_pct"] for g in parsed] == [None if u == "[N/A]" else u for _n, _u, _t, u in gpus]


# A name that is all brackets, or N/A, is how nvidia-smi writes "unavailable" ([N/A],
# [Insufficient Permissions]): read as no name, by design, so not round-tripped here.
PROC_NAME = st.from_regex(r"\A[A-Za-z0-9 ,/._()\[\]-]{1,60}\Z").map(str.strip).filter(bool).filter(
    lambda n: not (n.startswith("[") and n.endswith("]")) and n.upper() not in ("N/A", "NA"))


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 4194304), st.integers(0, 200000), PROC_NAME), max_size=8))
def test_nvidia_smi_app_rows_round_trip(apps):
    text = "".join("GPU-aaaa, %d, %d MiB, %s\n" % (pid, used, name) for pid, used, name in apps) or \
        "No running processes found\n"
    parsed = _query.parse_apps(text.replace(" MiB", ""))
    # nvidia-smi's placeholders ("N/A", "NA", anything in brackets such as "[Not Found]") are
    # no name at all: those come back as None.
    expected = [(pid, used, None if name.upper() in ("N/A", "NA") or (name[0] == "[" and name[-1] == "]") else name)
                for pid, used, name in apps]
    assert [(a["pid"], a["used_memory_mib"], a["name"]) for a in parsed] == expected


COMM = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n"), min_size=1,
               max_size=15)


@SETTINGS
@given(COMM, st.sampled_from("RSDZTI"), st.integers(0, 2**22), st.integers(0, 2**40))
def test_proc_stat_round_trip_with_hostile_comm(comm, state, ppid, started):
    rest = [state, str(ppid)] + ["0"] * 17 + [str(started)] + ["0"] * 30
    text = "4242 (%s) %s\n" % (comm, " ".join(rest))
    assert _proc.parse_stat(text) == (comm, state, ppid, started)


@pytest.fixture(scope="module")
def pct():
    from ansible_collections.gpufleet.hygiene.plugins.inventory import proxmox_lxc
    return proxmox_lxc


@SETTINGS
@given(st.one_of(ANY_TEXT, PATHOLOGICAL))
def test_pct_parsers_any_text(text):
    for row in _pct.parse_list(text):
        assert isinstance(row["vmid"], int) and row["vmid"] >= 0
        assert all(isinstance(row[k], str) and "\n" not in row[k] for k in ("status", "lock", "name"))
    conf = _pct.parse_config(text)
    assert isinstance(conf, dict)
    devices = _pct.nvidia_devices(conf)
    assert all(d.startswith("/dev/nvidia") for d in devices) and len(set(devices)) == len(devices)
    assert all(isinstance(i, int) and i >= 0 for i in _pct.gpu_indices(devices))


CT_NAME = st.from_regex(r"\A[a-z][a-z0-9-]{0,19}\Z")


@SETTINGS
@given(st.lists(st.tuples(st.integers(100, 999999999), st.sampled_from(["running", "stopped"]),
                          st.sampled_from(["", "backup", "migrate", "snapshot"]), CT_NAME), max_size=10))
def test_pct_list_round_trip(rows):
    text = ("%-10s %-10s %-12s %-20s\n" % ("VMID", "Status", "Lock", "Name") if rows else "")
    text += "".join("%-10s %-10s %-12s %-20s\n" % row for row in rows)
    parsed = _pct.parse_list(text)
    assert [(r["vmid"], r["status"], r["lock"], r["name"]) for r in parsed] == rows


@SETTINGS
@given(st.lists(st.tuples(st.integers(100, 999999999), st.one_of(ANY_TEXT, CT_NAME)), max_size=8),
       st.lists(CT_NAME, max_size=3))
def test_container_host_names_never_take_a_node_or_an_odd_name(pct, rows, node_names):
    """What a node says a container is called becomes an inventory host name only when it is
    a DNS name that no node and no other container has; else <node>-<vmid>."""
    rows = [{"vmid": v, "name": n} for v, n in rows]
    names = {}
    for row in rows:
        names.setdefault(row["name"], []).append(row["vmid"])
    for row in rows:
        host = pct.container_host_name("name", "pve1", row, names, set(node_names))
        if host != "pve1-%d" % row["vmid"]:
            assert host == row["name"] and host not in node_names and len(names[host]) == 1
            assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*", host, re.ASCII)
        assert pct.container_host_name("vmid", "pve1", row, names, set(node_names)) == "ct%d" % row["vmid"]


# --------------------------------------------------------------------------- dist-info


DIST_DIR = st.one_of(st.builds(lambda n, v: "%s-%s.dist-info" % (n, v), ANY_TEXT, ANY_TEXT),
                     st.builds(lambda n: "%s.dist-info" % n, ANY_TEXT), st.builds(lambda n: "%s.egg-info" % n, ANY_TEXT))


@SETTINGS
@given(DIST_DIR, st.one_of(st.none(), st.binary(max_size=300), HOSTILE.map(str.encode)))
def test_dist_info_directory_names_and_metadata(tmp_path_factory, dirname, metadata):
    """Any directory name a site-packages can hold, with any METADATA or none: read as a
    distribution whose problems are listed; only a real project name and version may ever
    reach an installer's command line."""
    if "/" in dirname or "\x00" in dirname or dirname in (".", ".."):
        return
    site = tmp_path_factory.mktemp("site")
    info = site / dirname
    try:
        info.mkdir()
    except OSError:  # too long for the file system: no such directory can exist
        return
    if metadata is not None:
        (info / ("PKG-INFO" if dirname.endswith(".egg-info") else "METADATA")).write_bytes(metadata)
    dists, _shadowed = _dist.iter_distributions([str(site)])
    [dist] = dists
    assert isinstance(dist.name, str) and dist.key == _dist.canonical_name(dist.name)
    assert dist.version is None or isinstance(dist.version, str)
    assert all(isinstance(p, str) for p in dist.problems)
    if _dist.valid_project_name(dist.name):
        assert dist.name[0].isalnum() and re.fullmatch(r"[a-z0-9-]+", dist.key)
    if _dist.valid_version(dist.version):
        assert not dist.version.startswith("-") and not re.search(r"[\s;$`'\"=<>@/\\]", dist.version)


@SETTINGS
@given(ANY_TEXT)
def test_project_name_check_refuses_every_option_and_shell_word(name):
    if _dist.valid_project_name(name):
        assert re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name, re.ASCII)
    else:
        assert not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name, re.ASCII)


@SETTINGS
@given(ANY_TEXT, ANY_TEXT)
def test_versions_match_any_text(pinned, installed):
    assert _inventory.versions_match(pinned, installed) in (True, False)
    assert _inventory.versions_match(pinned, None) is False


@SETTINGS
@given(st.one_of(st.binary(max_size=600), HOSTILE.map(str.encode), PATHOLOGICAL.map(str.encode)))
def test_pyvenv_cfg_and_pth_files_any_bytes(tmp_path_factory, data):
    venv = tmp_path_factory.mktemp("venv")
    (venv / "pyvenv.cfg").write_bytes(data)
    cfg = _venv.read_pyvenv_cfg(str(venv))
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in cfg.items())
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "x.pth").write_bytes(data)
    for path in _venv.pth_dirs(str(site)):
        assert os.path.isdir(path)


# ------------------------------------------------- the same, through the real file layer
# Files as a hostile user leaves them: any bytes, a FIFO (whose read would block), links to
# /dev/zero (endless) or elsewhere, a directory, or more than the cap. Read through the file
# layer the readers use: each is read or skipped with a problem, within the hang bound.

FILE_SHAPES = st.one_of(
    st.binary(max_size=600).map(lambda b: ("bytes", b)),
    PATHOLOGICAL.map(lambda t: ("bytes", t.encode())),
    st.sampled_from([("fifo", None), ("link", "/dev/zero"), ("link", "/etc/hostname"), ("dir", None), ("huge", None)]),
)


def _make(path, shape):
    kind, data = shape
    if kind == "bytes":
        path.write_bytes(data)
    elif kind == "fifo":
        os.mkfifo(str(path))
    elif kind == "link":
        os.symlink(data, str(path))
    elif kind == "dir":
        path.mkdir()
    else:  # past every cap but RECORD's, a multi-byte character across each cap
        path.write_bytes(b"Name: torch\nVersion: 2.8.0\nSummary: " + "\u00e9\u20ac".encode() * ((_files.CAPS["metadata"] // 5) + 2))


@settings(SETTINGS, max_examples=120)
@given(FILE_SHAPES, FILE_SHAPES, FILE_SHAPES, FILE_SHAPES)
def test_dist_info_files_of_any_kind_through_the_file_layer(tmp_path_factory, metadata, record, shared_object, version_py):
    site = tmp_path_factory.mktemp("site")
    info = site / "torch-2.8.0.dist-info"
    info.mkdir()
    _make(info / "METADATA", metadata)
    # A readable RECORD always lists the shared object, so its shape is always met.
    _make(info / "RECORD", ("bytes", b"torch/libx.so,sha256=AAAA,\n" + record[1]) if record[0] == "bytes" else record)
    (site / "torch").mkdir()
    _make(site / "torch" / "libx.so", shared_object)
    _make(site / "torch" / "version.py", version_py)
    dists, _shadowed = _dist.iter_distributions([str(site)])
    [dist] = dists
    _cuda.classify(dist)  # reads RECORD, then DT_NEEDED of its shared objects
    _cuda.torch_reference(dists)  # reads torch/version.py (no label on this version)
    missing, modified, _checked = dist.verify()
    assert all(isinstance(p, str) for p in dist.problems)
    for name, shape in (("METADATA", metadata), ("RECORD", record)):
        said = [p for p in dist.problems if p.startswith("torch-2.8.0.dist-info/" + name)]
        if shape[0] in ("fifo", "link", "dir"):
            assert said and "not read" in said[0], dist.problems
        if shape[0] == "bytes" and _valid_utf8(shape[1]):
            assert not [p for p in said if "UTF-8" in p], dist.problems
    if version_py[0] in ("fifo", "link", "dir") and dist.key == "torch":
        assert [p for p in dist.problems if p.startswith("torch/version.py is ")], dist.problems
    if record[0] == "bytes" and shared_object[0] in ("fifo", "link", "dir"):
        assert "torch/libx.so" in modified, (missing, modified)


def _valid_utf8(data):
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(SETTINGS, max_examples=200)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=300), st.integers(1, 400))
def test_a_capped_read_is_whole_characters_and_says_the_cut(tmp_path_factory, text, cap):
    """Any valid UTF-8, any cap: the bytes read decode as UTF-8, are the file's first bytes, and
    a cut is said as the reader's (truncated at N bytes), never as the file's fault."""
    path = tmp_path_factory.mktemp("cap") / "f"
    data = text.encode("utf-8")
    path.write_bytes(data)
    problems = []
    fd = _files.open_regular(str(path))
    try:
        got = _files.read_fd(fd, cap, "f", problems)
    finally:
        os.close(fd)
    assert data.startswith(got) and got.decode("utf-8") == text[:len(got.decode("utf-8"))]
    if len(data) > cap:
        assert problems == ["f is larger than %d bytes: truncated at %d bytes" % (cap, cap)] and len(got) > cap - 4
    else:
        assert problems == [] and got == data


# --------------------------------------------------------------------------- CUDA labels


@SETTINGS
@given(VERSION.map(lambda v: v.split("+")[0]), st.from_regex(r"\A[0-9]{1,4}\Z"), st.sampled_from(["", "x", "-1", ".post1", "cu"]))
def test_cuda_label_digits(version, digits, tail):
    """A cuNN label names CUDA major >= 1, or no CUDA at all: cu00 is no CUDA 0 (it would make
    every package labelled so a contaminant of any venv)."""
    found = _cuda.label_cuda("%s+cu%s%s" % (version, digits, tail))
    if found is not None:
        major, minor = found
        assert major >= 1 and digits.startswith(str(major))
        assert minor is None or minor.startswith("%d." % major)


@SETTINGS
@given(st.one_of(ANY_TEXT, PATHOLOGICAL))
def test_cuda_name_families_and_sonames_any_text(text):
    key = _dist.canonical_name(text)
    found = _cuda.name_cuda(key, text)
    assert found is None or found[0] >= 1
    assert _cuda.soname_cuda(text) is None or _cuda.soname_cuda(text) >= 0
    assert _cuda.is_cpu_label(text) in (True, False)


@SETTINGS
@given(st.one_of(st.binary(max_size=800), HOSTILE.map(str.encode), PATHOLOGICAL.map(str.encode)))
def test_torch_version_py_any_bytes(tmp_path_factory, data):
    site = tmp_path_factory.mktemp("site")
    (site / "torch").mkdir()
    (site / "torch" / "version.py").write_bytes(data)
    read = _cuda.read_torch_version_py(str(site))
    assert read is None or set(read) >= {"version", "cuda"}


# --------------------------------------------------------------------------- /proc


@SETTINGS
@given(st.one_of(ANY_TEXT, PATHOLOGICAL))
def test_proc_files_any_text(text):
    with contextlib.suppress(ValueError, IndexError):  # what read_stat() turns into "gone"
        _proc.parse_stat(text)
    uid, nspid = _proc.parse_status(text)
    assert uid is None or uid >= 0
    assert all(isinstance(p, int) and p >= 0 for p in nspid)
    vmid = _cgroup.vmid_of_cgroup(text)
    assert vmid is None or vmid >= 0
    found = _cgroup.classify(text)
    assert found is None or (found[0] in ("payload", "monitor") and found[1] >= 0 and found[2][0] in "./")
    minor = _proc.device_minor(text)
    assert minor is None or minor >= 0


@SETTINGS
@given(st.lists(st.one_of(st.binary(max_size=300), HOSTILE.map(str.encode)), max_size=4))
def test_driver_information_files_any_bytes(tmp_path_factory, files):
    proc = tmp_path_factory.mktemp("proc")
    for i, data in enumerate(files):
        d = proc / "driver" / "nvidia" / "gpus" / ("0000:%02x:00.0" % i)
        d.mkdir(parents=True)
        (d / "information").write_bytes(data)
    try:
        found = _proc.driver_minor_uuids(str(proc))
    except UnicodeDecodeError:
        pytest.fail("driver_minor_uuids crashed on undecodable bytes")
    assert all(isinstance(m, int) and isinstance(u, str) and u for m, u in found.items())


@SETTINGS
@given(st.lists(st.one_of(ANY_TEXT, HOSTILE), min_size=1, max_size=3), st.one_of(st.none(), ANY_TEXT))
def test_scope_patterns_and_session_names_any_text(patterns, session):
    """A pattern is compiled or refused with the reason; one that matches every process and a
    tmux session name that tmux would read as another target are refused."""
    try:
        scope = _scope.Scope(cmdline=patterns, tmux_session=session)
    except _scope.ProcError as exc:
        msg = str(exc)
        assert msg.startswith(("scope has an invalid regular expression", "scope.cmdline pattern", "scope.tmux_session"))
        return
    assert not any(rx.search("") for rx in scope.cmdline)
    if session is not None:
        assert session and not re.search(r"[:.\x00-\x1f\x7f]", session)


# --------------------------------------------------------------------------- files the modules write and read back


@SETTINGS
@given(st.one_of(st.binary(max_size=600), HOSTILE.map(str.encode), PATHOLOGICAL.map(str.encode),
                 st.builds(lambda v: json.dumps({"owner": "x", "taken": 0, "expires": v}).encode(),
                           st.one_of(st.text(max_size=10), st.floats(), st.lists(st.integers(), max_size=2), st.none()))))
def test_lock_file_any_bytes(tmp_path_factory, data):
    """A lock file that is not one this module wrote is 'garbled' (taken over), never a crash."""
    path = tmp_path_factory.mktemp("lock") / "lock"
    path.write_bytes(data)
    held = _hostlock.read_lock(str(path))
    assert isinstance(held, dict)
    try:
        changed, info, _note = _hostlock.acquire(str(path), "run-1", ttl=60, wait=0, check_mode=True)
    except _hostlock.LockError as exc:  # a well-formed lock of another run, not expired
        assert "is held by x since" in str(exc) and "another run is acting on this host" in str(exc)
        return
    assert isinstance(changed, bool) and isinstance(info, dict)


@SETTINGS
@given(st.one_of(st.binary(max_size=600), HOSTILE.map(str.encode), PATHOLOGICAL.map(str.encode),
                 st.recursive(st.one_of(st.none(), st.integers(), st.text(max_size=5)),
                              lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
                              max_leaves=10).map(lambda v: json.dumps({"fingerprint": v}).encode())))
def test_cache_marker_any_bytes(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("cache")
    (root / _marker.MARKER).write_bytes(data)
    fingerprint, problem = _marker.read_marker(str(root))
    assert (fingerprint is None) != (problem is None) or (fingerprint is None and problem is None)
    if problem:
        assert str(root) in problem and "rewritten on the next clear" in problem
    if fingerprint is not None:
        assert set(fingerprint) == set(_fingerprint.FINGERPRINT_KEYS)


@SETTINGS
@given(st.one_of(ANY_TEXT, HOSTILE, st.builds(lambda a, b: a + "/" + b, ANY_TEXT, ANY_TEXT)))
def test_cache_root_check_any_path(path):
    """Whatever a cache variable holds: refused with the reason, or a real absolute path that
    is neither / nor a system directory."""
    if "\x00" in path:
        return  # no variable can hold a NUL
    real, problem = _roots.check_root(path, homes=("/root", "/home/trainer"), venv="/opt/venv")
    if problem is None:
        assert real == os.path.realpath(path) and os.path.isabs(real)
        assert _roots.unsafe_root(real, ("/root", "/home/trainer"), "/opt/venv") is None
        assert real not in ("/", "/root", "/opt/venv") and real.count("/") >= 2
    else:
        assert isinstance(problem, str) and problem


# --------------------------------------------------------------------------- training log


@SETTINGS
@given(st.one_of(ANY_TEXT, HOSTILE, PATHOLOGICAL,
                 st.builds(lambda n: "step 1 loss 2 %s tokens/s\n" % ("9" * n), st.integers(300, 5000))))
def test_throughput_readings_any_log(text):
    """Any log, including a line of digits or blanks hundreds of kilobytes long (the old default
    pattern took minutes on one): finite readings only, in linear time."""
    values = throughput.readings(text, re.compile(throughput.DEFAULT_PATTERN))
    assert all(v >= 0 and v != float("inf") for v in values)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 10**9), st.sampled_from(["", " ", "K", "k", " M", "M "]),
                          st.sampled_from(["tokens/s", "tok/s"])), max_size=10))
def test_throughput_readings_round_trip(lines):
    text = "".join("step %d loss 1.5 %d%s %s\n" % (i, v, u, t) for i, (v, u, t) in enumerate(lines))
    got = throughput.readings(text, re.compile(throughput.DEFAULT_PATTERN))
    scale = {"": 1, "K": 1e3, "k": 1e3, "M": 1e6}
    assert got == [v * scale[u.strip()] for v, u, _t in lines]


# Count the examples every property test above tried (hypothesis calls inner_test once per example).
def _counting(name, inner):
    def run(*args, **kwargs):
        COUNTS[name] += 1
        return inner(*args, **kwargs)
    return run


for _name, _test in list(globals().items()):
    if _name.startswith("test_") and hasattr(getattr(_test, "hypothesis", None), "inner_test"):
        _test.hypothesis.inner_test = _counting(_name, _test.hypothesis.inner_test)
