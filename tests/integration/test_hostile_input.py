# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Hostile input, decoys and nothing lost, on a simulated fleet of its own.

One node with two containers of the `incident` scenario: train-100 has the CUDA-13
contamination in its venv, train-101 a stale training process holding its GPU. Both get a
stale Inductor cache and decoys that resemble the job or sit beside its caches: processes
(`python3 /home/u/train_dflash.py.bak`, a `vim train_dflash.py`, `tail -F` of the job's log,
a user's own tmux session `notes`) and files (`/tmp/torchinductor_root.keep`, notes in the
cache's parent directory, links from inside the cache to a user's data and notes).

1. Every remediating role on its own (verify, relaunch, kill, purge, verify) on train-100,
   then remediate.yml on train-101: a snapshot of the container's packages, processes and
   files (tests/lib/nothinglost.py) before and after each, and the difference must be
   exactly what the role was asked to remove or change; every decoy survives (same PID and
   start time, same file hashes).
2. Inventory values carrying `;`, `$(...)`, backquotes, quotes, newlines, `..`, option
   look-alikes and links out of scope, each in its own run: a clear refusal where the value
   is invalid, no sentinel file anywhere (node and containers), and the container's whole
   file system, processes and packages, and the node's own files, unchanged.

The fleet: state $GPUFLEET_HOSTILE_STATE (default /var/tmp/gpufleet-sim-hostile), port
$GPUFLEET_HOSTILE_PORT (default 2950), so it runs beside any other fleet.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import time

import inputcounts
import nothinglost
import pytest
import simfleet
from cuda_fixtures import SEED_ADDED, SHARED_LIBS

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
ROLE_PLAYBOOK = os.path.join(REPO, "tests", "integration", "targets", "hostile_input", "role.yml")
STATE = os.path.abspath(os.environ.get("GPUFLEET_HOSTILE_STATE", "/var/tmp/gpufleet-sim-hostile"))
PORT = os.environ.get("GPUFLEET_HOSTILE_PORT", "2950")
TOKEN = "gpufleetpwned" + secrets.token_hex(4)
SENTINEL = "/tmp/" + TOKEN
JOB = "/usr/bin/python3 /opt/gpufleet/train_dflash.py"
LOG = "/var/log/gpufleet-train.log"
CACHE = "/tmp/torchinductor_root"
CLAIMS = "/opt/gpufleet/gpu/claims"
SITE = "/opt/venv/lib/python3.11/site-packages"

# The caches that did not exist are created and recorded as this venv's by purge (state fresh
# records a missing cache, docs/torch_cache.md): their roots and the record, nothing else.
_MISSING = ["/root/.cache/flashinfer", "/root/.cache/torch_extensions", "/root/.cache/tvm-ffi", "/root/.nv/ComputeCache",
            "/root/.triton/cache"]
RECORDED_CACHES = sorted(_MISSING + [r + "/.gpufleet-hygiene-fingerprint.json" for r in _MISSING]
                         + ["/root/.cache", "/root/.nv", "/root/.triton"])

DECOY_SETUP = r"""
set -e
mkdir -p /home/u /home/trainer/data %(cache)s/fxgraph/ab
printf 'import time\ntime.sleep(10**7)\n' > /home/u/train_dflash.py.bak
printf 'a user copy of the script, not the job\n' > /home/u/train_dflash.py
head -c 4096 /dev/urandom > /home/trainer/data/shard-0.bin
printf 'results of run 41\n' > /root/notes.md
printf 'keep me\n' > %(cache)s.keep
printf 'notes beside the cache\n' > /tmp/notes.txt
printf 'compiled by nobody knows which torch\n' > %(cache)s/fxgraph/ab/entry
ln -s /home/trainer/data %(cache)s/fxgraph/data-link
ln -s /root/notes.md %(cache)s/notes-link
ln -s /home/trainer/data /tmp/cache-link
cd /home/u
setsid /usr/bin/python3 /home/u/train_dflash.py.bak </dev/null >/dev/null 2>&1 &
setsid /usr/bin/python3 -c 'import os, sys; os.execv(sys.executable, ["vim", "-c", sys.argv[1], "train_dflash.py"])' \
    'import time; time.sleep(10**7)' </dev/null >/dev/null 2>&1 &
setsid tail -F %(log)s </dev/null >/dev/null 2>&1 &
tmux new-session -d -s notes /usr/bin/python3 -c 'import time; time.sleep(10**7)' notes-of-trainer
"""
DECOY_PROCESSES = ("/usr/bin/python3 /home/u/train_dflash.py.bak", "vim -c import time; time.sleep(10**7) train_dflash.py",
                   "tail -F " + LOG, "/usr/bin/python3 -c import time; time.sleep(10**7) notes-of-trainer")
DECOY_FILES = ("/home/u/train_dflash.py.bak", "/home/u/train_dflash.py", "/home/trainer/data/shard-0.bin", "/root/notes.md",
               CACHE + ".keep", "/tmp/notes.txt", "/tmp/cache-link", "/home/trainer/data", "/home/u")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("hostile")
    with simfleet.running(STATE, nodes=1, containers=2, scenario="incident", inventory=work / "inventory",
                          port=PORT) as (info, env):
        info.update(work=work, env=env, inventory=str(work / "inventory" / "fleet.yml"),
                    lxcpath=simfleet.lxcpath(STATE, "pve1"))
        for vmid in (100, 101):
            sh(info, vmid, DECOY_SETUP % {"cache": CACHE, "log": LOG})
        info["initial"] = {vmid: nothinglost.snapshot(info["lxcpath"], vmid) for vmid in (100, 101)}
        for vmid in (100, 101):
            assert len(decoys(info["initial"][vmid])) == len(DECOY_PROCESSES), info["initial"][vmid]["processes"]
        yield info


def sh(fleet, vmid, script):
    return simfleet.sh(fleet["lxcpath"], vmid, script)


def decoys(snap):
    """{cmdline: (pid, start time)} of the decoy processes."""
    return {p["cmdline"]: (pid, p["start_time"]) for pid, p in snap["processes"].items() if p["cmdline"] in DECOY_PROCESSES}


def ansible_playbook(fleet, playbook, *args, inventories=()):
    env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    argv = [os.path.join(VENV_BIN, "ansible-playbook"), "-i", fleet["inventory"]]
    for inv in inventories:
        argv += ["-i", inv]
    return subprocess.run(argv + [playbook] + list(args), cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=600, check=False)


def run_role(fleet, host, role, *extra, inventories=()):
    return ansible_playbook(fleet, ROLE_PLAYBOOK, "-e", "target_hosts=%s" % host, "-e", "role_under_test=%s" % role,
                            *extra, inventories=inventories)


def node_tree():
    """The node's own files (configs, keys, root's home), the containers' file systems aside."""
    return nothinglost.tree(os.path.join(STATE, "nodes", "pve1"), skip=("lxc/100/rootfs", "lxc/101/rootfs"))


def rootfs(vmid):
    return os.path.join(STATE, "nodes", "pve1", "lxc", str(vmid), "rootfs")


def no_sentinel(everywhere=False):
    """The sentinel every hostile value would create had it reached a shell: at its path on
    the node (the host's /tmp) and in each container; with ``everywhere``, any file named
    after the token under the node's and the containers' trees, the checkout (where the
    controller runs) and the temporary directories."""
    found = [p for p in (SENTINEL, rootfs(100) + SENTINEL, rootfs(101) + SENTINEL) if os.path.lexists(p)]
    if everywhere:
        found += nothinglost.sentinels(TOKEN, ["/tmp", "/var/tmp", REPO, STATE, rootfs(100), rootfs(101)])
        found += [p for p in os.listdir("/") if TOKEN in p]
    assert found == [], "a hostile value reached a shell: %s" % found


def assert_decoys_survive(fleet, vmid, after):
    initial = fleet["initial"][vmid]
    assert decoys(after) == decoys(initial), "a decoy process was stopped or replaced"
    for path in DECOY_FILES:
        assert after["files"].get(path) == initial["files"][path], "decoy %s changed" % path


def files_of(snap, names):
    return set(f for n in names for f in snap["packages"][n]["files"])


def job_pids(d, key):
    return [pid for pid, cmd in d["processes"][key] if cmd.startswith(JOB)]


# --------------------------------------------------------------------------- nothing lost, one role at a time


def test_every_role_changes_only_what_it_was_asked_to(fleet):
    lx = fleet["lxcpath"]
    steps = []
    logs = {}

    def step(role, *extra, refused=None):
        before = nothinglost.snapshot(lx, 100)
        res = run_role(fleet, "train-100", role, *extra)
        if refused is None:
            assert res.returncode == 0, res.stdout[-4000:]
        else:  # the role fails the host, saying why, and still changes only what it was asked to
            assert res.returncode != 0 and refused in res.stdout, res.stdout[-4000:]
        after = nothinglost.snapshot(lx, 100)
        logs[role] = res.stdout
        print("==== %s\n%s" % (role, res.stdout))  # shown when the test fails
        assert_decoys_survive(fleet, 100, after)
        steps.append(role)
        d = nothinglost.diff(before, after)
        nothinglost.own_state_is_root_only(d, after)  # the evidence cache: root's, nothing else
        return before, after, d

    # verify: read-only.
    _b, _a, d = step("verify", "-e", "verify_fail=false")
    assert nothinglost.is_empty(d), d

    # relaunch: one new process, the job; its log and its GPU claim. The venv is still the
    # contaminated one, so the new run maps its CUDA 13 NCCL (and the CUDA 13 runtime that links
    # in): the role launches it, reads what it maps, and fails the host naming the library.
    _b, after, d = step("relaunch", refused="the relaunched job runs on the wrong libraries: 2 wrong libraries mapped")
    [job] = job_pids(d, "new")
    assert d["processes"] == {"gone": [], "new": [(job, after["processes"][str(job)]["cmdline"])]}
    assert d["files"] == {"removed": [], "added": ["%s/%d.json" % (CLAIMS, job), LOG], "changed": []}
    assert not any(d["packages"].values())

    # kill: exactly the job stops; its claim goes; the log it wrote until then may grow.
    before, _a, d = step("kill")
    assert before["processes"][str(job)]["state"] not in ("Z", "X"), before["processes"]
    assert d["processes"]["new"] == [] and [p for p, _c in d["processes"]["gone"]] == [job], (d, logs["kill"][-3000:])
    assert d["files"]["removed"] == ["%s/%d.json" % (CLAIMS, job)]
    assert d["files"]["added"] == [] and d["files"]["changed"] in ([], [LOG])
    assert not any(d["packages"].values())

    # purge: the contaminants and the leftovers go, with their files and nothing else; the
    # files they had overwritten come back; the stale cache is emptied (its links removed,
    # never followed) and recorded; nothing beside it is touched.
    before, after, d = step("purge")
    asked = sorted(n for n, _v in SEED_ADDED)
    assert d["packages"] == {"removed": asked, "added": [], "changed": []}
    assert not any(d["processes"].values())
    owned_by_removed = files_of(before, asked)
    kept = set(before["packages"]) - set(asked)
    shared = owned_by_removed & files_of(before, kept)
    site_removed = nothinglost.under(d["files"]["removed"], SITE)
    assert set(site_removed) >= owned_by_removed - shared  # every file of theirs is gone ...
    for path in site_removed:  # ... and what else went is a directory they alone filled
        assert path in owned_by_removed or any(f.startswith(path + "/") for f in owned_by_removed), path
    # The packages whose files had been overwritten are reinstalled at their versions: those
    # files are back, and the installer rewrote their own records (RECORD, uv_cache.json).
    restored = {"nvidia-%s-cu12" % lib for lib in SHARED_LIBS}
    clobbered = {"%s/%s" % (SITE, rel) for rel in SHARED_LIBS.values()}
    assert set(nothinglost.under(d["files"]["changed"], SITE)) >= clobbered
    restored_info = [os.path.dirname(f) for f in files_of(before, restored) if f.endswith(".dist-info/METADATA")]
    assert len(restored_info) == len(restored)
    for path in nothinglost.under(d["files"]["added"] + d["files"]["changed"], SITE):
        assert path in clobbered or nothinglost.under([path], *restored_info), path
    cache_gone = nothinglost.under(before["files"], CACHE + "/")
    assert nothinglost.under(d["files"]["removed"], CACHE + "/") == cache_gone
    assert nothinglost.under(d["files"]["added"], CACHE + "/") == [CACHE + "/.gpufleet-hygiene-fingerprint.json"]
    created = RECORDED_CACHES
    everything = d["files"]["removed"] + d["files"]["added"] + d["files"]["changed"]
    assert nothinglost.outside(everything, SITE, CACHE + "/") == created
    assert nothinglost.outside(d["files"]["added"], SITE, CACHE + "/") == created

    # verify again: still read-only, and now every check passes.
    _b, _a, d = step("verify")
    assert nothinglost.is_empty(d), d
    assert steps == ["verify", "relaunch", "kill", "purge", "verify"]


def test_remediate_changes_only_what_it_was_asked_to(fleet):
    """remediate.yml on the stale holder: the stale process goes, the job is relaunched, the
    stale cache is emptied; the venv, the decoys and every other file stay."""
    lx = fleet["lxcpath"]
    before = nothinglost.snapshot(lx, 101)
    [stale] = [int(p) for p, v in before["processes"].items() if v["cmdline"].startswith(JOB) and "--tag stale" in v["cmdline"]]
    res = ansible_playbook(fleet, os.path.join(REPO, "playbooks", "remediate.yml"), "-e", "gpufleet_hosts=train-101")
    assert res.returncode == 0, res.stdout[-4000:]
    after = nothinglost.snapshot(lx, 101)
    assert_decoys_survive(fleet, 101, after)
    d = nothinglost.diff(before, after)
    assert [p for p, _c in d["processes"]["gone"]] == [stale]
    [job] = job_pids(d, "new")
    assert [p for p, _c in d["processes"]["new"]] == [job] and "--tag" not in after["processes"][str(job)]["cmdline"]
    assert not any(d["packages"].values())
    assert d["files"]["removed"] == sorted(["%s/%d.json" % (CLAIMS, stale)] + nothinglost.under(before["files"], CACHE + "/"))
    assert d["files"]["added"] == sorted(["%s/%d.json" % (CLAIMS, job), CACHE + "/.gpufleet-hygiene-fingerprint.json"]
                                         + RECORDED_CACHES)
    # The stale run had written its slow readings to the job's log; the relaunched job appends to it.
    assert d["files"]["changed"] == [LOG]


# --------------------------------------------------------------------------- hostile inventory values


def job(**change):
    """The fleet's job as the inventory describes it, with some values replaced."""
    base = {
        "command": [JOB.split()[0], JOB.split()[1], "--state", "/opt/gpufleet/gpu", "--gpu", "0", "--device", "/dev/nvidia0",
                    "--mib", "40960", "--log-throughput", "20000", "--log-every", "0.5"],
        "workdir": "/root", "env": {}, "method": "tmux", "tmux_session": "train", "log": LOG,
        "patterns": [r"^\S*python3? /opt/gpufleet/train_dflash\.py", r"^\S*python3? /opt/gpufleet/train-standin"],
        "users": [], "ready_regex": r"^step \d+ loss", "baseline_tokens_per_s": 20000,
    }
    base.update(change)
    return base


S = SENTINEL
LXCPATH = os.path.join(STATE, "nodes", "pve1", "lxc")
# (case id, role or playbook, host variables of train-100, what the refusal says or None
# when the value is harmless and the run must pass without changing anything)
CASES = [
    # The connection: the vmid and the node-side paths reach the node's shell.
    ("vmid-semicolon", "verify", {"ansible_pct_vmid": "100; touch %s" % S}, "vmid must be an integer"),
    ("vmid-subshell", "verify", {"ansible_pct_vmid": "$(touch %s)" % S}, "vmid must be an integer"),
    ("vmid-newline", "verify", {"ansible_pct_vmid": "100\ntouch %s" % S}, "vmid must be an integer"),
    ("vmid-backquote", "verify", {"ansible_pct_vmid": "`touch %s`" % S}, "vmid must be an integer"),
    ("vmid-dotdot", "verify", {"ansible_pct_vmid": "../100"}, "vmid must be an integer"),
    # The read is the node's, which starts no program: a hostile lxc path or pct path is never run
    # (nothing is touched, no sentinel); the repairs, which enter the container, refuse them (kill).
    ("lxc-path-semicolon", "verify", {"ansible_pct_method": "lxc-attach", "ansible_pct_lxc_path": "%s; touch %s" % (LXCPATH, S),
                                      "verify_fail": False}, None),
    ("pct-path-subshell", "verify", {"ansible_pct_path": "pct$(touch %s)" % S, "verify_fail": False}, None),
    ("lxc-path-semicolon-kill", "kill", {"ansible_pct_method": "lxc-attach", "ansible_pct_lxc_path": "%s; touch %s" % (LXCPATH, S)},
     "lxc-attach"),
    ("pct-path-subshell-kill", "kill", {"ansible_pct_path": "pct$(touch %s)" % S}, "not found on node"),
    ("node-user-option", "verify", {"ansible_pct_node_user": "root -oProxyCommand=touch\\ %s" % S}, "node_user must be a user name"),
    ("node-user-dash", "verify", {"ansible_pct_node_user": "-oProxyCommand=touch %s" % S}, "node_user must be a user name"),
    # kill: the tmux session and the process patterns.
    ("tmux-session-colon", "kill", {"gpufleet_job": job(tmux_session="notes:0")}, "scope.tmux_session 'notes:0'"),
    ("tmux-session-dot", "kill", {"gpufleet_job": job(tmux_session="notes.0")}, "scope.tmux_session 'notes.0'"),
    ("tmux-session-newline", "kill", {"gpufleet_job": job(tmux_session="train\nnotes")}, "no session is named that way"),
    ("tmux-session-shell", "kill", {"gpufleet_job": job(tmux_session="train; touch %s" % S)}, None),
    ("tmux-session-subshell", "kill", {"gpufleet_job": job(tmux_session="$(touch %s)" % S)}, None),
    ("pattern-empty", "kill", {"gpufleet_job": job(patterns=[""])}, "matches the empty string, so it matches every process"),
    ("pattern-dotstar", "kill", {"gpufleet_job": job(patterns=[".*"])}, "matches the empty string, so it matches every process"),
    ("pattern-alternative-empty", "kill", {"gpufleet_job": job(patterns=["train_dflash|"])}, "matches the empty string"),
    ("pattern-invalid", "kill", {"gpufleet_job": job(patterns=["("])}, "invalid regular expression"),
    ("pattern-subshell", "kill", {"gpufleet_job": job(patterns=["$(touch %s)" % S, "`touch %s`" % S])}, None),
    ("pattern-quotes", "kill", {"gpufleet_job": job(patterns=["train_dflash.py'; touch %s; echo '" % S])}, None),
    # The simulated containers have no systemd: the unit name reaches systemctl as one argument, which fails.
    ("systemd-unit-shell", "kill", {"gpufleet_job": job(tmux_session="", systemd_unit="x; touch %s" % S)},
     "System has not been booted with systemd"),
    # purge: the venv, the leftovers, the wheel source, the cache variables.
    ("venv-semicolon", "purge", {"gpufleet_venv": "/opt/venv; touch %s" % S}, "does not exist"),
    ("venv-subshell", "purge", {"gpufleet_venv": "$(touch %s)" % S}, "does not exist"),
    ("venv-dotdot-to-root", "purge", {"gpufleet_venv": "/opt/venv/../.."}, "it is not a virtual environment"),
    ("venv-link-to-usr", "purge", {"gpufleet_venv": "/tmp/cache-link/../../../usr"}, "it is not a virtual environment"),
    ("also-remove-shell", "purge", {"gpufleet_also_remove": ["sglang; touch %s" % S]}, "which is not a package name"),
    ("also-remove-option", "purge", {"gpufleet_also_remove": ["--python=/usr/bin/python3"]}, "which is not a package name"),
    ("also-remove-dotdot", "purge", {"gpufleet_also_remove": ["../torch", "`touch %s`" % S]}, "which are not package names"),
    ("find-links-option", "purge", {"gpufleet_find_links": "--index-url=http://127.0.0.1:9/simple"}, "is not a directory of wheels"),
    ("cache-not-absolute", "purge", {"gpufleet_job": job(env={"TORCHINDUCTOR_CACHE_DIR": "$(touch %s)" % S})},
     "is not an absolute path"),
    ("cache-dotdot", "purge", {"gpufleet_job": job(env={"TORCHINDUCTOR_CACHE_DIR": "/tmp/../etc"})}, "the top-level directory /etc"),
    ("cache-link-out", "purge", {"gpufleet_job": job(env={"TORCHINDUCTOR_CACHE_DIR": "/tmp/cache-link"})},
     "is a symbolic link to /home/trainer/data"),
    ("cache-home", "purge", {"gpufleet_job": job(env={"TRITON_CACHE_DIR": "/root"})}, "is the home directory /root"),
    ("cache-holds-venv", "purge", {"gpufleet_job": job(env={"CUDA_CACHE_PATH": "/opt/venv/.."})}, "the top-level directory /opt"),
    ("cache-newline", "purge", {"gpufleet_job": job(env={"TORCHINDUCTOR_CACHE_DIR": "/tmp\n/etc"})}, "holds a control character"),
    # relaunch: the command, the environment, the session, the working directory, the log.
    ("env-name-option", "relaunch", {"gpufleet_job": job(env={"-S": "touch %s" % S})}, "are not variable names"),
    ("env-name-assignment", "relaunch", {"gpufleet_job": job(env={"A=$(touch %s)" % S: "1"})}, "are not variable names"),
    ("relaunch-session-colon", "relaunch", {"gpufleet_job": job(tmux_session="notes:0")}, "a character tmux reads as a window"),
    ("workdir-relative", "relaunch", {"gpufleet_job": job(workdir="../..")}, "workdir '../..' is not an absolute path"),
    ("workdir-missing", "relaunch", {"gpufleet_job": job(workdir="/root; touch %s" % S)}, "is not a directory in the container"),
    ("log-relative", "relaunch", {"gpufleet_job": job(log="$(touch %s)" % S)}, "is not an absolute path"),
    # verify reads only: a hostile venv is a failed check with its reason, never a command.
    ("verify-venv-subshell", "verify", {"gpufleet_venv": "`touch %s`" % S, "verify_fail": False}, None),
]


def case_inventory(fleet, path, cases):
    """One inventory host per case, each the container train-100 as the fleet's inventory
    describes it with the case's values on top: every case of a role runs in one
    ansible-playbook, in parallel, each value in its own host's variables."""
    with open(fleet["inventory"]) as f:
        base = json.loads("".join(line for line in f if not line.startswith("#")))
    train100 = base["all"]["children"]["pve_containers"]["children"]["node_pve1"]["hosts"]["train-100"]
    hosts = {"case-" + case_id: dict(train100, **hostvars) for case_id, _role, hostvars, _refusal in cases}
    path.write_text(json.dumps({"all": {"children": {"pve_containers": {"children": {"node_pve1": {"hosts": hosts}}}}}}))
    return str(path)


def host_results(output, host):
    """(unreachable + failed count, the host's failure lines) from an ansible-playbook output."""
    recap = re.search(r"^%s\s+: ok=\d+\s+changed=\d+\s+unreachable=(\d+)\s+failed=(\d+)" % re.escape(host), output, re.MULTILINE)
    assert recap, "no recap for %s" % host
    lines = [line for line in output.splitlines() if line.startswith(("fatal: [%s]" % host, "failed: [%s]" % host))]
    return int(recap.group(1)) + int(recap.group(2)), "\n".join(lines)


ROLES = ("verify", "kill", "purge", "relaunch")


@pytest.mark.parametrize("role", ROLES)
def test_hostile_inventory_values(fleet, tmp_path, role):
    cases = [c for c in CASES if c[1] == role]
    inv = case_inventory(fleet, tmp_path / "cases.yml", cases)
    before, node_before = nothinglost.snapshot(fleet["lxcpath"], 100), node_tree()
    res = ansible_playbook(fleet, ROLE_PLAYBOOK, "-f", "12", "-e", "target_hosts=" + ",".join("case-" + c[0] for c in cases),
                           "-e", "role_under_test=" + role, inventories=[inv])
    after, node_after = nothinglost.snapshot(fleet["lxcpath"], 100), node_tree()
    inputcounts.record("hostile-inventory", role, len(cases))
    no_sentinel()
    wrong = []
    for case_id, _role, _hostvars, refusal in cases:
        failures, lines = host_results(res.stdout, "case-" + case_id)
        if refusal is None and failures:
            wrong.append("%s: should pass, failed: %s" % (case_id, lines[-600:]))
        elif refusal is not None and (not failures or refusal not in lines):
            wrong.append("%s: should be refused with %r, got: %s" % (case_id, refusal, lines[-600:] or "no failure"))
    assert wrong == [], "\n".join(wrong)
    d = nothinglost.diff(before, after)
    assert nothinglost.is_empty(d), d
    assert node_after == node_before
    assert_decoys_survive(fleet, 100, after)


def overlay_inventory(path, hostvars):
    path.write_text(json.dumps({"all": {"children": {"pve_containers": {"children": {"node_pve1": {
        "hosts": {"train-100": hostvars}}}}}}}))
    return str(path)


def test_job_secrets_never_reach_the_output_at_vvv(fleet, tmp_path):
    """gpufleet_job.env holds tokens (HF_TOKEN): verify, purge, relaunch and kill at -vvv print
    every module argument and result, and the token is in none of them; the cache variables
    of the same environment still reach torch_cache."""
    secret = "hf_" + secrets.token_hex(16)
    inv = overlay_inventory(tmp_path / "overlay.yml", {"gpufleet_job": job(env={"HF_TOKEN": secret, "TORCHINDUCTOR_CACHE_DIR": CACHE})})
    outputs = {}
    # A tmux server of its own (the decoy sessions keep the container's usual one running), so
    # that the relaunch is what starts it: a server keeps the command line that started it.
    tmux_dir = "/tmp/gpufleet-secret-tmux"
    sh(fleet, 100, "mkdir -m 700 %s" % tmux_dir)
    env = json.dumps({"role_environment": {"TMUX_TMPDIR": tmux_dir}})
    try:
        for role in ("verify", "purge", "relaunch", "kill"):
            res = run_role(fleet, "train-100", role, "-vvv", "-e", "verify_fail=false", "-e", env, inventories=[inv])
            assert res.returncode == 0, res.stdout[-3000:]
            outputs[role] = res.stdout
            assert secret not in res.stdout, "%s printed the job's token" % role
            if role == "relaunch":
                # Every command line in the container, the new tmux server's and the job's included.
                cmdlines = sh(fleet, 100, "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done")
                assert "tmux" in sh(fleet, 100, "ls %s" % tmux_dir)
                assert secret not in cmdlines, "a process's command line shows the job's token"
    finally:
        sh(fleet, 100, "rm -rf %s" % tmux_dir)
    assert '"TORCHINDUCTOR_CACHE_DIR": "%s"' % CACHE in outputs["verify"]  # what places the caches still goes
    assert "HF_TOKEN" not in outputs["verify"] and "HF_TOKEN" not in outputs["purge"]
    inputcounts.record("hostile-inventory", "secret-in-job-env", 1)


def test_decoys_survived_everything(fleet):
    """After every role, remediate.yml and every hostile value: the decoys of both
    containers are the processes and files they were at the start."""
    for vmid in (100, 101):
        assert_decoys_survive(fleet, vmid, nothinglost.snapshot(fleet["lxcpath"], vmid))
    assert sh(fleet, 100, "tmux has-session -t =notes && echo yes").strip() == "yes"
    no_sentinel(everywhere=True)
    assert re.fullmatch(r"gpufleetpwned[0-9a-f]{8}", TOKEN)


def test_hostile_files_in_a_venv_are_problems_not_hangs(fleet):
    """A container user's venv holding a FIFO as a METADATA and a RECORD linked to /dev/zero:
    the readiness read over the real transport returns, within a bound, with both named in
    its problems (it would block on the FIFO, or read /dev/zero forever, if it followed them)."""
    info = SITE + "/hostile_pkg-1.0.dist-info"
    sh(fleet, 101, "mkdir %s && mkfifo %s/METADATA && ln -s /dev/zero %s/RECORD" % (info, info, info))
    try:
        env = dict(fleet["env"], ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
                   PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
        args = json.dumps({"venv": "/opt/venv", "require_gpu": False, "caches": False})
        start = time.monotonic()
        res = subprocess.run([os.path.join(VENV_BIN, "ansible"), "train-101", "-i", fleet["inventory"], "-m",
                              "gpufleet.hygiene.readiness", "-a", args], cwd=REPO, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300, check=False)
        elapsed = time.monotonic() - start
        assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
        # The ad-hoc callback prints "<host> | SUCCESS => {the result as JSON}".
        assert "train-101 | SUCCESS => {" in res.stdout, (res.stdout[:3000], res.stderr[-2000:])
        result = json.JSONDecoder().raw_decode(res.stdout[res.stdout.index(" => {") + 4:])[0]
        problems = result["cuda_contamination"]["problems"]
        assert "hostile_pkg-1.0.dist-info/METADATA is a FIFO, not a regular file: not read" in problems
        assert "hostile_pkg-1.0.dist-info/RECORD is a symbolic link: not followed, not read" in problems
        assert result["cuda_contamination"]["reference"]["cuda_version"] == "12.8"
        assert elapsed < 120, elapsed
    finally:
        sh(fleet, 101, "rm -rf %s" % info)
    inputcounts.record("hostile-files", "fifo-and-dev-zero-in-venv", 1)
