# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs read once per node (node_readiness gpu_read=node): the node's nvidia-smi, its holders
mapped to their containers and their PIDs there, and each container's view of that reading - the
same GPUs and holders as the container's own nvidia-smi gives."""

from __future__ import annotations

import os
import stat

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _state
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._state import GpuState, container_view
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox._node import node_gpus
from ansible_collections.gpufleet.hygiene.plugins.module_utils.transport import _bootstrap

UUID = "GPU-5d3c1f7e-0001-4c6e-9f0e-%012d"


def fake_smi(tmp_path, name, gpu_rows, app_rows):
    """An nvidia-smi answering the two queries the collection asks with these CSV rows."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\ncase \"$1\" in\n--query-gpu=*) printf '%s' '" + "".join(r + "\n" for r in gpu_rows)
                    + "';;\n--query-compute-apps=*) printf '%s' '" + "".join(r + "\n" for r in app_rows) + "';;\nesac\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def fake_pid(proc, pid, cgroup, nspid, fds=()):
    d = proc / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "stat").write_text("%d (python3) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 0 0" % pid)
    (d / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\nNSpid:\t%s\n" % "\t".join(str(n) for n in nspid))
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(b"python3\0train.py\0")
    for n, dev in enumerate(fds):
        os.symlink(dev, str(d / "fd" / str(n + 3)))


NODE_GPUS = ["0, %s, NVIDIA H200, 0, 143771, 0" % (UUID % 0), "1, %s, NVIDIA H200, 40960, 143771, 90" % (UUID % 1)]


def test_the_node_maps_each_holder_to_its_container_and_its_pid_there(tmp_path):
    proc = tmp_path / "proc"
    fake_pid(proc, 48211, "0::/lxc/101/ns/user.slice\n", (48211, 1731), fds=("/dev/nvidiactl", "/dev/nvidia1"))
    fake_pid(proc, 48300, "0::/lxc.payload.102/init.scope\n", (48300, 55), fds=("/dev/null", "/dev/nvidia0"))
    fake_pid(proc, 900, "0::/system.slice/pvedaemon.service\n", (900,), fds=("/dev/nvidia0",))  # the node's own: no container's
    # Container 103's sshd holds no GPU: a row naming it (a process of 101 that called itself
    # "x\n<row>") is no holder of 103's.
    fake_pid(proc, 48400, "0::/lxc/103/ns/system.slice/ssh.service\n", (48400, 77), fds=("/dev/null", "socket:[123]"))
    smi = fake_smi(tmp_path, "nvidia-smi", NODE_GPUS, ["%s, 48211, 40960, python3" % (UUID % 1), "%s, 48300, 10, python3" % (UUID % 0),
                                                       "%s, 900, 5, Xorg" % (UUID % 0), "%s, 4242, 5, gone" % (UUID % 0),
                                                       "%s, 48400, 40960, sshd" % (UUID % 1)])
    reading, by_vmid = node_gpus(smi, 15, proc=str(proc))
    assert [g["uuid"] for g in reading["gpus"]] == [UUID % 0, UUID % 1] and reading["backend"] == "nvidia-smi"
    assert by_vmid == {101: [{"gpu_uuid": UUID % 1, "pid": 1731, "used_memory_mib": 40960, "name": "python3"}],
                       102: [{"gpu_uuid": UUID % 0, "pid": 55, "used_memory_mib": 10, "name": "python3"}]}


def container(tmp_path, minors, driver=None):
    """A container's /dev (its GPUs' device files) and /proc (its holders, the driver's table)."""
    dev, proc = tmp_path / "dev", tmp_path / "cproc"
    dev.mkdir(parents=True)
    for name in ["nvidia%d" % m for m in minors] + ["nvidiactl", "nvidia-uvm"]:
        (dev / name).write_text("")
    fake_pid(proc, 1731, "0::/init.scope\n", (1731,), fds=[str(dev / ("nvidia%d" % minors[0])), str(dev / "nvidiactl")])
    for minor, uuid in (driver or {}).items():
        info = proc / "driver" / "nvidia" / "gpus" / ("0000:%02x:00.0" % minor)
        info.mkdir(parents=True)
        (info / "information").write_text("GPU UUID: \t %s\nDevice Minor: \t %d\n" % (uuid, minor))
    return str(dev), str(proc)


READING = {"gpus": [{"index": 0, "uuid": UUID % 0, "name": "NVIDIA H200", "memory_used_mib": 0, "memory_total_mib": 143771, "utilization_pct": 0},
                    {"index": 1, "uuid": UUID % 1, "name": "NVIDIA H200", "memory_used_mib": 40960, "memory_total_mib": 143771,
                     "utilization_pct": 90}],
           "apps": [{"gpu_uuid": UUID % 1, "pid": 1731, "used_memory_mib": 40960, "name": "python3"}], "backend": "nvidia-smi", "seconds": 0.01}


def test_a_container_sees_the_gpus_whose_device_file_it_has_numbered_from_zero(tmp_path):
    dev, proc = container(tmp_path, [1])
    gpus, apps, backend, _seconds = container_view(READING, proc, dev)
    assert [(g["index"], g["uuid"], g["memory_used_mib"]) for g in gpus] == [(0, UUID % 1, 40960)]
    assert apps == READING["apps"] and backend == "nvidia-smi"
    # The driver's table names the GPU by its minor when the container has it.
    dev2, proc2 = container(tmp_path / "b", [7], driver={7: UUID % 0})
    assert [g["uuid"] for g in container_view(READING, proc2, dev2)[0]] == [UUID % 0]
    assert container_view(READING, proc2, dev2)[1] == []


def test_the_reading_given_is_what_the_containers_own_nvidia_smi_gives(tmp_path, monkeypatch):
    dev, proc = container(tmp_path, [1])
    monkeypatch.setattr(_state, "DEV", dev)
    # What the container's own nvidia-smi says: its one GPU as GPU 0, its holder by its PID there.
    own = fake_smi(tmp_path, "own-nvidia-smi", ["0, %s, NVIDIA H200, 40960, 143771, 90" % (UUID % 1)],
                   ["%s, 1731, 40960, python3" % (UUID % 1)])
    patterns = [dev + "/nvidia*"]
    by_itself = GpuState("nvidia-smi", own, vantage="container", device_patterns=patterns, proc=proc).run(state="query")
    given = GpuState("nvidia-smi", "/nonexistent/nvidia-smi", vantage="container", device_patterns=patterns, proc=proc,
                     reading=READING).run(state="query")
    assert given["gpus"] == by_itself["gpus"]
    assert given["gpus"][0]["processes"][0]["pid"] == 1731 and given["gpus"][0]["processes"][0]["used_memory_mib"] == 40960
    assert given["idle"] is by_itself["idle"] is False


def test_a_container_without_any_of_the_nodes_gpus_asks_its_own_nvidia_smi(tmp_path, monkeypatch):
    empty = tmp_path / "dev"
    empty.mkdir()
    monkeypatch.setattr(_state, "DEV", str(empty))
    state = GpuState("nvidia-smi", None, vantage="container", proc=str(tmp_path), reading=READING)
    result = state.run(state="query", require_gpu=False)
    assert result["gpu_available"] is False and "nvidia-smi was not found" in result["reason"]


def test_the_payload_carries_the_reading_only_when_given():
    def head(data):
        return __import__("json").loads(data.split(b"\n")[1])

    assert "gpu_reading" not in head(_bootstrap.payload([], b"", {}, False))
    assert head(_bootstrap.payload([], b"", {}, False, gpu_reading=READING))["gpu_reading"] == READING
