# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The node read's container view (proxmox/_view): ids as an unprivileged container sees them
(its uid_map), its /proc from the node's through per-process handles, its accounts from its own
/etc/passwd, and a thread whose root is the container's: paths and links stay inside, nothing runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _view

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
                               _view.parse_id_map(UNPRIVILEGED), _view.parse_id_map(UNPRIVILEGED), "/lxc/123/ns")
    try:
        assert view.listdir("/proc") == ["1", "7"]
        assert _proc.parse_stat(view.read_proc("/proc/7/stat").decode()) == ("python3", "R", 1, 777)
        assert _proc.parse_stat(view.read_proc("/proc/1/stat").decode())[2] == 0  # its parent is outside
        assert _proc.parse_status(view.read_proc("/proc/7/status").decode()) == (1000, [7])
        assert _proc.parse_status(view.read_proc("/proc/1/status").decode()) == (0, [1])
        assert view.read_proc("/proc/7/cgroup") == b"0::/user.slice\n"
        assert _proc.vmid_from_cgroup(view.read_proc("/proc/7/cgroup").decode()) is None
        assert view.read_proc("/proc/7/cmdline") == b"python3\0train.py\0"
        # A PID the container does not have is gone, whatever the node has under that number.
        with pytest.raises(FileNotFoundError):
            view.read_proc("/proc/4200/stat")
        # Not a process's file: read through the root like any other.
        assert view.read_proc("/proc/driver/nvidia/version") is None
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
        _view.run_in(view, work)
    finally:
        view.close()
    job, other = seen["job"], seen["other"]
    assert (job["comm"], job["state"], job["cmdline"], job["uid"], job["user"]) == ("python3", "R", "python3 train.py", 1000, "trainer")
    assert (other["comm"], other["uid"], other["user"]) == ("sleep", 4242, "4242")


def test_its_accounts_are_its_own_passwd(tmp_path):
    os.makedirs(tmp_path / "etc")
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n# a comment\nbroken line\n"
                                             "trainer:x:1000:1000:Trainer:/home/trainer:/bin/bash\n")
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(5, 1, root_fd, {}, {}, [], [], None)
    seen = {}

    def work():
        seen["trainer"] = _view.getpwnam("trainer")
        seen["root"] = _view.getpwuid(0)
        seen["all"] = [a.pw_name for a in _view.getpwall()]
        seen["name"] = _proc.user_name(1000)
        with pytest.raises(KeyError):
            _view.getpwnam("nobody-here")

    _view.run_in(view, work)
    assert (seen["trainer"].pw_uid, seen["trainer"].pw_dir) == (1000, "/home/trainer")
    assert seen["root"].pw_dir == "/root" and seen["all"] == ["root", "trainer"] and seen["name"] == "trainer"


def test_a_thread_in_the_view_resolves_every_path_inside_the_container_and_runs_nothing(tmp_path):
    """Run in a child process: the audit hook stays for the life of the process that installs it."""
    node_secret = tmp_path / "node-secret"
    node_secret.write_text("the node's own file\n")
    root = tmp_path / "ct"
    os.makedirs(root / "etc")
    (root / "etc" / "secret").write_text("the container's file\n")
    os.symlink(str(node_secret), root / "abs-link")  # absolute: inside the container it names /tmp/...
    os.symlink("../../../../../../../../" + str(node_secret), root / "up-link")
    marker = tmp_path / "ran"
    (root / "bin").mkdir()
    (root / "bin" / "evil").write_text("#!/bin/sh\ntouch %s\n" % marker)
    (root / "bin" / "evil").chmod(0o755)
    code = r"""
import os, subprocess, sys
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _view
root_fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
view = _view.ContainerView(9, 1, root_fd, {}, {}, [], [], None)
def work():
    out = [open("/etc/secret").read().strip()]
    for path in ("/abs-link", "/up-link", sys.argv[2]):
        try:
            out.append(open(path).read().strip())
        except OSError as exc:
            out.append(type(exc).__name__)
    for attempt in (lambda: subprocess.run(["/bin/evil"]), lambda: __import__("ctypes").CDLL("/bin/evil"),
                    lambda: __import__("xdrlib")):
        try:
            attempt()
            out.append("ran")
        except (PermissionError, OSError) as exc:
            out.append("refused" if "runs nothing" in str(exc) else repr(exc))
    return out
print("|".join(_view.run_in(view, work)))
print(open(sys.argv[2]).read().strip())  # the node's own threads keep the node's root
"""
    res = subprocess.run([sys.executable, "-c", code, str(root), str(node_secret)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), check=False, timeout=60)
    assert res.returncode == 0, res.stderr
    inside, outside = res.stdout.splitlines()
    assert inside.split("|") == ["the container's file", "FileNotFoundError", "FileNotFoundError", "FileNotFoundError",
                                 "refused", "refused", "refused"]
    assert outside == "the node's own file"
    assert not marker.exists()


def test_an_unprivileged_containers_root_owns_its_files_in_its_view(tmp_path):
    """Its /var, 100000's on the node, is root's as the container sees it: a directory the
    restore record may be kept under (venv/_contamination's trust check), not another user's."""
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _contamination

    os.makedirs(tmp_path / "var" / "lib")
    os.chown(tmp_path / "var", 100000, 100000)
    os.chmod(tmp_path / "var", 0o755)
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(11, 1, root_fd, {}, {}, _view.parse_id_map(UNPRIVILEGED), _view.parse_id_map(UNPRIVILEGED), None)
    inside = _view.run_in(view, lambda: (_view.seen_uid(os.stat("/var").st_uid), _contamination._trusted(os.stat("/var"))))
    assert inside == (0, True)
    # On the node it is 100000's, not root's.
    assert _contamination._trusted(os.stat(tmp_path / "var")) is False


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


def test_a_process_in_a_namespace_nested_in_the_container_has_its_container_pid(tmp_path):
    """NSpid lists a PID a level: the container sees a process of a namespace nested in it (a
    user's unshare) under the second, not under the innermost."""
    proc = tmp_path / "proc"
    _proc_entry(proc, 4100, [4100, 1], 300, init=True)
    _proc_entry(proc, 4200, [4200, 9, 1], 300)
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
