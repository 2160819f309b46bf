# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Real compile-cache trees, real venvs with torch/triton wheels, real FlashInfer releases, and
real processes holding files.

The trees mimic what torch, Triton, FlashInfer and TVM FFI write (hash-named folders, .so
launchers, .cubin kernels, a locks folder); sizes and names are real on disk, contents are tiny.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from cuda_fixtures import UV
from wheelmaker import build_wheel

INDUCTOR_TREE = {
    "fxgraph/ab/fab12cd/entry": b"x" * 300,
    "aotautograd/cd/acd34/entry": b"y" * 200,
    "triton/0/KX3J4ABC/triton_poi_fused_add_0.cubin": b"\x7fELF" + b"\0" * 96,
    "triton/0/KX3J4ABC/triton_poi_fused_add_0.json": b'{"name": "triton_poi_fused_add_0"}',
    "triton/0/KX3J4ABC/__grp__triton_poi_fused_add_0.json": b"{}",
    "locks/fxgraph.lock": b"",
    "cu/cuabc123.py": b"# generated\n",
}

TRITON_TREE = {
    "QWERTY123/cuda_utils.so": b"\x7fELF" + b"\0" * 60,
    "QWERTY123/__triton_launcher.so": b"\x7fELF" + b"\0" * 40,
    "ZXCVB456/add_kernel.cubin": b"\0" * 128,
    "ZXCVB456/add_kernel.ptx": b".version 8.7\n",
}


# sglang's JIT kernels as TVM FFI's load_inline builds them: <module>_<16 hex digits of the hash
# of its sources and flags>/ holding the sources it wrote, build.ninja, its lock and the module.
TVM_FFI_TREE = {
    "sgl_kernel_jit_add_constant_4_3f9a0c1d2b4e5f60/main.cpp": b'#include "add_constant.cuh"\n',
    "sgl_kernel_jit_add_constant_4_3f9a0c1d2b4e5f60/cuda.cu": b"// generated\n",
    "sgl_kernel_jit_add_constant_4_3f9a0c1d2b4e5f60/build.ninja": b"ninja_required_version = 1.3\n",
    "sgl_kernel_jit_add_constant_4_3f9a0c1d2b4e5f60/lock": b"",
    "sgl_kernel_jit_add_constant_4_3f9a0c1d2b4e5f60/cuda_0.o": b"\x7fELF" + b"\0" * 60,
    "sgl_kernel_jit_add_constant_4_3f9a0c1d2b4e5f60/sgl_kernel_jit_add_constant_4.so": b"\x7fELF" + b"\0" * 80,
}


def flashinfer_tree(version, archs="90a"):
    """FlashInfer's JIT workspace as release ``version`` (0.5 on) lays it out under its cache root
    (flashinfer/jit/env.py, core.py, cpp_ext.py): ``<version>/<archs>/`` holding its log,
    ``cached_ops/<module>/`` (build.ninja, one object per source named <folder>_<stem>.cuda.o, the
    module), ``cached_ops/tmp/<module>.lock``, and ``generated/<uri>/`` sources."""
    ws = "%s/%s/" % (version, archs)
    uri = ("batch_prefill_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_head_dim_qk_128_"
           "head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False")
    return {
        ws + "flashinfer_jit.log": b"2026-01-01 00:00:00 - INFO - core.py:301 - flashinfer.jit: Finished building norm\n",
        ws + "cached_ops/norm/build.ninja": b"ninja_required_version = 1.3\n",
        ws + "cached_ops/norm/.ninja_log": b"# ninja log v6\n",
        ws + "cached_ops/norm/csrc_norm.cuda.o": b"\x7fELF" + b"\0" * 120,
        ws + "cached_ops/norm/csrc_flashinfer_norm_binding.cuda.o": b"\x7fELF" + b"\0" * 100,
        ws + "cached_ops/norm/norm.so": b"\x7fELF" + b"\0" * 200,
        ws + "cached_ops/tmp/norm.lock": b"",
        ws + "cached_ops/%s/%s.so" % (uri, uri): b"\x7fELF" + b"\0" * 150,
        ws + "generated/%s/batch_prefill_config.inc" % uri: b"#pragma once\n",
    }


# Prebuilt kernels FlashInfer downloads when flashinfer-cubin is not installed: kept by a clear.
FLASHINFER_CUBINS = {"cubins/8ec3a5f2/fmha/trtllm-gen/checksums.txt": b"0123abcd  kernel.cubin\n",
                     "cubins/8ec3a5f2/fmha/trtllm-gen/kernel.cubin": b"\0" * 64}

# Released flashinfer-python wheels, by version: the SHA-256 pip checks them against.
FLASHINFER_WHEELS = {
    "0.6.11.post1": "52c6dbd1262ff0d46dce0253996108e0c55e86faa7c25a1bed7072b31d23551a",  # the seed's
    "0.6.0": "e8be4fd2f9229a7faef411579439eebc6c6dc54893d62bd50498f374cd04cc16",
}
WHEEL_CACHE = os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "wheels")


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def flashinfer_wheel(version):
    """The released flashinfer-python ``version`` wheel (pure Python, 7 to 14 MB), downloaded once
    by pip from the package index with its hash pinned, kept in the checkout's .cache/wheels."""
    name = "flashinfer_python-%s-py3-none-any.whl" % version
    path = os.path.abspath(os.path.join(WHEEL_CACHE, name))
    if os.path.exists(path) and _sha256(path) == FLASHINFER_WHEELS[version]:
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(path))  # a worker of its own: the rename is atomic
    try:
        req = os.path.join(tmp, "req.txt")
        with open(req, "w") as f:
            f.write("flashinfer-python==%s --hash=sha256:%s\n" % (version, FLASHINFER_WHEELS[version]))
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--only-binary=:all:", "--require-hashes", "-r", req, "-d", tmp], check=True)
        os.replace(os.path.join(tmp, name), path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def flashinfer_release(venv):
    """The version an installed FlashInfer names its workspace by (flashinfer.__version__, from
    the _build_meta.py its wheel ships), read without importing it."""
    import glob
    import re
    [meta] = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "flashinfer", "_build_meta.py"))
    with open(meta, encoding="utf-8") as f:
        return re.search(r"^__version__ = [\"']([^\"']+)[\"']", f.read(), re.MULTILINE).group(1)


def install_wheel(venv, wheel):
    """Install a wheel file as it is (its dependencies, torch among them, not wanted here)."""
    subprocess.run([UV, "pip", "install", "--quiet", "--no-deps", "--python", os.path.join(venv, "bin", "python"), wheel],
                   check=True)


def uninstall(venv, *names):
    subprocess.run([UV, "pip", "uninstall", "--quiet", "--python", os.path.join(venv, "bin", "python")] + list(names),
                   check=True)


def make_tree(root, files):
    """Write ``{relpath: bytes}`` under root; return the total bytes written."""
    total = 0
    for rel, data in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        total += len(data)
    return total


def snapshot(root):
    """Everything under root, not following links: ``{relpath: ("f", bytes) | ("l", target) | ("d", None)}``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                out[rel] = ("l", os.readlink(path))
            elif os.path.isdir(path):
                out[rel] = ("d", None)
            else:
                with open(path, "rb") as f:
                    out[rel] = ("f", f.read())
    return out


def torch_wheels(outdir, torch="2.8.0+cu128", cuda="12.8", triton="3.4.0"):
    """A torch wheel with a real torch/version.py and a triton wheel, as PyTorch ships them."""
    version_py = "__version__ = '%s'\ndebug = False\ncuda: Optional[str] = %s\ngit_version = 'abc'\nhip = None\n" % (
        torch, "'%s'" % cuda if cuda else "None")
    build_wheel(outdir, "torch", torch, {"torch/__init__.py": "", "torch/version.py": version_py},
                requires=["triton==%s" % triton] if triton else ())
    if triton:
        build_wheel(outdir, "triton", triton, {"triton/__init__.py": "__version__ = '%s'\n" % triton})
    return outdir


def make_venv(path):
    subprocess.run([UV, "venv", "--quiet", "--python", sys.executable, path], check=True)
    return path


def install(venv, wheel_dir, *reqs):
    subprocess.run([UV, "pip", "install", "--quiet", "--python", os.path.join(venv, "bin", "python"),
                    "--no-index", "--find-links", wheel_dir] + list(reqs), check=True)


_HOLDER = r"""
import mmap, os, sys, time
path, how = sys.argv[1], sys.argv[2]
keep = []
if how == "open":
    keep.append(open(path, "rb"))
elif how == "map":
    with open(path, "rb") as f:
        keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))  # the fd closes, the mapping stays
elif how == "cwd":
    os.chdir(path)
print("ready", flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def holder(path, how="open"):
    """A real process that holds ``path`` open, mapped, or as its working directory."""
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, path, how], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("holder process did not start: %r" % line)
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()


class Swapper:
    """A real process of ``uid`` exchanging (renameat2 RENAME_EXCHANGE) each pair of paths under
    ``cwd`` in a loop until stopped. Forked, then setuid: the user's own Python may be unreadable."""

    def __init__(self, cwd, pairs, uid, gid):
        ready_r, ready_w = os.pipe()
        out_r, out_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the test
            try:
                os.close(ready_r)
                os.close(out_r)
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                os.chdir(cwd)
                _swap_loop([(a.encode(), b.encode()) for a, b in pairs], ready_w, out_w)
            finally:
                os._exit(1)
        os.close(ready_w)
        os.close(out_w)
        self.pid, self._out = pid, out_r
        ready = os.read(ready_r, 16)
        os.close(ready_r)
        if ready != b"ready":
            os.waitpid(pid, 0)
            raise RuntimeError("swapper did not start")
        self.swaps = self.failed = None

    def stop(self):
        """Stop the loop; ``(swaps, failed)`` exchanges."""
        if self.swaps is None:
            os.kill(self.pid, signal.SIGTERM)
            data = b""
            while True:
                chunk = os.read(self._out, 64)
                if not chunk:
                    break
                data += chunk
            os.close(self._out)
            os.waitpid(self.pid, 0)
            self.swaps, self.failed = (int(x) for x in data.split())
        return self.swaps, self.failed


def _swap_loop(pairs, ready_w, out_w):
    libc = ctypes.CDLL(None, use_errno=True)
    counts = [0, 0]

    def stop(*_):
        os.write(out_w, b"%d %d" % tuple(counts))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    at_fdcwd, rename_exchange = -100, 2
    os.write(ready_w, b"ready")
    os.close(ready_w)
    while True:
        for a, b in pairs:
            counts[0 if libc.renameat2(at_fdcwd, a, at_fdcwd, b, rename_exchange) == 0 else 1] += 1


def listing(root):
    """A tree's shape without reading it (system trees are large): ``{relpath: (type, size, mtime_ns)}``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return out
