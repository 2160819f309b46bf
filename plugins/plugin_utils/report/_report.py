# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The report's files: which ones, what each would hold, and writing those that changed.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils._atomic import write_atomic
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._html import render_html
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._junit import render_junit
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._prometheus import render_prometheus
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import build_run, parse_timestamp, render_json
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import ReportError, normalize_hosts

FORMATS = ("json", "junit", "prometheus", "html")
FILENAMES = {
    "json": "report.json",
    "junit": "report.junit.xml",
    "prometheus": "gpufleet_hygiene.prom",
    "html": "report.html",
}
# The files the page links to, in its footer, when they are written beside it.
_LINKED = ("json", "junit", "prometheus")


def render(run, formats):
    """Return {format: text} for the formats asked."""
    renderers = {
        "json": render_json,
        "junit": render_junit,
        "prometheus": render_prometheus,
        "html": lambda r: render_html(r, [(f, FILENAMES[f]) for f in _LINKED if f in formats]),
    }
    return dict((fmt, renderers[fmt](run)) for fmt in formats)


def read_text(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReportError("%s cannot be read: %s" % (path, exc.strerror or exc)) from exc


def _diff(fmt, path, before, text):
    if fmt == "html":
        # Markup makes no readable diff: the size says the page changed.
        return {"before_header": path, "after_header": path,
                "before": "" if before is None else "(HTML, %d characters)\n" % len(before),
                "after": "(HTML, %d characters)\n" % len(text)}
    return {"before_header": path, "after_header": path, "before": before or "", "after": text}


class FleetReport(object):
    """Plan and write the report files; a file is rewritten only when its content differs."""

    def __init__(self, hosts, dest, formats=FORMATS, title="GPU fleet hygiene", run_started=None,
                 prometheus_file=None, check_mode=False, now=None, origins=None, run_kind="hygiene", phases=None):
        if not title or not str(title).strip():
            raise ReportError("title must not be empty")
        self.hosts, self.warnings = normalize_hosts(hosts, origins)
        self.dest = dest
        self.formats = [f for f in FORMATS if f in formats]
        unknown = sorted(set(formats) - set(FORMATS))
        if unknown:
            raise ReportError("formats: unknown %s (choose from %s)" % (", ".join(unknown), ", ".join(FORMATS)))
        if prometheus_file and "prometheus" not in self.formats:
            raise ReportError("prometheus_file is set but 'prometheus' is not in formats")
        self.prometheus_file = prometheus_file
        self.check_mode = check_mode
        self.run = build_run(self.hosts, str(title), parse_timestamp(run_started, now=now), run_kind=run_kind, phases=phases)

    def targets(self):
        out = [(fmt, os.path.join(self.dest, FILENAMES[fmt])) for fmt in self.formats]
        if self.prometheus_file:
            path = self.prometheus_file
            if os.path.isdir(path):
                path = os.path.join(path, FILENAMES["prometheus"])
            elif not path.endswith(".prom"):
                self.warnings.append("prometheus_file %s does not end in .prom; a textfile collector ignores it" % path)
            out.append(("prometheus", path))
        return out

    def _check_dirs(self, paths):
        if os.path.exists(self.dest) and not os.path.isdir(self.dest):
            raise ReportError("dest %s exists and is not a directory" % self.dest)
        for path in paths:
            parent = os.path.dirname(os.path.abspath(path))
            if parent != os.path.abspath(self.dest) and not os.path.isdir(parent):
                raise ReportError("the directory of %s does not exist" % path)
            if os.path.isdir(path):
                raise ReportError("%s is a directory" % path)

    def _write(self, files, texts):
        try:
            if not os.path.isdir(self.dest):
                os.makedirs(self.dest)
            for f in files:
                if f["changed"]:
                    write_atomic(f["path"], texts[f["format"]])
        except OSError as exc:
            where = getattr(exc, "filename", None) or self.dest
            raise ReportError("cannot write the report: %s: %s" % (where, exc.strerror or exc)) from exc

    def apply(self):
        """Write what changed (nothing in check mode); return the task's result, its diff under "diff"."""
        texts = render(self.run, self.formats)
        targets = self.targets()
        self._check_dirs([p for _f, p in targets])
        files, diffs = [], []
        for fmt, path in targets:
            text = texts[fmt]
            before = read_text(path)
            changed = before != text
            files.append({"format": fmt, "path": path, "changed": changed, "size": len(text.encode("utf-8"))})
            if changed:
                diffs.append(_diff(fmt, path, before, text))
        changed = any(f["changed"] for f in files)
        if changed and not self.check_mode:
            self._write(files, texts)
        return {
            "changed": changed,
            "files": files,
            "summary": self.run["summary"],
            "run_started": self.run["run_started"],
            "not_ready": [h["host"] for h in self.hosts if not h["ready"]],
            "diff": diffs,
        }
