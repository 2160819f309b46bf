# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_pkgtool, the installers' command lines and who may run them, on files laid out in a
temporary directory (no uv and no pip ever runs; the fake uv is a file that is never executed):

- Installer: the exact uninstall and reinstall argv of uv and of pip (no cache, no dependencies,
  find_links, no_index), the tool refused when unknown, and choose(): uv when found, pip when
  only pip is there, the failures when what is asked for is missing;
- untrusted(): a path and the directories above it owned by root and writable by nobody else
  (a sticky directory excepted; a link judged as a link);
- find_uv(): a uv on PATH only when root alone controls its real file, else the venv's own;
  never the current directory;
- run_as(): None when root alone controls the venv, its interpreter, its site directories, their
  .pth files and the program, else the owner who must run it; a root-owned part others may
  write refused (files given to other uids: runs as root);
- privileged_run(): as is, or a real child dropped to the uid and gid with that user's HOME and
  no VIRTUAL_ENV (a /bin/sh, run as root);
- has_pip() and shell_join()."""

from __future__ import annotations

import os
import pwd
import re
import stat

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _pkgtool

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to other uids or drops to one: runs as root")

USER, GROUP = 4242, 4343  # an owner other than root; need not exist
OTHER = 4545
UV_BYTES = b"#!/bin/sh\nexit 99\n"  # never run


def _root_only_chain(path):
    """Whether ``path`` and every directory above it is root's and not writable by others
    (checked here without _pkgtool, so that a broken untrusted() fails tests instead of skipping them)."""
    path = os.path.abspath(path)
    while True:
        st = os.lstat(path)
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_uid != 0 or (not sticky_dir and st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
            return False
        if os.path.dirname(path) == path:
            return True
        path = os.path.dirname(path)


@pytest.fixture
def base(tmp_path):
    """A directory of root's (0755) under a chain root alone controls."""
    path = os.path.join(os.path.realpath(str(tmp_path)), "base")
    os.mkdir(path)
    os.chmod(path, 0o755)
    if not _root_only_chain(path):
        pytest.skip("the temporary directory is not under a chain that root alone controls")
    return path


def mkdir(path, mode=0o755, uid=0, gid=0):
    os.mkdir(path)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return path


def mkfile(path, mode=0o755, uid=0, gid=0, data=UV_BYTES):
    with open(path, "wb") as f:
        f.write(data)
    os.chown(path, uid, gid)
    os.chmod(path, mode)
    return path


class Venv(object):
    """base/venv with bin/python a link to base/cpython/bin/python3.12 (the real interpreter) and
    lib/python3.12/site-packages; everything root's, 0755."""

    def __init__(self, base):
        self.base = base
        self.venv = mkdir(os.path.join(base, "venv"))
        self.bin = mkdir(os.path.join(self.venv, "bin"))
        mkdir(os.path.join(base, "cpython"))
        mkdir(os.path.join(base, "cpython", "bin"))
        self.real = mkfile(os.path.join(base, "cpython", "bin", "python3.12"))
        self.python = os.path.join(self.bin, "python")
        os.symlink(self.real, self.python)
        self.lib = mkdir(os.path.join(self.venv, "lib"))
        mkdir(os.path.join(self.lib, "python3.12"))
        self.site = mkdir(os.path.join(self.lib, "python3.12", "site-packages"))

    def run_as(self, program=None, site_dirs=None):
        return _pkgtool.run_as(self.venv, self.python, [self.site] if site_dirs is None else site_dirs, program)


def owned(where, uid=USER, gid=GROUP):
    return uid, gid, "%s is owned by uid %d" % (where, uid)


# ----------------------------------------------------------------------------- Installer argv


def test_uv_uninstall_argv():
    inst = _pkgtool.Installer("uv", "/srv/venv/bin/python", uv="/usr/local/bin/uv")
    assert inst.uninstall(["droppkg", "Other_Pkg"]) == [
        "/usr/local/bin/uv", "pip", "uninstall", "--no-cache", "--python", "/srv/venv/bin/python", "droppkg", "Other_Pkg"]


def test_pip_uninstall_argv():
    inst = _pkgtool.Installer("pip", "/srv/venv/bin/python")
    assert inst.uninstall(("droppkg",)) == [
        "/srv/venv/bin/python", "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", "--no-input", "droppkg"]


def test_uv_reinstall_argv_pins_exact_versions_without_dependencies_or_cache():
    inst = _pkgtool.Installer("uv", "/srv/venv/bin/python", uv="/srv/venv/bin/uv")
    assert inst.reinstall([("keeppkg", "1.0"), ("torch", "2.9.1+cu128")]) == [
        "/srv/venv/bin/uv", "pip", "install", "--no-cache", "--python", "/srv/venv/bin/python", "--reinstall", "--no-deps",
        "keeppkg==1.0", "torch==2.9.1+cu128"]


def test_pip_reinstall_argv_pins_exact_versions_without_dependencies_or_cache():
    inst = _pkgtool.Installer("pip", "/srv/venv/bin/python")
    assert inst.reinstall([("keeppkg", "1.0")]) == [
        "/srv/venv/bin/python", "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir",
        "--disable-pip-version-check", "--no-input", "keeppkg==1.0"]


@pytest.mark.parametrize("tool, head", [
    ("uv", ["/bin/uv", "pip", "install", "--no-cache", "--python", "/v/bin/python", "--reinstall", "--no-deps"]),
    ("pip", ["/v/bin/python", "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir",
             "--disable-pip-version-check", "--no-input"]),
])
def test_reinstall_from_find_links_and_no_index_go_before_the_pins(tool, head):
    inst = _pkgtool.Installer(tool, "/v/bin/python", uv="/bin/uv")
    pins = [("a", "1"), ("b", "2")]
    assert inst.reinstall(pins, find_links="/srv/wheels", no_index=True) == head + [
        "--find-links", "/srv/wheels", "--no-index", "a==1", "b==2"]
    assert inst.reinstall(pins, find_links="/srv/wheels") == head + ["--find-links", "/srv/wheels", "a==1", "b==2"]
    assert inst.reinstall(pins, no_index=True) == head + ["--no-index", "a==1", "b==2"]
    assert inst.reinstall(pins, find_links="", no_index=False) == head + ["a==1", "b==2"]
    assert inst.reinstall([]) == head


def test_each_call_builds_a_new_list():
    inst = _pkgtool.Installer("pip", "/v/bin/python")
    first = inst.uninstall(["x"])
    first.append("--oops")
    assert inst.uninstall(["x"])[-1] == "x"


@pytest.mark.parametrize("tool", ["conda", "UV", "Pip", "", None])
def test_an_unknown_installer_is_refused(tool):
    with pytest.raises(GpufleetError) as exc:
        _pkgtool.Installer(tool, "/v/bin/python")
    assert exc.value.msg == "unknown installer %r" % (tool,)


def test_an_installer_keeps_its_tool_python_and_uv():
    inst = _pkgtool.Installer("uv", "/v/bin/python", uv="/bin/uv")
    assert (inst.tool, inst.python, inst.uv) == ("uv", "/v/bin/python", "/bin/uv")
    assert _pkgtool.Installer("pip", "/v/bin/python").uv is None


# ----------------------------------------------------------------------------- Installer.choose


@pytest.fixture
def layout(tmp_path):
    """A venv's bin and site directory (any owner: choose() looks at the venv's own uv only)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    site = venv / "lib" / "site-packages"
    site.mkdir(parents=True)
    return str(venv), str(venv / "bin" / "python"), str(site)


def _own_uv(venv):
    return mkfile(os.path.join(venv, "bin", "uv"), uid=os.geteuid(), gid=os.getegid())


def _pip(site):
    os.mkdir(os.path.join(site, "pip"))


@pytest.mark.parametrize("preference", ["auto", "uv"])
def test_choose_takes_uv_when_found(layout, preference):
    venv, python, site = layout
    uv = _own_uv(venv)
    _pip(site)
    inst = _pkgtool.Installer.choose(preference, venv, python, [site], path_env="")
    assert (inst.tool, inst.python, inst.uv) == ("uv", python, uv)


def test_choose_takes_pip_when_asked_even_with_uv_there(layout):
    venv, python, site = layout
    _own_uv(venv)
    _pip(site)
    inst = _pkgtool.Installer.choose("pip", venv, python, [site], path_env="")
    assert (inst.tool, inst.python, inst.uv) == ("pip", python, None)


def test_auto_without_uv_takes_pip(layout):
    venv, python, site = layout
    _pip(site)
    inst = _pkgtool.Installer.choose("auto", venv, python, ["/nonexistent/site", site], path_env="")
    assert (inst.tool, inst.uv) == ("pip", None)


def test_uv_asked_for_and_not_found_is_refused(layout):
    venv, python, site = layout
    _pip(site)
    with pytest.raises(GpufleetError) as exc:
        _pkgtool.Installer.choose("uv", venv, python, [site], path_env="")
    assert exc.value.msg == "installer=uv but no uv was found in %s/bin or on PATH" % venv


@pytest.mark.parametrize("preference", ["auto", "pip"])
def test_neither_uv_nor_pip_is_refused_with_how_to_get_one(layout, preference):
    venv, python, site = layout
    with pytest.raises(GpufleetError) as exc:
        _pkgtool.Installer.choose(preference, venv, python, [site], path_env="")
    assert exc.value.msg == ("neither uv nor pip is available for %s: install uv on the target, or pip into the venv "
                             "('%s -m ensurepip')" % (venv, python))


# ----------------------------------------------------------------------------- has_pip, shell_join


def test_has_pip_is_a_pip_package_directory_in_a_site_directory(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert _pkgtool.has_pip([]) is False
    assert _pkgtool.has_pip([str(a), str(b), str(tmp_path / "missing")]) is False
    (a / "pip").write_text("a file, not the package\n")
    (b / "pip-24.0.dist-info").mkdir()
    assert _pkgtool.has_pip([str(a), str(b)]) is False
    (b / "pip").mkdir()
    assert _pkgtool.has_pip([str(a), str(b)]) is True


@pytest.mark.parametrize("argv, want", [
    (["/v/bin/python", "-m", "pip", "install", "a==1"], "/v/bin/python -m pip install a==1"),
    (["/my venv/bin/uv", "pip", "install", "x>=1"], "'/my venv/bin/uv' pip install 'x>=1'"),
    (["echo", "it's", ""], "echo 'it'\"'\"'s' ''"),
    (["a;b", "$HOME", "`id`"], "'a;b' '$HOME' '`id`'"),
    ([], ""),
])
def test_shell_join_quotes_for_a_posix_shell(argv, want):
    assert _pkgtool.shell_join(argv) == want


# ----------------------------------------------------------------------------- untrusted


@root_only
def test_a_root_owned_path_only_root_may_write_is_trusted(base):
    path = mkfile(os.path.join(base, "uv"))
    assert _pkgtool.untrusted(path) is None
    assert _pkgtool.untrusted(base) is None


@root_only
def test_a_file_of_another_owner_is_untrusted(base):
    path = mkfile(os.path.join(base, "uv"), uid=USER, gid=GROUP)
    assert _pkgtool.untrusted(path) == "%s is owned by uid %d" % (path, USER)


@root_only
def test_a_directory_above_of_another_owner_makes_it_untrusted(base):
    d = mkdir(os.path.join(base, "home"), uid=USER, gid=GROUP)
    sub = mkdir(os.path.join(d, "bin"))
    path = mkfile(os.path.join(sub, "uv"))
    assert _pkgtool.untrusted(path) == "%s is owned by uid %d" % (d, USER)


@root_only
@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o765, 0o2775])
def test_a_file_its_group_or_others_may_write_is_untrusted(base, mode):
    path = mkfile(os.path.join(base, "uv"), mode=mode)
    assert _pkgtool.untrusted(path) == "%s is writable by its group or by others" % path


@root_only
def test_a_directory_above_its_group_or_others_may_write_makes_it_untrusted(base):
    d = mkdir(os.path.join(base, "shared"), mode=0o777)
    path = mkfile(os.path.join(d, "uv"))
    assert _pkgtool.untrusted(path) == "%s is writable by its group or by others" % d


@root_only
def test_a_sticky_directory_others_may_write_is_trusted_as_tmp_is(base):
    d = mkdir(os.path.join(base, "tmp"), mode=0o1777)
    path = mkfile(os.path.join(d, "uv"))
    assert _pkgtool.untrusted(path) is None
    # sticky on a file means nothing: it is still writable by others
    loose = mkfile(os.path.join(base, "loose"), mode=0o1777)
    assert _pkgtool.untrusted(loose) == "%s is writable by its group or by others" % loose


@root_only
def test_the_owner_is_named_before_the_mode(base):
    path = mkfile(os.path.join(base, "uv"), mode=0o777, uid=USER, gid=GROUP)
    assert _pkgtool.untrusted(path) == "%s is owned by uid %d" % (path, USER)


@root_only
def test_a_link_is_judged_as_a_link_not_as_what_it_points_to(base):
    theirs = mkdir(os.path.join(base, "theirs"), uid=USER, gid=GROUP)
    target = mkfile(os.path.join(theirs, "uv"), uid=USER, gid=GROUP, mode=0o777)
    link = os.path.join(base, "uv")
    os.symlink(target, link)  # root's link (mode 0777, as every link is)
    assert _pkgtool.untrusted(link) is None
    assert _pkgtool.untrusted(os.path.realpath(link)) == "%s is owned by uid %d" % (target, USER)
    # a link of another owner is theirs
    os.lchown(link, USER, GROUP)
    assert _pkgtool.untrusted(link) == "%s is owned by uid %d" % (link, USER)


@root_only
def test_a_missing_path_is_judged_by_the_directories_above_it(base):
    assert _pkgtool.untrusted(os.path.join(base, "no", "such", "uv")) is None
    theirs = mkdir(os.path.join(base, "theirs"), uid=USER, gid=GROUP)
    assert _pkgtool.untrusted(os.path.join(theirs, "no", "uv")) == "%s is owned by uid %d" % (theirs, USER)


@root_only
def test_a_relative_path_is_judged_from_the_current_directory(base, monkeypatch):
    theirs = mkdir(os.path.join(base, "theirs"), uid=USER, gid=GROUP)
    mkfile(os.path.join(theirs, "uv"))
    monkeypatch.chdir(theirs)
    assert _pkgtool.untrusted("uv") == "%s is owned by uid %d" % (theirs, USER)


# ----------------------------------------------------------------------------- find_uv


@root_only
def test_a_uv_on_path_that_root_alone_controls_is_found(base):
    v = Venv(base)
    b = mkdir(os.path.join(base, "bin"))
    uv = mkfile(os.path.join(b, "uv"))
    assert _pkgtool.find_uv(v.venv, path_env=os.pathsep.join(["/nonexistent", b])) == uv


@root_only
def test_the_first_trusted_uv_on_path_wins(base):
    v = Venv(base)
    one, two = mkdir(os.path.join(base, "one")), mkdir(os.path.join(base, "two"))
    mkfile(os.path.join(one, "uv"))
    mkfile(os.path.join(two, "uv"))
    assert _pkgtool.find_uv(v.venv, path_env=two + os.pathsep + one) == os.path.join(two, "uv")


@root_only
def test_path_defaults_to_the_environment(base, monkeypatch):
    v = Venv(base)
    b = mkdir(os.path.join(base, "bin"))
    uv = mkfile(os.path.join(b, "uv"))
    monkeypatch.setenv("PATH", b)
    assert _pkgtool.find_uv(v.venv) == uv
    monkeypatch.setenv("PATH", "")
    assert _pkgtool.find_uv(v.venv) is None


@root_only
@pytest.mark.parametrize("case", ["owner", "parent owner", "writable", "writable parent", "not executable", "directory",
                                  "link to theirs"])
def test_a_uv_on_path_not_root_s_alone_is_passed_over_for_the_venv_s_own(base, case):
    v = Venv(base)
    b = mkdir(os.path.join(base, "bin"), uid=USER if case == "parent owner" else 0,
              mode=0o777 if case == "writable parent" else 0o755)
    cand = os.path.join(b, "uv")
    if case == "directory":
        mkdir(cand)
    elif case == "link to theirs":
        theirs = mkdir(os.path.join(base, "theirs"), uid=USER, gid=GROUP)
        os.symlink(mkfile(os.path.join(theirs, "uv"), uid=USER, gid=GROUP), cand)
    else:
        mkfile(cand, uid=USER if case == "owner" else 0, mode={"writable": 0o775, "not executable": 0o644}.get(case, 0o755))
    assert _pkgtool.find_uv(v.venv, path_env=b) is None
    own = mkfile(os.path.join(v.bin, "uv"), uid=USER, gid=GROUP)  # the venv's own: its owner's, run as them
    assert _pkgtool.find_uv(v.venv, path_env=b) == own


@root_only
def test_a_link_on_path_to_a_uv_root_alone_controls_is_found_as_the_link(base):
    v = Venv(base)
    real_dir = mkdir(os.path.join(base, "opt"))
    real = mkfile(os.path.join(real_dir, "uv-0.9"))
    b = mkdir(os.path.join(base, "bin"))
    link = os.path.join(b, "uv")
    os.symlink(real, link)
    assert _pkgtool.find_uv(v.venv, path_env=b) == link


@root_only
def test_an_empty_path_entry_is_not_the_current_directory(base, monkeypatch):
    v = Venv(base)
    here = mkdir(os.path.join(base, "here"))
    mkfile(os.path.join(here, "uv"))
    monkeypatch.chdir(here)
    for path_env in ("", os.pathsep, os.pathsep + "/nonexistent" + os.pathsep):
        assert _pkgtool.find_uv(v.venv, path_env=path_env) is None


def test_the_venv_s_own_uv_must_be_an_executable_file(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    own = venv / "bin" / "uv"
    assert _pkgtool.find_uv(str(venv), path_env="") is None
    own.write_bytes(UV_BYTES)
    os.chmod(str(own), 0o644)
    assert not os.access(str(own), os.X_OK)  # not even for root: no x bit at all
    assert _pkgtool.find_uv(str(venv), path_env="") is None
    os.chmod(str(own), 0o755)
    assert _pkgtool.find_uv(str(venv), path_env="") == str(own)


# ----------------------------------------------------------------------------- run_as


def test_not_root_runs_as_itself_whoever_owns_the_venv(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    venv.mkdir()
    if os.geteuid() == 0:
        os.chown(str(venv), USER, GROUP)  # not root's (as root would be told: run as uid 4242)
    os.chmod(str(venv), 0o777)  # nor root's alone (as root would be refused)
    monkeypatch.setattr(_pkgtool.os, "geteuid", lambda: 1000)
    assert _pkgtool.run_as(str(venv), str(venv / "bin" / "python"), [str(venv)], program="/bin/sh") is None


@root_only
def test_a_venv_root_alone_controls_runs_as_root(base):
    v = Venv(base)
    mkfile(os.path.join(v.site, "distutils-precedence.pth"), mode=0o644, data=b"import os\n")
    program = mkfile(os.path.join(base, "uv"))
    assert v.run_as() is None
    assert v.run_as(program=program) is None


@root_only
@pytest.mark.parametrize("part", ["venv", "bin", "lib", "site"])
def test_a_venv_directory_of_another_owner_runs_as_that_owner(base, part):
    v = Venv(base)
    where = getattr(v, part)
    os.chown(where, USER, GROUP)
    assert v.run_as() == owned(where)


@root_only
def test_the_venv_itself_is_named_before_its_parts(base):
    v = Venv(base)
    os.chown(v.site, OTHER, OTHER)
    os.chown(v.venv, USER, GROUP)
    assert v.run_as() == owned(v.venv)


@root_only
def test_the_interpreter_link_and_its_real_file_are_both_judged(base):
    v = Venv(base)
    os.chown(v.real, USER, GROUP)  # root's link in root's bin, to their interpreter
    assert v.run_as() == owned(v.real)
    os.chown(v.real, 0, 0)
    os.chown(os.path.dirname(v.real), USER, GROUP)
    assert v.run_as() == owned(os.path.dirname(v.real))
    os.chown(os.path.dirname(v.real), 0, 0)
    os.lchown(v.python, OTHER, OTHER)
    assert v.run_as() == owned(v.python, OTHER, OTHER)


@root_only
def test_a_pth_file_of_another_owner_runs_as_that_owner(base):
    v = Venv(base)
    mkfile(os.path.join(v.site, "zz.pth"), mode=0o644, uid=OTHER, gid=OTHER, data=b"import os\n")
    pth = mkfile(os.path.join(v.site, "aa.pth"), mode=0o644, uid=USER, gid=GROUP, data=b"/srv/extra\n")
    assert v.run_as() == owned(pth)  # the first by name


@root_only
def test_only_pth_files_of_a_site_directory_are_judged_by_owner(base):
    v = Venv(base)
    mkfile(os.path.join(v.site, "notes.txt"), mode=0o644, uid=USER, gid=GROUP)
    mkfile(os.path.join(v.site, "x.pth.bak"), mode=0o644, uid=USER, gid=GROUP)
    assert v.run_as() is None


@root_only
def test_every_site_directory_is_judged(base):
    v = Venv(base)
    extra = mkdir(os.path.join(base, "extra-site"))
    pth = mkfile(os.path.join(extra, "x.pth"), mode=0o644, uid=USER, gid=GROUP)
    assert v.run_as(site_dirs=[v.site, extra]) == owned(pth)
    assert v.run_as(site_dirs=[v.site]) is None
    assert v.run_as(site_dirs=[]) is None
    gone = os.path.join(v.lib, "python3.13", "site-packages")  # missing: its existing parents are judged
    assert v.run_as(site_dirs=[gone]) is None


@root_only
def test_the_program_and_its_real_file_are_judged(base):
    v = Venv(base)
    theirs = mkfile(os.path.join(base, "uv-theirs"), uid=USER, gid=GROUP)
    assert v.run_as(program=theirs) == owned(theirs)
    link = os.path.join(base, "uv")
    os.symlink(theirs, link)
    assert v.run_as(program=link) == owned(theirs)
    assert v.run_as() is None  # no program: nothing of theirs is run


@root_only
@pytest.mark.parametrize("part, mode", [("venv", 0o775), ("bin", 0o777), ("site", 0o757), ("lib", 0o2775)])
def test_a_root_owned_part_others_may_write_is_refused(base, part, mode):
    v = Venv(base)
    where = getattr(v, part)
    os.chmod(where, mode)
    with pytest.raises(GpufleetError) as exc:
        v.run_as()
    assert exc.value.msg == (
        "%s is writable by its group or by others: a program would run what they can change there as root; make it "
        "writable by its owner only (chmod go-w), or give the venv to its user (chown -R)" % where)


@root_only
def test_a_root_owned_interpreter_or_program_others_may_write_is_refused(base):
    v = Venv(base)
    os.chmod(v.real, 0o775)
    with pytest.raises(GpufleetError, match="^%s is writable by its group or by others" % re.escape(v.real)):
        v.run_as()
    os.chmod(v.real, 0o755)
    program = mkfile(os.path.join(base, "uv"), mode=0o757)
    with pytest.raises(GpufleetError, match="^%s is writable by its group or by others" % re.escape(program)):
        v.run_as(program=program)


@root_only
def test_a_sticky_directory_others_may_write_is_no_refusal(base):
    v = Venv(base)
    os.chmod(v.site, 0o1777)
    assert v.run_as() is None


@root_only
def test_an_owner_other_than_root_anywhere_comes_before_any_refusal(base):
    v = Venv(base)
    os.chmod(v.venv, 0o777)  # would be refused alone
    os.chown(v.site, USER, GROUP)
    assert v.run_as() == owned(v.site)


@root_only
def test_a_root_owned_pth_file_others_may_write_is_refused(base):
    """site.py runs a .pth file's import lines at every start: one that anyone may write would run their
    code as root (it was judged by its owner only)."""
    v = Venv(base)
    mkfile(os.path.join(v.site, "evil.pth"), mode=0o666, data=b"import os\n")
    with pytest.raises(GpufleetError, match="evil.pth is writable by its group or by others"):
        v.run_as()


@root_only
def test_a_pth_link_is_judged_by_the_file_it_points_to(base):
    """A root-owned link named *.pth pointing to a user's file: site.py reads the user's file, so the
    installer runs as that user (the link's own owner was all that was looked at)."""
    v = Venv(base)
    target = os.path.join(base, "user-owned.pth-target")
    mkfile(target, mode=0o644, data=b"import os\n")
    os.chown(target, USER, GROUP)
    os.symlink(target, os.path.join(v.site, "linked.pth"))
    assert v.run_as() == owned(target)


# ----------------------------------------------------------------------------- privileged_run


def test_no_identity_is_the_run_itself():
    def run(argv):
        return 0, "", ""

    assert _pkgtool.privileged_run(None, run) is run


SHOW = ["/bin/sh", "-c", 'echo "$(id -u) $(id -g) $(id -G)"; echo "$HOME"; pwd; echo "${VIRTUAL_ENV-unset}"']


def _nobody():
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no nobody account here")


@root_only
def test_an_identity_runs_argv_as_that_uid_and_gid_without_groups_in_its_home(monkeypatch):
    nobody = _nobody()
    monkeypatch.setenv("VIRTUAL_ENV", "/srv/root-venv")
    monkeypatch.setenv("HOME", "/root")
    run = _pkgtool.privileged_run((nobody.pw_uid, nobody.pw_gid, "why"), None)
    groups = os.getgroups()
    os.setgroups(groups + [OTHER])  # a supplementary group of root's, which the child must not keep
    try:
        got = run(SHOW)
    finally:
        os.setgroups(groups)
    assert got == (0, "%d %d %d\n%s\n/\nunset\n" % (nobody.pw_uid, nobody.pw_gid, nobody.pw_gid, nobody.pw_dir), "")
    assert os.environ["VIRTUAL_ENV"] == "/srv/root-venv" and os.environ["HOME"] == "/root"  # this process's unchanged


@root_only
def test_an_identity_with_no_account_runs_with_home_slash():
    uid = 4242420
    try:
        pwd.getpwuid(uid)
    except KeyError:
        pass
    else:
        pytest.skip("uid %d has an account here" % uid)
    run = _pkgtool.privileged_run((uid, uid + 1, "why"), None)
    assert run(SHOW) == (0, "%d %d %d\n/\n/\nunset\n" % (uid, uid + 1, uid + 1), "")


@root_only
def test_the_status_and_both_streams_come_back_decoded():
    nobody = _nobody()
    run = _pkgtool.privileged_run((nobody.pw_uid, nobody.pw_gid, "why"), None)
    assert run(["/bin/sh", "-c", "echo out; echo err >&2; printf '\\377' >&2; exit 3"]) == (3, "out\n", "err\n\ufffd")


@root_only
def test_a_program_that_cannot_be_run_is_127_and_said(base):
    nobody = _nobody()
    run = _pkgtool.privileged_run((nobody.pw_uid, nobody.pw_gid, "why"), None)
    assert run(["/nonexistent/uv", "pip"]) == (
        127, "", "/nonexistent/uv could not be run as uid %d: No such file or directory" % nobody.pw_uid)
    # root's alone (0700): root could run it, the dropped identity may not
    private = mkfile(os.path.join(base, "uv"), mode=0o700)
    assert run([private, "pip"]) == (127, "", "%s could not be run as uid %d: Permission denied" % (private, nobody.pw_uid))
