# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node read's container view (view/_view): ids as an unprivileged container sees them
(its uid_map), its /proc from the node's through per-process handles, its accounts from its own
/etc/passwd parsed as bytes, its files resolved inside its root (fs/_root) while the thread's
own root stays the node's, nothing run, and a read that does not end left behind at its deadline."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _files, _root
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _accounts, _cgroup, _view

# The reads below take milliseconds; their deadline is a safety net, wide enough for a machine
# busy with other suites (a read left behind at it would fail the test for the wrong reason).
DEADLINE = 300

# Proxmox VE's default for an unprivileged container: root is 100000 on the node.
UNPRIVILEGED = "         0     100000      65536\n"
PRIVILEGED = "         0          0 4294967295\n"


def test_an_unprivileged_containers_ids_are_shown_as_it_sees_them():
    id_map = _view.parse_id_map(UNPRIVILEGED)
    assert id_map == [(0, 100000, 65536)]
    assert _view.inside_id(id_map, 100000) == 0
    assert _view.inside_id(id_map, 101000) == 1000
    assert _view.inside_id(id_map, 165535) == 65535
    # The node's own root and ids past the range have no id there: the kernel's overflow id.
    assert _view.inside_id(id_map, 0) == _view.OVERFLOW_ID
    assert _view.inside_id(id_map, 165536) == _view.OVERFLOW_ID
    assert _view.inside_id(_view.parse_id_map(PRIVILEGED), 1000) == 1000


def test_a_split_idmap_maps_each_range():
    # lxc.idmap with a user passed through: u 0 100000 1000, u 1000 1000 1, u 1001 101001 64535
    id_map = _view.parse_id_map("0 100000 1000\n1000 1000 1\n1001 101001 64535\n")
    assert [_view.inside_id(id_map, u) for u in (100000, 100999, 1000, 101001, 999)] == [0, 999, 1000, 1001, _view.OVERFLOW_ID]


def fake_proc(tmp_path, pid, stat, status, cgroup):
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text(stat)
    (d / "status").write_text(status)
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(b"python3\0train.py\0")
    return os.open(str(d), os.O_RDONLY | os.O_DIRECTORY)


def test_its_proc_is_the_nodes_with_pids_and_users_as_the_container_sees_them(tmp_path):
    init_fd = fake_proc(tmp_path, 4100, "4100 (init) S 4000 4100 4100 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 500 0\n",
                        "Name:\tinit\nPid:\t4100\nPPid:\t4000\nUid:\t100000\t100000\t100000\t100000\n"
                        "Gid:\t100000\t100000\t100000\t100000\nNSpid:\t4100\t1\n", "0::/lxc/123/ns/init.scope\n")
    job_fd = fake_proc(tmp_path, 4200, "4200 (python3) R 4100 4200 4200 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 777 0\n",
                       "Name:\tpython3\nPid:\t4200\nPPid:\t4100\nUid:\t101000\t101000\t101000\t101000\n"
                       "Gid:\t101000\t101000\t101000\t101000\nNSpid:\t4200\t7\n", "0::/lxc/123/ns/user.slice\n")
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(123, 4100, root_fd, {1: init_fd, 7: job_fd}, {4100: 1, 4200: 7},
                               _view.parse_id_map(UNPRIVILEGED), _view.parse_id_map(UNPRIVILEGED), "/lxc/123/ns",
                               proc=str(tmp_path / "proc"))
    try:
        assert view.listdir("/proc") == ["1", "7"]
        assert _proc.parse_stat(view.read_proc("/proc/7/stat").decode()) == ("python3", "R", 1, 777)
        assert _proc.parse_stat(view.read_proc("/proc/1/stat").decode())[2] == 0  # its parent is outside
        assert _proc.parse_status(view.read_proc("/proc/7/status").decode()) == (1000, [7])
        assert _proc.parse_status(view.read_proc("/proc/1/status").decode()) == (0, [1])
        assert view.read_proc("/proc/7/cgroup") == b"0::/user.slice\n"
        assert _cgroup.vmid_of_cgroup(view.read_proc("/proc/7/cgroup").decode()) is None
        assert view.read_proc("/proc/7/cmdline") == b"python3\0train.py\0"
        # A PID the container does not have is gone, whatever the node has under that number;
        # /proc/self is the node's reader, no process of the container's; ".." leaves nothing.
        for path in ("/proc/4200/stat", "/proc/self/status", "/proc/thread-self/status", "/proc/7/../4200/stat",
                     "/proc/1/../../etc/passwd"):
            with pytest.raises(FileNotFoundError):
                view.read_proc(path)
        # The kernel's own files are the node's /proc's (the view's proc), never the container's.
        (tmp_path / "proc" / "uptime").write_text("12.5 3.0\n")
        assert view.read_proc("/proc/uptime") == b"12.5 3.0\n"
        # Outside /proc: no business of the view's.
        assert view.read_proc("/etc/passwd") is None
    finally:
        view.close()


def test_a_process_described_in_the_view_is_text_with_the_container_s_names(tmp_path):
    """proc/_proc through the view as the node read runs it: describe() gives text (the view
    hands bytes), the user named from the container's /etc/passwd, and a uid it does not list
    by its number."""
    os.makedirs(tmp_path / "etc")
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\ntrainer:x:1000:1000::/home/trainer:/bin/bash\n")
    job_fd = fake_proc(tmp_path, 4200, "4200 (python3) R 4100 4200 4200 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 777 0\n",
                       "Name:\tpython3\nUid:\t101000\t101000\t101000\t101000\nNSpid:\t4200\t7\n", "0::/lxc/123/ns/user.slice\n")
    other_fd = fake_proc(tmp_path, 4300, "4300 (sleep) S 4100 4300 4300 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 900 0\n",
                         "Name:\tsleep\nUid:\t104242\t104242\t104242\t104242\nNSpid:\t4300\t9\n", "0::/lxc/123/ns/user.slice\n")
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(123, 4100, root_fd, {7: job_fd, 9: other_fd}, {4200: 7, 4300: 9},
                               _view.parse_id_map(UNPRIVILEGED), _view.parse_id_map(UNPRIVILEGED), "/lxc/123/ns")
    seen = {}

    def work():
        seen["job"] = _proc.describe(7)
        seen["other"] = _proc.describe(9)

    try:
        _view.run(view, work, DEADLINE)
    finally:
        view.close()
    job, other = seen["job"], seen["other"]
    assert (job["comm"], job["state"], job["cmdline"], job["uid"], job["user"]) == ("python3", "R", "python3 train.py", 1000, "trainer")
    assert (other["comm"], other["uid"], other["user"]) == ("sleep", 4242, "4242")


def _tree_with_links(tmp_path):
    node_secret = tmp_path / "node-secret"
    node_secret.write_text("the node's own file\n")
    root = tmp_path / "ct"
    os.makedirs(root / "etc" / "sub")
    (root / "etc" / "secret").write_text("the container's file\n")
    # Directories on the way named by links: absolute ones name the node's directory of the
    # secret, relative ones climb far above the container's root to reach it.
    os.symlink(str(tmp_path), root / "abs-dir")
    os.symlink("../../../../../../../../" + str(tmp_path), root / "up-dir")
    os.symlink(str(node_secret), root / "abs-link")
    os.symlink("/etc/secret", root / "etc" / "sub" / "to-own")  # absolute, to the container's own file
    os.symlink("../secret", root / "etc" / "sub" / "rel")
    os.symlink("/etc", root / "etc-link")
    os.symlink("../../../../etc", root / "etc" / "sub" / "up-etc")  # climbs above / and stays there
    os.symlink("loop-b", root / "loop-a")
    os.symlink("loop-a/x", root / "loop-b")
    os.mkfifo(root / "etc" / "fifo")
    return node_secret, root


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch):
    """Each test of a root's resolution runs twice: with openat2, and with the walk it falls back to."""
    if request.param == "walk":
        monkeypatch.setattr(_root.calls(), "openat2", False)
    elif _root.calls().openat2 is False:
        pytest.skip("this kernel has no openat2")  # pragma: no cover - every kernel since 5.6 has it
    return request.param


def test_a_view_resolves_every_path_inside_the_container_and_its_thread_keeps_the_node_s_root(tmp_path, resolution):
    node_secret, root = _tree_with_links(tmp_path)
    root_fd = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(9, 1, root_fd, {}, {}, [], [], None)
    name = node_secret.name

    def read(path):
        problems = []
        data = _files.read_file(path, "pth", problems)
        return data.decode().strip() if data is not None else problems[0]

    def work():
        out = [read(p) for p in ("/etc/secret", "/etc-link/secret", "/../../../etc/secret", "/etc/sub/up-etc/secret",
                                 "/abs-dir/" + name, "/up-dir/" + name, str(node_secret), "/loop-a/y", "/etc/fifo",
                                 "/abs-link", "/etc/sub/to-own")]
        out += [_root.realpath("/etc-link/sub/rel"), _root.realpath("/etc/sub/to-own"), _root.realpath("/up-dir/" + name),
                _root.realpath("/etc-link/../nowhere/x"), _root.isdir("/etc-link"), _root.exists("/abs-link"),
                _root.lexists("/abs-link"), _root.readlink("/etc/sub/rel"), sorted(_root.listdir("/etc-link/sub"))]
        with open(str(node_secret)) as f:  # what is not asked of fs/_root is the node's, as the C library's is
            out.append(f.read().strip())
        return out

    try:
        got = _view.run(view, work, DEADLINE)
    finally:
        view.close()
    assert got[:4] == ["the container's file"] * 4
    assert got[4:7] == ["/abs-dir/%s does not exist" % name, "/up-dir/%s does not exist" % name, "%s does not exist" % node_secret]
    assert got[7] == "/loop-a/y is a symbolic link: not followed, not read"  # ELOOP: two links naming each other
    assert got[8] == "/etc/fifo is a FIFO, not a regular file: not read"
    # A link at the end of a file's path is never followed (fs/_files), inside a root too.
    assert got[9:11] == ["/abs-link is a symbolic link: not followed, not read", "/etc/sub/to-own is a symbolic link: not followed, not read"]
    assert got[11:] == ["/etc/secret", "/etc/secret", str(tmp_path) + "/" + name, "/nowhere/x", True, False, True,
                        "../secret", ["rel", "to-own", "up-etc"], "the node's own file"]


def test_a_view_reads_no_file_of_a_kernel_file_system_nor_writes_any(tmp_path, resolution):
    """A container's root can mount a procfs or sysfs anywhere in its tree or link to its /proc:
    the node never reads such a file as the container's data, by its path nor by its file
    system's type; and it opens nothing to write."""
    root = tmp_path / "ct"
    (root / "etc").mkdir(parents=True)
    os.symlink("/proc/self/status", tmp_path / "to-proc")
    root_fd = os.open(str(root), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(9, 1, root_fd, {}, {}, [], [], None)

    def work():
        out = []
        for path in ("/proc/1/environ", "/proc", "/etc/../proc/self/status"):
            with pytest.raises(OSError) as info:
                _root.open(path, os.O_RDONLY)
            out.append(info.value.strerror)
        # Reached through a link, or a mount, of the tree: refused by the file system's type. (The
        # host's own root stands for a container's here: one of its links leads into a procfs.)
        host = os.open("/", os.O_PATH | os.O_DIRECTORY)
        try:
            for path in (str(tmp_path / "to-proc"), "/sys/kernel/mm/transparent_hugepage/enabled"):
                with pytest.raises(OSError) as info:
                    _root.Root(host).open(path, os.O_RDONLY)
                out.append(info.value.strerror)
        finally:
            os.close(host)
        for flags in (os.O_WRONLY, os.O_RDWR, os.O_RDONLY | os.O_CREAT, os.O_RDONLY | os.O_TRUNC):
            with pytest.raises(OSError) as info:
                _root.open("/etc/new", flags)
            out.append(info.value.strerror)
        return out

    try:
        got = _view.run(view, work, DEADLINE)
    finally:
        view.close()
    assert got[:3] == ["a container's /proc is never read from its node: process facts come from the node's own /proc"] * 3
    assert got[3:5] == ["on the container's procfs: a kernel file system's, never read as its data",
                        "on the container's sysfs: a kernel file system's, never read as its data"]
    assert got[5:] == ["a container is only read from its node, never written"] * 4
    assert not (root / "etc" / "new").exists()


def test_a_view_s_thread_runs_nothing_and_loads_nothing(tmp_path):
    """Run in a child process: the audit hook stays for the life of the process that installs it."""
    marker = tmp_path / "ran"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "evil").write_text("#!/bin/sh\ntouch %s\n" % marker)
    (tmp_path / "bin" / "evil").chmod(0o755)
    code = r"""
import os, subprocess, sys
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _view
root_fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
view = _view.ContainerView(9, 1, root_fd, {}, {}, [], [], None)
def work():
    out = []
    for attempt in (lambda: subprocess.run([sys.argv[1] + "/bin/evil"]), lambda: __import__("ctypes").CDLL(sys.argv[1] + "/bin/evil"),
                    lambda: os.system(sys.argv[1] + "/bin/evil")):
        try:
            attempt()
            out.append("ran")
        except (PermissionError, OSError) as exc:
            out.append("refused" if "runs nothing" in str(exc) else repr(exc))
    return out
print("|".join(_view.run(view, work, 300)))
subprocess.run([sys.argv[1] + "/bin/evil"], check=True)  # the node's own threads run what the node runs
"""
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["refused|refused|refused"]
    assert marker.exists()  # by the node's own thread, after


def test_a_read_that_does_not_end_is_left_behind_at_its_deadline(tmp_path):
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(42, 1, root_fd, {}, {}, [], [], None)
    release = threading.Event()
    started = time.monotonic()
    with pytest.raises(_view.Late) as info:
        _view.run(view, lambda: release.wait(60), 0.5)
    assert time.monotonic() - started < 5
    assert "reading container 42 from its node did not finish within 0.5s" in info.value.msg
    assert view.abandoned
    view.close()  # kept open for the thread still reading
    assert os.fstat(root_fd)
    release.set()
    view.abandoned = False
    view.close()


def test_an_unprivileged_containers_root_owns_its_files_in_its_view(tmp_path):
    """Its /var, 100000's on the node, is root's as the container sees it: a directory the
    restore record may be kept under (venv/_contamination's trust check), not another user's."""
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _restore

    os.makedirs(tmp_path / "var" / "lib")
    os.chown(tmp_path / "var", 100000, 100000)
    os.chmod(tmp_path / "var", 0o755)
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(11, 1, root_fd, {}, {}, _view.parse_id_map(UNPRIVILEGED), _view.parse_id_map(UNPRIVILEGED), None)
    try:
        inside = _view.run(view, lambda: (_accounts.seen_uid(_root.stat_path("/var").st_uid),
                                          _restore._trusted(_root.stat_path("/var"))), DEADLINE)
    finally:
        view.close()
    assert inside == (0, True)
    # On the node it is 100000's, not root's.
    assert _restore._trusted(os.stat(tmp_path / "var")) is False


def _proc_entry(proc, pid, nspid, vmid, init=False):
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text("0::/lxc/%d/ns/%s\n" % (vmid, "init.scope" if init else "user.slice"))
    (d / "status").write_text("Name:\tx\nPid:\t%d\nNSpid:\t%s\n" % (pid, "\t".join(str(n) for n in nspid)))
    if init:
        (d / "root").mkdir()
        (d / "uid_map").write_text("0 0 4294967295\n")
        (d / "gid_map").write_text("0 0 4294967295\n")


def test_two_containers_of_one_vmid_are_read_as_neither_never_mixed(tmp_path):
    """Two LXC containers named 200 on one host (two LXC paths): their processes cannot be told
    apart by cgroup, so neither is read - never one view holding both containers' processes."""
    proc = tmp_path / "proc"
    _proc_entry(proc, 4100, [4100, 1], 200, init=True)
    _proc_entry(proc, 4105, [4105, 5], 200)
    _proc_entry(proc, 5100, [5100, 1], 200, init=True)
    _proc_entry(proc, 5106, [5106, 6], 200)
    views, missing = _view.open_views([200], proc=str(proc))
    assert views == {}
    assert missing == {200: "2 containers with vmid 200 run on this node (init PIDs 4100, 5100): not read from the node, "
                            "whose processes are whose cannot be told apart; a Proxmox VE node runs one container of each vmid"}


def test_a_container_without_any_process_is_told_from_one_without_its_init(tmp_path):
    """No process at all of a vmid: stopped or not on this node (NoProcess, for its node to tell);
    processes but no init: plainly not read."""
    proc = tmp_path / "proc"
    _proc_entry(proc, 4105, [4105, 5], 400)
    views, missing = _view.open_views([400, 401], proc=str(proc))
    assert views == {}
    assert missing == {400: "no init process of container 400 in the node's /proc",
                       401: "no init process of container 401 in the node's /proc"}
    assert isinstance(missing[401], _view.NoProcess) and not isinstance(missing[400], _view.NoProcess)


def test_a_process_in_a_namespace_nested_in_the_container_has_its_container_pid(tmp_path):
    """NSpid lists a PID a level: the container sees a process of a namespace nested in it (a
    user's unshare) under the second, not under the innermost."""
    proc = tmp_path / "proc"
    _proc_entry(proc, 4100, [4100, 1], 300, init=True)
    _proc_entry(proc, 4200, [4200, 9, 1], DEADLINE)
    views, missing = _view.open_views([300], proc=str(proc))
    try:
        assert missing == {} and sorted(c for c, _fd in views[300].processes()) == [1, 9]
    finally:
        views[300].close()


def _monitor(proc, pid, lxcpath, name, cgroup_name):
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text("0::/lxc.monitor%s\n" % cgroup_name)
    (d / "cmdline").write_bytes(("[lxc monitor] %s %s" % (lxcpath, name)).encode() + b"\0")


def test_a_container_named_like_one_of_another_lxc_path_is_found_by_its_monitor(tmp_path):
    """Two LXC paths on one host each run a container 100: LXC names the second one's cgroup
    lxc.payload.100-1. Given the container's LXC path, its monitor says which cgroup is its;
    without it, neither is read, and the message says what to give."""
    proc = tmp_path / "proc"
    for pid, nspid, cg in ((4100, [4100, 1], "100"), (4105, [4105, 5], "100"), (5100, [5100, 1], "100-1"), (5106, [5106, 6], "100-1")):
        d = proc / str(pid)
        d.mkdir(parents=True)
        (d / "cgroup").write_text("0::/lxc.payload.%s\n" % cg)
        (d / "status").write_text("Name:\tx\nPid:\t%d\nNSpid:\t%s\n" % (pid, "\t".join(str(n) for n in nspid)))
        if nspid[1] == 1:
            (d / "root").mkdir()
            (d / "uid_map").write_text("0 0 4294967295\n")
            (d / "gid_map").write_text("0 0 4294967295\n")
    _monitor(proc, 4000, "/var/lib/lxc", "100", ".100")
    _monitor(proc, 5000, "/srv/other/lxc/", "100", ".100-1")
    for path, pids in (("/srv/other/lxc", [1, 6]), ("/var/lib/lxc/", [1, 5])):
        views, missing = _view.open_views([100], proc=str(proc), lxc_paths={100: path})
        try:
            assert missing == {} and sorted(c for c, _fd in views[100].processes()) == pids, path
            assert views[100].init == {"/srv/other/lxc": 5100, "/var/lib/lxc/": 4100}[path]
        finally:
            views[100].close()
    views, missing = _view.open_views([100], proc=str(proc))
    assert views == {}
    assert missing == {100: "2 containers named 100 run on this node from different LXC paths (cgroup keys .100, .100-1): "
                            "give the container's lxc_path to tell which is meant"}


def _payload_entry(proc, pid, nspid, cgroup_name, ppid):
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text("0::/lxc.payload%s\n" % cgroup_name)
    (d / "status").write_text("Name:\tx\nPid:\t%d\nPPid:\t%d\nNSpid:\t%s\n" % (pid, ppid, "\t".join(str(n) for n in nspid)))
    if nspid[-1] == 1:
        (d / "root").mkdir()
        (d / "uid_map").write_text("0 0 4294967295\n")
        (d / "gid_map").write_text("0 0 4294967295\n")


def test_a_container_whose_monitor_cgroup_has_another_suffix_is_found_by_its_init_s_parent(tmp_path):
    """A failed start leaves lxc.monitor.100 behind (LXC cannot remove it): the next start's monitor
    takes lxc.monitor.100-1 while its container takes the free lxc.payload.100, as LXC picks each
    name alone. The monitor is the parent of the container's init: that says which cgroup is its."""
    proc = tmp_path / "proc"
    _monitor(proc, 5028, "/var/lib/lxc", "100", ".100-1")
    _payload_entry(proc, 5029, [5029, 1], ".100", ppid=5028)
    _payload_entry(proc, 5040, [5040, 7], ".100", ppid=5029)
    views, missing = _view.open_views([100], proc=str(proc), lxc_paths={100: "/var/lib/lxc"})
    try:
        assert missing == {} and views[100].init == 5029
        assert sorted(c for c, _fd in views[100].processes()) == [1, 7]
    finally:
        views[100].close()


def test_two_lxc_paths_whose_cgroup_suffixes_crossed_each_read_their_own_container(tmp_path):
    """Two LXC paths each run a container 100, and a failed start left names behind so that the
    first path's monitor holds lxc.monitor.100-1 and its container lxc.payload.100, the second's
    the other way round: each path's container is the one its monitor started, never the one
    whose cgroup suffix matches the monitor's."""
    proc = tmp_path / "proc"
    _monitor(proc, 4000, "/var/lib/lxc", "100", ".100-1")
    _payload_entry(proc, 4100, [4100, 1], ".100", ppid=4000)
    _payload_entry(proc, 4105, [4105, 5], ".100", ppid=4100)
    _monitor(proc, 5000, "/srv/other/lxc", "100", ".100")
    _payload_entry(proc, 5100, [5100, 1], ".100-1", ppid=5000)
    _payload_entry(proc, 5106, [5106, 6], ".100-1", ppid=5100)
    for path, init, pids in (("/var/lib/lxc", 4100, [1, 5]), ("/srv/other/lxc/", 5100, [1, 6])):
        views, missing = _view.open_views([100], proc=str(proc), lxc_paths={100: path})
        try:
            assert missing == {} and views[100].init == init, path
            assert sorted(c for c, _fd in views[100].processes()) == pids, path
        finally:
            views[100].close()


@pytest.mark.parametrize("text, ppid", [
    ("Name:\tx\nPPid:\t4000\n", 4000), ("PPid:\t0\n", 0), ("Name:\tx\n", None), ("PPid:\t\n", None),
    ("PPid:\t-1\n", None), ("PPid:\t\u0664\n", None), ("NotPPid:\t12\nPPid:\t13\n", 13),
])
def test_the_parent_pid_is_read_from_status_only_from_ascii_digits(text, ppid):
    assert _view._ppid(text) == ppid


def test_a_stopped_container_of_the_lxc_path_given_is_not_read_as_the_one_of_its_name_that_runs_elsewhere(tmp_path):
    """The container 100 of /var/lib/lxc is stopped; another LXC path on the host runs a container
    100 (the only one of that name, so its cgroup is lxc.payload.100). Given the LXC path, the
    read finds no monitor of it and says the container is stopped: it never reads the other one."""
    proc = tmp_path / "proc"
    _monitor(proc, 5000, "/srv/other/lxc", "100", ".100")
    _payload_entry(proc, 5100, [5100, 1], ".100", ppid=5000)
    _payload_entry(proc, 5106, [5106, 6], ".100", ppid=5100)
    views, missing = _view.open_views([100], proc=str(proc), lxc_paths={100: "/var/lib/lxc/"})
    assert views == {}
    assert missing == {100: "no LXC monitor of /var/lib/lxc runs a container 100 on this node; the one of that name "
                            "(cgroup key .100) runs from another LXC path"}
    _monitor(proc, 6000, "/srv/third/lxc", "100", ".100-1")
    _payload_entry(proc, 6100, [6100, 1], ".100-1", ppid=6000)
    views, missing = _view.open_views([100], proc=str(proc), lxc_paths={100: "/var/lib/lxc"})
    assert views == {}
    assert missing == {100: "no LXC monitor of /var/lib/lxc runs a container 100 on this node; the 2 of that name "
                            "(cgroup keys .100, .100-1) run from another LXC path"}


def _entry(proc, pid, nspid, cgroup):
    d = proc / str(pid)
    d.mkdir(parents=True)
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text("Name:\tx\nPid:\t%d\nNSpid:\t%s\n" % (pid, "\t".join(str(n) for n in nspid)))
    if nspid[-1] == 1:
        (d / "root").mkdir()
        (d / "uid_map").write_text("0 100000 65536\n")
        (d / "gid_map").write_text("0 100000 65536\n")


def test_a_container_cannot_make_its_processes_another_container_s(tmp_path):
    """Container 102's root makes the cgroups lxc.payload/101 and lxc/101/ns below its own and moves
    its init and a process there: both stay 102's; container 101 is read as it is."""
    proc = tmp_path / "proc"
    _entry(proc, 4100, [4100, 1], "0::/lxc/101/ns/init.scope\n")
    _entry(proc, 4105, [4105, 5], "0::/lxc/101/ns/user.slice\n")
    _entry(proc, 5100, [5100, 1], "0::/lxc/102/ns/lxc.payload/101\n")
    _entry(proc, 5107, [5107, 7], "0::/lxc/102/ns/lxc/101/ns/user.slice\n")
    views, missing = _view.open_views([101, 102], proc=str(proc))
    try:
        assert missing == {}
        assert (views[101].init, sorted(c for c, _fd in views[101].processes())) == (4100, [1, 5])
        assert (views[102].init, sorted(c for c, _fd in views[102].processes())) == (5100, [1, 7])
        assert (views[101].cgroup_root, views[102].cgroup_root) == ("/lxc/101/ns", "/lxc/102/ns")
    finally:
        for view in views.values():
            view.close()


def test_openat2_s_eagain_is_tried_again(tmp_path, monkeypatch):
    """openat2 with RESOLVE_IN_ROOT answers EAGAIN when a rename or mount anywhere on the host raced the
    resolution of a "..": the open is tried again (seen failing: "/up-dir/<file> cannot be opened: Resource
    temporarily unavailable" under another worker's renames); an EAGAIN that never ends is the open's error."""
    if _root.calls().openat2 is False:
        pytest.skip("this kernel has no openat2")  # pragma: no cover - every kernel since 5.6 has it
    calls = _root.calls()
    real = calls.call
    answers = []

    def racing(dirfd, path, flags, resolve):
        answers.append(path)
        return (-1, errno.EAGAIN) if len(answers) <= racing.eagains else real(dirfd, path, flags, resolve)

    monkeypatch.setattr(calls, "call", racing)
    (tmp_path / "f").write_text("data")
    (tmp_path / "sub").mkdir()
    root = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        racing.eagains = 3
        fd = calls.open2(root, "sub/../f", os.O_RDONLY, 0x10)  # RESOLVE_IN_ROOT
        # 4 calls, or more when the real openat2 itself met a rename of another test worker (the
        # race this retry is for: seen once in a parallel run)
        assert fd >= 0 and 4 <= len(answers) < _root.EAGAIN_TRIES
        os.close(fd)
        answers.clear()
        racing.eagains = _root.EAGAIN_TRIES
        with pytest.raises(OSError) as err:
            calls.open2(root, "f", os.O_RDONLY, 0x10)
        assert err.value.errno == errno.EAGAIN and len(answers) == _root.EAGAIN_TRIES
    finally:
        os.close(root)
