# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""pip_inventory's result (and the read's packages check): a venv's or an interpreter's packages,
compared with a baseline requirements file or pylock.toml (drift), their files checked against
RECORD.

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_file
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import DistError, iter_distributions
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._lockfile import BaselineError, parse_lock
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._pkgtool import privileged_run, run_as
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv, interpreter_dirs, interpreter_site_dirs


def parse_requirements(data, what):
    """Parse a baseline (bytes): a requirements file (pip freeze, uv export, uv pip compile) or a
    PEP 751 pylock.toml, into ``{canonical_name: {"name", "version" (pin or None), "spec"}}``;
    see venv/_lockfile.py. A malformed one raises a DistError naming the file and the line."""
    try:
        return parse_lock(data, what)
    except BaselineError as exc:
        raise DistError(exc.msg) from exc


def versions_match(pinned, installed):
    """``==pinned`` against an installed version, with PEP 440's local-label rule."""
    if installed is None:
        return False
    pinned = pinned.strip().lower()
    installed = installed.strip().lower()
    if pinned == installed:
        return True
    if "+" not in pinned:
        return installed.split("+", 1)[0] == pinned
    return False


def drift(dists, wanted):
    """Compare an inventory with a parsed baseline: extra, missing, changed."""
    have = {d.key: d for d in dists}
    extra = [{"name": d.name, "version": d.version} for k, d in sorted(have.items()) if k not in wanted]
    missing = []
    changed = []
    for key, want in sorted(wanted.items()):
        dist = have.get(key)
        if dist is None:
            missing.append({"name": want["name"], "version": want["version"], "spec": want["spec"]})
        elif want["version"] is not None and not versions_match(want["version"], dist.version):
            changed.append({"name": dist.name, "baseline": want["version"], "installed": dist.version})
    return {"extra": extra, "missing": missing, "changed": changed}


def inventory(venv, python, baseline, verify_files, run):
    """The pip_inventory module's result: a venv's (a path or a Venv) or an interpreter's
    packages read from disk, compared with a baseline requirements file, their files checked
    against RECORD.

    ``run(argv)`` returns ``(rc, stdout, stderr)``; raises DistError.
    """
    if not venv and python and _root.isfile(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(python))), "pyvenv.cfg")):
        # A venv's interpreter may be anyone's program: its venv is read from files instead.
        venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    if venv:
        env = Venv.of(venv, run)
        sites, dists, shadowed = env.site_dirs, env.distributions, env.shadowed
    else:
        # Another interpreter is run to ask its sys.path: as root only when root alone controls it.
        real = _root.realpath(python)
        sites = interpreter_site_dirs(python, privileged_run(run_as(os.path.dirname(real), python, interpreter_dirs(real)), run))
        dists, shadowed = iter_distributions(sites)
    result = {
        "changed": False,
        "packages": [d.as_dict() for d in dists],
        "count": len(dists),
        "site_dirs": sites,
        "shadowed": [d.as_dict() for d in shadowed],
    }
    if baseline:
        unread = []
        data = read_file(baseline, "requirements", unread)
        if data is None or unread:
            raise DistError("baseline %s cannot be read: %s" % (baseline, unread[0]))
        result["drift"] = drift(dists, parse_requirements(data, baseline))
    if verify_files:
        problems, checked = [], 0
        for dist in dists:
            missing, modified, count = dist.verify()
            checked += count
            if missing or modified:
                problems.append({"name": dist.name, "version": dist.version, "missing": missing, "modified": modified})
        result["integrity"] = {"ok": not problems, "files_checked": checked, "packages": problems}
    result["problems"] = (env.problems if venv else []) + [p for d in dists for p in d.problems]
    return result
