# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Is the training job alive? A job is running only while it makes progress.

- **stalled**: processes match the job's patterns, but its log has not grown for
  ``stall_after`` seconds (when the log is known), or, with no log to go by, every GPU the job
  holds shows no utilisation (nvidia-smi's utilization.gpu, itself an average over the
  driver's last sample period). A log is the better witness: a job hung in a collective can
  keep its GPUs busy spinning.
- **leftovers**: GPU holders of the job's own users (the job's ``users``, the owners of its
  processes, or ``leftover_users`` when given) that are neither a job process nor a descendant
  or an ancestor of one, whose parent is the container's init (PID 1): workers whose job is gone,
  reparented to init. Each carries its PID and start time, which the repair names it by. Another
  user's process is never one, whatever it holds; with no job user known there are none.
- **namespace_inits**: such holders that are the init of their own PID namespace (NSpid ends in
  1): never signalled (proc._proc.protection), so returned apart, for the check to say what to do.
- **throughput**: the last tokens/s reading at the end of the log (the throughput gate's
  pattern and parser, job/_throughput), against the job's recorded baseline when one is given.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import posixpath
import re
import time

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._files import Skipped
from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs._tail import read_window, stat_log
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import DEFAULT_PATTERN, readings
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import PROC, ancestors, parse_status, proc_file, read_stat, user_name
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view._accounts import acting_uid, getpwnam

DEFAULT_STALL_AFTER = 900
# How much of the log's end is searched for the last throughput reading: a job logs one every few
# steps, so its last one is near the end; a log that writes none there has none to show.
TAIL_BYTES = 64 << 10


def uids_of(names):
    """The uids of user names (or numeric uids as text); a name that is not a user here is left out."""
    out = set()
    for name in names or ():
        text = str(name).strip()
        if text.isdigit():
            out.add(int(text))
            continue
        try:
            out.add(getpwnam(text).pw_uid)
        except KeyError:
            continue
    return out


def job_owners(job, users=None, leftover_users=None):
    """Whose GPU holders may be leftovers: the uids of ``leftover_users`` when given, else of the
    job's users (``users``, gpufleet_job.users) and of the owners of the job's processes."""
    if leftover_users:
        return uids_of(leftover_users)
    owners = uids_of(users)
    owners |= uids_of(p.get("user") for p in job.get("processes", []) if p.get("user") is not None)
    return owners


def launch_uid(user=None):
    """The uid the job is launched as: its user's (``gpufleet_job.user``), else the user this read
    acts as on the host (a container's root, entered by ``pct exec``); None for a user it lacks."""
    if user:
        uids = uids_of([user])
        return min(uids) if uids else None
    return acting_uid()


def runs_venv(pid, venv, proc=PROC):
    """Whether a process runs the venv's interpreter: started as ``<venv>/bin/...``, or mapping a
    file below the venv (what an interpreter of the venv imports), never another install's."""
    if not venv:
        return False
    prefixes = set(p.rstrip("/") + "/" for p in (posixpath.normpath(venv), _root.realpath(venv)))
    try:
        argv0 = proc_file("%s/%d/cmdline" % (proc, pid)).split(b"\0")[0].decode("utf-8", "replace")
        if argv0 and any(posixpath.normpath(argv0).startswith(p + "bin/") for p in prefixes):
            return True
        for line in proc_file("%s/%d/maps" % (proc, pid)).split(b"\n"):
            fields = line.split(None, 5)
            path = fields[5].decode("utf-8", "replace") if len(fields) == 6 else ""
            if any(path.startswith(p) for p in prefixes):
                return True
    except OSError:
        return False
    return False


def _owner(pid, proc):
    """(real uid, NSpid list) of a live PID, or (None, []): on a container read from its node, its
    uid as the container sees it (its uid map), as the job's users are named there."""
    try:
        return parse_status(proc_file("%s/%d/status" % (proc, pid)).decode("utf-8", "replace"))
    except OSError:  # gone (parse_status raises nothing: it reads only digits as numbers)
        return None, []


def _leftovers(job_pids, gpus, proc, owners, launch=None):
    """(leftovers, namespace_inits): GPU holders of one of ``owners`` (uids) whose parent is init
    and that are neither the job nor its worker nor what it runs under; with ``launch`` ((uid,
    venv): the user the job is launched as and its venv), also that user's holders whose parent
    is init that run the venv's interpreter. A holder that is the init of its own PID namespace
    is never signalled (proc._proc.protection): it is returned apart, for the check to say what
    to do. Another user's holder is neither: it is not the job's."""
    out, inits, seen = [], [], set()
    if not owners and not (launch and launch[0] is not None):
        return out, inits
    # A holder the job runs under (a launcher that keeps a GPU open) is the job's, not left behind.
    above = set().union(*(ancestors(pid, proc) for pid in job_pids)) if job_pids else set()
    for gpu in gpus:
        for h in gpu.get("processes", []):
            pid = h.get("pid")
            if pid is None or pid in seen or pid in job_pids or pid in above:
                continue
            seen.add(pid)
            if ancestors(pid, proc) & job_pids:
                continue  # a worker of the running job
            st = read_stat(pid, proc)
            if st is None or st[2] != 1:
                continue  # gone, or another parent than init: not left behind by a job
            uid, nspid = _owner(pid, proc)
            if uid is None:
                continue
            if uid not in owners and not (launch and uid == launch[0] and runs_venv(pid, launch[1], proc)):
                continue  # another user's process, or the launch user's running no interpreter of the venv
            entry = {"pid": pid, "start_time": st[3], "name": h.get("name") or st[0], "cmdline": h.get("cmdline") or "",
                     "gpu": gpu.get("index"), "used_memory_mib": h.get("used_memory_mib"), "user": user_name(uid)}
            (inits if len(nspid) > 1 and nspid[-1] == 1 else out).append(entry)
    return out, inits


def workers(job_pids, gpus, proc=PROC):
    """The GPU holders that are the job's own workers, not matched by its patterns: descendants of
    one of its processes (torch.compile's compile workers, a data loader's children each hold a GPU
    context). They are the job's holding the GPUs as much as the job itself."""
    if not job_pids:
        return []
    found = set()
    for gpu in gpus:
        for h in gpu.get("processes", []):
            pid = h.get("pid")
            if isinstance(pid, int) and pid not in job_pids and (ancestors(pid, proc) - {pid}) & job_pids:
                found.add(pid)
    return sorted(found)


def _log(path):
    """The log's size and mtime from fstat of its handle (fs._tail: no link followed on the way or
    at the end, a regular file only): a link's target is never stat'ed, so nothing of a file the
    job's user cannot read leaks into the record."""
    try:
        st = stat_log(path)
    except Skipped as exc:
        return {"path": path, "exists": False, "error": exc.problem}
    return {"path": path, "exists": True, "size": st.st_size, "mtime": st.st_mtime}


def throughput(path, pattern=None, baseline=None, tail=TAIL_BYTES):
    """{tokens_per_s, baseline, ratio, problem} of the job's log: its last reading (None when the
    end of the log holds none or cannot be read, ``problem`` saying why), the baseline as given,
    their ratio when both are known. The log is a file the container's user writes: opened as
    fs._tail reads a user's log (its directory reached from / through no link, no link at the end,
    a regular file only, its last ``tail`` bytes read within a time bound)."""
    out = {"tokens_per_s": None, "baseline": baseline or None, "ratio": None, "problem": None}
    try:
        regex = re.compile(pattern or DEFAULT_PATTERN)
    except re.error as exc:
        out["problem"] = "pattern %r is not a valid regular expression: %s" % (pattern, exc)
        return out
    try:
        data, cut, _where, _st = read_window(path, tail)
    except Skipped as exc:
        out["problem"] = exc.problem
        return out
    if cut:  # the first line is cut: a part of a number is no reading
        data = data.partition(b"\n")[2]
    values = readings(data.decode("utf-8", "replace"), regex)
    if not values:
        out["problem"] = "no throughput reading in the last %d bytes of %s" % (tail, path)
        return out
    out["tokens_per_s"] = values[-1]
    if out["baseline"]:
        out["ratio"] = round(values[-1] / out["baseline"], 4)
    return out


def liveness(job, gpus, log=None, stall_after=DEFAULT_STALL_AFTER, proc=PROC, now=None, users=None, leftover_users=None,
             launch_user=None, venv=None):
    """{state, pids, log, reason, leftovers, namespace_inits} of a container: state "none" (no job
    process), "running" or "stalled"; job is the processes read ({processes: [...]}), gpus
    gpu_state's GPUs; users the job's users, leftover_users whose holders may be leftovers
    (job_owners()); without leftover_users, the holders of the user the job is launched as
    (launch_user, else the user this read acts as) that run the venv's interpreter are too."""
    pids = set(p["pid"] for p in job.get("processes", []))
    now = time.time() if now is None else now
    launch = None if leftover_users else (launch_uid(launch_user), venv)
    leftovers, inits = _leftovers(pids, gpus, proc, job_owners(job, users, leftover_users), launch)
    result = {"state": "none", "pids": sorted(pids), "log": _log(log) if log else None, "reason": None,
              "stall_after": stall_after, "leftovers": leftovers, "namespace_inits": inits,
              "workers": workers(pids, gpus, proc)}
    if not pids:
        return result
    result["state"] = "running"
    if log:
        info = result["log"]
        if info["exists"]:
            info["age_s"] = round(max(0.0, now - info["mtime"]), 1)
            if info["age_s"] > stall_after:
                result["state"] = "stalled"
                result["reason"] = "its log %s has not grown for %ds (stall_after %ds)" % (log, info["age_s"], stall_after)
        return result
    held = [g for g in gpus if any(h.get("pid") in pids or ancestors(h["pid"], proc) & pids for h in g.get("processes", []))]
    utils = [g.get("utilization_pct") for g in held]
    if held and all(u is not None and u == 0 for u in utils):
        result["state"] = "stalled"
        result["reason"] = "the GPUs it holds (%s) show 0%% utilisation" % ", ".join(str(g.get("index")) for g in held)
    return result
