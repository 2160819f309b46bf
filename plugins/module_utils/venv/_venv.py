# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""One virtual environment: its interpreter, the directories its packages come from (its own
site-packages, what their ``.pth`` lines add, the base installation's when it sees them), found
from files without running anything of it, and the distributions there (Venv, resolved once).

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import read_text
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._dist import DistError, iter_distributions


def venv_python(venv):
    """The interpreter of a virtual environment, or a DistError saying what is wrong."""
    if not venv:
        raise DistError("venv is empty: give the path of a virtual environment")
    if not _root.exists(venv):
        raise DistError("venv %s does not exist" % venv)
    if not _root.isdir(venv):
        raise DistError("venv %s is not a directory" % venv)
    for cand in ("bin/python", "bin/python3"):
        path = os.path.join(venv, cand)
        if _root.executable(path):
            return path
    raise DistError(
        "venv %s has no bin/python: it is not a virtual environment, or it is broken "
        "(recreate it with 'python3 -m venv %s' or 'uv venv %s')" % (venv, venv, venv))


def read_pyvenv_cfg(venv, problems=None):
    """pyvenv.cfg's keys (lower case) and values; {} when it is absent or skipped."""
    cfg = {}
    problems = [] if problems is None else problems
    text = read_text(os.path.join(venv, "pyvenv.cfg"), "pyvenv_cfg", problems, what="pyvenv.cfg", missing_ok=True)
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            cfg[key.strip().lower()] = value.strip()
    return cfg


def venv_site_dirs(venv):
    """site-packages of a venv, found on disk without starting its interpreter."""
    found = []
    seen = set()
    candidates = []
    for lib in ("lib", "lib64"):
        try:
            names = sorted(n for n in _root.listdir(os.path.join(venv, lib)) if n.startswith("python"))
        except OSError:
            continue
        candidates.extend(os.path.join(venv, lib, n, "site-packages") for n in names)
    candidates.append(os.path.join(venv, "Lib", "site-packages"))
    for path in candidates:
        if _root.isdir(path):
            real = _root.realpath(path)
            if real not in seen:
                seen.add(real)
                found.append(path)
    return found


_SYS_PATH_CODE = "import json, sys; print(json.dumps(sys.path))"


def interpreter_site_dirs(python, run):
    """The directories an interpreter imports from (its sys.path), asked of it once.

    ``run(argv)`` returns ``(rc, stdout, stderr)``. -E keeps PYTHONPATH out, as a fresh
    training process started from a clean environment would. Only for an interpreter the
    user named (pip_inventory's ``python``), never a venv's own: see base_site_dirs().
    """
    if not _root.executable(python):
        raise DistError("python %s does not exist or is not executable" % python)
    import json

    rc, out, err = run([python, "-E", "-c", _SYS_PATH_CODE])
    if rc != 0:
        raise DistError("%s could not be run (rc=%s): %s" % (python, rc, (err or out or "").strip()[:400]))
    try:
        paths = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise DistError("%s printed no sys.path: %r" % (python, (out or "")[:200])) from None
    return [p for p in paths if p and _root.isdir(p)]


def interpreter_dirs(python):
    """The directories an interpreter reads at every start, found by its installation's layout
    (nothing is run): its standard library (``<prefix>/lib*/python*``) and the site-packages and
    dist-packages directories beside it, whose ``.pth`` lines site.py runs. run_as() is given
    them, so that an interpreter of root's whose site directory (or a .pth in it) is another
    user's is run as that user."""
    import glob

    prefix = glob.escape(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    found = []
    for pattern in ("lib*/python*", "lib*/python*/site-packages", "lib*/python*/dist-packages",
                    "local/lib*/python*/site-packages", "local/lib*/python*/dist-packages"):
        found.extend(p for p in sorted(glob.glob(os.path.join(prefix, pattern))) if os.path.isdir(p))
    return found


def _python_xy(cfg):
    """``(X.Y, abiflags)`` from pyvenv.cfg's ``version_info`` (uv) or ``version`` (venv), or None."""
    import re

    for key in ("version_info", "version"):
        match = re.match(r"^(\d+)\.(\d+)", cfg.get(key, ""))
        if match:
            return "%s.%s" % match.groups()
    return None


def base_site_dirs(cfg):
    """The site directories of the base installation a venv was made from, derived from
    pyvenv.cfg's ``home`` (the base interpreter's bin directory) and its version, by the
    installation's layout: nothing is run. Returns ``(directories, problem or None)``.

    Debian's interpreter reads dist-packages (``/usr/local/lib/python3.X/dist-packages``,
    ``/usr/lib/python3/dist-packages``, ``/usr/lib/python3.X/dist-packages``), every other
    build its ``<prefix>/lib/python3.X/site-packages``; only those that exist are kept, in the
    order the interpreter would put them on sys.path.
    """
    home = cfg.get("home", "")
    xy = _python_xy(cfg)
    if not home or not os.path.isabs(home) or xy is None:
        return [], ("pyvenv.cfg says include-system-site-packages = true but gives no absolute home (%r) or no "
                    "version (%r): the base installation's packages are not read" % (home, cfg.get("version_info") or cfg.get("version")))
    prefix = os.path.dirname(os.path.normpath(home))
    names = ["python" + xy, "python" + xy + "t"]
    candidates = [os.path.join(prefix, "local", "lib", n, "dist-packages") for n in names[:1]]
    candidates.append(os.path.join(prefix, "lib", "python3", "dist-packages"))
    for name in names:
        for lib in ("lib", "lib64"):
            candidates.append(os.path.join(prefix, lib, name, "dist-packages"))
            candidates.append(os.path.join(prefix, lib, name, "site-packages"))
    found = [c for c in candidates if _root.isdir(c)]
    if not found:
        return [], "pyvenv.cfg's home %s has no site-packages or dist-packages beside it: the base installation's packages are not read" % home
    return found, None


def pth_dirs(site, problems=None):
    """Directories a site directory's ``*.pth`` files add to sys.path, as site.py does:
    each line that is not a comment or an ``import`` names a path relative to the site
    directory, added when it exists. A venv pointed at another environment's packages
    this way imports them, so they are part of what it runs."""
    found = []
    problems = [] if problems is None else problems
    try:
        names = sorted(n for n in _root.listdir(site) if n.endswith(".pth"))
    except OSError:
        return found
    for name in names:
        text = read_text(os.path.join(site, name), "pth", problems, what=name)
        for raw in (text or "").splitlines():
            line = raw.rstrip()
            if not line or line.startswith(("#", "import ", "import\t")):
                continue
            path = os.path.normpath(os.path.join(site, line))
            if _root.isdir(path):
                found.append(path)
    return found


def environment_site_dirs(venv, own=None, problems=None):
    """Where packages of a venv come from: its site-packages (``own``, found when not given)
    and the directories their ``.pth`` files add, then, when the venv was made with
    --system-site-packages, the base installation's (base_site_dirs(): read, never run).
    What could not be read is appended to ``problems``."""
    problems = [] if problems is None else problems
    own = venv_site_dirs(venv) if own is None else own
    if not own:
        raise DistError("venv %s has no lib/python*/site-packages: it is not a virtual environment" % venv)
    sites = []
    for site in own:
        for path in [site] + pth_dirs(site, problems):
            if path not in sites:
                sites.append(path)
    cfg = read_pyvenv_cfg(venv, problems)
    if cfg.get("include-system-site-packages", "false").lower() == "true":
        seen = set(_root.realpath(s) for s in sites)
        base, problem = base_site_dirs(cfg)
        if problem:
            problems.append(problem)
        for path in base:
            if _root.realpath(path) not in seen:
                seen.add(_root.realpath(path))
                sites.append(path)
    return sites


class Venv(object):
    """One virtual environment, resolved once and handed to every reader of it (contamination,
    packages, caches): its interpreter, the directories its packages come from and the
    distributions there, each found on first use and kept. Nothing of the venv is run to find
    them (its interpreter may be anyone's program): they are read from files. A venv that cannot
    be resolved keeps its DistError and raises it to each reader that asks, so each fails as it
    would alone. ``problems``: what could not be read while resolving it (pyvenv.cfg, *.pth).

    ``run(argv)`` returns ``(rc, stdout, stderr)``: given to the installers, never to the reads.
    """

    def __init__(self, path, run):
        self.path = path
        self.run = run
        self.problems = []
        self._resolved = None  # (python, own site dirs, site dirs), or the DistError
        self._found = None  # (distributions, shadowed)

    @classmethod
    def of(cls, venv, run):
        """``venv`` (a path or a Venv) as a Venv."""
        return venv if isinstance(venv, cls) else cls(venv, run)

    def _resolve(self):
        if self._resolved is None:
            try:
                python = venv_python(self.path)
                own = venv_site_dirs(self.path)
                self._resolved = (python, own, environment_site_dirs(self.path, own, self.problems))
            except DistError as exc:
                self._resolved = exc
        if isinstance(self._resolved, DistError):
            raise self._resolved
        return self._resolved

    def _read(self):
        if self._found is None:
            self._found = iter_distributions(self.site_dirs)
        return self._found

    python = property(lambda self: self._resolve()[0], doc="The venv's interpreter (bin/python).")
    own_site_dirs = property(lambda self: self._resolve()[1], doc="Its own site-packages, not those it sees.")
    site_dirs = property(lambda self: self._resolve()[2], doc="Every directory its packages come from.")
    distributions = property(lambda self: self._read()[0], doc="The distributions there, first on the path wins.")
    shadowed = property(lambda self: self._read()[1], doc="Later copies of a project found before.")

    def rescan(self):
        """The distributions read again, after an installer changed the venv."""
        self._found = None
        return self.distributions
