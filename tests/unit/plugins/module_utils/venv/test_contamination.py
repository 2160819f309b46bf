# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The removal's stash (venv/_contamination.Stash) on real directories of another user: files are
copied into root's 0700 directory and put back through handles; a directory exchanged for
another real one, or swapped for a link, is refused and named; nothing is ever replaced; a
directory the uninstall removed is made again as it was."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _contamination

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the stash is root's: these tests run as root")

NOBODY = 65534
BODY = b"the kept package's bytes\n"


def digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


@pytest.fixture
def site(monkeypatch, tmp_path):
    """A site directory of nobody's holding pkg/sub/data.bin (nobody's, 0640), and the stash's
    state directory in this test's own tree."""
    monkeypatch.setattr(_contamination, "STATE_DIR", str(tmp_path / "state" / "restore"))
    root = tempfile.mkdtemp(prefix="gpufleet-owned-", dir="/tmp")
    os.chmod(root, 0o755)
    path = os.path.join(root, "site-packages")
    os.makedirs(os.path.join(path, "pkg", "sub"))
    with open(os.path.join(path, "pkg", "sub", "data.bin"), "wb") as f:
        f.write(BODY)
    os.chmod(os.path.join(path, "pkg", "sub", "data.bin"), 0o640)
    os.chmod(os.path.join(path, "pkg", "sub"), 0o750)
    for top, _dirs, files in os.walk(path):
        for name in [top] + [os.path.join(top, n) for n in files]:
            os.chown(name, NOBODY, NOBODY)
    yield path
    shutil.rmtree(root, ignore_errors=True)


def taken(site):
    stash = _contamination.Stash()
    assert stash.take(site, "pkg/sub/data.bin", digest(BODY), "sha256") is None
    os.remove(os.path.join(site, "pkg", "sub", "data.bin"))  # the uninstall
    return stash


def test_the_copy_is_root_s_alone_and_goes_with_the_run(site):
    stash = taken(site)
    st = os.stat(stash.where)
    copy = os.stat(os.path.join(stash.where, "0"))
    assert (st.st_uid, st.st_mode & 0o777, copy.st_uid, copy.st_mode & 0o777, copy.st_nlink) == (0, 0o700, 0, 0o600, 1)
    assert os.stat(_contamination.stash_dir()).st_mode & 0o777 == 0o700
    assert stash.put_back(stash.items[0]) is None
    stash.close()
    assert not os.path.exists(_contamination.stash_dir())
    path = os.path.join(site, "pkg", "sub", "data.bin")
    st = os.stat(path)
    with open(path, "rb") as f:
        assert f.read() == BODY
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777, st.st_nlink) == (NOBODY, NOBODY, 0o640, 1)
    assert not [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".gpufleet")]


def test_a_directory_the_uninstall_removed_is_made_again_as_it_was(site):
    stash = taken(site)
    shutil.rmtree(os.path.join(site, "pkg"))
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    for rel, mode in (("pkg", 0o755), ("pkg/sub", 0o750)):
        st = os.stat(os.path.join(site, rel))
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, mode), rel
    with open(os.path.join(site, "pkg", "sub", "data.bin"), "rb") as f:
        assert f.read() == BODY


def test_a_file_put_there_meanwhile_is_never_replaced(site):
    stash = taken(site)
    with open(os.path.join(site, "pkg", "sub", "data.bin"), "wb") as f:
        f.write(b"the owner's own\n")
    try:
        assert stash.put_back(stash.items[0]) is None
    finally:
        stash.close()
    with open(os.path.join(site, "pkg", "sub", "data.bin"), "rb") as f:
        assert f.read() == b"the owner's own\n"


@pytest.mark.parametrize("swap", ["a link", "another directory", "the site for a link"])
def test_a_swapped_directory_is_refused_and_named_and_nothing_is_written(site, tmp_path, swap):
    stash = taken(site)
    elsewhere = os.path.join(os.path.dirname(site), "elsewhere")
    os.makedirs(os.path.join(elsewhere, "sub"))
    sub = os.path.join(site, "pkg", "sub")
    if swap == "a link":
        os.rename(sub, sub + ".real")
        os.symlink(os.path.join(elsewhere, "sub"), sub)
        said = "is reached through the symbolic link %s" % sub
    elif swap == "another directory":
        os.rename(sub, sub + ".real")
        os.rename(os.path.join(elsewhere, "sub"), sub)
        said = "is reached through %s, which is another directory than before the uninstall" % sub
    else:
        os.rename(site, site + ".real")
        os.symlink(elsewhere, site)
        os.symlink(os.path.join(elsewhere, "sub"), os.path.join(elsewhere, "pkg"))
        said = "%s is a symbolic link to %s" % (site, elsewhere)
    try:
        problem = stash.put_back(stash.items[0])
    finally:
        stash.close()
    assert problem is not None and said in problem and "nothing was written there" in problem, problem
    for top, _dirs, files in os.walk(elsewhere):
        assert files == [], (top, files)
    for top, _dirs, files in os.walk(site + (".real" if swap == "the site for a link" else "")):
        assert "data.bin" not in files, top


def test_a_file_that_changed_before_it_was_copied_is_not_kept(site):
    stash = _contamination.Stash()
    try:
        problem = stash.take(site, "pkg/sub/data.bin", digest(b"what RECORD says"), "sha256")
        assert problem and "no longer matches its RECORD" in problem
        assert stash.items == [] and stash.take(site, "../etc/passwd") and stash.items == []
    finally:
        stash.close()
