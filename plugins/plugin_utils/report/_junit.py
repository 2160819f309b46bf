# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run as JUnit XML: one <testsuite>, a <testcase> per host and check.

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import check_state, started

# XML 1.0 cannot carry these characters even escaped.
_XML_INVALID = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _x(value):
    return _XML_INVALID.sub("\ufffd", "" if value is None else str(value))


def _classname(h):
    parts = ["gpufleet"]
    if h["node"]:
        parts.append(h["node"])
    parts.append(h["host"])
    return ".".join(p.replace(".", "_") for p in parts)


def _case(suite, h, name):
    return ET.SubElement(suite, "testcase", {"classname": _x(_classname(h)), "name": _x(name), "time": "0"})


def _text(parent, tag, text, attrs=None):
    el = ET.SubElement(parent, tag, attrs or {})
    el.text = _x(text)


def _findings(check):
    """gpu_healthy's findings of severity fail, one line each with what to do."""
    lines = ["GPU %s: %s: %s -> %s" % (g.get("index"), f["code"], f["what"], f["action"])
             for g in check.get("gpus", []) for f in g.get("findings", []) if f.get("severity") == "fail"]
    lines += ["%s: %s -> %s" % (f["code"], f["what"], f["action"]) for f in check.get("findings", []) if f.get("severity") == "fail"]
    return "".join("\n" + line for line in lines)


def _libraries(check):
    """job_libraries' wrong mappings, one line each: the process, the file, its package, why."""
    return "".join("\npid %s %s: %s (%s): %s" % (
        lib["pid"], lib["comm"], lib["path"], "%s %s" % (lib["package"], lib["package_version"] or "") if lib["package"]
        else "no package of the venv", "; ".join(lib["reasons"])) for lib in check.get("libraries", []))


def render_junit(run):
    """An unreachable host is an error; a failed check a failure; a warning passes (noted in system-out)."""
    suite = ET.Element("testsuite")
    tests = failures = errors = 0
    for h in run["hosts"]:
        if h["error"]:
            tests += 1
            errors += 1
            _text(_case(suite, h, "reachable"), "error", h["error"], {"message": _x(h["error"]), "type": "error"})
        if h["repair_error"]:
            tests += 1
            failures += 1
            _text(_case(suite, h, "repair"), "failure", "the repair of %s failed: %s" % (h["host"], h["repair_error"]),
                  {"message": _x(h["repair_error"]), "type": "fail"})
        for c in h["checks"]:
            tests += 1
            tc = _case(suite, h, c["name"])
            state = check_state(c)
            if state == "fail":
                failures += 1
                _text(tc, "failure", "%s on %s: %s%s%s" % (c["name"], h["host"], c["summary"], _findings(c), _libraries(c)),
                      {"message": _x(c["summary"]), "type": "fail"})
            elif state == "warn":
                _text(tc, "system-out", "warning: %s" % c["summary"])
            elif c["summary"]:
                _text(tc, "system-out", c["summary"])
    for k, v in (("name", _x(run["title"])), ("tests", str(tests)), ("failures", str(failures)), ("errors", str(errors)),
                 ("skipped", "0"), ("time", "0"), ("timestamp", started(run).strftime("%Y-%m-%dT%H:%M:%S")),
                 ("hostname", "controller")):
        suite.set(k, v)
    root = ET.Element("testsuites", {"name": _x(run["title"]), "tests": str(tests), "failures": str(failures),
                                     "errors": str(errors), "time": "0"})
    root.append(suite)
    _indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _indent(elem, level=0):
    # By hand rather than ElementTree.indent, so the file's layout stays exactly what it has been.
    pad = "\n" + "  " * level
    if len(elem):
        if not (elem.text or "").strip():
            elem.text = pad + "  "
        for child in elem:
            _indent(child, level + 1)
        if not (child.tail or "").strip():
            child.tail = pad
    if level and not (elem.tail or "").strip():
        elem.tail = pad
