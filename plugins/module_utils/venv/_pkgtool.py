# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Command lines for the package installers (uv, pip), built as argv lists.

One place builds every argv so it can be unit-tested without running anything.
Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import shlex
import stat

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import getpwuid


def _chain(path):
    """``(path, lstat)`` of ``path`` and of every directory above it, up to /."""
    path = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None:
            yield path, st
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _pth_files(site_dirs):
    """``(path, lstat)`` of every ``*.pth`` file in ``site_dirs``: site.py runs their lines."""
    for site in site_dirs:
        try:
            names = sorted(n for n in os.listdir(site) if n.endswith(".pth"))
        except OSError:
            continue
        for name in names:
            try:
                yield os.path.join(site, name), os.lstat(os.path.join(site, name))
            except OSError:
                continue


def _others_write(st):
    if stat.S_ISLNK(st.st_mode) or (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return False
    return bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def untrusted(path):
    """Why ``path`` and the directories above it could be changed by someone other than root
    (an owner other than root, or group/other write without the sticky bit), or None."""
    for where, st in _chain(path):
        if st.st_uid != 0:
            return "%s is owned by uid %d" % (where, st.st_uid)
        if _others_write(st):
            return "%s is writable by its group or by others" % where
    return None


def find_uv(venv, path_env=None):
    """A uv that only root can have put there (untrusted() of its real path is None), found on
    PATH; else uv beside the venv's python, which runs as the venv's owner (run_as()); None
    when neither."""
    for entry in (path_env if path_env is not None else os.environ.get("PATH", "")).split(os.pathsep):
        cand = os.path.join(entry, "uv") if entry else None
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK) and untrusted(os.path.realpath(cand)) is None:
            return cand
    own = os.path.join(venv, "bin", "uv")
    if os.path.isfile(own) and os.access(own, os.X_OK):
        return own
    return None


def run_as(venv, python, site_dirs, program=None):
    """Who runs an installer on ``venv``: None (root, as now) when root alone controls the
    venv, its interpreter (the real file and its directories), its own site-packages (their
    ``.pth`` lines run at every start, and those .pth files) and ``program``; else ``(uid, gid, why)`` of their
    owner, so that nothing a user controls runs as root. A root-owned part that others may
    write raises: no identity can run it safely."""
    if os.geteuid() != 0:
        return None
    parts = [venv, os.path.join(venv, "bin"), python, os.path.realpath(python)] + list(site_dirs)
    if program:
        parts += [program, os.path.realpath(program)]
    chains = [list(_chain(part)) for part in parts]
    # Each .pth file, and where a link among them points (site.py opens it through the link): the file
    # that is read and every directory above it.
    pths = []
    for where, st in _pth_files(site_dirs):
        pths.append([(where, st)] + (list(_chain(os.path.realpath(where))) if stat.S_ISLNK(st.st_mode) else []))
    for chain in chains + pths:
        for where, st in chain:
            if st.st_uid != 0:
                return st.st_uid, st.st_gid, "%s is owned by uid %d" % (where, st.st_uid)
    for chain in chains + pths:
        for where, st in chain:
            if _others_write(st):
                raise GpufleetError(
                    "%s is writable by its group or by others: a program would run what they can change there as "
                    "root; make it writable by its owner only (chmod go-w), or give the venv to its user (chown -R)"
                    % where)
    return None


def privileged_run(identity, run):
    """``run`` as is (identity None), or a run(argv) that drops to ``identity``'s uid and gid
    (no supplementary groups) before executing argv, with that user's HOME."""
    if identity is None:
        return run
    import subprocess

    uid, gid, _why = identity
    try:
        home = getpwuid(uid).pw_dir
    except KeyError:
        home = "/"

    def drop():
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    def run_dropped(argv):
        env = dict(os.environ, HOME=home)
        env.pop("VIRTUAL_ENV", None)
        try:
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=drop,
                                  env=env, cwd="/", check=False)
        except OSError as exc:
            return 127, "", "%s could not be run as uid %d: %s" % (argv[0], uid, exc.strerror or exc)
        return (proc.returncode, proc.stdout.decode("utf-8", "replace"), proc.stderr.decode("utf-8", "replace"))

    return run_dropped


def has_pip(site_dirs):
    return any(os.path.isdir(os.path.join(site, "pip")) for site in site_dirs)


class Installer(object):
    """Which tool acts on the venv, and the argv it takes."""

    def __init__(self, tool, python, uv=None):
        if tool not in ("uv", "pip"):
            raise GpufleetError("unknown installer %r" % tool)
        self.tool = tool
        self.python = python
        self.uv = uv

    @classmethod
    def choose(cls, preference, venv, python, site_dirs, path_env=None):
        uv = find_uv(venv, path_env)
        pip = has_pip(site_dirs)
        if preference == "uv" or (preference == "auto" and uv):
            if not uv:
                raise GpufleetError("installer=uv but no uv was found in %s/bin or on PATH" % venv)
            return cls("uv", python, uv)
        if not pip:
            raise GpufleetError(
                "neither uv nor pip is available for %s: install uv on the target, or pip into "
                "the venv ('%s -m ensurepip')" % (venv, python))
        return cls("pip", python)

    # No cache: a run must not leave uv's or pip's cache (copies of every wheel it read) in
    # the home directory of whoever it runs as; only the venv is what it was asked to change.
    def uninstall(self, names):
        if self.tool == "uv":
            return [self.uv, "pip", "uninstall", "--no-cache", "--python", self.python] + list(names)
        return [self.python, "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check",
                "--no-input"] + list(names)

    def reinstall(self, pins, find_links=None, no_index=False):
        """Reinstall exact versions, without touching their dependencies."""
        if self.tool == "uv":
            argv = [self.uv, "pip", "install", "--no-cache", "--python", self.python, "--reinstall", "--no-deps"]
        else:
            argv = [self.python, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir",
                    "--disable-pip-version-check", "--no-input"]
        if find_links:
            argv += ["--find-links", find_links]
        if no_index:
            argv.append("--no-index")
        return argv + ["%s==%s" % (name, version) for name, version in pins]


def shell_join(argv):
    return " ".join(shlex.quote(a) for a in argv)
