# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Compile caches of torch, Triton, CUDA, FlashInfer and TVM FFI: found, measured, cleared
safely, kept fresh.

The job of the torch_cache module and of the readiness read, one account's caches at a time.
Its parts: where a cache lives (_locate), what it is built against (_fingerprint), its marker
(_marker), whether its root may be touched (_roots), and measuring, holders and clearing (_clear).

Private to gpufleet.hygiene (leading underscore): not a public API.
Standard library only: this runs on the target.
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._clear import clear_root, describe_errors, find_holders, has_content, measure
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._fingerprint import (
    FINGERPRINT_KEYS,
    fingerprint_text,
    python_tag,
    same_fingerprint,
    venv_fingerprint,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._locate import CACHE_NAMES, CacheError, Identity, locate
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._marker import MARKER, read_marker, write_marker
from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._roots import KEPT, make_root, open_root, protected_homes
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tree import UnsafePath
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv


def _state_text(entry):
    lines = ["path: {}".format(entry["path"]), "exists: {}".format(entry["exists"])]
    if entry["exists"]:
        lines.append("entries: {}".format(entry["entries"]))
        lines.append("size: {}".format(entry["size"]))
        lines.append("fingerprint: {}".format(fingerprint_text(entry["fingerprint"])))
    return "\n".join(lines) + "\n"


class TorchCache:
    """Report, clear or keep fresh the selected caches of one account."""

    def __init__(self, caches, state="present", venv=None, user=None, home=None, environment=None,
                 force=False, check_mode=False, run=None, proc="/proc"):
        self.names = []
        for name in caches or CACHE_NAMES:
            if name not in self.names:
                self.names.append(name)
        self.state = state
        self.env = Venv.of(venv, run) if venv else None  # a path, or the Venv a readiness read shares
        self.venv = self.env.path if self.env else None
        self.force = force
        self.check_mode = check_mode
        self.run = run
        self.proc = proc
        self.ident = Identity(user=user, home=home, environment=environment)
        self.owner = (self.ident.uid, self.ident.gid) if user and self.ident.uid is not None else None
        self.warnings = []

    def execute(self):
        if self.state == "fresh" and not self.venv:
            raise CacheError("state=fresh needs venv: the virtual environment whose torch, triton, "
                             "CUDA and flashinfer versions the caches must match")
        current = venv_fingerprint(self.env, self.run) if self.env else None
        pytag = python_tag(self.env.own_site_dirs) if self.env else None
        homes = protected_homes([self.ident.home])
        entries = []
        for name in self.names:
            loc = locate(name, self.ident, current, pytag)
            entries.append(self._inspect(loc, homes, current))
        result = {"changed": False, "caches": entries, "fingerprint": current, "diff": []}
        refused = [e for e in entries if e.get("_problem")]
        if refused and self.state != "present":
            e = refused[0]
            raise CacheError("refusing to touch the {} cache: {}".format(e["name"], e["_problem"]), self._public(result))
        for e in refused:
            self.warnings.append("{} cache: {}".format(e["name"], e["_problem"]))
        self._plan(entries, current)
        self._check_holders(entries, result)
        # Outer roots first: clearing one that holds another must not undo the inner's marker.
        order = sorted((e for e in entries if e["action"] != "none"), key=lambda e: e["path"].count("/"))
        for e in order:
            result["changed"] = True
            result["diff"].append(self._diff(e, current))
            if not self.check_mode:
                self._apply(e, current, result)
        return self._public(result)

    def _public(self, result):
        out = dict(result)
        out["caches"] = [{k: v for k, v in e.items() if not k.startswith("_")} for e in result["caches"]]
        return out

    def _inspect(self, loc, homes, current):
        entry = {
            "name": loc.name, "path": loc.path, "configured": loc.path, "source": loc.source,
            "exists": False, "size": 0, "entries": 0, "fingerprint": None, "stale": None,
            "marker": None, "holders": [], "action": "none", "removed": 0, "freed": 0,
            "problems": list(loc.notes),
        }
        if loc.name == "torch_extensions":
            entry["build_dir"] = loc.build_dir
        if loc.problem:
            entry["_problem"] = loc.problem
            entry["problems"].append(loc.problem)
            return entry
        with open_root(loc.path, homes, self.venv, loc.name) as root:
            if root.real:
                entry["path"] = root.real
            entry["exists"] = root.exists
            if root.problem:
                entry["_problem"] = f"{loc.path} {root.problem}"
                entry["problems"].append(entry["_problem"])
                return entry
            entry["marker"] = os.path.join(root.real, MARKER)
            if root.exists:
                entry["_id"] = (root.dir.dev, root.dir.ino)
                kept = KEPT.get(loc.name, ())
                size, count, problems = measure(root.dir, kept)
                entry["size"], entry["entries"] = size, count
                entry["problems"].extend(problems)
                entry["_content"] = has_content(root.dir, keep=kept)
                entry["_any"] = has_content(root.dir, keep_marker=False, keep=kept)
        if entry["exists"]:
            recorded, mproblem = read_marker(entry["path"])
            entry["fingerprint"] = recorded
            if mproblem:
                entry["problems"].append(mproblem)
        if current is not None:
            if entry["exists"] and entry["_content"]:
                entry["stale"] = not same_fingerprint(entry["fingerprint"], current)
            else:
                entry["stale"] = False
        return entry

    def _plan(self, entries, current):
        for e in entries:
            if e.get("_problem"):
                continue
            if self.state == "absent":
                if e["exists"] and e["_any"]:
                    e["action"] = "clear"
            elif self.state == "fresh":
                if e["exists"] and same_fingerprint(e["fingerprint"], current):
                    continue
                if e["exists"] and e["_content"]:
                    e["action"] = "clear_and_record"
                else:
                    e["action"] = "record"

    def _check_holders(self, entries, result):
        roots = [e["path"] for e in entries if e["exists"] and not e.get("_problem")]
        if not roots:
            return
        # A process using only what a clear leaves (FlashInfer's cubins) holds nothing cleared.
        kept = {e["path"]: [os.path.join(e["path"], n) for n in KEPT[e["name"]]] for e in entries
                if e["name"] in KEPT and e["exists"] and not e.get("_problem")}
        holders, uninspected = find_holders(roots, self.proc, kept=kept)
        for e in entries:
            e["holders"] = holders.get(e["path"], []) if e["exists"] and not e.get("_problem") else []
        clearing = [e for e in entries if e["action"] in ("clear", "clear_and_record")]
        if clearing and uninspected:
            self.warnings.append(f"{uninspected} processes could not be inspected for open cache files "
                                 "(run with become: true to see every holder)")
        for e in clearing:
            if not e["holders"]:
                continue
            who = "; ".join(f"PID {h['pid']} ({h['command']}) holds {h['paths'][0]}" for h in e["holders"][:3])
            if not self.force:
                raise CacheError(
                    "the {} cache {} is in use by a running process: {}. Stop the job first, or set "
                    "force: true to clear it from under the job".format(e["name"], e["path"], who),
                    self._public(result))
            self.warnings.append("force: clearing the {} cache {} while in use: {}".format(e["name"], e["path"], who))

    def _diff(self, e, current):
        before = _state_text(e)
        after = dict(e)
        after["exists"] = True
        if e["action"] in ("clear", "clear_and_record"):
            after["entries"] = after["size"] = 0
        after["fingerprint"] = None if e["action"] == "clear" else current
        # The after header says what the change is: a record on an empty or missing cache removes nothing.
        if e["action"] == "record":
            what = "fingerprint recorded, nothing removed" + ("" if e["exists"] else " (the directory created)")
        else:
            what = "{} entries removed{}".format(e["entries"], ", fingerprint recorded" if e["action"] == "clear_and_record" else "")
        return {
            "before_header": "{} cache {}".format(e["name"], e["path"]),
            "after_header": "{} cache {}: {}".format(e["name"], e["path"], what),
            "before": before,
            "after": _state_text(after),
        }

    def _apply(self, e, current, result):
        # Open and judge the root again just before acting: the tree may have changed since it was
        # inspected. Every change below goes through this one handle.
        with open_root(e["configured"], protected_homes([self.ident.home]), self.venv, e["name"]) as root:
            if root.problem or root.real != e["path"] or (root.exists and (root.dir.dev, root.dir.ino) != e.get("_id")):
                raise CacheError("refusing to touch the {} cache: {} {}".format(
                    e["name"], e["configured"], root.problem or "changed while being inspected"), self._public(result))
            if e["action"] in ("clear", "clear_and_record") and root.exists:
                self._clear(e, root.dir, result)
            if e["action"] in ("record", "clear_and_record"):
                self._record(e, root, current, result)

    def _clear(self, e, d, result):
        try:
            res = clear_root(d, KEPT.get(e["name"], ()))
        except OSError as exc:
            raise CacheError(f"cannot open the {e['name']} cache {d.path}: {exc.strerror}", self._public(result)) from exc
        e["removed"], e["freed"] = res.removed, res.freed
        e["problems"].extend(res.kept)
        if res.errors:
            raise CacheError(describe_errors(e["name"], d.path, res.errors), self._public(result))
        e["entries"], e["size"] = 0, 0
        e["fingerprint"] = None

    def _record(self, e, root, current, result):
        try:
            if root.dir is None:
                root.dir = make_root(e["path"], self.owner)
            write_marker(root.dir, current, self.venv, self.owner)
        except UnsafePath as exc:
            raise CacheError("refusing to touch the {} cache: {}".format(e["name"], exc.msg), self._public(result)) from exc
        except OSError as exc:
            raise CacheError(
                "cannot record the fingerprint in the {} cache {}: {} (run as the cache's owner or "
                "with become: true)".format(e["name"], e["path"], exc.strerror), self._public(result)) from exc
        e["exists"] = True
        e["fingerprint"] = {k: current.get(k) for k in FINGERPRINT_KEYS}
        e["stale"] = False
