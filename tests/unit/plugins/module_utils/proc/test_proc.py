# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""proc/_proc: /proc reading (start time, NSpid), fd scans, protection and the walk below a
process, on real processes too (the GPU stand-in's trainers: the gpu fixture, conftest.py);
find_processes() with a proc/_scope Scope. The scopes themselves are test_scope.py's, the
termination test_terminate.py's."""

from __future__ import annotations

import os

import pytest
from procfiles import fake_proc

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._proc import (
    ancestors,
    describe,
    detect_vantage,
    device_minor,
    driver_minor_uuids,
    open_files,
    parse_stat,
    parse_status,
    scan_device_holders,
)
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc._scope import Scope
from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

STAT = ("48211 (pt_main (thread)) S 1 48211 48211 0 -1 4194560 1234 0 0 0 10 20 0 0 20 0 12 0 "
        "8851230 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 4096 17663 0 0 0 17 3 0 0 0 0 0")


def test_parse_stat_field_22_with_parens_in_comm():
    assert parse_stat(STAT) == ("pt_main (thread)", "S", 1, 8851230)


def test_parse_status():
    text = "Name:\tpython3\nUid:\t100000\t100000\t100000\t100000\nNSpid:\t48211\t1731\n"
    assert parse_status(text) == (100000, [48211, 1731])


@pytest.mark.parametrize("uid_line, uid", [
    ("Uid:\t1000\t0\t0\t0", 1000),        # the real uid, not the effective one (a setuid program)
    ("Uid:\t1000", 1000),                   # one field is enough
    ("Uid:", None),
    ("Uid:\tx\t5\t5\t5", None),            # the real uid is what must be a number
    ("Uid:\t\u0661\u0662\t5\t5\t5", None),  # digits, but not ASCII ones: int() would take them
])
def test_the_uid_is_the_first_field_read_only_as_ascii_digits(uid_line, uid):
    assert parse_status("Name:\tpython3\n%s\nNSpid:\t7\n" % uid_line) == (uid, [7])


@pytest.mark.parametrize("nspid_line, nspid", [
    ("NSpid:\t48211\t7", [48211, 7]),
    ("NSpid:\t48211\tx", []),            # every entry must be a number, or none is taken
    ("NSpid:\tx\t7", []),                # the first one too
    ("NSpid:\t48211\t\u0667", []),        # a digit, but not an ASCII one
])
def test_nspid_is_taken_only_when_every_entry_is_ascii_digits(nspid_line, nspid):
    assert parse_status("Uid:\t5\t5\t5\t5\n%s\n" % nspid_line) == (5, nspid)


@pytest.mark.parametrize("info, why", [
    ({"pid": 1, "container_pid": 1}, "the node's PID namespace"),
    ({"pid": 1, "container_pid": None}, "the node's PID namespace"),  # no NSpid line (kernels before 4.1)
    ({"pid": 4100, "container_pid": 1}, "its container's PID namespace"),
    ({"pid": 4100, "container_pid": None, "kthread": False}, None),  # no NSpid line (kernels before 4.1)
    ({"pid": 4100, "container_pid": 2, "kthread": False}, None),
    ({"pid": 2, "container_pid": 2, "kthread": True}, "a kernel thread"),
])
def test_protection_is_pid_1_of_any_namespace_or_a_kernel_thread(info, why):
    got = _proc.protection(info)
    assert (got is None) if why is None else (why in got), got


@pytest.mark.parametrize("flags, kthread", [
    (0x00200000, True),            # PF_KTHREAD alone
    (0x00208040, True),            # kthreadd's flags as the kernel writes them
    (0x00400100, False),           # an ordinary process (PF_FORKNOEXEC | PF_SUPERPRIV)
    (0x00000001, False),           # the bits beside PF_KTHREAD say nothing of it
    (0x001FFFFF | 0x00400000, False),
])
def test_a_kernel_thread_is_the_pf_kthread_bit_alone(flags, kthread):
    assert _proc.is_kernel_thread(flags, "python3 job.py", 1) is kthread


@pytest.mark.parametrize("text", ["1 (x) S 0 1", "1 (x) S 0 1 1 0 -1 notanumber", "no parens"])
def test_flags_that_cannot_be_read_are_none(text):
    assert _proc.stat_flags(text) is None


def test_kernel_thread_fallback_without_flags():
    assert _proc.is_kernel_thread(None, "", 2) and _proc.is_kernel_thread(None, "", 0)
    assert not _proc.is_kernel_thread(None, "python3 job.py", 2)  # a namespace's PID 2's child
    assert not _proc.is_kernel_thread(0x400100, "", 2)           # the flags say no


def test_a_job_s_workers_are_found_to_the_last_generation_but_not_inside_a_namespace_it_started(tmp_path, monkeypatch):
    """with_descendants: the job (100), its worker (101) and the worker's child (102); the init
    of a container the job started (103, NSpid ending in 1) is refused, and nothing below it
    (104) is walked."""
    fake_proc(tmp_path, 100, cmdline=b"python3\0train_dflash.py\0")
    fake_proc(tmp_path, 101, ppid=100, nspid=(), cmdline=b"python3\0-c\0worker\0")  # no NSpid entries
    fake_proc(tmp_path, 102, ppid=101, cmdline=b"python3\0-c\0loader\0")
    fake_proc(tmp_path, 103, ppid=100, nspid=(103, 1), cmdline=b"/sbin/init\0")
    fake_proc(tmp_path, 104, ppid=103, nspid=(104, 2), cmdline=b"python3\0other.py\0")
    zombie = fake_proc(tmp_path, 105, ppid=100)  # walked first (the highest PID): passed over, not the end
    (zombie / "stat").write_text("105 (python3) Z 100 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0")
    monkeypatch.setattr(_proc, "all_pids", lambda proc=None: sorted(int(e) for e in os.listdir(str(tmp_path))))
    refused = []
    found = _proc.find_processes(Scope(cmdline=["train_dflash"]), proc=str(tmp_path), with_descendants=True,
                                 protected=refused)
    assert [(f["pid"], f["descendant_of"]) for f in found] == [(100, None), (101, 100), (102, 100)]
    assert [(r["pid"], r["descendant_of"]) for r in refused] == [(103, 100)]
    assert [f["pid"] for f in _proc.find_processes(Scope(cmdline=["train_dflash"]), proc=str(tmp_path))] == [100]
    assert "its container's PID namespace" in refused[0]["reason"]
    # With scope.users, a descendant of another user met first is passed over, not the end of the walk.
    other = fake_proc(tmp_path, 106, ppid=100, uid=0, cmdline=b"python3\0-c\0helper\0")
    (other / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t106\t9\n")
    found = _proc.find_processes(Scope(cmdline=["train_dflash"], users=["100000"]), proc=str(tmp_path),
                                 with_descendants=True)
    assert [f["pid"] for f in found] == [100, 101, 102]


def test_describe_on_a_node_names_container_and_inner_pid(tmp_path):
    fake_proc(tmp_path, 48211)
    info = describe(48211, proc=str(tmp_path))
    assert info["vmid"] == 200 and info["container_pid"] == 1731
    assert info["start_time"] == 777 and info["uid"] == 100000
    assert info["cmdline"] == "python3 train_dflash.py"
    assert describe(48212, proc=str(tmp_path)) is None


def test_scan_device_holders_fake_proc(tmp_path):
    d = fake_proc(tmp_path, 10)
    os.symlink("/dev/nvidia3", str(d / "fd" / "5"))
    os.symlink("/dev/nvidiactl", str(d / "fd" / "6"))
    os.symlink("/dev/null", str(d / "fd" / "7"))
    e = fake_proc(tmp_path, 11)
    os.symlink("/dev/nvidia0 (deleted)", str(e / "fd" / "3"))
    fake_proc(tmp_path, 12)
    holders, unreadable = scan_device_holders(["/dev/nvidia*"], proc=str(tmp_path))
    assert holders == {10: ["/dev/nvidia3", "/dev/nvidiactl"], 11: ["/dev/nvidia0"]}
    assert unreadable == 0
    assert [device_minor(p) for p in ("/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/x/dev/nvidia12")] \
        == [3, None, None, 12]


def test_mapped_files_are_the_maps_lines_that_name_a_path_and_no_others(tmp_path):
    """/proc/<pid>/maps as the kernel writes it: an anonymous mapping has five fields (no name),
    a pseudo-mapping names itself in brackets, a path may hold spaces and end in " (deleted)".
    Only real paths count, whole; and only when mapped files are asked for."""
    d = fake_proc(tmp_path, 10)
    os.symlink("/dev/nvidia0", str(d / "fd" / "3"))
    os.symlink("/home/u/run", str(d / "cwd"))
    (d / "maps").write_bytes(
        b"55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 131                        /venv/lib/libcudart.so.12\n"
        b"7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n"
        b"7f0000022000-7f0000043000 rw-p 00000000 00:00 0                          [heap]\n"
        b"7f0000044000-7f0000045000 r--p 00000000 fd:01 132                        /opt/my venv/libnccl.so.2 (deleted)\n"
        b"7f0000046000-7f0000047000 r--p 00000000 fd:01 133                        /opt/caf\xe9/libcudnn.so.9\n"
        b"7ffd00000000-7ffd00001000 r-xp 00000000 00:00 0                          [vdso]")
    assert list(open_files(str(tmp_path), maps=True)) == [
        (10, ["/dev/nvidia0", "/venv/lib/libcudart.so.12", "/opt/my venv/libnccl.so.2", "/opt/caf\ufffd/libcudnn.so.9"], False)]
    assert list(open_files(str(tmp_path))) == [(10, ["/dev/nvidia0"], False)]  # neither cwd nor maps unless asked
    assert list(open_files(str(tmp_path), cwd=True)) == [(10, ["/home/u/run", "/dev/nvidia0"], False)]
    os.unlink(str(d / "cwd"))  # gone, as for a process that exited between the listing and the read
    os.unlink(str(d / "maps"))
    assert list(open_files(str(tmp_path), cwd=True, maps=True)) == [(10, ["/dev/nvidia0"], False)]


def test_maps_that_cannot_be_read_say_denied_only_when_permission_was_refused(tmp_path, monkeypatch):
    d = fake_proc(tmp_path, 10)
    (d / "maps").write_bytes(b"")
    real_read = _proc._read

    def refused(path, binary=False):
        if path.endswith("/maps"):
            raise PermissionError(13, "Permission denied", path)
        return real_read(path, binary)

    monkeypatch.setattr(_proc, "_read", refused)
    assert list(open_files(str(tmp_path), maps=True)) == [(10, [], True)]


def test_fds_that_cannot_be_listed_say_denied_only_when_permission_was_refused(tmp_path, monkeypatch):
    d = fake_proc(tmp_path, 10)
    os.rmdir(str(d / "fd"))  # gone meanwhile: nothing to read, nothing refused
    assert list(open_files(str(tmp_path))) == [(10, [], False)]
    real_listdir = _proc._listdir

    def refused(path):
        if path.endswith("/fd"):
            raise PermissionError(13, "Permission denied", path)
        return real_listdir(path)

    monkeypatch.setattr(_proc, "_listdir", refused)
    assert list(open_files(str(tmp_path))) == [(10, [], True)]


def test_a_gpu_whose_driver_file_lacks_its_minor_or_its_uuid_is_left_out(tmp_path):
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    for bus, text in (("0000:18:00.0", "Device Minor: \t 0\n"), ("0000:2a:00.0", "GPU UUID: \t GPU-bbb\n"),
                      ("0000:3b:00.0", "GPU UUID: \t \nDevice Minor: \t 2\n")):
        (gpus / bus).mkdir(parents=True)
        (gpus / bus / "information").write_text(text)
    assert driver_minor_uuids(str(tmp_path)) == {}


def test_a_gpu_whose_driver_file_cannot_be_read_is_passed_over(tmp_path, monkeypatch):
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    (gpus / "0000:18:00.0" / "information").mkdir(parents=True)  # unreadable, and listed first
    (gpus / "0000:2a:00.0").mkdir()
    (gpus / "0000:2a:00.0" / "information").write_text("GPU UUID: \t GPU-bbb\nDevice Minor: \t 1\n")
    real_listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda path: sorted(real_listdir(path)))
    assert driver_minor_uuids(str(tmp_path)) == {1: "GPU-bbb"}


def test_driver_minor_uuids(tmp_path):
    info = tmp_path / "driver" / "nvidia" / "gpus" / "0000:18:00.0"
    info.mkdir(parents=True)
    (info / "information").write_text("Model: \t\t NVIDIA H200\nGPU UUID: \t GPU-aaa\nDevice Minor: \t 2\n")
    assert driver_minor_uuids(str(tmp_path)) == {2: "GPU-aaa"}
    # The driver's whole file (its lines in its order): only the two keys are read.
    (info / "information").write_text(
        "Model: \t\t NVIDIA H200\nIRQ:   \t\t 0\nGPU UUID: \t GPU-2d4c8d1f-9a0b-4c4e-8f3a-1b2c3d4e5f60\n"
        "Video BIOS: \t 96.00.af.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
        "Bus Location: \t 0000:18:00.0\nDevice Minor: \t 2\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n")
    assert driver_minor_uuids(str(tmp_path)) == {2: "GPU-2d4c8d1f-9a0b-4c4e-8f3a-1b2c3d4e5f60"}
    assert driver_minor_uuids(str(tmp_path / "nowhere")) == {}


def test_detect_vantage(tmp_path):
    assert detect_vantage(str(tmp_path)) == "node"
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "environ").write_bytes(b"PATH=/bin\0container=lxc\0")
    assert detect_vantage(str(tmp_path)) == "container"
    other = tmp_path / "other"
    (other / "run" / "systemd").mkdir(parents=True)
    (other / "run" / "systemd" / "container").write_text("lxc\n")
    assert detect_vantage(str(other)) == "container"


def test_the_walk_below_roots_gives_each_descendant_once_under_its_root_and_leaves_out_skip(tmp_path, monkeypatch):
    """Roots 10 and 20 (20 a child of 10), 30 skipped: 10's tree is 11 and its child 12; 20 is a
    root, so it is walked as its own and 21 comes under it; 30 and its child 31 are left out.
    A pruned PID is given, its children are not."""
    for pid, ppid in ((10, 1), (11, 10), (12, 11), (20, 10), (21, 20), (30, 10), (31, 30)):
        fake_proc(tmp_path, pid, ppid=ppid)
    # In PID order, so that 10's children are popped 30 (skipped), 20 (a root), then 11: a PID
    # passed over must not end the walk of its siblings.
    monkeypatch.setattr(_proc, "all_pids", lambda proc=None: sorted(int(e) for e in os.listdir(str(tmp_path))))
    walked = sorted(_proc.walk_descendants([10, 20], str(tmp_path), skip=[30]))
    assert walked == [(11, 10), (12, 10), (21, 20)]
    assert sorted(_proc.walk_descendants([10], str(tmp_path), prune=lambda pid: pid == 11)) == [
        (11, 10), (20, 10), (21, 10), (30, 10), (31, 10)]
    assert _proc.descendants([11], str(tmp_path)) == {11, 12}
    # A root that is also in skip is still neither given nor walked from another root.
    assert sorted(_proc.walk_descendants([10, 20], str(tmp_path), skip=[20])) == [(11, 10), (12, 10), (21, 20), (30, 10), (31, 10)]


def test_user_names():
    import pwd
    assert _proc.user_name(None) is None
    assert _proc.user_name(os.getuid()) == pwd.getpwuid(os.getuid()).pw_name
    assert describe(os.getpid())["user"] == pwd.getpwuid(os.getuid()).pw_name
    unknown = max(p.pw_uid for p in pwd.getpwall() if p.pw_uid < 4000000000) + 4242
    assert _proc.user_name(unknown) == str(unknown)


@pytest.mark.parametrize("wchan_text, where, stuck", [
    ("nfs_wait_bit_killable", "nfs_wait_bit_killable", "state D (uninterruptible sleep, in nfs_wait_bit_killable)"),
    ("0", None, "state D (uninterruptible sleep)"),  # the kernel's "no symbol"
    ("", None, "state D (uninterruptible sleep)"),
])
def test_a_stuck_process_names_where_it_waits_only_when_the_kernel_says(tmp_path, wchan_text, where, stuck):
    d = fake_proc(tmp_path, 10)
    (d / "stat").write_text("10 (python3) D 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0")
    (d / "wchan").write_text(wchan_text)
    assert _proc.wchan(10, str(tmp_path)) == where
    assert _proc.stuck_text(10, str(tmp_path)) == stuck


def test_ancestors_contain_self_and_parent():
    own = ancestors()
    assert os.getpid() in own and os.getppid() in own and 1 in own
    assert 0 not in own  # PID 1's parent, which is no process


def test_ancestors_end_on_a_loop_that_a_reused_pid_can_make(tmp_path):
    """The chain is read one /proc file at a time: a parent that ended and whose PID was taken by
    a descendant makes a loop, which must end the walk."""
    fake_proc(tmp_path, 10, ppid=11)
    fake_proc(tmp_path, 11, ppid=10)
    assert ancestors(10, str(tmp_path)) == {10, 11}


# ----------------------------------------------------------------------------- real processes


def test_scan_sees_real_standin_handles(gpu):
    state, trainers = gpu
    a = trainers.start(gpu=0, mib=100)
    b = trainers.start(gpu=1, mib=100)
    holders, _unreadable = scan_device_holders([os.path.join(state, "dev", "nvidia*")])
    assert holders[a.pid] == [gpu_standin.device(state, 0)]
    assert holders[b.pid] == [gpu_standin.device(state, 1)]
    assert os.getpid() not in holders


def _fake_stat_proc(tmp_path, pid, state, wchan):
    d = tmp_path / str(pid)
    d.mkdir()
    fields = [state, "1"] + ["0"] * 17 + ["4242"] + ["0"] * 10  # field 22 (start time) is 4242
    (d / "stat").write_text("%d (python3) %s\n" % (pid, " ".join(fields)))
    (d / "wchan").write_text(wchan)
    return str(tmp_path)


def test_stuck_text_names_state_d_and_where_it_waits(tmp_path):
    proc = _fake_stat_proc(tmp_path, 77, "D", "__refrigerator")
    assert _proc.stuck_text(77, proc) == "state D (uninterruptible sleep, in __refrigerator)"
    assert describe(77, proc)["state"] == "D"
    other = _fake_stat_proc(tmp_path, 78, "S", "do_select")
    assert _proc.stuck_text(78, other) == ""
    assert _proc.stuck_text(79, other) == ""  # gone
