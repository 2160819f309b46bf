# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The evidence cache (venv/_evcache.py) on REAL venvs installed with uv from real wheels: a
cached read of a changed venv equals a fresh uncached read, whatever changed (install,
uninstall, upgrade, a clobbered file, RECORD or a shared object rewritten with its size and
mtime kept); an unchanged venv is read from the cache; the venv's owner cannot poison it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time

import pytest
from cuda_fixtures import SEED_ADDED, SEED_BASE, UV, make_venv, pins
from wheelmaker import build_shared_object, build_wheel

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _evcache
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import reference, scan
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv
from ansible_collections.gpufleet.hygiene.plugins.modules import cuda_contamination

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cache is root's: these tests run as root")

NOBODY = 65534


def run(argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout, proc.stderr


def uv_pip(venv, *args):
    subprocess.run([UV, "pip"] + list(args) + ["--quiet", "--python", os.path.join(venv, "bin", "python")], check=True)


def install(venv, wheels, names, *extra):
    # Copied, not linked from uv's cache: the tests rewrite installed files.
    uv_pip(venv, "install", "--link-mode", "copy", "--no-index", "--find-links", wheels, *extra, *names)


@pytest.fixture(scope="module")
def extra_wheels(tmp_path_factory):
    """Packages whose evidence lives where the cache must notice change: a shared object's
    DT_NEEDED (plainext), an installed path (layoutpkg), a file another package owns (clobberer)."""
    root = tmp_path_factory.mktemp("evwheels")
    out, work = str(root / "wheels"), str(root / "work")
    os.makedirs(out)
    so12 = build_shared_object(os.path.join(work, "12"), "_ext.so", ["libcudart.so.12"])
    so13 = build_shared_object(os.path.join(work, "13"), "_ext.so", ["libcudart.so.13"])
    build_wheel(out, "plainext", "1.0", {"plainext/__init__.py": "", "plainext/_ext.so": so12})
    build_wheel(out, "plainext", "2.0", {"plainext/__init__.py": "", "plainext/_ext.so": so13})
    build_wheel(out, "layoutpkg", "1.0", {"layoutpkg/__init__.py": "", "layoutpkg/nvidia/cu12/lib/x.txt": "x"})
    build_wheel(out, "clobberer", "1.0", {"clobberer/__init__.py": "", "plainext/_ext.so": so13})
    build_wheel(out, "newpkg", "1.0", {"newpkg/__init__.py": "", "newpkg/_ext.so": so13})
    return out


@pytest.fixture
def venv(tmp_path, seed_wheels, extra_wheels):
    path = make_venv(str(tmp_path / "venv"), UV)
    install(path, seed_wheels, pins(SEED_BASE))
    install(path, seed_wheels, pins(SEED_ADDED))
    install(path, extra_wheels, ["plainext==1.0", "layoutpkg==1.0"])
    return path


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A cache directory (root's, 0700) and no racy window: entries are kept at once, and the
    tests wait a clock tick before changing anything, so that a change moves ctime."""
    monkeypatch.setattr(_evcache, "RACY_SECONDS", 0)
    return str(tmp_path / "cache" / "evidence")


def settle():
    time.sleep(0.05)


def read(venv, cache):
    """One scan as Contamination runs it: ``(result, hits, misses, RECORDs read)``."""
    env = Venv(venv, run)
    dists = env.distributions
    ref, _w = reference(dists, None)
    ev = _evcache.EvidenceCache.open(cache, venv)
    assert (ev is None) == (cache is False)
    try:
        contaminants, unknown, clobbered, _shared = scan(dists, ref["cuda_major"], True, ev)
    finally:
        if ev is not None:
            ev.close()
    result = {"contaminants": contaminants, "unknown": unknown, "clobbered": clobbered,
              "problems": [p for d in dists for p in d.problems]}
    records = sum(1 for d in dists if d._record_data is not None)
    return result, (ev.hits if ev else 0), (ev.misses if ev else 0), records


def full(venv, cache):
    return Contamination(venv, run, evidence_cache=cache).scan()[0]


def names(result):
    return sorted(c["name"] for c in result["contaminants"])


def test_unchanged_venv_is_read_from_the_cache(venv, cache_dir):
    first, hits, misses, _records = read(venv, cache_dir)
    assert hits == 0 and misses > 20
    settle()
    second, hits2, misses2, records = read(venv, cache_dir)
    assert (hits2, misses2) == (misses, 0)
    assert records == 0  # no RECORD read at all: paths shared by packages came from the cache too
    assert second == first == read(venv, False)[0]
    assert full(venv, cache_dir) == full(venv, False)
    assert "plainext" not in names(second) and "nvidia-nccl-cu13" in names(second)
    assert second["clobbered"]  # the seed's four overwritten cu12 libraries, judged live


def _rewrite_keeping_size_and_mtime(path, old, new, replace):
    """``old`` becomes ``new`` (same length) in ``path``; its mtime is put back. ``replace``:
    a new file renamed over it (new inode) instead of a write in place (same inode)."""
    st = os.stat(path)
    with open(path, "rb") as f:
        data = f.read()
    assert len(old) == len(new) and old in data
    data = data.replace(old, new)
    target = path + ".new" if replace else path
    with open(target, "r+b" if not replace else "wb") as f:
        f.write(data)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    if replace:
        os.rename(target, path)
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert (after.st_ino != st.st_ino) == replace


def _site(venv):
    return Venv(venv, run).own_site_dirs[0]


def _record_of(venv, name):
    site = _site(venv)
    return os.path.join(site, [e for e in os.listdir(site) if e.startswith(name + "-")][0], "RECORD")


CHANGES = {
    "install": lambda v, w: install(v, w, ["newpkg==1.0"]),
    "uninstall": lambda v, w: uv_pip(v, "uninstall", "nvidia-nccl-cu13"),
    "upgrade": lambda v, w: install(v, w, ["plainext==2.0"]),
    "clobber": lambda v, w: install(v, w, ["clobberer==1.0"]),
    "shared object rewritten in place, mtime kept": lambda v, w: _rewrite_keeping_size_and_mtime(
        os.path.join(_site(v), "plainext", "_ext.so"), b"libcudart.so.12", b"libcudart.so.13", replace=False),
    "RECORD rewritten in place, mtime kept": lambda v, w: _rewrite_keeping_size_and_mtime(
        _record_of(v, "layoutpkg"), b"nvidia/cu12/", b"nvidia/cu13/", replace=False),
    "RECORD replaced, same size and mtime": lambda v, w: _rewrite_keeping_size_and_mtime(
        _record_of(v, "layoutpkg"), b"nvidia/cu12/", b"nvidia/cu13/", replace=True),
}
# What each change makes the scan say that it did not say before.
NEWLY = {
    "install": "newpkg", "upgrade": "plainext", "clobber": "plainext",
    "shared object rewritten in place, mtime kept": "plainext",
    "RECORD rewritten in place, mtime kept": "layoutpkg", "RECORD replaced, same size and mtime": "layoutpkg",
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_cached_read_after_a_change_equals_a_fresh_read(venv, cache_dir, extra_wheels, change):
    before = read(venv, cache_dir)[0]
    settle()
    assert read(venv, cache_dir)[1:3] == (len(Venv(venv, run).distributions), 0)  # all kept
    settle()
    CHANGES[change](venv, extra_wheels)
    after, hits, misses, _records = read(venv, cache_dir)
    fresh = read(venv, False)[0]
    assert after == fresh
    assert full(venv, cache_dir) == full(venv, False)
    assert after != before
    if change == "uninstall":
        assert "nvidia-nccl-cu13" in names(before) and "nvidia-nccl-cu13" not in names(after)
    else:
        assert NEWLY[change] not in names(before) and NEWLY[change] in names(after)
    # Only what changed was read again; the rest came from the cache.
    assert hits > 20 and misses <= 2
    if change == "clobber":
        assert any(c["path"] == "plainext/_ext.so" and c["overwritten_by"] == ["clobberer"] for c in after["clobbered"])


def test_a_racy_entry_is_not_kept(venv, tmp_path, monkeypatch):
    """Files changed within RACY_SECONDS of the read may change again without moving ctime on a
    coarse clock: what was derived from them is read again next time."""
    monkeypatch.setattr(_evcache, "RACY_SECONDS", 3600)
    cache = str(tmp_path / "racy")
    read(venv, cache)
    assert read(venv, cache)[1] == 0


# --------------------------------------------------------------------------- poisoning


def _as_nobody(code, *args):
    """Python ``code`` run as uid/gid 65534 (the venv's owner, say): its rc and output."""
    proc = subprocess.run(["python3", "-c", code] + list(args), user=NOBODY, group=NOBODY, extra_groups=[],
                          capture_output=True, text=True, check=False)
    return proc.returncode, proc.stdout + proc.stderr


ATTEMPTS = r"""
import os, sys
d, f = sys.argv[1], sys.argv[2]
for name, act in (
        ("write", lambda: open(f, "a").write("x")),
        ("create", lambda: open(os.path.join(d, "planted.json"), "w")),
        ("symlink", lambda: os.symlink("/etc/passwd", os.path.join(d, "link.json"))),
        ("replace", lambda: os.rename("/tmp", f)),
        ("list", lambda: os.listdir(d))):
    try:
        act()
        print("DID", name)
    except PermissionError:
        print("refused", name)
"""


def test_the_venv_owner_cannot_write_replace_or_link_into_the_cache(venv, cache_dir):
    os.chown(os.path.dirname(os.path.dirname(cache_dir)), NOBODY, NOBODY)  # even their own tmp dir above
    os.chmod(os.path.dirname(os.path.dirname(cache_dir)), 0o755)
    # ... is refused as an ancestor: nobody could rename the cache away. No cache then.
    assert _evcache.EvidenceCache.open(cache_dir, venv) is None
    os.chown(os.path.dirname(os.path.dirname(cache_dir)), 0, 0)
    read(venv, cache_dir)
    top = os.stat(cache_dir)
    files = os.listdir(cache_dir)
    assert len(files) == 1
    entry = os.path.join(cache_dir, files[0])
    st = os.stat(entry)
    assert (top.st_uid, top.st_mode & 0o777, st.st_uid, st.st_mode & 0o777) == (0, 0o700, 0, 0o600)
    os.chmod(os.path.dirname(cache_dir), 0o755)  # let nobody reach the directory: it still may not enter it
    rc, out = _as_nobody(ATTEMPTS, cache_dir, entry)
    assert rc == 0, out
    assert out.split() == ["refused", "write", "refused", "create", "refused", "symlink", "refused", "replace",
                           "refused", "list"], out


def _forge(path, evidence_says_clean):
    """Rewrite the kept file so that every package is unknown (clean) and no path is shared."""
    with open(path) as f:
        doc = json.load(f)
    for entry in doc["packages"].values():
        entry.update(layer=None, majors=[], problems=[])
    doc["shared"]["entries"] = []
    with open(path, "w") as f:
        json.dump(doc, f)
    return evidence_says_clean


@pytest.mark.parametrize("plant", ["owner nobody", "mode 0644", "mode 0660", "two links", "corrupt JSON", "a symbolic link"])
def test_a_planted_cache_file_is_ignored_and_rewritten(venv, cache_dir, tmp_path, plant):
    fresh = read(venv, False)[0]
    read(venv, cache_dir)
    entry = os.path.join(cache_dir, os.listdir(cache_dir)[0])
    _forge(entry, True)
    if plant == "owner nobody":
        os.chown(entry, NOBODY, NOBODY)
    elif plant.startswith("mode"):
        os.chmod(entry, int(plant.split()[1], 8))
    elif plant == "two links":
        os.link(entry, str(tmp_path / "other-name"))
    elif plant == "corrupt JSON":
        with open(entry, "r+") as f:
            f.write("{not json")
    else:
        forged = str(tmp_path / "forged.json")
        shutil.move(entry, forged)
        os.symlink(forged, entry)
    assert _evcache.EvidenceCache(_evcache._open_dir(cache_dir), venv).packages == {}
    after, hits, _misses, _records = read(venv, cache_dir)
    assert after == fresh and hits == 0
    assert fresh["contaminants"] and fresh["clobbered"]
    st = os.lstat(entry)
    assert (st.st_uid, st.st_mode & 0o7777, st.st_nlink) == (0, 0o100600 & 0o7777, 1)
    assert os.path.isfile(entry) and not os.path.islink(entry)
    settle()
    assert read(venv, cache_dir)[1] > 20  # the rewritten file is used


def test_the_same_forgery_by_root_would_be_used(venv, cache_dir):
    """The planted files above are refused for who wrote them, not for what they say: a file of
    the right owner and mode is trusted (root wrote it), which is what the checks stand on."""
    read(venv, cache_dir)
    entry = os.path.join(cache_dir, os.listdir(cache_dir)[0])
    _forge(entry, True)
    assert read(venv, cache_dir)[0]["contaminants"] == []


@pytest.mark.parametrize("where", ["a symbolic link", "owned by nobody", "group-writable", "relative"])
def test_an_unsafe_cache_directory_means_no_cache(venv, tmp_path, where):
    target = tmp_path / "target"
    target.mkdir(mode=0o700)
    path = str(tmp_path / "evidence")
    if where == "a symbolic link":
        os.symlink(str(target), path)
    elif where == "owned by nobody":
        os.mkdir(path, 0o700)
        os.chown(path, NOBODY, NOBODY)
    elif where == "group-writable":
        os.mkdir(path, 0o770)
        os.chmod(path, 0o770)
    else:
        path = "relative/evidence"
    assert _evcache.EvidenceCache.open(path, venv) is None
    assert Contamination(venv, run, evidence_cache=path).scan()[0] == full(venv, False)
    assert os.listdir(str(target)) == []


def test_not_root_means_no_cache(venv, tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert _evcache.EvidenceCache.open(str(tmp_path / "c"), venv) is None
    assert not os.path.exists(str(tmp_path / "c"))


@pytest.mark.parametrize("setting", [False, "false", "no"])
def test_turned_off(venv, tmp_path, setting):
    assert _evcache.EvidenceCache.open(setting, venv) is None


def test_the_module_option(venv, tmp_path, run_module, monkeypatch):
    monkeypatch.setattr(_evcache, "RACY_SECONDS", 0)
    where = str(tmp_path / "modcache")
    on = run_module(cuda_contamination.main, {"venv": venv, "evidence_cache": where})
    assert len(os.listdir(where)) == 1
    off = run_module(cuda_contamination.main, {"venv": venv, "evidence_cache": False})
    again = run_module(cuda_contamination.main, {"venv": venv, "evidence_cache": where})
    for result in (on, off, again):
        result.pop("invocation")
    assert on == off == again
    assert names(on)


def test_only_the_cache_s_own_two_directories_are_made(venv, tmp_path):
    """A cache path whose grandparent is missing (a container without /var/cache) gets no
    directory made for it and no cache; the scan is the same."""
    deep = tmp_path / "missing" / "cache" / "evidence"
    assert full(venv, str(deep)) == full(venv, False)
    assert not (tmp_path / "missing").exists()


# ------------------------------------- the venv's owner exchanges site-packages while root reads

EXCHANGE_SECONDS = float(os.environ.get("GPUFLEET_RACE_SECONDS", "20"))


@pytest.fixture
def exchanged_venv(seed_wheels, tmp_path):
    """A real venv of nobody's holding torch (cu128) and evilpkg 1.0+cu130 (a contaminant by its
    version label), and beside its site-packages a sibling of nobody's where evilpkg's METADATA
    says 1.0: the same names, a clean verdict. ``REAL`` marks which one is the venv's own."""
    import tempfile

    root = tempfile.mkdtemp(prefix="gpufleet-owned-", dir="/tmp")
    os.chmod(root, 0o755)
    wheels = str(tmp_path / "wheels")
    os.makedirs(wheels)
    build_wheel(wheels, "evilpkg", "1.0+cu130", {"evilpkg/__init__.py": ""})
    venv = os.path.join(root, "venv")
    subprocess.run([UV, "venv", "--quiet", "--python", "/usr/bin/python3.11", venv], check=True)
    install(venv, seed_wheels, ["torch==2.8.0+cu128"])
    install(venv, wheels, ["evilpkg==1.0+cu130"])
    site = Venv(venv, run).own_site_dirs[0]
    sibling = site + ".clean"
    shutil.copytree(site, sibling, symlinks=True)
    meta = os.path.join(sibling, "evilpkg-1.0+cu130.dist-info", "METADATA")
    with open(meta) as f:
        text = f.read()
    with open(meta, "w") as f:
        f.write(text.replace("Version: 1.0+cu130", "Version: 1.0"))
    open(os.path.join(site, "REAL"), "w").close()
    subprocess.run(["chown", "-R", "%d:%d" % (NOBODY, NOBODY), venv], check=True)
    yield venv, site, sibling
    shutil.rmtree(root, ignore_errors=True)


def _entry(cache_dir, venv, name):
    """The kept entry of the dist-info ``name`` in the cache file of ``venv``, or None."""
    files = os.listdir(cache_dir)
    if not files:
        return None
    with open(os.path.join(cache_dir, files[0])) as f:
        doc = json.load(f)
    return next((e for d, e in doc["packages"].items() if os.path.basename(d) == name), None)


def test_exchanging_site_packages_while_root_reads_never_poisons_the_cache(exchanged_venv, cache_dir):
    """A real process of the venv's owner exchanges (renameat2 RENAME_EXCHANGE) site-packages with
    its sibling in a loop while root reads the venv again and again with the cache. Whatever root
    read during the loop, what it kept is keyed on what it read, through handles, directories from
    / included: once the loop stops, the cached read equals a fresh one (evilpkg is flagged), and no
    kept entry says 'clean' under the key of the venv's own evilpkg."""
    from cachetree import Swapper

    venv, site, sibling = exchanged_venv
    info = "evilpkg-1.0+cu130.dist-info"
    fresh = read(venv, False)[0]
    assert "evilpkg" in names(fresh)
    own_key = _evcache.EvidenceCache.package_key(
        next(d for d in Venv(venv, run).distributions if d.key == "evilpkg"))
    parent = os.path.dirname(site)
    swapper = Swapper(parent, [(os.path.basename(site), os.path.basename(sibling))], NOBODY, NOBODY)
    poisoned = rounds = 0
    try:
        deadline = time.monotonic() + EXCHANGE_SECONDS
        while time.monotonic() < deadline and not poisoned:
            rounds += 1
            with contextlib.suppress(GpufleetError):  # a read of a half-exchanged venv may fail; never poison
                read(venv, cache_dir)
            entry = _entry(cache_dir, venv, info)
            poisoned += bool(entry and entry["key"] == own_key and entry["layer"] is None)
    finally:
        swaps, _failed = swapper.stop()
    if not os.path.exists(os.path.join(site, "REAL")):  # the loop stopped on the exchanged side
        os.rename(site, site + ".tmp")
        os.rename(sibling, site)
        os.rename(site + ".tmp", sibling)
    assert poisoned == 0, "a clean verdict was kept under the key of the venv's own evilpkg (round %d)" % rounds
    assert swaps > 100 and rounds > 5, (swaps, rounds)
    settle()
    cached = read(venv, cache_dir)[0]
    assert "evilpkg" in names(cached)
    assert names(cached) == names(fresh)
    settle()
    again, hits, _misses, _records = read(venv, cache_dir)  # and the cache serves the venv again
    assert hits > 0 and names(again) == names(fresh)
