# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Find and remove packages built for another CUDA major, restoring what they clobbered.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import reference, scan
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import (
    DistError,
    Venv,
    canonical_name,
    file_digest,
    info_entries,
    valid_project_name,
    valid_version,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._pkgtool import (
    Installer,
    has_pip,
    privileged_run,
    run_as,
    shell_join,
)


class VenvLock(object):
    """An exclusive flock on the venv directory itself, so two runs never remove at once and
    no lock file is left in the user's venv."""

    def __init__(self, venv, timeout):
        self.path = venv
        self.timeout = timeout
        self.fd = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except (IOError, OSError) as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    raise DistError(
                        "another run holds the lock on venv %s for more than %ss; wait for it or raise lock_timeout"
                        % (self.path, self.timeout)) from None
                time.sleep(0.1)

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# What a dist-info says is put on an installer's command line only when it is a package
# name and a version: "--python=/usr/bin/python3" as a Name would be an option of uv.
_UNSAFE = ("its metadata names it %r, version %r, which an installer would not read as a package (%s): "
           "not handed to uv or pip; remove that directory by hand")


def blocking_entries(sites):
    """The ``*.dist-info`` / ``*.egg-info`` entries of ``sites`` whose directory name is no
    ``name-version`` an installer can parse: uv refuses a whole venv that holds one."""
    found = []
    for site, entry in info_entries(sites):
        name, _sep, version = entry.rsplit(".", 1)[0].partition("-")
        if not valid_project_name(name) or (version and not valid_version(version.split("-", 1)[0])):
            found.append(os.path.join(site, entry))
    return found


def _pkg_lines(dists):
    return "".join("%s==%s\n" % (d.name, d.version) for d in sorted(dists, key=lambda d: d.key))


class Contamination(object):
    """The scan, and with ``remove`` the remediation, of one venv (a path or a Venv)."""

    def __init__(self, venv, run, expected_cuda=None, protect=("torch",), also_remove=(),
                 find_links=None, no_index=False, installer="auto", scan_binaries=True,
                 lock_timeout=60, check_mode=False, path_env=None):
        self.env = Venv.of(venv, run)
        self.venv = self.env.path
        self.run_cmd = run
        self.expected_cuda = expected_cuda
        for option, names in (("also_remove", also_remove), ("protect", protect)):
            bad = [n for n in names if not valid_project_name(n)]
            if bad:
                raise DistError(
                    "%s holds %s, which %s: a name is letters, digits, '.', '_' and '-', starting and ending with a "
                    "letter or digit (as in sglang, flashinfer-python)"
                    % (option, ", ".join(repr(n) for n in bad), "is not a package name" if len(bad) == 1 else "are not package names"))
        self.protect = set(canonical_name(p) for p in protect)
        self.also_remove = [canonical_name(n) for n in also_remove]
        self.find_links = find_links
        self.no_index = no_index
        self.installer_pref = installer
        self.scan_binaries = scan_binaries
        self.lock_timeout = lock_timeout
        self.check_mode = check_mode
        self.path_env = path_env
        self._identity = None
        clash = sorted(set(self.also_remove) & self.protect)
        if clash:
            raise DistError(
                "%s is both protected and in also_remove; a protected package is never removed: "
                "drop it from also_remove or from protect" % ", ".join(clash))
        if find_links and not os.path.isdir(find_links):
            raise DistError("find_links %s is not a directory of wheels" % find_links)
        self.python = self.env.python
        self.sites = self.env.site_dirs
        root = os.path.realpath(self.venv) + os.sep
        self.own_sites = set(os.path.realpath(s) for s in self.sites if os.path.realpath(s).startswith(root))

    def _installer_run(self, argv):
        """An installer's argv run as whoever controls the venv (run_as()): root never runs a
        program, an interpreter or a .pth line that a user could have put there."""
        return privileged_run(self._identity, self.run_cmd)(argv)

    def scan(self):
        dists = self.env.distributions
        ref, warnings = reference(dists, self.expected_cuda)
        contaminants, unknown, clobbered, shared = scan(dists, ref["cuda_major"], self.scan_binaries)
        problems = list(self.env.problems)
        for dist in dists:
            problems.extend(dist.problems)
        result = {
            "reference": ref,
            "contaminants": contaminants,
            "clobbered": [dict((k, v) for k, v in c.items() if k != "file") for c in clobbered],
            "unknown": unknown,
            "clean": not contaminants,
            "scanned": len(dists),
            "problems": problems,
            "warnings": warnings,
        }
        return result, dists, clobbered, shared

    def run(self, remove=False):
        """The cuda_contamination module's result: the scan, and with ``remove`` the removal.
        A failure once the scan is done carries the result so far (its ``partial``)."""
        result, dists, _clobbered, shared = self.scan()
        result["changed"] = False
        if not remove:
            return result
        try:
            return self.remediate(result, dists, shared)
        except GpufleetError as exc:
            raise GpufleetError(exc.msg, exc.partial or result) from exc

    # ------------------------------------------------------------------ removal
    def plan(self, dists, contaminants, shared):
        by_key = dict((d.key, d) for d in dists)
        remove, kept = [], []
        for item in contaminants:
            key = canonical_name(item["name"])
            dist = by_key[key]
            if key in self.protect:
                kept.append({"name": item["name"], "reason": "protected"})
            elif not valid_project_name(dist.name) or not valid_version(dist.version):
                kept.append({"name": item["name"], "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
            elif os.path.realpath(dist.site_dir) not in self.own_sites:
                kept.append({"name": item["name"], "reason": "installed outside the venv, in %s" % dist.site_dir})
            else:
                remove.append(dist)
        for key in self.also_remove:
            dist = by_key.get(key)
            if dist is None or dist in remove:
                continue
            if os.path.realpath(dist.site_dir) not in self.own_sites:
                kept.append({"name": dist.name, "reason": "installed outside the venv, in %s" % dist.site_dir})
                continue
            if not valid_project_name(dist.name) or not valid_version(dist.version):
                kept.append({"name": dist.name, "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
                continue
            remove.append(dist)
        removing = set(d.key for d in remove)
        preserve = []  # (abs_path, keeper) whose current content a keeper still needs
        reinstall = {}  # key -> dist whose shared files no longer match its RECORD
        for abs_path, group in shared.items():
            if not any(d.key in removing for d, _r, _a, _h in group):
                continue
            keepers = [(d, a, h) for d, _r, a, h in group if d.key not in removing]
            if not keepers:
                continue
            for dist, algo, digest in keepers:
                ok = False
                if os.path.lexists(abs_path):
                    if not digest:
                        ok = True
                    else:
                        try:
                            ok = file_digest(abs_path, algo) == digest
                        except (IOError, OSError, ValueError):
                            ok = False
                if ok:
                    preserve.append(abs_path)
                elif valid_project_name(dist.name) and valid_version(dist.version):
                    reinstall[dist.key] = dist
                elif not any(k["name"] == dist.name for k in kept):
                    kept.append({"name": dist.name, "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
        return remove, kept, sorted(set(preserve)), sorted(reinstall.values(), key=lambda d: d.key)

    def remediate(self, result, dists, shared):
        if not (os.path.isfile(os.path.join(self.venv, "pyvenv.cfg")) or os.path.isdir(os.path.join(self.venv, "conda-meta"))):
            # A system prefix (/usr, or "/opt/venv/../../usr") has a bin/python3 and, on many
            # distributions, a lib/python3.X/site-packages: it looks like a venv, and is the OS's.
            raise DistError(
                "venv %s (%s) has no pyvenv.cfg and no conda-meta: it is neither a virtual nor a conda environment, "
                "and packages are removed only from one of those; give the training venv's own directory"
                % (self.venv, os.path.realpath(self.venv)))
        remove, kept, preserve, reinstall = self.plan(dists, result["contaminants"], shared)
        result["kept"] = kept
        result["removed"] = [{"name": d.name, "version": d.version} for d in remove]
        result["restored"] = [{"name": d.name, "version": d.version} for d in reinstall]
        result["preserved_files"] = len(preserve)
        before = _pkg_lines(dists)
        removing = set(d.key for d in remove)
        result["diff"] = {"before": before, "after": _pkg_lines([d for d in dists if d.key not in removing])}
        if not remove:
            result["changed"] = False
            return result
        installer = Installer.choose(self.installer_pref, self.venv, self.python, self.sites, self.path_env)
        blocking = blocking_entries(sorted(self.own_sites))
        if blocking and installer.tool == "uv":
            if self.installer_pref == "auto" and has_pip(self.sites):
                installer = Installer("pip", self.python)  # pip passes over such an entry; uv refuses the venv
            else:
                raise DistError(
                    "uv refuses this venv because of %s, whose name is no package name-version; nothing was removed. "
                    "Remove %s by hand (%s) and run again%s"
                    % (", ".join(repr(os.path.basename(b)) for b in blocking),
                       "it" if len(blocking) == 1 else "them", "; ".join("rm -r -- %s" % shell_join([b]) for b in blocking),
                       "" if self.installer_pref == "uv" else ", or install pip into the venv, which passes over it"),
                    result)
        # Who runs it is decided before anything changes: a venv no identity can run safely is refused.
        self._identity = run_as(self.venv, self.python, sorted(self.own_sites), installer.uv or installer.python)
        result["changed"] = True
        result["installer"] = installer.tool
        if self.check_mode:
            return result
        with VenvLock(self.venv, self.lock_timeout):
            return self._execute(result, dists, remove, preserve, reinstall, installer)

    def _execute(self, result, dists, remove, preserve, reinstall, installer):
        stash = tempfile.mkdtemp(prefix=".gpufleet-preserve-", dir=self.venv)
        saved = []
        try:
            for index, path in enumerate(preserve):
                target = os.path.join(stash, str(index))
                try:
                    os.link(path, target)
                except OSError:
                    shutil.copy2(path, target)
                saved.append((path, target))
            argv = installer.uninstall([d.name for d in remove])
            rc, out, err = self._installer_run(argv)
            for path, target in saved:
                if not os.path.lexists(path):
                    parent = os.path.dirname(path)
                    if not os.path.isdir(parent):
                        os.makedirs(parent)
                    os.rename(target, path)
        finally:
            shutil.rmtree(stash, ignore_errors=True)

        after = self.env.rescan()
        present = set(d.key for d in after)
        removed = [d for d in remove if d.key not in present]
        failed = [d for d in remove if d.key in present]
        result["removed"] = [{"name": d.name, "version": d.version} for d in removed]
        lost = [d for d in dists if d.key not in present and d not in remove]

        pins = [(d.name, d.version) for d in reinstall if d.key in present or d in lost]
        restore_failed = None
        if pins:
            rargv = installer.reinstall(pins, self.find_links, self.no_index)
            rrc, rout, rerr = self._installer_run(rargv)
            if rrc != 0:
                restore_failed = (rargv, (rerr or rout or "").strip())
        after = self.env.rescan()
        result["diff"]["after"] = _pkg_lines(after)
        result["restored"] = [] if restore_failed else [{"name": n, "version": v} for n, v in pins]
        present = set(d.key for d in after)
        lost = [d.name for d in dists if d.key not in present and d not in remove]
        damaged = []
        for dist in after:
            if dist.key in set(canonical_name(n) for n, _v in pins):
                missing, modified, _checked = dist.verify()
                if missing or modified:
                    damaged.append("%s (%d missing, %d modified)" % (dist.name, len(missing), len(modified)))
        new_result, _d, _c, _s = self.scan()
        result["clean"] = new_result["clean"]
        result["clobbered_after"] = new_result["clobbered"]

        errors = []
        if rc != 0 or failed:
            # The installer's own words say what stopped it: no guess at a cause here.
            errors.append(
                "the uninstall failed part-way (%s exited %s): removed %s; still installed %s: %s. Fix what %s names "
                "and run again: the next run removes what is left and restores the files the removed packages had "
                "overwritten"
                % (installer.tool, rc, ", ".join(d.name for d in removed) or "nothing",
                   ", ".join(d.name for d in failed) or "nothing", (err or out or "").strip()[:600] or "no message",
                   installer.tool))
        if restore_failed:
            rargv, text = restore_failed
            hint = list(rargv)
            if not self.find_links:
                hint[-len(pins):-len(pins)] = ["--find-links", "<a directory holding these wheels>"]
            errors.append(
                "could not reinstall %s, whose files the removed packages had overwritten: no "
                "configured source has them. Restore them with: %s (%s)"
                % (", ".join("%s==%s" % p for p in pins), shell_join(hint), text[-400:]))
        if lost:
            errors.append("packages that were not asked for disappeared: %s" % ", ".join(lost))
        if damaged and not restore_failed:
            errors.append("restored packages still differ from their RECORD: %s" % ", ".join(damaged))
        if errors:
            raise GpufleetError("; ".join(errors), result)
        return result
