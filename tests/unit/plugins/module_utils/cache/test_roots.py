# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What may be cleared: cache roots opened from / through real directories and judged (cache/_roots.py)."""

from __future__ import annotations

import os
import pwd

import pytest
from cachetree import FLASHINFER_CUBINS, TVM_FFI_TREE, flashinfer_tree, make_tree

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._roots import check_root, protected_homes
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tree

ME = pwd.getpwuid(os.getuid())


@pytest.mark.parametrize("path,why", [
    ("/", "is / itself"),
    ("/tmp", "top-level directory /tmp"),
    ("/tmp/", "top-level directory /tmp"),
    ("/home", "top-level directory /home"),
    ("/usr/local", "system directory /usr/local"),
    ("/var/tmp", "system directory /var/tmp"),
    ("/etc/ssl", "lies in the system directory /etc"),
    ("/usr/lib/x86_64-linux-gnu", "lies in the system directory /usr/lib"),
    ("/proc/1", "lies in the system directory /proc"),
    # Through a name that cannot exist (nothing can be made in /proc), whatever this host holds.
    ("/proc/gpufleet-no-such-dir/../../..", "is / itself"),
])
def test_system_paths_are_refused(path, why):
    _real, problem = check_root(path, homes=())
    assert problem is not None and why in problem


def test_home_itself_and_its_parents_are_refused(tmp_path):
    home = tmp_path / "users" / "alice"
    home.mkdir(parents=True)
    homes = protected_homes([str(home)])
    assert "is the home directory" in check_root(str(home), homes)[1]
    assert "is the home directory" in check_root(str(home) + "/.cache/..", homes)[1]
    assert "contains the home directory" in check_root(str(tmp_path / "users"), homes)[1]
    assert check_root(str(home / ".cache/torch_extensions"), homes)[1] is None
    # every account's home is protected, not only the job's
    assert "is the home directory" in check_root(ME.pw_dir, protected_homes())[1]


def test_dotdot_through_a_symlink_is_refused_not_resolved_lexically(tmp_path):
    """'link/..' is the parent of the link's target, not the link's own folder: a lexical check
    would allow scratch/, the kernel would reach home/. Neither: the link is refused and named."""
    home = tmp_path / "home"
    (home / "project").mkdir(parents=True)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    os.symlink(str(home / "project"), str(scratch / "link"))
    path = str(scratch / "link") + "/.."
    assert os.path.normpath(path) == str(scratch)  # what a lexical check would wrongly allow
    real, problem = check_root(path, protected_homes([str(home)]))
    assert real == str(scratch / "link")
    assert problem.startswith("is reached through the symbolic link %s (to %s)" % (scratch / "link", home / "project"))


@pytest.mark.parametrize("suffix", ["", "/", "/.", "//./"])
def test_root_that_is_a_symlink_is_refused_however_spelt(tmp_path, suffix):
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.symlink(str(target), str(tmp_path / "cache"))
    real, problem = check_root(str(tmp_path / "cache") + suffix, ())
    assert real == str(tmp_path / "cache")
    assert "is a symbolic link to %s" % target in problem


def test_root_holding_the_venv_is_refused(tmp_path):
    venv = tmp_path / "work" / "venv"
    venv.mkdir(parents=True)
    assert "contains the virtual environment" in check_root(str(tmp_path / "work"), (), str(venv))[1]


def test_root_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "cache").write_text("not a dir")
    assert check_root(str(tmp_path / "cache"), ())[1] == "is not a directory"


def test_a_symlink_earlier_in_the_path_is_refused_and_named(tmp_path):
    """TRITON_CACHE_DIR=~/datalink/cache: clearing would reach inside the link's target, and a
    link can be swapped to point anywhere; the link is named, its target is left alone."""
    data = tmp_path / "data"
    (data / "cache" / "torch_extensions").mkdir(parents=True)
    (data / "cache" / "torch_extensions" / "keep").write_text("x")
    os.symlink(str(data), str(tmp_path / "datalink"))
    for path in (tmp_path / "datalink/cache", tmp_path / "datalink/cache/torch_extensions", tmp_path / "datalink/cache/missing"):
        real, problem = check_root(str(path), (), kind="triton")
        assert real == str(tmp_path / "datalink")
        assert problem.startswith("is reached through the symbolic link %s (to %s): " % (tmp_path / "datalink", data))
        assert "point the variable at the real directory" in problem
    assert (data / "cache" / "torch_extensions" / "keep").read_text() == "x"


@pytest.fixture(params=["walk", "openat2"])
def resolver(request, monkeypatch):
    """The component walk, and openat2 where this kernel has it: both must give one answer."""
    monkeypatch.setitem(_tree.OPENAT2, "usable", False if request.param == "walk" else None)
    if request.param == "openat2":
        with _tree.opened("/"):
            pass
        if not _tree.OPENAT2["usable"]:
            pytest.skip("this kernel has no openat2: the walk case covers it")
    return request.param


def test_lookup_walks_real_directories_only(tmp_path, resolver):
    (tmp_path / "a/b/c").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    os.symlink(str(tmp_path / "a"), str(tmp_path / "link"))
    real, d = _tree.lookup(str(tmp_path) + "//a/./b/../b/c/")
    with d:
        assert real == str(tmp_path / "a/b/c") and d.path == real
        assert (d.dev, d.ino) == (os.stat(real).st_dev, os.stat(real).st_ino)
    assert _tree.lookup(str(tmp_path / "a/missing/x")) == (str(tmp_path / "a/missing/x"), None)
    for path, component, reason in [
        (tmp_path / "link", tmp_path / "link", "is a symbolic link to %s" % (tmp_path / "a")),
        (tmp_path / "link/b/c", tmp_path / "link", "is reached through the symbolic link %s (to %s)" % (tmp_path / "link", tmp_path / "a")),
        (tmp_path / "link/missing", tmp_path / "link", "is reached through the symbolic link"),
        (tmp_path / "file", tmp_path / "file", "is not a directory"),
        (tmp_path / "file/x", tmp_path / "file", "is reached through %s, which is not a directory" % (tmp_path / "file")),
    ]:
        with pytest.raises(_tree.UnsafePath) as info:
            _tree.lookup(str(path))
        assert info.value.component == str(component)
        assert info.value.reason.startswith(reason)


def test_make_dirs_creates_through_handles_and_refuses_a_link(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(str(outside), str(tmp_path / "link"))
    with pytest.raises(_tree.UnsafePath, match="is reached through the symbolic link"):
        _tree.make_dirs(str(tmp_path / "link/new/cache"))
    assert os.listdir(str(outside)) == []
    nobody = pwd.getpwnam("nobody")
    with _tree.make_dirs(str(tmp_path / "new/cache"), owner=(nobody.pw_uid, nobody.pw_gid)) as d:
        assert d.path == str(tmp_path / "new/cache")
        _tree.write_file(d, "f", b"data")
    if os.geteuid() == 0:
        for p in ("new", "new/cache", "new/cache/f"):
            assert os.stat(str(tmp_path / p)).st_uid == nobody.pw_uid
    assert (tmp_path / "new/cache/f").read_bytes() == b"data"


@pytest.mark.parametrize("kind,tree,why", [
    ("inductor", {"fxgraph/ab/x": b"1", "cu/cu123.py": b"#"}, None),
    ("inductor", {"fxgraph/ab/x": b"1", "photos/a.jpg": b"1"}, "holds 'photos'"),
    ("triton", {"QWERTY123/k.so": b"1", "0/KX3J4ABC/k.cubin": b"1"}, None),
    ("triton", {"QWERTY123/k.so": b"1", "id_rsa": b"k"}, "holds the file 'id_rsa'"),
    ("triton", {"systemd/user.conf": b"1"}, "holds 'systemd'"),
    ("torch_extensions", {"fused_adam/build.ninja": b"r", "py311_cu128/lltm/lock": b""}, None),
    ("torch_extensions", {"git/config": b"[user]"}, "holds 'git', which is not an extension's build folder"),
    ("cuda", {"index": b"\0", "ab/cd/0123": b"\1"}, None),
    ("cuda", {"index": b"\0", "Documents/cv.pdf": b"%PDF"}, "holds 'Documents'"),
    ("cuda", {}, None),  # empty: nothing to lose
    ("flashinfer", flashinfer_tree("0.6.11.post1", "120f"), None),
    ("flashinfer", dict(flashinfer_tree("0.0.0+unknown", "80_89_90a"), **FLASHINFER_CUBINS), None),
    ("flashinfer", {"75_80_89_90/cached_ops/norm/norm.so": b"\x7f", "noarch/generated/x.cu": b"//"}, None),  # before 0.5
    ("flashinfer", {"0.6.11.post1/90a/cached_ops/norm/norm.so": b"1", "projects/notes.md": b"#"}, "holds 'projects'"),
    ("flashinfer", {"flashinfer_jit.log": b"log"}, "holds the file 'flashinfer_jit.log'"),
    ("tvm_ffi", TVM_FFI_TREE, None),
    ("tvm_ffi", dict(TVM_FFI_TREE, **{"photos/a.jpg": b"1"}), "holds 'photos'"),
    ("tvm_ffi", {"build_0123/lock": b""}, "holds 'build_0123'"),  # not 16 hex digits
])
def test_a_root_off_the_layout_must_look_like_its_kind(tmp_path, kind, tree, why):
    root = tmp_path / "somewhere"
    root.mkdir()
    make_tree(str(root), tree)
    _real, problem = check_root(str(root), (), kind=kind)
    if why is None:
        assert problem is None
    else:
        assert problem.startswith("is not a%s %s cache location (" % ("n" if kind == "inductor" else "", kind))
        assert "does not look like one: it " + why in problem


@pytest.mark.parametrize("kind,rel", [("triton", ".triton/cache"), ("torch_extensions", ".cache/torch_extensions"),
                                      ("cuda", ".nv/ComputeCache"), ("inductor", "tmp/torchinductor_trainer"),
                                      ("flashinfer", ".cache/flashinfer"), ("tvm_ffi", ".cache/tvm-ffi")])
def test_the_known_layout_in_a_home_is_a_cache_whatever_it_holds(tmp_path, kind, rel):
    home = tmp_path / "home"
    make_tree(str(home / rel), {"odd-but-ours.txt": b"x"})
    homes = protected_homes([str(home)])
    assert check_root(str(home / rel), homes, kind=kind) == (str(home / rel), None)
    (home / ".ssh").mkdir()
    assert check_root(str(home / ".ssh"), homes, kind=kind)[1] is None  # an empty ~/.ssh holds nothing to lose
    (home / ".ssh/authorized_keys").write_text("ssh-ed25519 AAAA")
    _real, problem = check_root(str(home / ".ssh"), homes, kind=kind)
    assert problem.startswith("is inside the home directory %s and is not a" % home)
