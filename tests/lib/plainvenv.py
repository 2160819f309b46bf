# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Venvs laid out with plain files for the tests of venv/_contamination, _removal, _restore and
_stash (tests/unit/plugins/module_utils/venv): no venv is built and no installer runs - a fake
run(argv) (FakeInstaller) acts on the files as pip or uv would, so those tests run in seconds."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import shutil

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _dist, _removal, _restore, _stash

# The tests that give files to another user, or need root's own stash, run as root; the rest as any user.
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="gives files to another user or uses root's stash: runs as root")

NOBODY = 65534
BODY = b"the kept package's bytes\n"


def digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def taken(site):
    stash = _stash.Stash()
    assert stash.take(site, "pkg/sub/data.bin", digest(BODY), "sha256") is None
    os.remove(os.path.join(site, "pkg", "sub", "data.bin"))  # the uninstall
    return stash


# ==================================================================== the rest, on plain files
# Venvs are laid out by hand (bin/python a shell script, pyvenv.cfg, site-packages with dist-info
# directories as pip writes them); the installer is FakeInstaller, which acts on those files.

DEFAULTS = (_restore.STATE_DIR, _restore._STATE_MAX, _stash._COPY_CHUNK, _stash.STASH_FILE_MAX,
            _stash.STASH_TOTAL_MAX)
SITE_REL = os.path.join("lib", "python3.11", "site-packages")
PIP_UNINSTALL = ["-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", "--no-input"]
PIP_INSTALL = ["-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-cache-dir", "--disable-pip-version-check", "--no-input"]
KEEP_DATA = b"the CUDA 12 build's data\n"
DROP_DATA = b"the CUDA 13 build's data, longer\n"
COMMON = b"# the family's namespace\n"
NAME_RULE = ("a name is letters, digits, '.', '_' and '-', starting and ending with a letter or digit "
             "(as in sglang, flashinfer-python)")


def _write(path, data=b""):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


def _digest(data, algo="sha256"):
    return base64.urlsafe_b64encode(hashlib.new(algo, data).digest()).rstrip(b"=").decode("ascii")


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _dist_info(site, name, version, files, algo="sha256", dirname=None):
    """A dist-info directory as pip writes it (METADATA, INSTALLER, RECORD with a hash and a size
    on each row; ``algo`` None: rows without a hash), and ``files`` (rel -> bytes) below ``site``."""
    base = dirname or "%s-%s.dist-info" % (name.replace("-", "_"), version)
    info = os.path.join(site, base)
    own = {"%s/METADATA" % base: ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n\n" % (name, version)).encode("utf-8"),
           "%s/INSTALLER" % base: b"pip\n"}
    rows = []
    for rel, data in list(files.items()) + list(own.items()):
        _write(os.path.normpath(os.path.join(site, rel)), data)
        rows.append("%s,%s=%s,%d" % (rel, algo, _digest(data, algo), len(data)) if algo else "%s,," % rel)
    rows.append("%s/RECORD,," % base)
    _write(os.path.join(info, "RECORD"), ("\n".join(rows) + "\n").encode("utf-8"))
    return info


class FakeInstaller(object):
    """run(argv) acting on a venv's files as pip (or uv) would: an uninstall removes each named
    package's RECORD files and its dist-info, a reinstall writes the pinned packages back from
    ``wheels``; each argv is kept in ``calls``."""

    def __init__(self, site):
        self.site = site
        self.wheels = {}  # canonical name -> (name, version, files, algo, dirname)
        self.infos = {}
        self.calls = []
        self.uninstall_result = (0, "", "")
        self.left = set()  # what the uninstall fails to remove
        self.also_take = set()  # what it takes away besides
        self.reinstall_result = None  # returned without writing anything

    def add(self, name, version, files, algo="sha256", dirname=None, site=None):
        info = _dist_info(site or self.site, name, version, files, algo, dirname)
        key = _dist.canonical_name(name)
        self.infos[key] = (site or self.site, info)
        self.wheels[key] = (name, version, files, algo, dirname)
        return info

    def remove(self, key):
        """As pip does: each RECORD file, then the directories of site-packages it leaves empty."""
        site, info = self.infos[key]
        with open(os.path.join(info, "RECORD")) as f:
            for line in f.read().splitlines():
                path = os.path.normpath(os.path.join(site, line.rsplit(",", 2)[0]))
                if os.path.lexists(path) and not os.path.isdir(path):
                    os.unlink(path)
                here = os.path.dirname(path)
                while here.startswith(site + "/") and os.path.isdir(here) and not os.listdir(here):
                    os.rmdir(here)
                    here = os.path.dirname(here)
        if os.path.isdir(info):
            shutil.rmtree(info)

    def __call__(self, argv):
        self.calls.append(list(argv))
        if "uninstall" in argv:
            for name in argv[6 if argv[1] == "pip" else 7:]:
                if _dist.canonical_name(name) not in self.left:
                    self.remove(_dist.canonical_name(name))
            for key in sorted(self.also_take):
                self.remove(key)
            return self.uninstall_result
        if self.reinstall_result is not None:
            return self.reinstall_result
        for pin in [a for a in argv if "==" in a]:
            name, version = pin.split("==")
            spec = self.wheels.get(_dist.canonical_name(name))
            if spec is None or spec[1] != version:
                return 1, "", "ERROR: No matching distribution found for %s\n" % pin
            self.add(*spec)
        return 0, "", ""


class World(object):
    """A venv at ``venv`` laid out with files, its FakeInstaller ``fake`` (``fake.add`` installs)."""

    def __init__(self, root, pip=True):
        self.root = root
        self.venv = os.path.join(root, "venv")
        self.site = os.path.join(self.venv, SITE_REL)
        _write(os.path.join(self.venv, "bin", "python"), b"#!/bin/sh\n")
        os.chmod(os.path.join(self.venv, "bin", "python"), 0o755)
        _write(os.path.join(self.venv, "pyvenv.cfg"), b"home = /usr/bin\nversion_info = 3.11.2\n")
        os.makedirs(self.site)
        if pip:
            _write(os.path.join(self.site, "pip", "__init__.py"))
        self.python = os.path.join(self.venv, "bin/python")
        self.fake = FakeInstaller(self.site)
        self.add = self.fake.add

    def uv(self):
        path = _write(os.path.join(self.venv, "bin", "uv"), b"#!/bin/sh\n")
        os.chmod(path, 0o755)
        return path

    def contamination(self, **kw):
        args = dict(installer="pip", scan_binaries=False, evidence_cache=False, path_env="")
        args.update(kw)
        return _removal.Removal(args.pop("venv", self.venv), self.fake, **args)

    def read(self, rel):
        with open(os.path.join(self.site, rel), "rb") as f:
            return f.read()


def _world(tmp_path, common=True, clobber=True):
    """torch 2.9.1+cu128 (the reference: CUDA 12), keeppkg 1.0 and droppkg 1.0+cu130 (the
    contaminant), which share shared/__init__.py (the same bytes: kept aside) and shared/data.txt
    (droppkg's bytes over keeppkg's: keeppkg is reinstalled)."""
    w = World(str(tmp_path))
    w.add("torch", "2.9.1+cu128", {"torch/__init__.py": b"torch\n"})
    keep, drop = {"keeppkg/__init__.py": b"keep\n"}, {"droppkg/__init__.py": b"drop\n"}
    if common:
        keep["shared/__init__.py"] = drop["shared/__init__.py"] = COMMON
    if clobber:
        keep["shared/data.txt"], drop["shared/data.txt"] = KEEP_DATA, DROP_DATA
    w.add("keeppkg", "1.0", keep)
    w.add("droppkg", "1.0+cu130", drop)
    return w


def _pending_text(name, version, what):
    return ("%s %s lost files when the packages that had overwritten them were removed, and their reinstall failed: it %s. "
            "The venv stays not clean until they are back: reinstall it with find_links (cuda_contamination remove=true "
            "find_links=<a directory holding %s==%s>, or pip install --force-reinstall --no-deps --find-links <that directory> "
            "%s==%s)" % (name, version, what, name, version, name, version))


def _reinstall_text(pins, argv, text):
    return ("could not reinstall %s, whose files the removed packages had overwritten: no configured source has them. "
            "Restore them with: %s (%s)" % (pins, " ".join(shlex.quote(a) for a in argv), text))


BEFORE = "droppkg==1.0+cu130\nkeeppkg==1.0\ntorch==2.9.1+cu128\n"
AFTER = "keeppkg==1.0\ntorch==2.9.1+cu128\n"
HINT = ["--find-links", "<a directory holding these wheels>"]


MiB = 1 << 20


def _sparse(path, runs, size):
    """A file of ``size`` bytes holding data only at ``runs`` ({offset: bytes}): holes elsewhere."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for offset, data in runs.items():
            os.pwrite(fd, data, offset)
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    return path


def _linked(w, tmp_path):
    """An image's packages outside the venv (``image``), seen through site/linked, a link to them
    named by a .pth line: their files are reached through the venv's site-packages."""
    image = tmp_path / "image"
    image.mkdir()
    os.symlink(str(image), os.path.join(w.site, "linked"))
    _write(os.path.join(w.site, "_image.pth"), b"# the image's packages\nlinked\nimport sys\n")
    return os.path.join(w.site, "linked"), str(image)
