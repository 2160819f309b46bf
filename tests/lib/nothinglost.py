# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Nothing lost, shown: before/after inventories of one container, and their difference.

snapshot() runs one Python script inside the container (through lxc-attach, so what it
sees is the container's own /proc and file system) and returns:

- packages: every dist-info of the venv, {name: {"version", "files"}} (files: the absolute
  paths its RECORD lists);
- processes: {"<pid>": {"start_time", "state", "cmdline"}} of every process but the script
  itself (a PID with another start time is another process; a zombie, state Z, has exited);
- files: {path: "f <mode> <uid> <sha256>" | "l <target>" | "d <mode> <uid>" | "s" | ...}
  of the whole file system except the kernel's (/proc, /sys, /dev) and the read-only /usr
  the simulated fleet shares from the host, never following a link.

diff(before, after) says what differs; the tests then assert that this is exactly what the
role was asked to remove or change. sentinels() looks for files a hostile value would have
created had it ever reached a shell.
"""

from __future__ import annotations

import json
import os
import subprocess

from simfleet import attach_argv

SKIP = ("/proc", "/sys", "/dev", "/usr")

_SCRIPT = r'''
import hashlib, json, os, stat, sys
venv, skip = sys.argv[1], set(sys.argv[2].split(","))
me = os.getpid()
procs = {}
for entry in os.listdir("/proc"):
    if not entry.isdigit() or int(entry) == me:
        continue
    try:
        with open("/proc/%s/stat" % entry, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        with open("/proc/%s/cmdline" % entry, "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        continue
    if int(fields[1]) == me:
        continue  # a child of this script (none expected)
    procs[entry] = {"start_time": int(fields[19]), "state": fields[0].decode(),
                    "cmdline": " ".join(a.decode("utf-8", "replace") for a in argv if a)}
files = {}
def walk(top):
    for name in sorted(os.listdir(top)):
        path = os.path.join(top, name)
        if path in skip:
            continue
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            files[path] = "l " + os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            files[path] = "d %o %d" % (stat.S_IMODE(st.st_mode), st.st_uid)
            walk(path)
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            files[path] = "f %o %d %s" % (stat.S_IMODE(st.st_mode), st.st_uid, h.hexdigest())
        else:
            files[path] = "s" if stat.S_ISSOCK(st.st_mode) else "p" if stat.S_ISFIFO(st.st_mode) else "o"
walk("/")
packages = {}
lib = os.path.join(venv, "lib")
for py in sorted(os.listdir(lib)) if os.path.isdir(lib) else []:
    site = os.path.join(lib, py, "site-packages")
    for info in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        if not info.endswith(".dist-info"):
            continue
        meta = {}
        with open(os.path.join(site, info, "METADATA"), "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                if not line.strip():
                    break
                key, _sep, value = line.partition(":")
                meta.setdefault(key.strip().lower(), value.strip())
        owned = []
        try:
            with open(os.path.join(site, info, "RECORD"), "rb") as f:
                for row in f.read().decode("utf-8", "replace").splitlines():
                    if row:
                        owned.append(os.path.normpath(os.path.join(site, row.rsplit(",", 2)[0])))
        except OSError:
            pass
        packages[meta.get("name", info)] = {"version": meta.get("version"), "files": sorted(owned)}
json.dump({"packages": packages, "processes": procs, "files": files}, sys.stdout)
'''


def snapshot(lxcpath, vmid, venv="/opt/venv", skip=SKIP):
    """Packages, processes and files of one container, read inside it."""
    res = subprocess.run(attach_argv(lxcpath, vmid, ["/usr/bin/python3", "-c", _SCRIPT, venv, ",".join(skip)]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, check=False)
    if res.returncode != 0:
        raise AssertionError("snapshot of container %s failed: %s" % (vmid, res.stderr.decode(errors="replace")))
    return json.loads(res.stdout)


def diff(before, after):
    """What differs: packages removed/added/changed, processes gone/new (by PID and start
    time), files removed/added/changed (by type, mode, owner and content)."""
    bp, ap = before["packages"], after["packages"]
    bproc, aproc = before["processes"], after["processes"]

    def same_proc(pid):
        # A zombie has exited (its parent has not reaped it yet): the process is gone.
        return pid in aproc and aproc[pid]["start_time"] == bproc[pid]["start_time"] and aproc[pid]["state"] not in ("Z", "X")

    bf, af = before["files"], after["files"]
    own = dict((p, v) for p, v in list(bf.items()) + list(af.items()) if is_own_state(p))
    bf = dict((p, v) for p, v in bf.items() if p not in own)
    af = dict((p, v) for p, v in af.items() if p not in own)
    ob = dict((p, v) for p, v in before["files"].items() if p in own)
    oa = dict((p, v) for p, v in after["files"].items() if p in own)
    return {
        # The collection's own root-owned state (the evidence cache): apart, each test says what it may hold.
        "own_state": {"removed": sorted(p for p in ob if p not in oa), "added": sorted(p for p in oa if p not in ob),
                      "changed": sorted(p for p in ob if p in oa and ob[p] != oa[p])},
        "packages": {
            "removed": sorted(n for n in bp if n not in ap),
            "added": sorted(n for n in ap if n not in bp),
            "changed": sorted(n for n in bp if n in ap and bp[n]["version"] != ap[n]["version"]),
        },
        "processes": {
            # A process that had already exited before (a zombie then) is not one the step stopped.
            "gone": sorted((int(p), bproc[p]["cmdline"]) for p in bproc if bproc[p]["state"] not in ("Z", "X") and not same_proc(p)),
            "new": sorted((int(p), aproc[p]["cmdline"]) for p in aproc
                          if aproc[p]["state"] not in ("Z", "X") and not (p in bproc and bproc[p]["start_time"] == aproc[p]["start_time"])),
        },
        "files": {
            "removed": sorted(p for p in bf if p not in af),
            "added": sorted(p for p in af if p not in bf),
            "changed": sorted(p for p in bf if p in af and bf[p] != af[p]),
        },
    }


def under(paths, *roots):
    """The paths that are one of ``roots`` or lie below one."""
    return sorted(p for p in paths if any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots))


def outside(paths, *roots):
    inside = set(under(paths, *roots))
    return sorted(p for p in paths if p not in inside)


# Where the collection keeps state of its own in a container (root's, 0700): the evidence cache.
OWN_STATE = ("/var/cache/gpufleet-hygiene",)


def is_own_state(path):
    return any(path == root or path.startswith(root + "/") for root in OWN_STATE)


def own_state_is_root_only(d, after):
    """What the step added or changed under OWN_STATE: directories root's 0700, files root's 0600
    (the evidence cache's JSON), nothing else. The paths, for the caller's message."""
    touched = d["own_state"]["added"] + d["own_state"]["changed"]
    for path in touched:
        kind = after["files"][path].split(" ")
        assert (kind[0], kind[1], kind[2]) in (("d", "700", "0"), ("f", "600", "0")) or (
            kind[0] == "d" and path.count("/") < 4 and kind[2] == "0"), (path, after["files"][path])
        assert kind[0] == "d" or path.endswith(".json"), path
    return touched


def is_empty(d):
    return not any(d["packages"].values()) and not any(d["processes"].values()) and not any(d["files"].values())


def sentinels(token, roots):
    """Every path under ``roots`` whose name holds ``token`` (mount points below a root,
    such as a container's /usr or /proc, are not entered)."""
    found = []
    for root in roots:
        if not os.path.isdir(root):
            continue
        for top, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(top, d))]
            found += [os.path.join(top, n) for n in dirs + names if token in n]
    return sorted(found)


def tree(root, skip=()):
    """{relative path: type, mode and content hash} of a host directory, links not followed."""
    import hashlib
    import stat

    out = {}
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not os.path.ismount(os.path.join(top, d))
                         and os.path.relpath(os.path.join(top, d), root) not in skip)
        for name in sorted(dirs + names):
            path = os.path.join(top, name)
            rel = os.path.relpath(path, root)
            if rel in skip:
                continue
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    out[rel] = "f %o %s" % (stat.S_IMODE(st.st_mode), hashlib.sha256(f.read()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = "l " + os.readlink(path)
            else:
                out[rel] = "%o" % st.st_mode
    return out
