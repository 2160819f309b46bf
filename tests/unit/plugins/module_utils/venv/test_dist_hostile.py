# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a container's user controls, read as root: REAL venvs (uv, pip), REAL FIFOs, links to
/dev/zero, huge files, and interpreters that are another user's scripts. Each read returns
within a bound with a problem; nothing of the venv runs as root.

Mostly venv/_venv (the venv resolved), venv/_dist (METADATA and RECORD read) and venv/_inventory
(the interpreter asked as its owner), reached through the readers that use it: venv/_contamination's scan and removal (the
cuda_contamination module), pip_inventory, and readiness/_readiness's read_timeout. The file
layer under them alone (fs/_files) is tested in fs/test_files.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time

import pytest
from cuda_fixtures import SEED_BASE, UV, make_venv, pins
from hostilefiles import replace, timed

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _files
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _options, _readiness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _inventory, _venv
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination
from ansible_collections.gpufleet.hygiene.plugins.modules import cuda_contamination, pip_inventory

pytestmark = pytest.mark.slow

NOBODY = 65534


def install(uv, venv, wheel_dir, names):
    """As cuda_fixtures.install, with the files copied: these tests change and chown installed
    files, which uv would otherwise hard-link from its cache."""
    subprocess.run([uv, "pip", "install", "--quiet", "--link-mode", "copy", "--python", os.path.join(venv, "bin", "python"),
                    "--no-index", "--find-links", wheel_dir] + list(names), check=True)


def run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(autouse=True)
def uv_on_path(monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(UV) + os.pathsep + os.environ.get("PATH", ""))


@pytest.fixture
def seeded(tmp_path, seed_wheels):
    """A real venv with torch cu128, its CUDA 12 family and one CUDA 13 contaminant."""
    venv = make_venv(str(tmp_path / "venv"), UV)
    install(UV, venv, seed_wheels, pins(SEED_BASE) + ["sglang-kernel==0.4.2.post2+cu130"])
    return venv, _venv.venv_site_dirs(venv)[0]


def dist_info(site, key):
    [name] = [n for n in os.listdir(site) if n.lower().startswith(key + "-") and n.endswith(".dist-info")]
    return os.path.join(site, name)


def rewrite(path, change):
    """The file at ``path`` replaced by a new one holding ``change(its bytes)``. Never written in
    place: uv hard-links installed files from its cache, and a write through the link would
    change every later install of that wheel."""
    with open(path, "rb") as f:
        data = f.read()
    os.remove(path)
    with open(path, "wb") as f:
        f.write(change(data))


# ------------------------------------------------------------------ through the venv's readers


@pytest.mark.parametrize("how", ["fifo", "/dev/zero"])
@pytest.mark.parametrize("which", ["METADATA", "RECORD"])
def test_hostile_metadata_or_record_is_a_problem_not_a_hang(seeded, which, how):
    venv, site = seeded
    info = dist_info(site, "sglang_kernel")
    replace(os.path.join(info, which), how)
    result, _seconds = timed(lambda: Contamination(venv, run).scan()[0])
    name = os.path.basename(info) + "/" + which
    assert [p for p in result["problems"] if p.startswith(name)], result["problems"]
    assert result["reference"]["cuda_version"] == "12.8"
    inv, _seconds = timed(_inventory.inventory, venv, None, None, True, run)
    assert any(p.startswith(name) for p in inv["problems"])


def test_fifo_as_a_shared_object_listed_in_record(seeded):
    """DT_NEEDED is read from the *.so files RECORD lists: a FIFO there is skipped and said."""
    venv, site = seeded
    info = dist_info(site, "sglang_kernel")
    rewrite(os.path.join(info, "RECORD"), lambda data: data + b"sgl_kernel/evil.so,sha256=AAAA,\n")
    os.makedirs(os.path.join(site, "sgl_kernel"), exist_ok=True)
    os.mkfifo(os.path.join(site, "sgl_kernel", "evil.so"))
    # The label decides sglang-kernel first: a package without one is read down to its binaries.
    labelled = os.path.join(site, os.path.basename(info))
    os.rename(labelled, labelled.replace("+cu130", ""))
    rewrite(os.path.join(labelled.replace("+cu130", ""), "METADATA"), lambda data: data.replace(b"+cu130", b""))
    result, _seconds = timed(lambda: Contamination(venv, run).scan()[0])
    assert "sgl_kernel/evil.so is a FIFO, not a regular file: not read" in result["problems"]
    inv, _seconds = timed(_inventory.inventory, venv, None, None, True, run)  # verify_files hashes it: skipped too
    [bad] = [p for p in inv["integrity"]["packages"] if p["name"] == "sglang-kernel"]
    assert "sgl_kernel/evil.so" in bad["modified"]


def test_fifo_as_torch_version_py(seeded, tmp_path):
    """torch/version.py is read when torch's version has no label: a FIFO there is a problem."""
    venv, site = seeded
    info = dist_info(site, "torch")
    rewrite(os.path.join(info, "METADATA"), lambda data: data.replace(b"2.8.0+cu128", b"2.8.0"))
    replace(os.path.join(site, "torch", "version.py"), "fifo")
    result, _seconds = timed(lambda: Contamination(venv, run, expected_cuda="12.8").scan()[0])
    assert "torch/version.py is a FIFO, not a regular file: not read" in result["problems"]


def test_a_40_mb_metadata_without_a_blank_line_is_read_in_linear_time(seeded):
    venv, site = seeded
    info = dist_info(site, "sglang_kernel")
    rewrite(os.path.join(info, "METADATA"), lambda _data: b"Metadata-Version: 2.1\nName: sglang-kernel\n"
            b"Version: 0.4.2.post2+cu130\nDescription: " + b"a" * (40 << 20))
    result, seconds = timed(lambda: Contamination(venv, run).scan()[0])
    assert seconds < 2.0, seconds
    name = os.path.basename(info) + "/METADATA"
    assert "%s is larger than %d bytes: truncated at %d bytes" % (name, _files.CAPS["metadata"], _files.CAPS["metadata"]) in result["problems"]
    assert [c["name"] for c in result["contaminants"]] == ["sglang-kernel"]


def test_the_readiness_read_has_a_deadline(seeded, tmp_path):
    """A read still running at read_timeout is reported failed and left behind; the others are
    kept. The slow read here is real: verify_files hashing a 1 GB sparse file RECORD lists
    (seconds of hashing on the test machine, which the left-behind thread then finishes)."""
    venv, site = seeded
    info = dist_info(site, "numpy")
    rewrite(os.path.join(info, "RECORD"), lambda data: data + b"numpy/huge.bin,sha256=AAAA,\n")
    with open(os.path.join(site, "numpy", "huge.bin"), "wb") as f:
        f.truncate(1 << 30)
    defaults = {name: spec.get("default") for name, spec in _options.ARGUMENT_SPEC.items()}
    p = dict(defaults, venv=venv, verify_files=True, require_gpu=False, nvidia_smi="/nonexistent/nvidia-smi",
             device_patterns=["/nonexistent/nvidia*"], read_timeout=1.0,
             cache_environment={"HOME": str(tmp_path), "USER": "trainer", "TMPDIR": str(tmp_path)})
    start = time.monotonic()
    result = _readiness.read(p, run, lambda name: None)
    assert time.monotonic() - start < 2.5
    assert result["pip_inventory"]["failed"] is True
    assert result["pip_inventory"]["msg"].startswith("pip_inventory did not finish within 1.0s (read_timeout)")
    assert result["cuda_contamination"]["contaminants"][0]["name"] == "sglang-kernel"
    assert result["ready"] is False
    [packages] = [c for c in result["checks"] if c["name"] == "packages"]
    assert packages["ok"] is False and "read_timeout" in packages["summary"]


# ------------------------------------------------- nothing of the venv runs as root (item 2)


def marker_script(marker):
    # python.real, a link to the base interpreter beside it, keeps the venv the venv.
    return "#!/bin/sh\nid -u >> %s\nexec \"$(dirname \"$0\")/python.real\" \"$@\"\n" % marker


@pytest.fixture
def reachable(tmp_path):
    """A directory another user can reach (the tests' own are root's alone)."""
    root = tempfile.mkdtemp(prefix="gpufleet-owned-", dir="/tmp")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def hostile_venv(root, seed_wheels, system_site, python="/usr/bin/python3.11"):
    """A real venv of another user (nobody) whose bin/python is a script of theirs that writes
    the uid it runs as to a marker, then runs the real interpreter."""
    venv = os.path.join(root, "venv")
    subprocess.run([UV, "venv", "--quiet", "--python", python, venv], check=True)
    install(UV, venv, seed_wheels, ["torch==2.8.0+cu128", "nvidia-cuda-runtime-cu12==12.8.90",
                                    "sglang-kernel==0.4.2.post2+cu130"])
    if system_site:
        rewrite(os.path.join(venv, "pyvenv.cfg"),
                lambda data: data.replace(b"include-system-site-packages = false", b"include-system-site-packages = true"))
    marker = os.path.join(root, "ran-as")
    real = os.path.realpath(os.path.join(venv, "bin", "python"))
    os.remove(os.path.join(venv, "bin", "python"))
    os.symlink(real, os.path.join(venv, "bin", "python.real"))
    with open(os.path.join(venv, "bin", "python"), "w") as f:
        f.write(marker_script(marker))
    os.chmod(os.path.join(venv, "bin", "python"), 0o755)
    subprocess.run(["chown", "-R", "%d:%d" % (NOBODY, NOBODY), venv], check=True)
    open(marker, "w").close()
    os.chown(marker, NOBODY, NOBODY)
    return venv, marker


def ran_as(marker):
    with open(marker) as f:
        return f.read().split()


def test_reading_a_system_site_venv_never_runs_its_interpreter(run_module, reachable, seed_wheels):
    venv, marker = hostile_venv(reachable, seed_wheels, system_site=True)
    scan = run_module(cuda_contamination.main, dict(venv=venv))
    inv = run_module(pip_inventory.main, dict(venv=venv))
    assert not scan.get("failed") and not inv.get("failed"), (scan, inv)
    assert ran_as(marker) == []
    # The base installation's directories (Debian's dist-packages) are those its interpreter uses.
    out = subprocess.run(["/usr/bin/python3.11", "-E", "-c", "import sys; print('\\n'.join(sys.path))"],
                         capture_output=True, text=True, check=True).stdout.split()
    base = [p for p in out if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]
    assert base and inv["site_dirs"][1:] == base
    assert [c["name"] for c in scan["contaminants"]] == ["sglang-kernel"]


def test_the_python_option_of_a_venv_reads_the_venv_without_running_it(run_module, reachable, seed_wheels):
    venv, marker = hostile_venv(reachable, seed_wheels, system_site=True)
    inv = run_module(pip_inventory.main, dict(python=os.path.join(venv, "bin", "python")))
    assert not inv.get("failed") and {"torch", "sglang-kernel"} <= {p["name"] for p in inv["packages"]}, inv
    assert ran_as(marker) == [] and inv["site_dirs"][0] == _venv.venv_site_dirs(venv)[0]


def test_another_users_interpreter_is_asked_as_that_user(run_module, reachable):
    """An interpreter outside any venv is run to ask its sys.path: as its owner when root does
    not control it alone."""
    python = os.path.join(reachable, "python3")
    marker = os.path.join(reachable, "ran-as")
    os.symlink("/usr/bin/python3.11", os.path.join(reachable, "python.real"))
    with open(python, "w") as f:
        f.write(marker_script(marker))
    os.chmod(python, 0o755)
    open(marker, "w").close()
    for path in (python, marker):
        os.chown(path, NOBODY, NOBODY)
    inv = run_module(pip_inventory.main, dict(python=python))
    assert not inv.get("failed"), inv
    assert ran_as(marker) == [str(NOBODY)]


@pytest.mark.parametrize("owned", ["the directory", "the .pth file"])
def test_a_root_interpreter_whose_site_directory_is_another_users_runs_as_that_user(run_module, reachable, owned):
    """An interpreter of root's (its binary and bin/ root's) whose dist-packages directory, or a
    .pth file in it, is nobody's: site.py runs the .pth lines there at every start, so asking it
    its sys.path as root ran nobody's line as root. Its site directories are found by layout
    (nothing run) and it runs as nobody."""
    prefix = os.path.join(reachable, "prefix")
    stdlib = os.path.join(prefix, "lib", "python3.11")
    dist = os.path.join(prefix, "local", "lib", "python3.11", "dist-packages")
    os.makedirs(os.path.join(prefix, "bin"))
    os.makedirs(stdlib)
    os.makedirs(dist)
    python = os.path.join(prefix, "bin", "python3.11")
    shutil.copy2("/usr/bin/python3.11", python)  # its prefix is where it lies: lib/python3.11/os.py there
    for name in os.listdir("/usr/lib/python3.11"):
        if name not in ("site-packages", "dist-packages"):
            os.symlink(os.path.join("/usr/lib/python3.11", name), os.path.join(stdlib, name))
    marker = os.path.join(reachable, "ran-as")
    open(marker, "w").close()
    os.chmod(marker, 0o666)
    with open(os.path.join(dist, "zz_owner.pth"), "w") as f:
        f.write("import os; open(%r, 'a').write('%%d\\n' %% os.getuid())\n" % marker)
    if owned == "the directory":
        subprocess.run(["chown", "-R", "%d:%d" % (NOBODY, NOBODY), os.path.join(prefix, "local")], check=True)
    else:
        os.chown(os.path.join(dist, "zz_owner.pth"), NOBODY, NOBODY)
    inv = run_module(pip_inventory.main, dict(python=python))
    assert not inv.get("failed"), inv
    assert dist in inv["site_dirs"]
    assert ran_as(marker) == [str(NOBODY)]


def test_removal_runs_the_venv_own_programs_as_its_owner(run_module, reachable, seed_wheels):
    venv, marker = hostile_venv(reachable, seed_wheels, system_site=False)
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True))
    assert not result.get("failed"), result.get("msg")
    assert [r["name"] for r in result["removed"]] == ["sglang-kernel"]
    site = _venv.venv_site_dirs(venv)[0]
    assert not [n for n in os.listdir(site) if n.startswith("sglang_kernel")]
    # uv starts the venv's interpreter to learn about it: as its owner, never as root.
    uids = ran_as(marker)
    assert uids and set(uids) == {str(NOBODY)}, uids


def test_a_root_venv_others_can_write_is_refused_before_running_anything(run_module, reachable, seed_wheels):
    venv, marker = hostile_venv(reachable, seed_wheels, system_site=False)
    subprocess.run(["chown", "-R", "0:0", venv], check=True)
    site = _venv.venv_site_dirs(venv)[0]
    os.chmod(site, 0o777)
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True))
    assert result["failed"] and "%s is writable by its group or by others" % site in result["msg"]
    assert ran_as(marker) == [] and [n for n in os.listdir(site) if n.startswith("sglang_kernel")]


# ------------------------------------------- a dist-info name that blocks the installer (item 8)

HOSTILE = "x;touch P $(id)-1.0+cu130.dist-info"


def plant(site):
    path = os.path.join(site, HOSTILE)
    os.makedirs(path)
    with open(os.path.join(path, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: x;touch P $(id)\nVersion: 1.0+cu130\n\n")
    return path


@pytest.mark.parametrize("seed_pip", [False, True])
def test_a_hostile_dist_info_name_is_named_and_what_can_go_goes(run_module, tmp_path, seed_wheels, seed_pip):
    venv = make_venv(str(tmp_path / "venv"), UV, seed_pip=seed_pip)
    install(UV, venv, seed_wheels, ["torch==2.8.0+cu128", "sglang-kernel==0.4.2.post2+cu130"])
    site = _venv.venv_site_dirs(venv)[0]
    hostile = plant(site)
    result = run_module(cuda_contamination.main, dict(venv=venv, remove=True))
    left = os.listdir(site)
    assert os.path.isdir(hostile) and not os.path.exists(os.path.join(str(tmp_path), "P"))
    if seed_pip:
        # pip passes over the entry uv refuses: the real contaminant goes, the entry is kept and said.
        assert not result.get("failed"), result
        assert result["installer"] == "pip" and [r["name"] for r in result["removed"]] == ["sglang-kernel"]
        assert not [n for n in left if n.startswith("sglang_kernel")]
        [kept] = [k for k in result["kept"] if k["name"].startswith("x;")]
        assert "not handed to uv or pip; remove that directory by hand" in kept["reason"]
    else:
        assert result["failed"]
        assert "uv refuses this venv because of %r" % HOSTILE in result["msg"]
        assert "rm -r -- '%s'" % hostile in result["msg"]
        assert "read-only" not in result["msg"] and "disk" not in result["msg"]
        assert [n for n in left if n.startswith("sglang_kernel")]
        # The command it gives works, and the next run then removes the contaminant.
        subprocess.run(["sh", "-c", "rm -r -- '%s'" % hostile], check=True)
        again = run_module(cuda_contamination.main, dict(venv=venv, remove=True))
        assert not again.get("failed") and [r["name"] for r in again["removed"]] == ["sglang-kernel"]
