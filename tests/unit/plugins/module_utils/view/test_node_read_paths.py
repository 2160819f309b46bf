# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node read as it reads a container: every file through the container's root handle.

A container's tree is laid out in a directory (a REAL venv made by uv with REAL wheels, its
interpreter a file of the container's own, a job log, caches, /etc/passwd), a real process
stands for its job, and the whole readiness read runs in a view of it (view/_view.run) while
every path-taking call of os and builtins is watched: none may come from the collection's
readers (a path given to os.* resolves on the node, not in the container), only fs/_root's
handle-relative calls and the view's reads of the node's own /proc. Modules reachable from the
node read never call the C library's account lookups either (read from their source)."""

from __future__ import annotations

import ast
import builtins
import os
import shutil
import subprocess
import sys
import threading

import pytest
from cachetree import install, make_venv, torch_wheels
from importgraph import PACKAGE, collection_imports, module_files
from wheelmaker import build_wheel

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox._node import _no_tool, _refuse_run
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options, _readiness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _view

UTILS = os.path.dirname(os.path.dirname(_root.__file__))
# The view reads the node's /proc itself (by design); fs/_root is where paths become handles.
ALLOWED = (os.path.join(UTILS, "view", "_view.py"), os.path.join(UTILS, "fs", "_root.py"))
WATCHED = ("open", "stat", "lstat", "listdir", "scandir", "readlink", "access", "chdir", "mkdir", "unlink", "rmdir", "rename")


@pytest.fixture(scope="module")
def container(tmp_path_factory):
    """A container's root: a venv whose torch is CUDA 12.8 with a CUDA-13 wheel mixed in."""
    top = tmp_path_factory.mktemp("ct")
    root = top / "root"
    wheels = str(top / "wheels")
    os.makedirs(wheels)
    torch_wheels(wheels, torch="2.8.0+cu128", cuda="12.8", triton="3.4.0")
    build_wheel(wheels, "nvidia-nccl-cu13", "2.28.9", {"nvidia/nccl/lib/libnccl.so.2": b"\x7fELF fixture nccl 13\n"})
    venv = make_venv(str(root / "opt" / "venv"))
    install(venv, wheels, "torch==2.8.0+cu128", "triton==3.4.0", "nvidia-nccl-cu13==2.28.9")
    # The venv's interpreter is the container's own file, as in a real container (uv linked the host's).
    os.makedirs(root / "usr" / "bin")
    shutil.copyfile("/bin/true", root / "usr" / "bin" / "python3")
    os.chmod(root / "usr" / "bin" / "python3", 0o755)
    for name in os.listdir(os.path.join(venv, "bin")):
        if name.startswith("python"):
            os.unlink(os.path.join(venv, "bin", name))
            os.symlink("/usr/bin/python3", os.path.join(venv, "bin", name))
    os.makedirs(root / "etc")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\ntrainer:x:1000:1000::/home/trainer:/bin/sh\n")
    (root / "etc" / "nsswitch.conf").write_text("passwd: /../tmp/evil files\n")
    os.makedirs(root / "home" / "trainer" / ".triton" / "cache" / "ABCDEF0123456789")
    os.makedirs(root / "train")
    (root / "train" / "train.log").write_text("step 10 | 19800 tok/s\n")
    (root / "opt" / "requirements.txt").write_text("torch==2.8.0+cu128\ntriton==3.4.0\n")
    os.makedirs(root / "dev")
    (root / "dev" / "nvidia0").write_text("")
    return root


@pytest.fixture
def job():
    """A real process standing for the container's job (its PID 7 there)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "train_dflash.py"])
    yield proc
    proc.kill()
    proc.wait()


def watched_calls(monkeypatch):
    """Every call of a path-taking os function (or builtins.open) with a path and no dir_fd, made
    in a thread inside a root, with the collection file that made it (the innermost of its frames)."""
    calls = []

    def wrap(module, name):
        real = getattr(module, name)

        def call(*args, **kwargs):
            path = args[0] if args else kwargs.get("path", kwargs.get("file"))
            if _root.current() is not None and isinstance(path, (str, bytes)) and kwargs.get("dir_fd") is None:
                frame = sys._getframe(1)
                while frame is not None and not frame.f_code.co_filename.startswith(UTILS):
                    frame = frame.f_back
                where = frame.f_code.co_filename if frame is not None else "?"
                if where not in ALLOWED:
                    calls.append((name, path, "%s:%d" % (os.path.relpath(where, UTILS), frame.f_lineno if frame else 0)))
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, call)

    for name in WATCHED:
        wrap(os, name)
    wrap(builtins, "open")
    return calls


def test_the_node_read_opens_every_file_of_a_container_through_its_root(container, job, monkeypatch):
    root_fd = os.open(str(container), os.O_RDONLY | os.O_DIRECTORY)
    proc_fd = os.open("/proc/%d" % job.pid, os.O_RDONLY | os.O_DIRECTORY)
    init_fd = os.open("/proc/%d" % os.getpid(), os.O_RDONLY | os.O_DIRECTORY)
    privileged = _view.parse_id_map("0 0 4294967295\n")
    view = _view.ContainerView(321, os.getpid(), root_fd, {1: init_fd, 7: proc_fd}, {os.getpid(): 1, job.pid: 7}, privileged, privileged, None)
    options = dict((name, spec.get("default")) for name, spec in _options.ARGUMENT_SPEC.items())
    options.update(venv="/opt/venv", job_patterns=[r"train_dflash\.py"], job_users=["trainer", "root"], job_log="/train/train.log",
                   baseline="/opt/requirements.txt", verify_files=True, cache_user="trainer", evidence_cache=False,
                   device_patterns=["/dev/nvidia*"], read_timeout=60)
    given = {"gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "memory_used_mib": 40960, "memory_total_mib": 143771,
                       "utilization_pct": 90}],
             "apps": [{"gpu_uuid": "GPU-0", "pid": 7, "used_memory_mib": 40960, "name": "python3"}], "backend": "nvidia-smi",
             "seconds": 0.0}
    calls = watched_calls(monkeypatch)
    try:
        result = _view.run(view, lambda: _readiness.read(options, _refuse_run, _no_tool, gpu_reading=given), 120)
    finally:
        monkeypatch.undo()
        view.close()
    assert calls == []
    # It read the container: its venv (the CUDA-13 wheel found), its job, its log, its caches.
    checks = dict((c["name"], c) for c in result["checks"])
    assert "nvidia-nccl-cu13 2.28.9 (CUDA 13)" in checks["venv_clean"]["summary"], checks["venv_clean"]
    assert checks["packages"]["ok"], checks["packages"]
    assert [p["pid"] for p in result["processes"]["processes"]] == [7]
    assert result["liveness"]["state"] == "running" and result["liveness"]["log"]["exists"]
    assert any(c["name"] == "triton" and c["path"] == "/home/trainer/.triton/cache" and c["exists"]
               for c in result["torch_cache"]["caches"]), result["torch_cache"]
    assert checks["gpu_idle"]["summary"].startswith("held by the inventory's own job (pid 7, started "), checks["gpu_idle"]


def test_a_reader_that_opens_a_path_itself_is_caught(container, monkeypatch):
    """The watch above is no formality: a reader that asks os for a path (here venv/_venv, given
    os.path's functions instead of fs/_root's) is seen, and named."""
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _venv

    class Bypass(object):
        def __getattr__(self, name):
            return getattr(os.path, name, None) or getattr(_root, name)

    root_fd = os.open(str(container), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(321, 1, root_fd, {}, {}, [], [], None)
    options = dict((name, spec.get("default")) for name, spec in _options.ARGUMENT_SPEC.items())
    options.update(venv="/opt/venv", evidence_cache=False, caches=False)
    monkeypatch.setattr(_venv, "_root", Bypass())
    calls = watched_calls(monkeypatch)
    try:
        result = _view.run(view, lambda: _readiness.read(options, _refuse_run, _no_tool), 60)
    finally:
        monkeypatch.undo()
        view.close()
    assert ("stat", "/opt/venv", "venv/_venv.py:%d" % _line(_venv.venv_python, "_root.exists(venv)")) in calls
    # And on the node, that path is not the container's venv: the read fails as it should not.
    assert result["cuda_contamination"]["msg"] == "venv /opt/venv does not exist"


def _line(function, text):
    import inspect

    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


# --------------------------------------------------------------------------- from the source

# What runs in a view's thread: the readiness read and the view (proxmox/_node orchestrates on the
# node and hands each container's read to them).
VIEW_READ = (PACKAGE + ".readiness._readiness", PACKAGE + ".view._view")
# The C library's lookups that read a host's files named by its configuration (NSS: passwd,
# group; locales), and what changes a process's root or namespaces.
FORBIDDEN_MODULES = ("pwd", "grp", "locale", "getpass", "spwd")
FORBIDDEN_CALLS = ("chroot", "fchdir", "unshare", "setns", "pivot_root", "expanduser", "getlogin")
# view/_accounts is where a host read as itself asks pwd; a view's thread never reaches that branch.
ACCOUNTS = PACKAGE + ".view._accounts"


def reachable(starts):
    files = module_files()
    graph = {}
    for name, path in files.items():
        with open(path, encoding="utf-8") as handle:
            top, late = collection_imports(handle.read(), files, path)
        graph[name] = top | late
    seen, todo = set(), list(starts)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.get(name, ()))
    return dict((name, files[name]) for name in sorted(seen))


def test_no_module_the_node_read_reaches_asks_the_c_library_for_accounts_or_changes_its_root():
    modules = reachable(VIEW_READ)
    assert PACKAGE + ".venv._dist" in modules and ACCOUNTS in modules and PACKAGE + ".cache._locate" in modules
    found = []
    for name, path in modules.items():
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                bad = [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom):
                bad = [node.module] if (node.module or "").split(".")[0] in FORBIDDEN_MODULES else []
            elif isinstance(node, ast.Attribute):
                bad = [node.attr] if node.attr in FORBIDDEN_CALLS else []
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                bad = [node.value] if node.value in ("chroot", "setns", "unshare", "pivot_root") else []
            else:
                bad = []
            if bad and not (name == ACCOUNTS and bad == ["pwd"]):
                found.append("%s:%d %s" % (name[len(PACKAGE) + 1:], node.lineno, ", ".join(bad)))
    assert found == []


def test_the_source_check_sees_each_forbidden_form(tmp_path):
    source = ("import pwd\nfrom grp import getgrnam\nimport locale as l\n"
              "def f(os, libc):\n    os.chroot('.')\n    libc.unshare(0x200)\n    os.path.expanduser('~')\n")
    tree = ast.parse(source)
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names if a.name in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in FORBIDDEN_MODULES:
            names.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_CALLS:
            names.append(node.attr)
    assert sorted(names) == ["chroot", "expanduser", "grp", "locale", "pwd", "unshare"]


def test_a_view_s_read_runs_in_threads_that_carry_its_root():
    """read() starts threads: each reads inside the root of the thread that started it."""
    seen = []
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    root = _root.Root(fd)
    try:
        with _root.inside(root):
            thread = threading.Thread(target=_root.carried(lambda: seen.append(_root.current())))
            thread.start()
            thread.join()
            bare = threading.Thread(target=lambda: seen.append(_root.current()))
            bare.start()
            bare.join()
    finally:
        os.close(fd)
    assert seen == [root, None]
