# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_venv: a venv's interpreter and the directories its packages come from, found from files
(nothing of it run), and the Venv every reader shares."""

from __future__ import annotations

import json
import os

import pytest
from distfiles import _dist_info, _make_venv, _write

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _dist, _venv

# ---------------------------------------------------------------------------------- venv layout


def test_venv_python_says_what_is_wrong(tmp_path):
    with pytest.raises(_dist.DistError, match="^venv is empty: give the path of a virtual environment$"):
        _venv.venv_python("")
    with pytest.raises(_dist.DistError, match="^venv %s does not exist$" % (tmp_path / "none")):
        _venv.venv_python(str(tmp_path / "none"))
    _write(str(tmp_path / "file"))
    with pytest.raises(_dist.DistError, match="^venv %s is not a directory$" % (tmp_path / "file")):
        _venv.venv_python(str(tmp_path / "file"))
    env = str(tmp_path / "env")
    _write(os.path.join(env, "bin", "python"), "not executable")
    with pytest.raises(_dist.DistError) as err:
        _venv.venv_python(env)
    assert str(err.value) == ("venv %s has no bin/python: it is not a virtual environment, or it is broken "
                              "(recreate it with 'python3 -m venv %s' or 'uv venv %s')" % (env, env, env))
    _make_venv(env, "python3")
    assert _venv.venv_python(env) == os.path.join(env, "bin", "python3")
    os.chmod(os.path.join(env, "bin", "python"), 0o755)
    assert _venv.venv_python(env) == os.path.join(env, "bin", "python")


def test_pyvenv_cfg_keys_lower_values_stripped(tmp_path):
    _write(str(tmp_path / "pyvenv.cfg"), "Home = /usr/bin \nno equals sign\ninclude-system-site-packages=True\nx = a = b\n")
    assert _venv.read_pyvenv_cfg(str(tmp_path)) == {"home": "/usr/bin", "include-system-site-packages": "True", "x": "a = b"}
    problems = []
    assert _venv.read_pyvenv_cfg(str(tmp_path / "none"), problems) == {} and problems == []
    os.mkfifo(str(tmp_path / "fifo"))
    os.makedirs(str(tmp_path / "f"))
    os.symlink(str(tmp_path / "fifo"), str(tmp_path / "f" / "pyvenv.cfg"))
    assert _venv.read_pyvenv_cfg(str(tmp_path / "f"), problems) == {}
    assert problems == ["pyvenv.cfg is a symbolic link: not followed, not read"]


def test_venv_site_dirs_in_order_once_each(tmp_path):
    env = str(tmp_path / "env")
    for rel in ("lib/python3.12/site-packages", "lib/python3.11/site-packages", "lib/pythonX/other",
                "lib/other/site-packages", "Lib/site-packages"):
        os.makedirs(os.path.join(env, rel))
    os.symlink("lib", os.path.join(env, "lib64"))  # as venv makes it: the same directories again
    assert _venv.venv_site_dirs(env) == [os.path.join(env, "lib/python3.11/site-packages"),
                                         os.path.join(env, "lib/python3.12/site-packages"),
                                         os.path.join(env, "Lib/site-packages")]
    assert _venv.venv_site_dirs(str(tmp_path / "none")) == []
    env2 = str(tmp_path / "env2")
    os.makedirs(os.path.join(env2, "lib64/python3.11/site-packages"))
    assert _venv.venv_site_dirs(env2) == [os.path.join(env2, "lib64/python3.11/site-packages")]


def _run_printing(out, rc=0, err=""):
    calls = []

    def run(argv):
        calls.append(argv)
        return rc, out, err
    return run, calls


def test_an_interpreter_is_asked_its_sys_path_once_without_pythonpath(tmp_path):
    python = _write(str(tmp_path / "python"), "#!/bin/sh\n")
    os.chmod(python, 0o755)
    there = str(tmp_path / "there")
    os.makedirs(there)
    run, calls = _run_printing("warning: noise\n" + json.dumps(["", there, str(tmp_path / "gone"), there]) + "\n")
    assert _venv.interpreter_site_dirs(python, run) == [there, there]
    assert calls == [[python, "-E", "-c", _venv._SYS_PATH_CODE]]


@pytest.mark.parametrize("out, rc, err, message", [
    ("", 1, "Traceback: boom\n", "could not be run (rc=1): Traceback: boom"),
    ("partial\n", 2, "", "could not be run (rc=2): partial"),
    ("", 3, "", "could not be run (rc=3): "),
    ("", -9, "", "could not be run (rc=-9): "),
    ("x" * 500, 1, "", "could not be run (rc=1): " + "x" * 400),
    ("not json\n", 0, "", "printed no sys.path: 'not json\\n'"),
    ("", 0, "", "printed no sys.path: ''"),
    ("y" * 300, 0, "", "printed no sys.path: '%s'" % ("y" * 200)),
])
def test_an_interpreter_that_fails_is_a_clear_error(tmp_path, out, rc, err, message):
    python = _write(str(tmp_path / "python"), "#!/bin/sh\n")
    os.chmod(python, 0o755)
    with pytest.raises(_dist.DistError) as error:
        _venv.interpreter_site_dirs(python, _run_printing(out, rc, err)[0])
    assert str(error.value) == "%s %s" % (python, message)


def test_an_interpreter_that_is_not_there_or_not_executable_is_never_run(tmp_path):
    run, calls = _run_printing("[]")
    _write(str(tmp_path / "plain"))
    for python in (str(tmp_path / "none"), str(tmp_path / "plain"), str(tmp_path)):
        with pytest.raises(_dist.DistError, match="^python %s does not exist or is not executable$" % python):
            _venv.interpreter_site_dirs(python, run)
    assert calls == []


def test_interpreter_dirs_are_its_installation_s_layout(tmp_path):
    prefix = tmp_path / "opt[1]"
    for rel in ("lib/python3.11/site-packages", "lib/python3.11/dist-packages", "lib64/python3.11",
                "local/lib/python3.11/site-packages", "local/lib/python3.11/dist-packages", "lib/other"):
        os.makedirs(str(prefix / rel))
    _write(str(prefix / "lib" / "python3.12"))  # a file, not a directory
    _write(str(prefix / "bin" / "python3.11"), "")
    os.symlink("python3.11", str(prefix / "bin" / "python"))
    p = str(prefix)
    assert _venv.interpreter_dirs(str(prefix / "bin" / "python")) == [
        p + "/lib/python3.11", p + "/lib64/python3.11", p + "/lib/python3.11/site-packages",
        p + "/lib/python3.11/dist-packages", p + "/local/lib/python3.11/site-packages",
        p + "/local/lib/python3.11/dist-packages"]


@pytest.mark.parametrize("cfg, xy", [
    ({"version_info": "3.12.1.final.0", "version": "3.11.2"}, "3.12"),
    ({"version": "3.11.2"}, "3.11"),
    ({"version_info": "x", "version": "3.10"}, "3.10"),
    ({"version": "3"}, None),
    ({"version": " 3.11"}, None),
    ({}, None),
])
def test_python_x_y_from_pyvenv_cfg(cfg, xy):
    assert _venv._python_xy(cfg) == xy


def test_base_site_dirs_in_the_order_the_interpreter_reads_them(tmp_path):
    prefix = str(tmp_path / "usr")
    order = ["local/lib/python3.11/dist-packages", "lib/python3/dist-packages", "lib/python3.11/dist-packages",
             "lib/python3.11/site-packages", "lib64/python3.11/dist-packages", "lib64/python3.11/site-packages",
             "lib/python3.11t/dist-packages", "lib/python3.11t/site-packages", "lib64/python3.11t/dist-packages",
             "lib64/python3.11t/site-packages"]
    for rel in order + ["local/lib/python3.11t/dist-packages", "lib/python3.12/site-packages"]:
        os.makedirs(os.path.join(prefix, rel))
    found, problem = _venv.base_site_dirs({"home": prefix + "/bin/", "version_info": "3.11.2"})
    assert problem is None
    assert found == [os.path.join(prefix, rel) for rel in order]


@pytest.mark.parametrize("cfg, words", [
    ({"version": "3.11.2"}, "gives no absolute home ('')"),
    ({"home": "usr/bin", "version": "3.11.2"}, "gives no absolute home ('usr/bin')"),
    ({"home": "/usr/bin"}, "or no version (None)"),
    ({"home": "/usr/bin", "version": "three"}, "or no version ('three')"),
])
def test_base_site_dirs_without_home_or_version_read_nothing_and_say_so(cfg, words):
    found, problem = _venv.base_site_dirs(cfg)
    assert found == [] and problem.startswith("pyvenv.cfg says include-system-site-packages = true but ")
    assert words in problem and problem.endswith("the base installation's packages are not read")


def test_base_site_dirs_none_there_is_said(tmp_path):
    found, problem = _venv.base_site_dirs({"home": str(tmp_path / "bin"), "version": "3.11.2"})
    assert found == [] and problem == ("pyvenv.cfg's home %s has no site-packages or dist-packages beside it: "
                                       "the base installation's packages are not read" % (tmp_path / "bin"))


def test_pth_dirs_as_site_py_reads_them(tmp_path):
    site = str(tmp_path / "site")
    for d in ("a", "b", "c", "d e", "../outside"):
        os.makedirs(os.path.normpath(os.path.join(site, d)))
    _write(os.path.join(site, "2.pth"), "# a comment\nb\n\nimport os; os.system('x')\nimport\tsys\nmissing\n  \n")
    _write(os.path.join(site, "1.pth"), "a\r\nd e  \n../outside\n%s\n" % os.path.join(site, "c"))
    _write(os.path.join(site, "3.pth.txt"), "c\n")
    assert _venv.pth_dirs(site) == [os.path.join(site, "a"), os.path.join(site, "d e"), str(tmp_path / "outside"),
                                    os.path.join(site, "c"), os.path.join(site, "b")]
    assert _venv.pth_dirs(str(tmp_path / "none")) == []
    problems = []
    os.symlink(os.path.join(site, "1.pth"), os.path.join(site, "0.pth"))
    assert _venv.pth_dirs(site, problems)[0] == os.path.join(site, "a")
    assert problems == ["0.pth is a symbolic link: not followed, not read"]


def test_environment_site_dirs_own_then_pth_then_the_base(tmp_path):
    env = str(tmp_path / "env")
    site = _make_venv(env)
    extra = str(tmp_path / "extra")
    base = str(tmp_path / "usr")
    os.makedirs(extra)
    os.makedirs(os.path.join(base, "lib/python3.11/site-packages"))
    os.makedirs(os.path.join(base, "lib/python3/dist-packages"))
    _write(os.path.join(site, "x.pth"), "%s\n%s\n%s\n" % (extra, extra, site))
    _write(os.path.join(env, "pyvenv.cfg"), "home = %s/bin\nversion = 3.11.2\ninclude-system-site-packages = TRUE\n" % base)
    os.symlink(os.path.join(base, "lib/python3.11/site-packages"), os.path.join(extra, "base-link"))
    _write(os.path.join(site, "y.pth"), os.path.join(extra, "base-link") + "\n")
    problems = []
    assert _venv.environment_site_dirs(env, problems=problems) == [
        site, extra, os.path.join(extra, "base-link"), os.path.join(base, "lib/python3/dist-packages")]
    assert problems == []
    for value in ("false", "yes", "1", "truer", "z"):  # as venv's site.py: "true" in any case, nothing else
        _write(os.path.join(env, "pyvenv.cfg"), "home = %s/bin\nversion = 3.11.2\ninclude-system-site-packages = %s\n" % (base, value))
        assert _venv.environment_site_dirs(env, [site]) == [site, extra, os.path.join(extra, "base-link")], value
    _write(os.path.join(env, "pyvenv.cfg"), "version = 3.11.2\ninclude-system-site-packages = true\n")
    assert _venv.environment_site_dirs(env, [site], problems) == [site, extra, os.path.join(extra, "base-link")]
    assert len(problems) == 1 and "gives no absolute home" in problems[0]


def test_environment_site_dirs_of_no_venv_is_a_clear_error(tmp_path):
    with pytest.raises(_dist.DistError, match="^venv %s has no lib/python\\*/site-packages: it is not a virtual environment$" % tmp_path):
        _venv.environment_site_dirs(str(tmp_path))


def test_a_venv_resolved_once_and_its_error_told_to_every_reader(tmp_path):
    env = str(tmp_path / "env")
    site = _make_venv(env)
    _dist_info(site, "a", "1")
    extra = str(tmp_path / "extra")
    os.makedirs(extra)
    _write(os.path.join(site, "extra.pth"), extra + "\n")
    venv = _venv.Venv(env, None)
    assert _venv.Venv.of(venv, None) is venv and _venv.Venv.of(env, None).path == env
    assert venv.python == os.path.join(env, "bin", "python")
    assert venv.own_site_dirs == [site] and venv.site_dirs == [site, extra]
    assert [d.name for d in venv.distributions] == ["a"] and venv.shadowed == []
    _dist_info(site, "b", "1")
    assert [d.name for d in venv.distributions] == ["a"]  # kept
    assert [d.name for d in venv.rescan()] == ["a", "b"]
    broken = _venv.Venv(str(tmp_path / "none"), None)
    for reader in ("python", "own_site_dirs", "site_dirs", "distributions"):
        with pytest.raises(_dist.DistError, match="does not exist"):
            getattr(broken, reader)
    assert isinstance(broken._resolved, _dist.DistError)
