# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Property-based tests of every parser: arbitrary input never crashes or hangs, and what
the real tools write is read back exactly."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.hygiene.plugins.module_utils import _cuda, _dist, _elf, _gpu, _gpuproc

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=400)
NAME = st.from_regex(r"\A[A-Za-z0-9]([A-Za-z0-9._-]{0,30}[A-Za-z0-9])?\Z")
VERSION = st.from_regex(r"\A[0-9]{1,3}(\.[0-9]{1,3}){0,3}(\+[a-z0-9]{1,8})?\Z")


@SETTINGS
@given(st.binary(max_size=2000))
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
@given(st.binary(max_size=3000))
def test_record_any_bytes(data):
    problems = []
    for row in _dist.parse_record(data, "R", problems, site_dir="/site"):
        abs_path, rel, algo, digest, size = row
        assert abs_path.startswith("/") and rel
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
@given(TEXT)
def test_canonical_name_matches_the_reference_rule(name):
    assert _dist.canonical_name(name) == re.sub(r"[-_.]+", "-", name).lower()


@SETTINGS
@given(TEXT)
def test_requirements_any_text(text):
    try:
        wanted = _dist.parse_requirements(text.encode("utf-8"), "req.txt")
    except _dist.DistError as exc:
        assert "req.txt" in str(exc) or "UTF-8" in str(exc)
        return
    assert all(isinstance(k, str) and "spec" in v for k, v in wanted.items())


@SETTINGS
@given(TEXT)
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
@given(TEXT)
def test_nvidia_smi_any_text(text):
    for parse in (_gpu.parse_gpus, _gpu.parse_apps):
        try:
            rows = parse(text)
        except _gpu.GpuParseError:
            continue
        assert isinstance(rows, list)


GPU_NAME = st.from_regex(r"\A[A-Za-z0-9 ,()_-]{1,40}\Z").map(str.strip).filter(bool)


@SETTINGS
@given(st.lists(st.tuples(GPU_NAME, st.integers(0, 200000), st.integers(0, 200000),
                          st.one_of(st.integers(0, 100), st.just("[N/A]"))), min_size=1, max_size=8))
def test_nvidia_smi_gpu_rows_round_trip(gpus):
    lines = ["%d, GPU-%08d, %s, %d, %d, %s" % (i, i, name, used, total, util)
             for i, (name, used, total, util) in enumerate(gpus)]
    parsed = _gpu.parse_gpus("\n".join(lines) + "\n")
    assert [g["name"] for g in parsed] == [name for name, _u, _t, _p in gpus]
    assert [g["utilization_pct"] for g in parsed] == [None if u == "[N/A]" else u for _n, _u, _t, u in gpus]


PROC_NAME = st.from_regex(r"\A[A-Za-z0-9 ,/._()\[\]-]{1,60}\Z").map(str.strip).filter(bool)


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 4194304), st.integers(0, 200000), PROC_NAME), max_size=8))
def test_nvidia_smi_app_rows_round_trip(apps):
    text = "".join("GPU-aaaa, %d, %d MiB, %s\n" % (pid, used, name) for pid, used, name in apps) or \
        "No running processes found\n"
    parsed = _gpu.parse_apps(text.replace(" MiB", ""))
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
    assert _gpuproc.parse_stat(text) == (comm, state, ppid, started)


@pytest.fixture(scope="module")
def pct():
    from ansible_collections.gpufleet.hygiene.plugins.inventory import proxmox_lxc
    return proxmox_lxc


@SETTINGS
@given(TEXT)
def test_pct_parsers_any_text(pct, text):
    for row in pct.parse_pct_list(text):
        assert isinstance(row["vmid"], int)
    assert isinstance(pct.parse_pct_config(text), dict)


CT_NAME = st.from_regex(r"\A[a-z][a-z0-9-]{0,19}\Z")


@SETTINGS
@given(st.lists(st.tuples(st.integers(100, 999999999), st.sampled_from(["running", "stopped"]),
                          st.sampled_from(["", "backup", "migrate", "snapshot"]), CT_NAME), max_size=10))
def test_pct_list_round_trip(pct, rows):
    text = ("%-10s %-10s %-12s %-20s\n" % ("VMID", "Status", "Lock", "Name") if rows else "")
    text += "".join("%-10s %-10s %-12s %-20s\n" % row for row in rows)
    parsed = pct.parse_pct_list(text)
    assert [(r["vmid"], r["status"], r["lock"], r["name"]) for r in parsed] == rows
