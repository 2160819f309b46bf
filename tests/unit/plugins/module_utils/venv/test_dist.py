# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_dist: the scan's cheap pass over RECORD (paths only, in bulk) must name exactly the files
the full RECORD parser names, whatever the paths look like; RECORD and METADATA garbage, one
input at a time. Hostile venvs read through it are in test_dist_hostile.py."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _dist

SEGMENT = st.one_of(
    st.sampled_from(["..", ".", "", "torch", "lib", "nvidia", "cu13", "a,b", "x y"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters='\x00\n\r"/'), min_size=1, max_size=12),
)
PATH = st.lists(SEGMENT, min_size=1, max_size=5).map("/".join).filter(lambda p: p.strip(","))
ROW = st.tuples(st.one_of(st.just(""), st.just("/"), st.just("./")), PATH,
                st.sampled_from(["", "sha256=AAAA"]), st.sampled_from(["", "12"]))


def _paths_both_ways(lines, problems=None):
    with tempfile.TemporaryDirectory() as prefix:
        site = os.path.join(prefix, "lib", "python3.11", "site-packages")
        info = os.path.join(site, "demo-1.0.dist-info")
        os.makedirs(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n\n")
        with open(os.path.join(info, "RECORD"), "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        first = _dist.Distribution(site, info)
        cheap = first.paths
        second = _dist.Distribution(site, info)
        full = [(r[0], r[1]) for r in second.record]
        assert first.problems == second.problems
        if problems is not None:
            problems.extend(second.problems)
    return cheap, full


@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, max_size=12))
@example([("", "\x85/.", "", "")])  # NEL is a line break to str.splitlines, not to RECORD
def test_cheap_paths_equal_the_full_parser(rows):
    lines = ["%s%s,%s,%s" % (lead, path, digest, size) for lead, path, digest, size in rows]
    cheap, full = _paths_both_ways(lines)
    assert cheap == full


def test_common_and_unusual_rows():
    lines = ["torch/__init__.py,sha256=AAAA,10", "../../../bin/torchrun,sha256=BBBB,20",
             "nvidia//cu13/lib/libcudart.so.13,,", "./pkg/x.py,,", "a,b.py,sha256=CCCC,3", "pkg/a\x85b\u2028c.py,,",
             "demo-1.0.dist-info/RECORD,,"]
    problems = []
    cheap, full = _paths_both_ways(lines, problems)
    assert cheap == full and problems == []
    expected = [
        "torch/__init__.py", "../../../bin/torchrun", "nvidia//cu13/lib/libcudart.so.13", "./pkg/x.py",
        "a,b.py", "pkg/a\x85b\u2028c.py", "demo-1.0.dist-info/RECORD",
    ]
    assert [rel for _abs, rel in cheap] == expected
    # A script row lands in the environment's bin/, beside lib/.
    site = os.path.dirname(os.path.dirname(cheap[0][0]))
    assert cheap[1][0] == os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(site))), "bin", "torchrun")


@pytest.mark.parametrize("row, why", [
    ("/etc/ld.so.preload", "an absolute path"),
    ("../../../../etc/ld.so.preload", "resolves outside the environment"),
    ("pkg/../../../../../etc/shadow", "resolves outside the environment"),
])
def test_a_row_outside_the_environment_is_refused_and_named(row, why):
    """Absolute rows and rows whose `..` leave the environment are no installed file: they are
    named once and never reach a reader (verify, the scan, the removal's restore)."""
    problems = []
    cheap, full = _paths_both_ways(["pkg/__init__.py,,", row + ",sha256=AAAA,10"], problems)
    assert cheap == full and [rel for _abs, rel in full] == ["pkg/__init__.py"]
    assert len(problems) == 1 and "demo-1.0.dist-info/RECORD line 2 names %r" % row in problems[0], problems
    assert why in problems[0] and "refused" in problems[0]


def test_a_body_that_is_not_utf8_is_no_problem_of_the_headers():
    # As typer's METADATA on a real GPU machine: headers fine, the long description ending in
    # the first byte of a three-byte character. Only the headers are read, so nothing is blamed.
    data = (b"Metadata-Version: 2.4\nName: typer\nVersion: 0.27.2\nRequires-Dist: click>=8.0.0\n\n"
            b"# Typer \xe2\x9c\xa8 done\n" + b"x" * 1000 + b"\xe2\x9c")
    problems = []
    fields = _dist.parse_metadata(data, "typer-0.27.2.dist-info/METADATA", problems)
    assert (fields["name"], fields["version"], fields["requires_dist"]) == ("typer", "0.27.2", ["click>=8.0.0"])
    assert problems == []
    # A header that is not UTF-8 still is.
    _dist.parse_metadata(b"Name: caf\xe9\nVersion: 1\n\nbody", "m", problems)
    assert problems and "not valid UTF-8" in problems[0]


# ------------------------------------------------------- RECORD and METADATA, one input at a time


def test_canonical_name():
    assert _dist.canonical_name("Flash_Attn.Four") == "flash-attn-four"
    assert _dist.canonical_name("nvidia--cudnn__cu13") == "nvidia-cudnn-cu13"


def test_parse_record_reports_garbage():
    problems = []
    rows = _dist.parse_record(b'a.py,sha256=abc,3\nb.py,md5,x\n"c.py,,\n', "R", problems)
    assert rows[0] == ("a.py", "sha256", "abc", 3)
    assert rows[1] == ("b.py", None, None, None)
    assert any("malformed hash" in p for p in problems)
    assert any("malformed size" in p for p in problems)


def test_parse_metadata_latin1_and_folding():
    problems = []
    fields = _dist.parse_metadata(b"Name: caf\xe9\nVersion: 1.0\nRequires-Dist: a\n  folded\nbroken line\n\nbody: x\n",
                                  "M", problems)
    assert fields["name"] == "caf\xe9" and fields["version"] == "1.0"
    assert fields["requires_dist"] == ["a"]
    assert any("not valid UTF-8" in p for p in problems)
    assert any("malformed header line" in p for p in problems)
