# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The fingerprint marker of a cache root, written and read on real files (cache/_marker.py)."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._marker import read_marker, write_marker


def test_marker_round_trip_and_garbage(tmp_path):
    fp = {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": "0.6.11.post1"}
    write_marker(str(tmp_path), fp, "/venv")
    assert read_marker(str(tmp_path)) == (fp, None)
    assert [p.name for p in tmp_path.iterdir()] == [".gpufleet-hygiene-fingerprint.json"]
    (tmp_path / ".gpufleet-hygiene-fingerprint.json").write_text("{not json")
    recorded, problem = read_marker(str(tmp_path))
    assert recorded is None and "not valid JSON" in problem


def test_marker_that_is_a_symlink_is_not_followed(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text('{"fingerprint": {"torch": "1", "triton": "2", "cuda": "3"}}')
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(str(outside), str(root / ".gpufleet-hygiene-fingerprint.json"))
    recorded, problem = read_marker(str(root))
    assert recorded is None and "cannot be read" in problem
    write_marker(str(root), {"torch": "a", "triton": "b", "cuda": "c"}, None)
    assert not os.path.islink(str(root / ".gpufleet-hygiene-fingerprint.json"))
    assert outside.read_text() == '{"fingerprint": {"torch": "1", "triton": "2", "cuda": "3"}}'
