# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""proxmox/_node, node_readiness's logic on the node: what a container without a reading is told,
the argv it is entered with (read_from=container), a container not running, and the node's one
GPU reading when the node's nvidia-smi is missing or fails."""

from __future__ import annotations

import json
import sys

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _state
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._query import GpuError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _node, _pct

ENV = ["/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]


@pytest.mark.parametrize("rc, stderr, method, start", [
    (255, "container '105' not running!\n", "pct", "container 105 is not running (stopped); start it (pct start 105)"),
    (1, "lxc-attach: 105: Failed to get init pid\n", "lxc-attach", "container 105 is not running (stopped)"),
    (255, "Configuration file 'nodes/pve1/lxc/105.conf' does not exist\n", "pct", "container 105 does not exist on node pve1: check"),
    (127, "", "pct", "no Python at /usr/bin/python3 in container 105 (exit status 127)"),
    (1, "Traceback: boom\n", "pct", "reading container 105 failed (exit status 1): Traceback: boom"),
])
def test_node_explains_a_container_without_a_reading(rc, stderr, method, start):
    assert _node.explain(105, "/usr/bin/python3", rc, "", stderr, method).startswith(start)


def test_node_enters_each_container_as_the_connection_does(tmp_path):
    """The argv node_readiness runs for a container: the connection's exec argv around the launcher."""
    printer = tmp_path / "pct"
    printer.write_text("#!%s\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n" % sys.executable)
    printer.chmod(0o755)
    entry = {"host": "ct", "vmid": 101, "python": "/usr/bin/python3", "method": "pct", "pct_path": str(printer), "lxc_path": None}
    job = ("ct", _pct.exec_argv(101, ["/usr/bin/python3", "-I"], "pct", str(printer)), b"", entry, 101)
    host, result = _node.read_one(job, 10)
    # The printer gives no reading: its failure names the container and what it printed.
    assert host == "ct" and result["failed"] is True and result["rc"] == 0
    assert json.loads(result["msg"].split(": ", 1)[1]) == ["exec", "101", "--", *ENV, "/usr/bin/python3", "-I"]


class _Quiet:
    check_mode = False

    def warn(self, msg):
        raise AssertionError(msg)

    def get_bin_path(self, name):
        return None


def _fake_pct(tmp_path, answers):
    """A pct that answers ``pct status <vmid>`` as Proxmox VE's does: {vmid: status, or None for a
    container the node has no config of}; every call logged."""
    script = tmp_path / "pct"
    script.write_text(
        "#!%s\nimport json, sys\nanswers = %r\n"
        "open(%r, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "status = answers.get(sys.argv[2])\n"
        "if status is None:\n"
        "    sys.stderr.write(\"Configuration file 'nodes/pve1/lxc/%%s.conf' does not exist\\n\" %% sys.argv[2]); sys.exit(255)\n"
        "print('status: %%s' %% status)\n" % (sys.executable, dict((str(k), v) for k, v in answers.items()), str(tmp_path / "calls")))
    script.chmod(0o755)
    return str(script)


def _calls(tmp_path):
    path = tmp_path / "calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _entry(host, vmid, pct_path):
    return {"host": host, "vmid": vmid, "python": "/usr/bin/python3", "method": "pct", "pct_path": pct_path,
            "lxc_path": None, "args": {"venv": "/opt/venv"}}


def test_a_container_without_an_init_in_the_nodes_proc_is_reported_as_not_running(tmp_path, monkeypatch):
    monkeypatch.setattr(_node, "PVE_LXC_DIR", str(tmp_path / "no-pve"))
    pct = _fake_pct(tmp_path, {999998: "stopped"})
    results, summary = _node.read_node(_Quiet(), [_entry("ct-stopped", 999998, pct)], 0, 60, read_from="node")
    assert summary["from"] == "node" and summary["failed"] == 1
    assert results["ct-stopped"]["failed"] is True and results["ct-stopped"]["not_read"] is True
    assert results["ct-stopped"]["msg"].startswith("container 999998 is not running (stopped); start it (pct start 999998)")
    assert _calls(tmp_path) == [["status", "999998"]]


def test_a_vmid_the_node_does_not_have_is_named_so_not_told_to_start(tmp_path, monkeypatch):
    """No process of it in the node's /proc, and pct says the node has no config of it: the node
    has no such container (pct start would fail just the same)."""
    monkeypatch.setattr(_node, "PVE_LXC_DIR", str(tmp_path / "no-pve"))
    pct = _fake_pct(tmp_path, {})
    results, summary = _node.read_node(_Quiet(), [_entry("ghost", 999997, pct)], 0, 60, read_from="node")
    assert summary["failed"] == 1 and results["ghost"]["not_read"] is True
    msg = results["ghost"]["msg"]
    assert msg.startswith("container 999997 does not exist on node pve1: check the vmid (ansible_pct_vmid) and the node "
                          "(pve_node, ansible_pct_node_host) the inventory gives it; pct list on that node lists its containers")
    assert "not running" not in msg and "pct start" not in msg


def test_a_stopped_container_s_config_on_the_node_needs_no_pct(tmp_path, monkeypatch):
    """On a Proxmox VE node a stopped container's config is in /etc/pve/lxc: pct is not asked."""
    pve = tmp_path / "pve-lxc"
    pve.mkdir()
    (pve / "999996.conf").write_text("hostname: stopped\n")
    monkeypatch.setattr(_node, "PVE_LXC_DIR", str(pve))
    pct = _fake_pct(tmp_path, {})  # would say "does not exist": never asked
    results, _summary = _node.read_node(_Quiet(), [_entry("ct", 999996, pct)], 0, 60, read_from="node")
    assert results["ct"]["msg"].startswith("container 999996 is not running (stopped)")
    assert _calls(tmp_path) == []


def test_without_pct_a_container_with_no_process_is_still_not_running(tmp_path, monkeypatch):
    """Not a Proxmox VE node (no pct, no /etc/pve): which it is cannot be told, the old wording stays."""
    monkeypatch.setattr(_node, "PVE_LXC_DIR", str(tmp_path / "no-pve"))
    results, _summary = _node.read_node(_Quiet(), [_entry("ct", 999995, str(tmp_path / "no-pct"))], 0, 60, read_from="node")
    assert results["ct"]["msg"].startswith("container 999995 is not running (stopped)")
    assert _node.on_this_node(999995, str(tmp_path / "no-pct"), 5)[0] is None


class _Module:
    def __init__(self, nvidia_smi=None):
        self.warnings = []
        self.nvidia_smi = nvidia_smi

    def warn(self, msg):
        self.warnings.append(msg)

    def get_bin_path(self, name):
        return self.nvidia_smi


def test_a_node_without_nvidia_smi_fails_its_containers_gpu_reading_saying_what_to_do():
    reading, apps = _node.gpu_reading(_Module(), "node", None, 15, containers_read_own=False)
    assert apps == {} and reading["error"]["kind"] == "missing"
    assert reading["error"]["msg"] == ("reading the GPUs on the node: nvidia-smi was not found on this node: install the NVIDIA "
                                       "driver's tools on the node, or name them with nvidia_smi (the node read runs nothing in "
                                       "a container)")


def test_a_node_whose_nvidia_smi_fails_gives_each_container_that_failure_not_an_empty_reading(tmp_path):
    """The node read never runs a container's nvidia-smi: when the node's fails (hangs, a GPU
    fallen off the bus), a container's GPUs cannot be read either, and its gpu_idle check must
    say why - not count no GPU as idle."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'Unable to determine the device handle for GPU0000:3B:00.0: GPU is lost.' >&2\nexit 15\n")
    smi.chmod(0o755)
    module = _Module(str(smi))
    reading, _apps = _node.gpu_reading(module, "node", None, 15, containers_read_own=False)
    assert module.warnings == [] and reading["error"]["rc"] == 15 and "GPU is lost" in reading["error"]["msg"]
    state = _state.GpuState(backend="nvidia-smi", nvidia_smi="/nonexistent/nvidia-smi", reading=dict(reading, apps=[]))
    with pytest.raises(GpuError) as exc:
        state.run(state="query", wanted=[], check_mode=True, require_gpu=True)
    assert exc.value.msg.startswith("reading the GPUs on the node: ") and "GPU is lost" in exc.value.msg and exc.value.rc == 15
    # Where the containers read their own (read_from=container), a warning, and they do.
    module = _Module(str(smi))
    assert _node.gpu_reading(module, "node", None, 15, containers_read_own=True) is None
    assert "each container reads its own" in module.warnings[0]
