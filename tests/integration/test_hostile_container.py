# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A container's content is data, never code: the node read against a container's own root.

One unprivileged node (Proxmox VE's default: root mapped to 100000, and its cgroup layout
/lxc/<vmid>/ns) with five containers of the `incident` scenario: train-700 contaminated,
train-701 trainer's stale run holding GPU 1, train-702 a stale cache, train-703 and train-704
healthy; train-704 shares GPU 0 with train-700 (a node's GPU may be passed to several containers).
Its vmids are its own (700-704), so that Proxmox VE's cgroups of no other fleet's containers are
theirs. What each test arranges, the container's root (or
user) arranges inside the container, as an attacker would; then the node reads its containers
(node_readiness read_from=node) from its own root process:

1. trainer's GPU holder left behind in train-703 (a reparented worker): the node read names it a
   leftover, as the read inside the container does, and gives every container the record of the
   read inside it, field by field (owners mapped through the uid map, not the node's 101000);
2. an nsswitch.conf naming a library of the container's (on an idle node, last): nothing of it runs in the node's process
   (no marker on the node nor in any container), and a 1 GiB /etc/passwd is read bounded;
3. the container's root mounts a tmpfs over its /proc, forges its job's comm and maps and puts a
   FIFO where another process's files were: every container of the node is read, in time, the
   job's comm and mappings as the node's /proc says;
4. train-704's root makes cgroups named after train-700 below its own and moves its init and a
   holder of their shared GPU there: they stay train-704's, and train-700 is read as it is;
5. a GPU holder whose name holds a newline, and one that forges a whole nvidia-smi row naming a
   process of another container that holds no GPU: the node's GPU reading stands, and no other
   container is given a holder that is not.

The fleet: state $GPUFLEET_HOSTILE_CT_STATE (default /var/tmp/gpufleet-sim-hostile-ct), port
$GPUFLEET_HOSTILE_CT_PORT (default 2966).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time

import noderead
import pytest
import simfleet
from noderead import differences, node_read, readiness_args, steady

STATE = os.path.abspath(os.environ.get("GPUFLEET_HOSTILE_CT_STATE", "/var/tmp/gpufleet-sim-hostile-ct"))
PORT = os.environ.get("GPUFLEET_HOSTILE_CT_PORT", "2966")
NODE = "pve1"
TOKEN = "gpufleetct" + secrets.token_hex(4)
JOB = "/opt/gpufleet/train_dflash.py"
# The stand-in's claim of a GPU (tests/standins/train_dflash.py): what makes a process a holder.
HOLDER = "/usr/bin/python3 -u %s --state /opt/gpufleet/gpu --gpu 0 --device /dev/nvidia%d --mib 2048 --tag %s"
# The container's root mounts the first hierarchy a process's cgroup file lists (the named systemd
# one of a host that mounts cgroup v1 controllers, else the unified one) where it likes: within its
# cgroup namespace, it is its own cgroup's tree.
HIERARCHY = "/tmp/cg"
MOUNT_HIERARCHY = ("mkdir -p /tmp/cg && (mountpoint -q /tmp/cg || mount -t cgroup -o none,name=systemd cgroup /tmp/cg "
                   "|| mount -t cgroup2 cgroup2 /tmp/cg)")
EVIL_NSS = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    int fd = open("/tmp/%s-nss", O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
}
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    work = tmp_path_factory.mktemp("hostilect")
    inventory = work / "inventory"
    with simfleet.running(STATE, nodes=1, containers=5, scenario="incident", inventory=inventory, port=PORT,
                          unprivileged=NODE, extra=["--pve-cgroups", "--vmid-base", "700"]) as (info, env):
        fleet = noderead.load(info, inventory, STATE, "incident", env)
        fleet["node"] = fleet["nodes"][0]
        fleet["lxc"] = simfleet.lxcpath(STATE, NODE)
        fleet["by_role"] = dict((ct["incident"], ct) for ct in fleet["node"]["containers"][:4])
        fleet["sharing"] = fleet["node"]["containers"][4]
        assert fleet["sharing"]["gpus"] == fleet["by_role"]["contaminated"]["gpus"]
        yield fleet


def rootfs(fleet, ct):
    return os.path.join(fleet["lxc"], str(ct["vmid"]), "rootfs")


def sh(fleet, ct, script, **kw):
    """A script run by the container's root, inside it."""
    return simfleet.sh(fleet["lxc"], ct["vmid"], script, **kw)


def as_trainer(script):
    return "setpriv --reuid=1000 --regid=1000 --clear-groups /bin/sh -c '%s'" % script.replace("'", "'\\''")


def args_for(fleet, ct, **extra):
    args = dict(readiness_args(fleet, ct), job_users=["trainer"], evidence_cache=False)
    args.update(extra)
    return args


def read_all(fleet, read_from="node", timeout=300, **extra):
    containers = fleet["node"]["containers"]
    return node_read(fleet, fleet["node"], read_from, containers,
                     dict((ct["name"], args_for(fleet, ct)) for ct in containers), timeout=timeout, **extra)


def start_holder(fleet, ct, tag, user=True):
    """A process of the container that claims its GPU, reparented to its init (setsid, the shell
    gone): what a crashed job's worker leaves behind. Its PID in the container."""
    line = HOLDER % (JOB, ct["gpus"][0], tag)
    script = "setsid %s </dev/null >/dev/null 2>&1 & echo $!" % line
    pid = int(sh(fleet, ct, as_trainer(script) if user else script).strip())
    for _attempt in range(100):
        if any(tag in cmd for cmd in simfleet.processes(fleet["lxc"], ct["vmid"]).values()):
            break
        time.sleep(0.1)
    time.sleep(1.0)  # its claim written
    return pid


def test_an_unprivileged_node_read_is_the_read_inside_and_finds_trainer_s_leftover(fleet):
    healthy = fleet["by_role"]["healthy"]
    pid = start_holder(fleet, healthy, TOKEN + "-left")
    try:
        inside = read_all(fleet, "container")
        from_node = read_all(fleet, "node")
        for ct in fleet["node"]["containers"]:
            a, b = steady(inside[ct["name"]]), steady(from_node[ct["name"]])
            assert not b.get("failed"), b
            diff = differences(a, b)
            assert diff == [], "%s: %s" % (ct["name"], "\n".join(diff))
        left = from_node[healthy["name"]]["liveness"]["leftovers"]
        assert [(h["pid"], h["user"]) for h in left] == [(pid, "trainer")], from_node[healthy["name"]]["liveness"]
        check = next(c for c in from_node[healthy["name"]]["checks"] if c["name"] == "job_live")
        assert not check["ok"] and "1 GPU holder(s) left by a job that is gone" in check["summary"], check
    finally:
        sh(fleet, healthy, "kill %d" % pid, check=False)


def test_a_huge_or_blocking_passwd_is_read_bounded(fleet):
    """The container's root grows its /etc/passwd to a sparse 1 GiB: its users are still found in
    the first 16 MiB, the rest said to be cut, never read. Then it makes its /etc/passwd a FIFO,
    which blocks whoever opens it to read: it is not read at all, and the read ends in time."""
    ct = fleet["by_role"]["stale_cache"]
    args = {ct["name"]: args_for(fleet, ct, cache_user="trainer")}
    sh(fleet, ct, "cp /etc/passwd /etc/passwd.orig && truncate -s 1G /etc/passwd")
    try:
        got = node_read(fleet, fleet["node"], "node", [ct], args)[ct["name"]]
        assert not got.get("failed"), got
        assert "node read: the container's /etc/passwd is larger than 16777216 bytes: truncated at 16777216 bytes" in got["warnings"], got
        assert any(c["name"] == "inductor" and c["path"] == "/tmp/torchinductor_trainer" for c in got["torch_cache"]["caches"]), got
        sh(fleet, ct, "rm /etc/passwd && mkfifo -m 644 /etc/passwd")
        started = time.monotonic()
        got = node_read(fleet, fleet["node"], "node", [ct], args, timeout=120)[ct["name"]]
        assert time.monotonic() - started < 60
        assert "node read: the container's /etc/passwd is a FIFO, not a regular file: not read" in got["warnings"], got
        assert "user trainer does not exist on this host" in got["torch_cache"]["msg"], got["torch_cache"]
    finally:
        sh(fleet, ct, "rm -f /etc/passwd && mv /etc/passwd.orig /etc/passwd")


def test_a_container_s_own_proc_is_never_read(fleet):
    """train-701's root mounts a tmpfs over its /proc: its job's comm and maps forged (a CUDA-13
    runtime it never mapped), a FIFO in place of its decoy's files. Every container of the node
    gets its record in time; train-701's job is named and judged as the node's /proc says."""
    ct = fleet["by_role"]["stale_holder"]
    job = next(pid for pid, cmd in simfleet.processes(fleet["lxc"], ct["vmid"]).items() if JOB in cmd and "--tag stale" in cmd)
    other = start_holder(fleet, ct, TOKEN + "-fifo")  # a second GPU holder: its files become FIFOs
    forged = "7f0000000000-7f0000001000 r-xp 00000000 00:00 4242 /opt/venv/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13\n"
    sh(fleet, ct, "mount -t tmpfs tmpfs /proc && mkdir -p /proc/%d /proc/%d && printf 'forged\\n' > /proc/%d/comm && "
                  "printf '%s' > /proc/%d/maps && for f in comm maps status stat cmdline cgroup; do mkfifo /proc/%d/$f; done"
                  % (job, other, job, forged, job, other))
    try:
        started = time.monotonic()
        got = read_all(fleet, timeout=240)
        took = time.monotonic() - started
        assert took < 120, took
        for each in fleet["node"]["containers"]:
            assert not got[each["name"]].get("failed"), got[each["name"]]
        mine = got[ct["name"]]
        job_procs = [p for p in mine["job_libraries"]["processes"] if p["pid"] == job]
        assert [p["comm"] for p in job_procs] == ["python3"], mine["job_libraries"]
        mapped = [lib["path"] for p in mine["job_libraries"]["processes"] for lib in p["libraries"]]
        assert not any("cu13" in path for path in mapped) and any("libcudart.so.12" in path for path in mapped), mapped
        assert job in mine["liveness"]["pids"], mine["liveness"]
    finally:
        sh(fleet, ct, "umount /proc; kill %d" % other)


def test_a_container_cannot_give_its_processes_to_another(fleet):
    """train-704's root makes cgroups named after train-700 below its own (LXC's lxc.payload/700,
    Proxmox VE's lxc/700/ns) and moves its init and a holder of the GPU both have into them: they
    stay train-704's; train-700 is read as it was (never "two containers of vmid 700"), its
    processes and its GPU's holders its own."""
    ct, other = fleet["sharing"], fleet["by_role"]["contaminated"]
    before = read_all(fleet)
    pid = start_holder(fleet, ct, TOKEN + "-moved", user=False)
    vmid = other["vmid"]
    try:
        sh(fleet, ct, MOUNT_HIERARCHY + " && cd %s && mkdir -p lxc.payload/%d lxc/%d/ns && echo 1 > lxc.payload/%d/cgroup.procs "
           "&& echo %d > lxc/%d/ns/cgroup.procs" % (HIERARCHY, vmid, vmid, vmid, pid, vmid))
        assert "lxc.payload/%d" % vmid in sh(fleet, ct, "cat /proc/1/cgroup").splitlines()[0]
        got = read_all(fleet)
        for each in fleet["node"]["containers"]:
            assert not got[each["name"]].get("failed"), got[each["name"]]
        assert [p["pid"] for p in got[other["name"]]["processes"]["processes"]] == \
            [p["pid"] for p in before[other["name"]]["processes"]["processes"]]
        held = [h["pid"] for g in got[ct["name"]]["gpu_state"]["gpus"] for h in g["processes"]]
        assert pid in held, got[ct["name"]]["gpu_state"]
        theirs = [(h["pid"], h["name"]) for g in got[other["name"]]["gpu_state"]["gpus"] for h in g["processes"]]
        was = [(h["pid"], h["name"]) for g in before[other["name"]]["gpu_state"]["gpus"] for h in g["processes"]]
        assert theirs == was, (theirs, was)
        assert got[other["name"]]["liveness"]["leftovers"] == before[other["name"]]["liveness"]["leftovers"]
    finally:
        sh(fleet, ct, "cd %s && echo 1 > cgroup.procs; kill %d; sleep 0.5; rmdir lxc/%d/ns lxc/%d lxc lxc.payload/%d lxc.payload; "
                      "cd / && umount /tmp/cg" % (HIERARCHY, pid, vmid, vmid, vmid), check=False)


def test_a_holder_s_name_breaks_no_reading_and_forges_no_holder(fleet):
    """A GPU holder of train-703 whose name holds a newline, then one whose name carries a whole
    nvidia-smi row naming train-702's decoy (a process of trainer's, reparented, that holds no
    GPU): the node's reading of every container stands, and train-702 is given no holder."""
    ct, victim = fleet["by_role"]["healthy"], fleet["by_role"]["stale_cache"]
    decoy = next(pid for pid, cmd in simfleet.processes(fleet["lxc"], victim["vmid"]).items() if "gpufleet-decoy" in cmd)
    decoy_node = simfleet.node_pid(fleet["lxc"], victim["vmid"], decoy)
    uuid = None
    started = []
    try:
        started.append(start_named(fleet, ct, "python3 evil\nname"))
        got = read_all(fleet)
        for c in fleet["node"]["containers"]:
            assert "gpus" in got[c["name"]]["gpu_state"], got[c["name"]]["gpu_state"]
        held = [h["pid"] for g in got[ct["name"]]["gpu_state"]["gpus"] for h in g["processes"]]
        assert started[0] in held, got[ct["name"]]["gpu_state"]
        uuid = got[ct["name"]]["gpu_state"]["gpus"][0]["uuid"]
        started.append(start_named(fleet, ct, "x\n%s, %d, 40960, python3" % (uuid, decoy_node)))
        got = read_all(fleet)
        assert all(not g["processes"] for g in got[victim["name"]]["gpu_state"]["gpus"]), got[victim["name"]]["gpu_state"]
        assert got[victim["name"]]["liveness"]["leftovers"] == []
    finally:
        for pid in started:
            sh(fleet, ct, "kill %d" % pid, check=False)
    assert uuid


def test_a_container_s_nsswitch_loads_nothing_in_the_node(fleet, tmp_path):
    """The container's root names a library of its own in /etc/nsswitch.conf (``passwd:
    /../tmp/evil files``: glibc would dlopen ``libnss_/../tmp/evil.so.2``), and the node reads
    that container alone (``--limit train-700``) with no GPU reading of its own first
    (gpu_read=container) on a node where no process holds a GPU: the node process has made no
    account lookup before the container's job users are looked up. Nothing of the container loads,
    on the node nor in any container. (Last: it stops the node's GPU holders.)"""
    ct = fleet["by_role"]["contaminated"]
    for each in fleet["node"]["containers"]:
        sh(fleet, each, "pkill -KILL -f '[t]rain_dflash.py'; true")
    time.sleep(2)  # their claims released
    src = tmp_path / "evil.c"
    src.write_text(EVIL_NSS % TOKEN)
    lib = os.path.join(rootfs(fleet, ct), "tmp", "evil.so.2")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib, str(src)], check=True)
    os.chown(lib, 100000, 100000)  # the container's root's, as if it had built it there
    sh(fleet, ct, "mkdir /libnss_ && cp /etc/nsswitch.conf /etc/nsswitch.conf.orig && "
                  "printf 'passwd: /../tmp/evil files\\ngroup: /../tmp/evil files\\n' > /etc/nsswitch.conf")
    assert os.path.isdir(os.path.join(rootfs(fleet, ct), "libnss_"))
    try:
        # Read as a host without a GPU, so that its liveness (whose users are looked up) is read at all.
        got = node_read(fleet, fleet["node"], "node", [ct], {ct["name"]: args_for(fleet, ct, require_gpu=False)},
                        gpu_read="container")[ct["name"]]
        markers = [os.path.join(r, "tmp", TOKEN + "-nss") for r in ["/"] + [rootfs(fleet, c) for c in fleet["node"]["containers"]]]
        assert [m for m in markers if os.path.exists(m)] == [], "a library of the container ran"
        assert not got.get("failed") and got["liveness"]["state"] == "none", got
    finally:
        sh(fleet, ct, "mv /etc/nsswitch.conf.orig /etc/nsswitch.conf; rm -rf /libnss_ /tmp/evil.so.2")


def start_named(fleet, ct, name):
    """A holder of the container's GPU whose argv[0] (what nvidia-smi prints as its name) is ``name``."""
    argv = ["-u", JOB, "--state", "/opt/gpufleet/gpu", "--gpu", "0", "--device", "/dev/nvidia%d" % ct["gpus"][0],
            "--mib", "1024", "--tag", TOKEN + "-named"]
    code = "import os, sys; os.execv('/usr/bin/python3', [sys.argv[1]] + sys.argv[2:])"
    script = "setsid /usr/bin/python3 -c \"%s\" \"$0\" \"$@\" </dev/null >/dev/null 2>&1 & echo $!" % code
    res = subprocess.run(simfleet.attach_argv(fleet["lxc"], ct["vmid"], ["/bin/sh", "-c", script, name] + argv), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60, check=True)
    time.sleep(1.5)
    return int(res.stdout.strip())
