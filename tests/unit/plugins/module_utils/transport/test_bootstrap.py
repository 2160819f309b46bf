# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""transport/_bootstrap: the bootstrap a container's Python runs, fed over stdin, in a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from importgraph import collection_imports, module_files

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _readiness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.transport import _bootstrap

ARGS = {"job_patterns": [], "job_users": [], "require_gpu": False, "threshold_mib": 64, "nvidia_smi": "/nonexistent/nvidia-smi",
        "command_timeout": 5.0, "device_patterns": ["/dev/nvidia*"], "venv": None, "expected_cuda": None, "baseline": None,
        "verify_files": False, "caches": True, "cache_user": None, "cache_environment": None, "allow_running_job": False}


def run_bootstrap(data):
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", _bootstrap.LAUNCHER], input=data, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return _bootstrap.parse_output(proc.stdout.decode())


# What the reads really import, asked of a fresh interpreter rather than of the bootstrap's own
# reading of import lines: the payload must hold exactly these collection modules.
_IMPORTED = """
import sys
import {reader}, {record}, {entry}
print("\\n".join(sorted(n for n in sys.modules if n.startswith("{package}.") and not n.endswith("__init__")
                         and n.rsplit(".", 1)[1].startswith("_"))))
"""


def test_the_payload_holds_exactly_what_the_reads_import():
    sources = _bootstrap.module_sources(_bootstrap.loaded_source)
    code = _IMPORTED.format(reader=_bootstrap.READER, record=_bootstrap.RECORD, entry=_bootstrap.ENTRY,
                            package=_bootstrap.PACKAGE)
    out = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=60, check=True, env={"PYTHONPATH": os.pathsep.join(sys.path)})
    assert sorted(sources) == out.stdout.split()
    assert {_bootstrap.READER, _bootstrap.RECORD, _bootstrap.ENTRY} <= set(sources)
    # Nothing of Ansible travels or is needed in the container.
    assert not any("from ansible.module_utils" in src or "import ansible." in src for src in sources.values())


def needed(names, get_source):
    """``names`` and every module_util they import, at the top or inside a function, read with ast."""
    known = module_files()
    found, todo = set(), list(names)
    while todo:
        name = todo.pop()
        if name not in found:
            found.add(name)
            top, late = collection_imports(get_source(name), known, name)
            todo.extend(top | late)
    return found


def test_the_list_holds_every_module_a_listed_file_imports_and_no_other():
    listed = sorted(_bootstrap.PACKAGE + "." + name for name in _bootstrap.TRAVELS)
    assert len(set(listed)) == len(listed) and set(listed) <= set(module_files())
    for name in listed:  # each listed file's own imports are listed
        top, late = collection_imports(_bootstrap.loaded_source(name), module_files(), name)
        assert top | late <= set(listed), "%s imports %s, not in TRAVELS" % (name, sorted((top | late) - set(listed)))
    roots = [_bootstrap.READER, _bootstrap.RECORD, _bootstrap.ENTRY]
    assert sorted(needed(roots, _bootstrap.loaded_source)) == listed  # and nothing travels that no read needs
    assert sorted(_bootstrap.module_sources(_bootstrap.loaded_source)) == listed


def test_bytecode_or_source_the_result_is_the_one_read_gives():
    entries, blob = _bootstrap.module_blobs(_bootstrap.module_sources(_bootstrap.loaded_source))
    same = _bootstrap.payload(entries, blob, ARGS, False)
    boot, head_line, rest = same.split(b"\n", 2)
    assert json.loads(boot) == _bootstrap.BOOTSTRAP  # the launcher's first line: the bootstrap itself
    head = json.loads(head_line)
    assert head["entry"] == _bootstrap.ENTRY and head["check_mode"] is False
    head["magic"] = "00000000"  # another Python version: the container compiles the sources itself
    other = boot + b"\n" + json.dumps(head).encode() + b"\n" + rest
    here = _readiness.read(dict(ARGS), _bootstrap._run, _bootstrap._which)
    for data in (same, other):
        got = run_bootstrap(data)
        assert got["checks"] == here["checks"] and got["ready"] is True
        assert got["checks"][0]["summary"].startswith("no usable GPU (")


def test_a_crash_in_the_container_is_a_result_not_a_traceback():
    entries, blob = _bootstrap.module_blobs(_bootstrap.module_sources(_bootstrap.loaded_source))
    broken = dict(ARGS)
    del broken["threshold_mib"]  # read() needs every option: a KeyError inside the container
    got = run_bootstrap(_bootstrap.payload(entries, blob, broken, False))
    assert got["failed"] is True and got["msg"] == "readiness failed in the container: KeyError: 'threshold_mib'"
    assert "Traceback" in got["exception"]


def test_launcher_argv_is_a_list_with_the_launcher_as_one_word():
    assert _bootstrap.launcher_argv("/usr/bin/python3") == ["/usr/bin/python3", "-I", "-B", "-c", _bootstrap.LAUNCHER]
    assert "\n" not in _bootstrap.LAUNCHER  # one line in ps


def test_a_loader_that_gives_bytes_still_gives_text(monkeypatch):
    """Ansible's collection loader (the controller's, and AnsiballZ's) returns a source as bytes."""
    import types

    class BytesLoader:
        def get_source(self, name):
            return "VALUE = 'é'\n".encode("utf-8")

    module = types.ModuleType("gpufleet_transport_probe")
    module.__loader__ = BytesLoader()
    monkeypatch.setitem(sys.modules, "gpufleet_transport_probe", module)
    assert _bootstrap.loaded_source("gpufleet_transport_probe") == "VALUE = 'é'\n"
