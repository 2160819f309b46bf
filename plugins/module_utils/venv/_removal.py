# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Remove the packages built for another CUDA major (Contamination's scan), restoring what they
clobbered: the venv's lock, the installer run as whoever controls the venv, the stash of the files
kept packages share with the removed ones, and the record of what a failed reinstall left.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _stash
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import (
    DistError,
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
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._restore import pending_problem, unrestored
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._stash import Stash, StashFull, stash_dir, stash_full


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
                    os.close(self.fd)
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


class Removal(Contamination):
    """The scan, and with ``remove`` the removal, of one venv (cuda_contamination, the purge's)."""

    def __init__(self, venv, run, expected_cuda=None, protect=("torch",), also_remove=(),
                 find_links=None, no_index=False, installer="auto", scan_binaries=True,
                 lock_timeout=60, check_mode=False, path_env=None, evidence_cache=True):
        super().__init__(venv, run, expected_cuda=expected_cuda, scan_binaries=scan_binaries, check_mode=check_mode,
                         evidence_cache=evidence_cache)
        for option, names in (("also_remove", also_remove), ("protect", protect)):
            bad = [n for n in names if not valid_project_name(n)]
            if bad:
                raise DistError(
                    "%s holds %s, which %s: a name is letters, digits, '.', '_' and '-', starting and ending with a "
                    "letter or digit (as in sglang, flashinfer-python)"
                    % (option, ", ".join(repr(n) for n in bad), "is not a package name" if len(bad) == 1 else "are not package names"))
        self.protect = set(canonical_name(p) for p in protect)
        self.also_remove = [canonical_name(n) for n in also_remove]
        clash = sorted(set(self.also_remove) & self.protect)
        if clash:
            raise DistError(
                "%s is both protected and in also_remove; a protected package is never removed: "
                "drop it from also_remove or from protect" % ", ".join(clash))
        if find_links and not _root.isdir(find_links):
            raise DistError("find_links %s is not a directory of wheels" % find_links)
        self.find_links = find_links
        self.no_index = no_index
        self.installer_pref = installer
        self.lock_timeout = lock_timeout
        self.path_env = path_env
        self._identity = None
        self._ran = False  # whether an installer was started: until then nothing of the venv changed
        self.python = self.env.python
        self.sites = self.env.site_dirs
        root = _root.realpath(self.venv) + os.sep
        self.own_sites = set(_root.realpath(s) for s in self.sites if _root.realpath(s).startswith(root))

    def _installer_run(self, argv):
        """An installer's argv run as whoever controls the venv (run_as()): root never runs a
        program, an interpreter or a .pth line that a user could have put there."""
        self._ran = True
        return privileged_run(self._identity, self.run_cmd)(argv)

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
            partial = exc.partial or result
            if not self._ran:
                # Refused (or stopped) before any installer ran: what the plan would have removed
                # and restored did not happen, and the venv is as the scan found it.
                partial.update(changed=False, removed=[], restored=[], preserved_files=0)
                partial.pop("installer", None)
                if "diff" in partial:
                    partial["diff"]["after"] = partial["diff"]["before"]
            raise GpufleetError(exc.msg, partial) from exc

    # ------------------------------------------------------------------ removal
    def _anchored(self, dist, abs_path):
        """``(anchor, rel)``: the file at ``abs_path`` (a RECORD row of ``dist``) as a path below
        the venv's real directory, where the stash takes it from and puts it back (a bin/ script
        as well as a file of site-packages); ``(None, abs_path)`` when it is not below it."""
        venv = _root.realpath(self.venv)
        rel = os.path.relpath(abs_path, dist.site_dir)
        real = os.path.normpath(os.path.join(_root.realpath(dist.site_dir), rel))
        if _root.realpath(dist.site_dir) not in self.own_sites or not real.startswith(venv.rstrip("/") + "/"):
            return None, abs_path
        return venv, real[len(venv.rstrip("/")) + 1:]

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
            elif _root.realpath(dist.site_dir) not in self.own_sites:
                kept.append({"name": item["name"], "reason": "installed outside the venv, in %s" % dist.site_dir})
            else:
                remove.append(dist)
        for key in self.also_remove:
            dist = by_key.get(key)
            if dist is None or dist in remove:
                continue
            if _root.realpath(dist.site_dir) not in self.own_sites:
                kept.append({"name": dist.name, "reason": "installed outside the venv, in %s" % dist.site_dir})
                continue
            if not valid_project_name(dist.name) or not valid_version(dist.version):
                kept.append({"name": dist.name, "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
                continue
            remove.append(dist)
        removing = set(d.key for d in remove)
        preserve = {}  # abs_path -> [site (real), rel, algo, digest, [keepers]]: content a keeper still needs
        reinstall = {}  # key -> dist whose shared files no longer match its RECORD
        for abs_path, group in shared.items():
            if not any(d.key in removing for d, _r, _a, _h in group):
                continue
            keepers = [(d, a, h) for d, _r, a, h in group if d.key not in removing]
            if not keepers:
                continue
            for dist, algo, digest in keepers:
                ok = False
                if _root.lexists(abs_path):
                    if not digest:
                        ok = True
                    else:
                        try:
                            ok = file_digest(abs_path, algo) == digest
                        except (IOError, OSError, ValueError):
                            ok = False
                if ok:
                    entry = preserve.setdefault(abs_path, list(self._anchored(dist, abs_path)) + [algo, digest, []])
                    if not entry[3] and digest:
                        entry[2:4] = [algo, digest]
                    entry[4].append((dist.name, dist.version))
                elif valid_project_name(dist.name) and valid_version(dist.version):
                    reinstall[dist.key] = dist
                elif not any(k["name"] == dist.name for k in kept):
                    kept.append({"name": dist.name, "reason": _UNSAFE % (dist.name, dist.version, dist.info_dir)})
        return remove, kept, sorted(preserve.values(), key=lambda e: (e[0] or "", e[1])), sorted(
            reinstall.values(), key=lambda d: d.key)

    def remediate(self, result, dists, shared):
        if not (_root.isfile(os.path.join(self.venv, "pyvenv.cfg")) or _root.isdir(os.path.join(self.venv, "conda-meta"))):
            # A system prefix (/usr, or "/opt/venv/../../usr") has a bin/python3 and, on many
            # distributions, a lib/python3.X/site-packages: it looks like a venv, and is the OS's.
            raise DistError(
                "venv %s (%s) has no pyvenv.cfg and no conda-meta: it is neither a virtual nor a conda environment, "
                "and packages are removed only from one of those; give the training venv's own directory"
                % (self.venv, _root.realpath(self.venv)))
        remove, kept, preserve, reinstall = self.plan(dists, result["contaminants"], shared)
        # What an earlier run failed to restore is reinstalled now, with or without a removal.
        keys = set(d.key for d in reinstall)
        pending = [(p["name"], p["version"]) for p in result["restore_pending"] if canonical_name(p["name"]) not in keys]
        result["kept"] = kept
        result["removed"] = [{"name": d.name, "version": d.version} for d in remove]
        result["restored"] = [{"name": d.name, "version": d.version} for d in reinstall] + [
            {"name": n, "version": v} for n, v in pending]
        result["preserved_files"] = len(preserve)
        before = _pkg_lines(dists)
        removing = set(d.key for d in remove)
        result["diff"] = {"before": before, "after": _pkg_lines([d for d in dists if d.key not in removing])}
        if not remove and not pending:
            result["changed"] = False
            return result
        # Validate before destroy: shared files too large to keep aside stop the removal here, in
        # check mode too (the stash counts again as it copies, before the uninstall).
        need = _stash.stash_need(preserve) if remove else []
        if sum(size for size, _w in need) > _stash.STASH_TOTAL_MAX:
            largest = sorted(need, reverse=True)[:3]
            raise DistError(stash_full(preserve, "the largest: %s" % ", ".join(
                "%s (%d bytes)" % (where, size) for size, where in largest)), result)
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
            return self._execute(result, dists, remove, preserve, reinstall, installer, pending)

    def _uninstall(self, remove, preserve, installer):
        """Uninstall ``remove``, keeping the files in ``preserve`` that a remaining package needs:
        copied into root's stash before, written back through directory handles after (Stash).
        Returns the installer's ``(rc, out, err)`` and the files not kept: ``[(problem, keepers)]``."""
        lost = []
        stash = None
        if preserve:
            try:
                stash = Stash()
            except OSError as exc:
                raise DistError(
                    "could not make %s, where the files the removed packages share with kept ones are kept during the "
                    "uninstall (%s); nothing was removed: run as root, with %s root's and writable by root alone"
                    % (stash_dir(), exc.strerror or exc, os.path.dirname(stash_dir()))) from None
        try:
            taken = []
            for anchor, rel, algo, digest, keepers in preserve:
                if anchor is None:
                    lost.append(("%s is not in the venv: not kept aside" % rel, keepers))
                    continue
                try:
                    problem = stash.take(anchor, rel, digest, algo)
                except StashFull as exc:
                    raise DistError(stash_full(preserve, "it went past it at %s" % exc.where)) from None
                if problem:
                    lost.append((problem, keepers))
                else:
                    taken.append(keepers)
            argv = installer.uninstall([d.name for d in remove])
            rc, out, err = self._installer_run(argv)
            for item, keepers in zip(stash.items if stash else [], taken):
                problem = stash.put_back(item)
                if problem:
                    lost.append((problem, keepers))
        finally:
            if stash is not None:
                stash.close()
        return rc, out, err, lost

    def _execute(self, result, dists, remove, preserve, reinstall, installer, pending):
        rc, out, err, unkept = self._uninstall(remove, preserve, installer) if remove else (0, "", "", [])

        after = self.env.rescan()
        present = set(d.key for d in after)
        removed = [d for d in remove if d.key not in present]
        failed = [d for d in remove if d.key in present]
        result["removed"] = [{"name": d.name, "version": d.version} for d in removed]
        lost = [d for d in dists if d.key not in present and d not in remove]

        pins = [(d.name, d.version) for d in reinstall if d.key in present or d in lost] + pending
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
        # What is still not back is recorded (outside the venv) so that every later read reports
        # it until it is; once all is back the record goes.
        still = unrestored(after, pins)
        # A kept package whose file could not be put back is recorded like a failed reinstall.
        pinned = set(canonical_name(n) for n, _v in pins)
        extra = []
        for _problem, keepers in unkept:
            for name, version in keepers:
                if canonical_name(name) not in pinned and valid_project_name(name) and valid_version(version):
                    pinned.add(canonical_name(name))
                    extra.append((name, version))
        damaged = ["%s (%d missing, %d modified)" % (p["name"], len(p["missing"]), len(p["modified"]))
                   for p in still if p["installed"]]
        still += unrestored(after, extra)
        recorded = self.restore_record.store([(p["name"], p["version"]) for p in still])
        new_result, _d, _c, _s = self.scan()
        result["clean"] = new_result["clean"]
        result["clobbered_after"] = new_result["clobbered"]
        before_pending = set(item["problem"] for item in result["restore_pending"])
        result["restore_pending"] = new_result["restore_pending"]
        result["problems"] = [p for p in result["problems"] if p not in before_pending] + [
            p for p in new_result["problems"] if p not in result["problems"]] + ([recorded] if recorded else [])
        if recorded:
            # The record could not be written, so the read above did not see what is still not
            # back: it is reported from what this run found, and the venv is not clean.
            seen = set(canonical_name(p["name"]) for p in result["restore_pending"])
            for item in still:
                if canonical_name(item["name"]) not in seen:
                    item["problem"] = pending_problem(item)
                    result["restore_pending"].append(item)
                    result["problems"].insert(len(result["problems"]) - 1, item["problem"])
                    result["clean"] = False

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
        if unkept:
            errors.append(
                "files that kept packages share with the removed ones were not put back: %s. Reinstall %s "
                "(cuda_contamination remove=true find_links=<a directory holding them>) once the venv's directories "
                "are plain directories again"
                % ("; ".join(p for p, _k in unkept[:5]) + (" and %d more" % (len(unkept) - 5) if len(unkept) > 5 else ""),
                   ", ".join(sorted(set("%s==%s" % k for _p, ks in unkept for k in ks)))))
        if damaged and not restore_failed:
            errors.append("restored packages still differ from their RECORD: %s" % ", ".join(damaged))
        if errors:
            raise GpufleetError("; ".join(errors), result)
        return result
