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

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError


def find_uv(venv, path_env=None):
    """uv beside the venv's python, else on PATH; None when absent."""
    candidates = [os.path.join(venv, "bin", "uv")]
    for entry in (path_env if path_env is not None else os.environ.get("PATH", "")).split(os.pathsep):
        if entry:
            candidates.append(os.path.join(entry, "uv"))
    for cand in candidates:
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


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
