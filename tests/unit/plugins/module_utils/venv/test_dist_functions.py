# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_dist, one function at a time, on files made in a temporary directory (no venv is built
and nothing is installed, so the whole file runs in a second or two): names and versions an
installer may be given, METADATA's and RECORD's rows, the environment's prefix and the rows
refused outside it, digests, a distribution's files, the distributions of site directories
(the venv's layout is test_venv.py's, the drift and the inventory test_inventory.py's).
Hostile venvs are in test_dist_hostile.py, the cheap RECORD pass against the full parser in
test_dist.py."""

from __future__ import annotations

import os

import pytest
from distfiles import _digest, _dist_info, _make_venv, _write

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _dist

# ----------------------------------------------------------------- names and versions for installers


@pytest.mark.parametrize("name, ok", [
    ("torch", True), ("a", True), ("7", True), ("nvidia-cudnn-cu13", True), ("Flash_Attn.x2", True),
    ("", False), (None, False), (3, False), ("-e", False), ("--index-url", False), ("torch-", False),
    (".torch", False), ("torch.", False), ("_x", False), ("a b", False), ("a;b", False), ("a/b", False),
    ("a=b", False), ("tôrch", False),
])
def test_a_project_name_is_what_pep_508_allows_and_never_an_option(name, ok):
    assert _dist.valid_project_name(name) is ok


@pytest.mark.parametrize("version, ok", [
    ("2.9.1", True), ("2.9.1+cu128", True), ("1!2.0", True), ("1.0_post1", True), ("0", True), ("v1", True),
    ("1.0-1", True), ("", False), (None, False), (1.0, False), ("-1", False), ("+cu128", False), (".1", False),
    ("!1", False), ("_1", False), ("1 0", False), ("1.0;rm", False), ("1/0", False), ("1,0", False),
])
def test_a_version_is_pep_440_characters_and_never_an_option(version, ok):
    assert _dist.valid_version(version) is ok


# ------------------------------------------------------------------------------------- METADATA


def test_metadata_headers_stop_at_the_first_blank_line_of_any_line_ending():
    for blank in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        nl = blank[:len(blank) // 2]
        data = b"Name: a" + nl + b"Version: 1" + blank + b"Requires-Dist: body" + nl + b"Name: b" + nl
        fields = _dist.parse_metadata(data, "M", [])
        assert (fields["name"], fields["version"], fields["requires_dist"]) == ("a", "1", []), blank


def test_metadata_a_blank_line_of_spaces_ends_the_headers_too():
    fields = _dist.parse_metadata(b"Name: a\n \t \nVersion: 9\nRequires-Dist: x\n", "M", [])
    assert fields == {"name": "a", "requires_dist": []}


def test_metadata_first_name_and_version_win_keys_any_case_every_requirement_kept():
    problems = []
    data = (b"Metadata-Version: 2.1\nNAME:  Torch \nname: other\nversion:2.9.1+cu128\nVersion: 0\n"
            b"Requires-Dist: nvidia-nccl-cu12 ; platform_system == 'Linux'\nrequires-dist:numpy\nSummary: a: b\n")
    fields = _dist.parse_metadata(data, "M", problems)
    assert fields == {"name": "Torch", "version": "2.9.1+cu128",
                      "requires_dist": ["nvidia-nccl-cu12 ; platform_system == 'Linux'", "numpy"]}
    assert problems == []


def test_metadata_starting_with_a_blank_line_has_no_headers_and_its_body_is_not_read():
    problems = []
    assert _dist.parse_metadata(b"\n\nName: a\nbody \xff\n", "M", problems) == {"requires_dist": []}
    assert problems == []


def test_metadata_version_only_from_the_version_header():
    # Any other header, one that sorts after it included, is not the version.
    fields = _dist.parse_metadata(b"Name: a\nX-Version-Tag: 9\nWheel-Version: 8\nVersion: 1\n", "M", [])
    assert fields["version"] == "1"


def test_metadata_without_a_problems_list_still_parses():
    assert _dist.parse_metadata(b"Name: a\nbroken\n")["name"] == "a"


def test_metadata_a_folded_line_is_skipped_but_an_indented_first_or_after_garbage_line_is_read():
    # A continuation (indented) line belongs to the header before it, and is skipped ...
    assert "version" not in _dist.parse_metadata(b"Name: a\n Version: 2\n", "M", [])
    # ... but with no header before it (the first line, or after a malformed one) it is a header.
    assert _dist.parse_metadata(b" Name: a\n", "M", [])["name"] == "a"
    problems = []
    assert _dist.parse_metadata(b"Name: a\nbroken\n Version: 3\n", "M", problems)["version"] == "3"
    assert problems == ["M has a malformed header line: 'broken'"]


def test_metadata_malformed_lines_three_listed_cut_at_80_the_rest_counted():
    problems = []
    lines = [b"x" * 100] + [b"bad%d" % i for i in range(5)]
    _dist.parse_metadata(b"\n".join(lines) + b"\nName: a\n", "pkg/METADATA", problems)
    assert problems == [
        "pkg/METADATA has a malformed header line: %r" % ("x" * 80),
        "pkg/METADATA has a malformed header line: 'bad0'",
        "pkg/METADATA has a malformed header line: 'bad1'",
        "pkg/METADATA has 3 more malformed header lines",
    ]
    problems = []
    _dist.parse_metadata(b"a\nb\nc\nName: x\n", "M", problems)
    assert len(problems) == 3 and not any("more" in p for p in problems)


# --------------------------------------------------------------------------------------- RECORD


@pytest.mark.parametrize("text, lines", [
    ("", []),
    ("a", ["a"]),
    ("a\n", ["a"]),
    ("a\r\nb\r\n", ["a", "b"]),
    ("a\nb", ["a", "b"]),
    ("a\n\n", ["a", ""]),
    ("a\rb\n", ["a\rb"]),
    ("a\x85b\u2028c\x0cd\n", ["a\x85b\u2028c\x0cd"]),
    ("a\r\r\n", ["a\r"]),
])
def test_record_lines_end_with_lf_or_crlf_only(text, lines):
    assert _dist.record_lines(text) == lines


def test_record_rows_hash_and_size_each_read_or_named():
    problems = []
    data = (b"a.py,sha256=AAA,3\n"  # a full row
            b"b.py,,\n"  # no hash, no size
            b"c.py\n"  # the path alone
            b"\n"  # an empty line: skipped, but counted
            b",sha256=BBB,1\n"  # no path: skipped
            b"d.py,sha256,4\n"  # a hash without '='
            b"e.py,sha256=,5\n"  # a hash without a digest
            b"f.py,sha256=FFF,-5\n"  # a size that is no number
            b"g.py,md5=GGG,\n"
            b"h.py,sha256=HHH\n")  # two fields: a hash, no size
    rows = _dist.parse_record(data, "pkg/RECORD", problems)
    assert rows == [("a.py", "sha256", "AAA", 3), ("b.py", None, None, None), ("c.py", None, None, None),
                    ("d.py", None, None, 4), ("e.py", None, None, 5), ("f.py", "sha256", "FFF", None),
                    ("g.py", "md5", "GGG", None), ("h.py", "sha256", "HHH", None)]
    assert problems == [
        "pkg/RECORD line 6 has a malformed hash 'sha256'",
        "pkg/RECORD line 7 has a malformed hash 'sha256='",
        "pkg/RECORD line 8 has a malformed size '-5'",
    ]


def test_record_garbage_three_listed_cut_the_rest_counted():
    problems = []
    rows = "\n".join(["a.py,%s,1" % ("x" * 60)] + ["b%d.py,sha,%s" % (i, "9" * 3 + "z" * 30) for i in range(4)])
    _dist.parse_record(rows.encode(), "R", problems)
    assert problems[0] == "R line 1 has a malformed hash %r" % ("x" * 40)
    assert problems[1] == "R line 2 has a malformed hash 'sha'"
    assert problems[2] == "R line 2 has a malformed size %r" % ("999" + "z" * 17)
    # Nine bad fields: three listed, six counted.
    assert problems[3:] == ["R has 6 more malformed hashes or sizes"]
    problems = []
    _dist.parse_record(b"a,b,c\nd,e,f\n", "R", problems)  # four bad: three listed, one counted
    assert len(problems) == 4 and problems[3] == "R has 1 more malformed hashes or sizes"


def test_record_quoted_rows_are_unquoted_by_csv():
    problems = []
    rows = _dist.parse_record(b'"a,b.py",sha256=AAA,3\nc.py,,\n"d.py",sha256=DDD\n', "R", problems)
    assert rows == [("a,b.py", "sha256", "AAA", 3), ("c.py", None, None, None), ("d.py", "sha256", "DDD", None)]
    assert problems == []


def test_record_that_csv_cannot_read_is_named_and_the_rows_before_kept():
    problems = []
    rows = _dist.parse_record(b'a.py,,\n"' + b"x" * 200000 + b'",,\nc.py,,\n', "R", problems)
    assert rows == [("a.py", None, None, None)]
    assert len(problems) == 1 and problems[0].startswith("R is not valid CSV: ")


def test_record_rows_below_a_site_directory_are_absolute_and_normal():
    site = "/srv/env/lib/python3.11/site-packages"
    problems = []
    data = (b"torch/__init__.py,sha256=AAA,3\n../../../bin/torchrun,,\n./pkg/x.py,,\npkg//y.py,,\n"
            b"pkg/../z.py,,\n-dir/,,\n.cache/ x/,,\n a.py,,\n")
    rows = _dist.parse_record(data, "R", problems, site_dir=site + "/")
    assert rows == [
        (site + "/torch/__init__.py", "torch/__init__.py", "sha256", "AAA", 3),
        ("/srv/env/bin/torchrun", "../../../bin/torchrun", None, None, None),
        (site + "/pkg/x.py", "./pkg/x.py", None, None, None),
        (site + "/pkg/y.py", "pkg//y.py", None, None, None),
        (site + "/z.py", "pkg/../z.py", None, None, None),
        # Nothing to normalise (whatever the first character): the row as it is, below the site.
        (site + "/-dir/", "-dir/", None, None, None),
        (site + "/.cache/ x/", ".cache/ x/", None, None, None),
        (site + "/ a.py", " a.py", None, None, None),
    ]
    assert problems == []


def test_record_rows_outside_the_environment_three_named_the_rest_counted():
    site = "/srv/env/lib/python3.11/site-packages"
    problems = []
    bad = ["/etc/passwd", "../../../../etc/shadow", "../../../../envy/x", "/root/.ssh/authorized_keys", "/a" * 150]
    rows = _dist.parse_record(("ok.py,,\n" + "".join(b + ",,\n" for b in bad)).encode(), "R", problems, site_dir=site)
    assert rows == [(site + "/ok.py", "ok.py", None, None, None)]
    assert len(problems) == 4
    assert problems[0] == _dist._REFUSED % ("R", 2, "/etc/passwd", "an absolute path")
    assert problems[1] == _dist._REFUSED % ("R", 3, "../../../../etc/shadow", "which resolves outside the environment /srv/env")
    # /srv/envy is beside /srv/env, not below it.
    assert problems[2] == _dist._REFUSED % ("R", 4, "../../../../envy/x", "which resolves outside the environment /srv/env")
    assert problems[3] == "R has 2 more rows naming a file outside the environment (refused)"
    problems = []
    _dist.parse_record(("/" + "a" * 300 + ",,\n").encode(), "R", problems, site_dir=site)
    assert problems == [_dist._REFUSED % ("R", 1, "/" + "a" * 199, "an absolute path")]


@pytest.mark.parametrize("site, prefix", [
    ("/p/lib/python3.11/site-packages", "/p"),
    ("/p/lib/python3.11/site-packages/", "/p"),
    ("/p/lib64/python3.12/site-packages", "/p"),
    ("/p/lib/python3.11/dist-packages", "/p"),
    ("/usr/lib/python3/dist-packages", "/usr"),
    ("/p/Lib/site-packages", "/p"),
    ("/p/lib/site-packages", "/p"),
    ("/p/share/python3.11/site-packages", "/p/share"),
    ("/p/other/site-packages", "/p/other"),
    ("/p/lib/python3.11", "/p/lib/python3.11"),
    ("/p/extra", "/p/extra"),
    ("/p/./lib//python3.11/site-packages", "/p"),
])
def test_environment_prefix_is_what_the_installer_writes_below(site, prefix):
    assert _dist.environment_prefix(site) == prefix


def test_outside_row_names_why():
    site = "/p/lib/python3.11/site-packages"
    assert _dist.outside_row(site, "/p/bin/x", "/p/bin/x") == "an absolute path"
    assert _dist.outside_row(site, "../../../bin/x", "/p/bin/x") is None
    assert _dist.outside_row(site, "../../../../q/x", "/q/x") == "which resolves outside the environment /p"
    assert _dist.outside_row(site, "../../../../p2/x", "/p2/x") == "which resolves outside the environment /p"
    assert _dist.outside_row(site, "../../../..", "/") == "which resolves outside the environment /p"


# -------------------------------------------------------------------------------------- digests


@pytest.mark.parametrize("size", [0, 1, 4095, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 7])
def test_file_digest_is_record_s_hash_whatever_the_size(tmp_path, size):
    data = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    path = _write(str(tmp_path / "f"), data)
    assert _dist.file_digest(path) == _digest(data)
    assert "=" not in _dist.file_digest(path)
    assert _dist.file_digest(path, "sha1") == _digest(data, "sha1")


@pytest.mark.parametrize("size, reads", [
    (0, [1]),
    (100, [101, 1 << 20]),
    ((1 << 20) - 1, [1 << 20, 1 << 20]),
    ((1 << 20) + 5, [1 << 20, 1 << 20, 1 << 20]),
])
def test_file_digest_reads_a_small_file_in_one_call_then_a_mebibyte_at_a_time(tmp_path, monkeypatch, size, reads):
    """verify() hashes every file of a RECORD (15,000 of torch's): a file up to 1 MiB costs one
    read of its size and the one byte that shows its end (an empty read), larger files 1 MiB
    reads. The digest is the same whatever the reads; their number is what this pins."""
    path = _write(str(tmp_path / "f"), b"y" * size)
    asked = []
    real_read = os.read

    def read(fd, n):
        asked.append(n)
        return real_read(fd, n)
    monkeypatch.setattr(os, "read", read)
    digest = _dist.file_digest(path)
    monkeypatch.undo()
    assert asked == reads and digest == _digest(b"y" * size)


def test_file_digest_refuses_a_link_a_fifo_and_a_missing_file(tmp_path):
    target = _write(str(tmp_path / "target"), b"data")
    os.symlink(target, str(tmp_path / "link"))
    os.mkfifo(str(tmp_path / "fifo"))
    for name, words in (("link", "symbolic link"), ("fifo", "not a regular file"), ("missing", "does not exist")):
        with pytest.raises(OSError) as err:
            _dist.file_digest(str(tmp_path / name))
        assert err.value.errno == 22 and words in err.value.strerror, name


def test_identity_of_a_file_and_of_a_link_itself(tmp_path):
    path = _write(str(tmp_path / "f"), b"12345")
    st = os.stat(path)
    assert _dist.file_identity(st) == [st.st_dev, st.st_ino, 5, st.st_mtime_ns, st.st_ctime_ns]
    os.symlink(path, str(tmp_path / "l"))
    assert _dist.path_identity(path) == _dist.file_identity(st)
    assert _dist.path_identity(str(tmp_path / "l"))[1] == os.lstat(str(tmp_path / "l")).st_ino != st.st_ino
    assert _dist.path_identity(str(tmp_path / "nothing")) is None


# -------------------------------------------------------------------------------- distributions


def test_a_distribution_read_through_its_anchor(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "Flash_Attn", "2.8.3", {"flash_attn/__init__.py": b"x = 1\n"}, installer="uv\n")
    anchor = _dist.Anchor(site)
    assert anchor.chain is not None and anchor.real == os.path.realpath(site)
    dist = _dist.Distribution(site, info, anchor)
    assert (dist.name, dist.version, dist.key, dist.installer, dist.problems) == ("Flash_Attn", "2.8.3", "flash-attn", "uv", [])
    assert dist.as_dict() == {"name": "Flash_Attn", "version": "2.8.3", "location": site, "installer": "uv"}
    assert [rel for _abs, rel in dist.paths] == ["flash_attn/__init__.py", "Flash_Attn-2.8.3.dist-info/RECORD"]
    assert dist.record[0] == (os.path.join(site, "flash_attn/__init__.py"), "flash_attn/__init__.py", "sha256",
                              _digest(b"x = 1\n"), 6)
    assert dist.verify() == ([], [], 1)
    chain, info_id, record_id, meta_id = dist.identities()
    assert chain == anchor.chain
    assert info_id == _dist.file_identity(os.stat(info))
    assert record_id == _dist.file_identity(os.stat(os.path.join(info, "RECORD")))
    assert meta_id == _dist.file_identity(os.stat(os.path.join(info, "METADATA")))
    anchor.close()
    anchor.close()
    assert anchor.dir is None


def test_an_anchor_that_cannot_be_walked_reads_by_path(tmp_path):
    """A site below a file (a non-directory on the way: _tree.UnsafePath), or one that does not
    exist (OSError): no chain, no handle, and no exception; its packages are read by path."""
    _write(str(tmp_path / "file"))
    for site in (str(tmp_path / "file" / "lib"), str(tmp_path / "none")):
        anchor = _dist.Anchor(site)
        assert (anchor.chain, anchor.dir) == (None, None)
        anchor.close()


def test_identities_of_an_unread_record_are_taken_by_fstat(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "a", "1")
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    assert "RECORD" not in dist.read_identities
    assert dist.identities()[2] == _dist.file_identity(os.stat(os.path.join(info, "RECORD")))
    os.unlink(os.path.join(info, "RECORD"))
    assert dist.identities()[2] is None


def test_a_distribution_without_an_anchor_is_read_by_path_and_has_no_identities(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "a", "1", {"a.py": b"1"})
    for anchor in (None, _dist.Anchor(str(tmp_path / "missing"))):
        dist = _dist.Distribution(site, info, anchor)
        assert dist.anchor is None and dist.steady is False
        assert (dist.name, dist.version) == ("a", "1")
        assert dist.identities() == [None, None, None, None]
        assert dist.verify() == ([], [], 1)


def test_metadata_missing_names_the_package_from_its_directory(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    os.makedirs(os.path.join(site, "Some_Pkg-3.1.dist-info"))
    for anchor in (None, _dist.Anchor(site)):
        dist = _dist.Distribution(site, os.path.join(site, "Some_Pkg-3.1.dist-info"), anchor)
        assert (dist.name, dist.version, dist.key) == ("Some_Pkg", "3.1", "some-pkg")
        assert dist.problems[0] == "Some_Pkg-3.1.dist-info/METADATA does not exist"
        assert "Some_Pkg-3.1.dist-info lacks Name or Version; taken from the directory name" in dist.problems
        # RECORD is not optional for a dist-info directory; INSTALLER is.
        assert dist.installer is None and dist.record == []
        assert dist.problems[-1] == "Some_Pkg-3.1.dist-info/RECORD does not exist"


def test_metadata_lacking_a_version_takes_the_directory_s_or_none(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "b", "2.0", metadata="Name: b\n\n")
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    assert dist.version == "2.0" and dist.problems == ["b-2.0.dist-info lacks Name or Version; taken from the directory name"]
    bare = os.path.join(site, "c.dist-info")
    _write(os.path.join(bare, "METADATA"), "Version: 1\n\n")
    dist = _dist.Distribution(site, bare)
    assert (dist.name, dist.version) == ("c", "1")
    bare = os.path.join(site, "d.dist-info")
    _write(os.path.join(bare, "METADATA"), "Name: D\n\n")
    assert _dist.Distribution(site, bare).version is None


def test_an_egg_info_reads_pkg_info_and_needs_no_record(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    egg = os.path.join(site, "legacy-0.1.egg-info")
    _write(os.path.join(egg, "PKG-INFO"), "Metadata-Version: 1.0\nName: legacy\nVersion: 0.1\n\n")
    _write(os.path.join(egg, "METADATA"), "Name: wrong\nVersion: 9\n\n")
    for anchor in (None, _dist.Anchor(site)):
        dist = _dist.Distribution(site, egg, anchor)
        assert dist.is_egg_info and (dist.name, dist.version) == ("legacy", "0.1")
        assert dist.record == [] and dist.paths == [] and dist.problems == []


def test_installer_is_its_first_word_stripped_or_none(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    for text, want in ((b"pip\n", "pip"), (b"  \n", None), (b"", None), (b"\xff\xfepip", "\ufffd\ufffdpip")):
        info = _dist_info(site, "p", "1", installer=text)
        assert _dist.Distribution(site, info, _dist.Anchor(site)).installer == want
        assert _dist.Distribution(site, info).installer == want


def test_verify_tells_missing_from_modified_by_size_and_by_hash(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    files = {"p/ok.py": b"same", "p/gone.py": b"x", "p/longer.py": b"abc", "p/samesize.py": b"abc",
             "p/dir.py": b"abc", "p/link.py": b"abc", "p/big.so": b"\x7fELF" * 1000}
    info = _dist_info(site, "p", "1", files)
    with open(os.path.join(info, "RECORD"), "a") as f:
        f.write("p/nosize.py,sha256=%s,\np/nohash.py,,\n" % _digest(b"orig"))
    _write(os.path.join(site, "p/nosize.py"), b"edit")
    os.unlink(os.path.join(site, "p/gone.py"))
    _write(os.path.join(site, "p/longer.py"), b"abcd")
    _write(os.path.join(site, "p/samesize.py"), b"abd")
    os.unlink(os.path.join(site, "p/dir.py"))
    os.makedirs(os.path.join(site, "p/dir.py"))
    os.unlink(os.path.join(site, "p/link.py"))
    os.symlink(os.path.join(site, "p/ok.py"), os.path.join(site, "p/link.py"))
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    missing, modified, checked = dist.verify()
    assert missing == ["p/gone.py"]
    # A directory has another size; a link to a file of the right size is still no regular file.
    assert sorted(modified) == ["p/dir.py", "p/link.py", "p/longer.py", "p/nosize.py", "p/samesize.py"]
    assert checked == 8


def test_verify_hashes_no_file_whose_size_already_differs(tmp_path, monkeypatch):
    """Size first: a file shorter or longer than RECORD says is modified without being read."""
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1", {"p/short.py": b"abcdef", "p/long.py": b"abc", "p/same.py": b"abc"})
    _write(os.path.join(site, "p/short.py"), b"abc")
    _write(os.path.join(site, "p/long.py"), b"abcdef")
    hashed = []
    real = _dist.file_digest

    def spy(path, algo="sha256"):
        hashed.append(os.path.basename(path))
        return real(path, algo)
    monkeypatch.setattr(_dist, "file_digest", spy)
    missing, modified, checked = _dist.Distribution(site, info).verify()
    assert (missing, sorted(modified), checked) == ([], ["p/long.py", "p/short.py"], 3)
    assert hashed == ["same.py"]


@pytest.mark.parametrize("made", ["before", "after"])
def test_a_dist_info_directory_exchanged_between_reads_is_named_and_unsteady(tmp_path, made):
    """Exchanged for a directory made before the first one or after it (an inode number below
    or above it, as file systems hand them out): another directory either way."""
    site = _make_venv(str(tmp_path / "env"))
    other = _dist_info(str(tmp_path / "other"), "p", "1", {"p.py": b"1"}) if made == "before" else None
    info = _dist_info(site, "p", "1", {"p.py": b"1"})
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    assert dist.steady and dist.info_identity is not None
    os.rename(info, info + ".old")
    if other is None:
        _dist_info(site, "p", "1", {"p.py": b"1"})
    else:
        os.rename(other, info)
    assert dist.record == []
    assert dist.steady is False
    assert dist.problems == ["p-1.dist-info/RECORD was not read: %s is another directory than when it was first read "
                             "(it was exchanged meanwhile)" % info]
    # Once unsteady, nothing more is opened: no second problem.
    assert dist.identities() == [None, None, None, None] and len(dist.problems) == 1


def test_a_dist_info_directory_gone_or_a_link_when_read_again(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    os.rename(info, str(tmp_path / "away"))
    assert dist.installer is None and dist.problems == ["p-1.dist-info/INSTALLER does not exist"]
    assert dist.steady is True
    os.symlink(str(tmp_path / "away"), info)
    assert dist.record == []
    assert dist.steady is False
    assert dist.problems[1].startswith("p-1.dist-info/RECORD was not read: ")


def test_identities_of_a_dist_info_directory_gone_since_its_read_name_its_record(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    os.rename(info, str(tmp_path / "away"))
    assert dist.identities() == [None, None, None, None]
    assert dist.problems == ["p-1.dist-info/RECORD does not exist"]


def test_a_dist_info_directory_made_a_file_when_read_again_is_named_with_the_error(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    os.rename(info, str(tmp_path / "away"))
    _write(info, b"a file now")
    assert dist.record == [] and dist.steady is False
    assert dist.problems == ["p-1.dist-info/RECORD was not read: %s cannot be opened: Not a directory" % info]


def test_a_file_that_fails_to_read_is_a_problem_of_its_package_not_an_error(tmp_path, monkeypatch):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    real_read = os.read

    def read(fd, n):
        if os.readlink("/proc/self/fd/%d" % fd).endswith("/RECORD"):
            raise OSError(5, "Input/output error")
        return real_read(fd, n)
    monkeypatch.setattr(os, "read", read)
    for anchor in (_dist.Anchor(site), None):
        dist = _dist.Distribution(site, info, anchor)
        assert dist.record == [] and dist.name == "p"
        assert dist.problems == ["p-1.dist-info/RECORD cannot be read: Input/output error"]


def test_replayed_problems_are_not_told_twice(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    _write(os.path.join(info, "RECORD"), "a.py,sha,1\nb.py,,x\n")
    dist = _dist.Distribution(site, info, _dist.Anchor(site))
    dist.replay(["p-1.dist-info/RECORD line 1 has a malformed hash 'sha'", "an older problem"])
    rows = dist.record
    assert len(rows) == 2
    assert dist.problems == ["p-1.dist-info/RECORD line 1 has a malformed hash 'sha'", "an older problem",
                             "p-1.dist-info/RECORD line 2 has a malformed size 'x'"]
    assert dist.paths == [(r[0], r[1]) for r in rows]
    # Another read, told one of the two before it parses: each is in its problems once.
    dist2 = _dist.Distribution(site, info, _dist.Anchor(site))
    dist2.replay(["p-1.dist-info/RECORD line 2 has a malformed size 'x'"])
    assert len(dist2.record) == 2
    assert dist2.problems.count("p-1.dist-info/RECORD line 2 has a malformed size 'x'") == 1
    assert dist2.problems.count("p-1.dist-info/RECORD line 1 has a malformed hash 'sha'") == 1


def test_the_cheap_paths_of_a_record_already_parsed_are_its_rows(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1", {"p.py": b"1"})
    dist = _dist.Distribution(site, info)
    rows = dist.record
    os.unlink(os.path.join(info, "RECORD"))
    assert dist.paths == [(r[0], r[1]) for r in rows]


@pytest.mark.parametrize("record, problem", [
    (b"ok.py,,\n\xff\xfe.py,,\n", "not valid UTF-8"),
    (b"ok.py,,\n/etc/passwd,,\n", "'/etc/passwd', an absolute path"),
    (b'ok.py,,\n"q,uoted.py",,\n', None),
    (b"ok.py,,\n../../../../../x,,\n", "which resolves outside the environment"),
])
def test_cheap_paths_fall_back_to_the_full_parser_which_names_the_problem(tmp_path, record, problem):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    _write(os.path.join(info, "RECORD"), record)
    cheap = _dist.Distribution(site, info)
    full = _dist.Distribution(site, info)
    assert cheap.paths == [(r[0], r[1]) for r in full.record]
    assert cheap.paths[0] == (os.path.join(site, "ok.py"), "ok.py")
    assert cheap.problems == full.problems
    assert (problem is None) == (cheap.problems == []) and (problem is None or problem in cheap.problems[0])


def test_cheap_paths_normalise_inside_rows_and_skip_empty_ones(tmp_path):
    site = _make_venv(str(tmp_path / "env"))
    info = _dist_info(site, "p", "1")
    _write(os.path.join(info, "RECORD"), b"a/./b.py,,\n\n../../../bin/x,,\nc//d.py,,\n,,\n-dir/,,\n.e/,,\nf/,,\n")
    dist = _dist.Distribution(site, info)
    # A row with nothing to normalise is taken as it is, whatever its first character.
    assert dist.paths == [(os.path.join(site, "a/b.py"), "a/./b.py"), (str(tmp_path / "env" / "bin" / "x"), "../../../bin/x"),
                          (os.path.join(site, "c/d.py"), "c//d.py"), (site + "/-dir/", "-dir/"), (site + "/.e/", ".e/"),
                          (site + "/f/", "f/")]
    assert dist.paths == [(r[0], r[1]) for r in _dist.Distribution(site, info).record]
    assert dist.problems == []
    _write(os.path.join(info, "RECORD"), b"a.py,,\n\n,x,\nb.py,,\n")
    assert _dist.Distribution(site, info).paths == [(os.path.join(site, "a.py"), "a.py"), (os.path.join(site, "b.py"), "b.py")]


def test_distributions_first_on_the_path_wins_later_copies_shadowed(tmp_path):
    first = _make_venv(str(tmp_path / "a"))
    second = _make_venv(str(tmp_path / "b"))
    _dist_info(first, "Torch", "2.9.1")
    _dist_info(first, "numpy", "2.0")
    _dist_info(second, "torch", "2.8.0")
    _dist_info(second, "zlib_x", "1")
    _write(os.path.join(second, "fake.dist-info"))  # a file, not a directory
    os.makedirs(os.path.join(second, "pkg"))
    legacy = os.path.join(second, "old-1.egg-info")
    _write(os.path.join(legacy, "PKG-INFO"), "Name: old\nVersion: 1\n\n")
    # A site directory that cannot be listed is passed over, not the end of the search.
    dists, shadowed = _dist.iter_distributions([first, str(tmp_path / "none"), second])
    assert [(d.name, d.version, d.site_dir) for d in dists] == [
        ("Torch", "2.9.1", first), ("numpy", "2.0", first), ("old", "1", second), ("zlib_x", "1", second)]
    assert [(d.name, d.version) for d in shadowed] == [("torch", "2.8.0")]
    # One anchor per site directory, shared by its distributions.
    assert dists[0].anchor is dists[1].anchor and dists[0].anchor is not dists[2].anchor
    assert list(_dist.info_entries([second])) == [(second, "fake.dist-info"), (second, "old-1.egg-info"),
                                                  (second, "torch-2.8.0.dist-info"), (second, "zlib_x-1.dist-info")]
