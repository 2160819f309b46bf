# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""A transport: run the readiness reads in a target's own Python, the code sent over stdin.

The target's Python is started with a one-line launcher (launcher_argv(), LAUNCHER) and reads,
from stdin (payload()), a small bootstrap program (BOOTSTRAP), this package's module_utils that
the reads need (TRAVELS, a list kept by hand and checked by a unit test), the options and, when
the target's Python is the sender's version, the bytecode already compiled (so that no target
compiles them again). The bootstrap imports them from memory
(nothing is written on the target), calls _readiness.read() exactly as the readiness module does,
and prints the result as one JSON line (parse_output(), outcome()).

Two senders use it: the readiness module's action, over the task's own connection, and
node_readiness on a Proxmox VE node, which starts it in each container through ``pct exec`` or
``lxc-attach`` (proxmox/_node.py). This is what the connection does for every Ansible module
anyway, minus what Ansible adds per module call: the AnsiballZ payload, the import of
ansible.module_utils.basic and the compilation of every shipped source.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only; the
half that runs on the target (container_main and below) imports nothing outside the standard
library and _readiness.
"""

from __future__ import annotations

import json
import os
import sys

PACKAGE = "ansible_collections.gpufleet.hygiene.plugins.module_utils"
ENTRY = PACKAGE + ".transport._bootstrap"
READER = PACKAGE + ".readiness._readiness"
RECORD = PACKAGE + ".readiness._record"
RESULT_MARK = "GPUFLEET-READINESS "
# Where the readiness module would look for nvidia-smi (AnsibleModule.get_bin_path: PATH, then these).
SBIN_DIRS = ("/sbin", "/usr/sbin", "/usr/local/sbin")

# What the target's Python is started with (python3 -I -B -c LAUNCHER): one short line, so that
# the process reads well in ps; it runs BOOTSTRAP, the first line of its stdin (JSON).
LAUNCHER = "import sys, json; exec(json.loads(sys.stdin.buffer.readline()))"

# The program each target runs: read the header line and the modules from the rest of stdin,
# import them from memory, call ENTRY's container_main(header).
BOOTSTRAP = r"""
import sys, json, marshal
from importlib.machinery import ModuleSpec
from importlib.util import MAGIC_NUMBER
def _boot():
    data = sys.stdin.buffer.read()
    cut = data.index(b"\n")
    head = json.loads(data[:cut].decode("utf-8"))
    pos, codes = cut + 1, {}
    same = MAGIC_NUMBER.hex() == head["magic"]
    for name, n_src, n_code in head["modules"]:
        src, code = data[pos:pos + n_src], data[pos + n_src:pos + n_src + n_code]
        pos += n_src + n_code
        codes[name] = (src, code if same else b"")
    packages = set()
    for name in codes:
        parts = name.split(".")
        packages.update(".".join(parts[:i]) for i in range(1, len(parts)))

    class Finder(object):
        # A meta path finder and loader by duck typing: importlib.abc would import
        # importlib.resources, a fifth of this program's start-up.
        def find_spec(self, name, path=None, target=None):
            if name in codes or name in packages:
                return ModuleSpec(name, self, is_package=name in packages)
            return None
        def create_module(self, spec):
            return None
        def exec_module(self, module):
            name = module.__name__
            if name in packages:
                module.__path__ = []
                return
            src, code = codes[name]
            module.__file__ = "<gpufleet.hygiene>/" + name.replace(".", "/") + ".py"
            exec(marshal.loads(code) if code else compile(src, module.__file__, "exec"), module.__dict__)

    sys.meta_path.insert(0, Finder())
    __import__(head["entry"], fromlist=["container_main"]).container_main(head)
_boot()
"""

# The module_utils that travel into a target (below PACKAGE): READER, RECORD and ENTRY, and
# every module_util any of them imports, at its top or inside a function, named here by hand.
# tests/unit/plugins/module_utils/transport/test_bootstrap.py reads their imports (Python's ast)
# and fails on a module missing here or one here that no listed file imports.
TRAVELS = (
    "cache._clear",
    "cache._fingerprint",
    "cache._locate",
    "cache._marker",
    "cache._roots",
    "cache._torch_cache",
    "common._errors",
    "common._waits",
    "fs._files",
    "fs._root",
    "fs._tail",
    "fs._tree",
    "gpu._findings",
    "gpu._health",
    "gpu._nvml",
    "gpu._query",
    "gpu._reading",
    "gpu._smi",
    "gpu._state",
    "gpu._xid",
    "gpu._xml",
    "job._libraries",
    "job._liveness",
    "job._throughput",
    "proc._ordinary",
    "proc._proc",
    "proc._scope",
    "proc._terminate",
    "readiness._checks",
    "readiness._options",
    "readiness._readiness",
    "readiness._record",
    "transport._bootstrap",
    "venv._contamination",
    "venv._cuda",
    "venv._dist",
    "venv._elf",
    "venv._evcache",
    "venv._inventory",
    "venv._lockfile",
    "venv._names",
    "venv._pkgtool",
    "venv._restore",
    "venv._venv",
    "view._accounts",
    "view._cgroup",
)


# ----------------------------------------------------------------------------- on the sender


def module_sources(get_source, names=TRAVELS):
    """{module name: source} of the modules that travel (``names``, below PACKAGE);
    get_source(name) returns a module's source."""
    return dict((PACKAGE + "." + name, get_source(PACKAGE + "." + name)) for name in names)


def loaded_source(name):
    """The source of an importable module as text, from its loader (a file, or the zip Ansible ships)."""
    __import__(name)
    module = sys.modules[name]
    source = module.__loader__.get_source(name) if hasattr(module.__loader__, "get_source") else None
    if source is None:
        with open(module.__file__, "rb") as handle:
            source = handle.read()
    # Ansible's collection loader (on the controller, and in AnsiballZ) gives bytes.
    return source.decode("utf-8") if isinstance(source, bytes) else source


def module_blobs(sources):
    """The modules part of the payload: (index entries, bytes). Each module is sent as source
    and as this Python's bytecode; a target whose Python has another magic number compiles
    the source instead."""
    import marshal

    entries, parts = [], []
    for name in sorted(sources):
        src = sources[name].encode("utf-8")
        code = marshal.dumps(compile(src, "<gpufleet.hygiene>/" + name.replace(".", "/") + ".py", "exec"))
        entries.append([name, len(src), len(code)])
        parts += [src, code]
    return entries, b"".join(parts)


def payload(entries, blob, args, check_mode, expand=(), brief=False, gpu_reading=None):
    """The launcher's stdin: BOOTSTRAP as one JSON line, one JSON header line, then the modules.
    expand: the options of type path that the target expands (~, $VAR) itself, as AnsibleModule
    would there; brief: return _record.brief() of the reading; gpu_reading: the node's reading of
    its GPUs for this target (node_readiness), read instead of the target's nvidia-smi."""
    import importlib.util

    head = {"magic": importlib.util.MAGIC_NUMBER.hex(), "modules": entries, "entry": ENTRY,
            "args": args, "check_mode": bool(check_mode), "expand": list(expand), "brief": bool(brief)}
    if gpu_reading is not None:
        head["gpu_reading"] = gpu_reading
    return json.dumps(BOOTSTRAP).encode("utf-8") + b"\n" + json.dumps(head).encode("utf-8") + b"\n" + blob


def launcher_argv(python):
    """The argv that starts the bootstrap in the target's Python (an argv list: no shell)."""
    # -I: no PYTHON* variables, no user site; -B: no bytecode written. Site packages stay (the
    # readiness module imports the NVML bindings from there when a target has them).
    return [python, "-I", "-B", "-c", LAUNCHER]


def explain_exit(where, python, rc, stdout, stderr):
    """A message for a bootstrap that gave no result once it was started (its transport worked)."""
    err = stderr.strip()
    if rc in (126, 127) or "No such file or directory" in err and python in err:
        return ("no Python at %s in %s (exit status %s): install python3 there, or name the interpreter "
                "with ansible_python_interpreter" % (python, where, rc))
    tail = err[-2000:] or stdout.strip()[-2000:] or "no output"
    return "reading %s failed (exit status %s): %s" % (where, rc, tail)


def outcome(where, rc, stdout, why, as_brief=False):
    """The reading a bootstrap printed, or a failure: why() says why there is none; a result that
    is not a reading (whatever the target printed) is refused."""
    result = parse_output(stdout) if rc == 0 else None
    if result is None:
        return {"changed": False, "failed": True, "rc": rc, "msg": why()}
    if not well_formed(result, as_brief):
        return {"changed": False, "failed": True, "rc": rc, "msg": "%s gave a result that is not a reading (%s)" % (where, type(result).__name__)}
    return result


def parse_output(stdout):
    """The result line the bootstrap printed, or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            try:
                return json.loads(line[len(RESULT_MARK):])
            except ValueError:
                return None
    return None


def well_formed(result, as_brief=False):
    """A reading as read() gives it (as_brief: as brief() gives it), or a failure as container_main gives it."""
    if not isinstance(result, dict):
        return False
    if result.get("failed") is True:
        return isinstance(result.get("msg"), str)
    if as_brief:
        lists = ("gpus", "contaminants", "caches")
        parts_ok = all(isinstance(result.get(name), list) for name in lists)
    else:
        parts = ("processes", "gpu_state", "cuda_contamination", "pip_inventory", "torch_cache")
        parts_ok = all(isinstance(result.get(name), dict) for name in parts)
    return (parts_ok and isinstance(result.get("checks"), list)
            and all(isinstance(c, dict) for c in result["checks"]) and isinstance(result.get("ready"), bool)
            and isinstance(result.get("running_job"), bool) and isinstance(result.get("warnings", []), list))


# ----------------------------------------------------------------------------- on the target


def _run(argv):
    """AnsibleModule.run_command's answer for an argv list: (rc, stdout, stderr) as text."""
    import subprocess

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    except OSError as exc:
        return 2, "", str(exc)
    return proc.returncode, proc.stdout.decode("utf-8", "surrogateescape"), proc.stderr.decode("utf-8", "surrogateescape")


def _which(name):
    """AnsibleModule.get_bin_path's answer: PATH, then the sbin directories; None when absent."""
    import shutil

    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    dirs += [d for d in SBIN_DIRS if d not in dirs]
    return shutil.which(name, path=os.pathsep.join(dirs))


def container_main(head):
    """The bootstrap's entry on the target: read, print one result line."""
    try:
        args = head["args"]
        for name in head.get("expand", ()):
            if isinstance(args.get(name), str):
                args[name] = os.path.expanduser(os.path.expandvars(args[name]))
        reader = __import__(READER, fromlist=["read"])
        result = reader.read(args, _run, _which, head["check_mode"], head.get("gpu_reading"))
        if head.get("brief"):
            result = __import__(RECORD, fromlist=["brief"]).brief(result, args)
    except Exception as exc:  # noqa: BLE001 - reported to the sender as this target's failure, with the traceback
        import traceback  # only now: a read that succeeds never needs it

        result = {"changed": False, "failed": True, "msg": "readiness failed in the container: %s: %s" % (type(exc).__name__, exc),
                  "exception": traceback.format_exc()}
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
