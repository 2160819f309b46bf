# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fs/_files, the file layer alone: a FIFO, a link to /dev/zero or a device in a file's place is
refused within a bound, never read; a capped read never cuts a character and says where it cut.
The same layer under the venv's readers, on real venvs: venv/test_dist_hostile.py."""

from __future__ import annotations

import pytest
from hostilefiles import replace, timed

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _files


@pytest.mark.parametrize("how, said", [("fifo", "is a FIFO, not a regular file"), ("/dev/zero", "is a symbolic link")])
def test_the_layer_refuses_fifos_and_links_without_blocking(tmp_path, how, said):
    path = str(tmp_path / "f")
    open(path, "w").close()
    replace(path, how)
    problems = []
    data, _seconds = timed(_files.read_file, path, "record", problems)
    assert data is None and len(problems) == 1 and said in problems[0]


def test_a_device_reached_by_its_own_name_is_refused(tmp_path):
    problems = []
    data, _seconds = timed(_files.read_file, "/dev/zero", "metadata", problems)
    assert data is None and problems == ["/dev/zero is a character device, not a regular file: not read"]


def test_a_cap_never_cuts_a_character_and_says_where_it_cut(tmp_path):
    """A capped read of UTF-8 text is whole characters (never "not valid UTF-8"), and the cut is
    reported as the reader's, with its byte count."""
    path = tmp_path / "METADATA"
    head = "Metadata-Version: 2.1\nName: typer\nVersion: 0.12.5\nSummary: "
    body = "é€𝄞" * ((_files.CAPS["metadata"] // 9) + 10)  # 2-, 3- and 4-byte characters across the cap
    path.write_bytes((head + body).encode("utf-8"))
    for shift in range(4):  # the cap falls inside each byte of a character in turn
        path.write_bytes(("x" * shift + head + body).encode("utf-8"))
        problems = []
        text = _files.read_text(str(path), "metadata", problems)
        assert problems == ["%s is larger than %d bytes: truncated at %d bytes" % (path, _files.CAPS["metadata"], _files.CAPS["metadata"])]
        assert text.startswith("x" * shift + head) and len(text.encode("utf-8")) > _files.CAPS["metadata"] - 4
