# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""proxmox/_pct, the one Proxmox layer: vmid, argv, pct's output formats (verbatim, as DESIGN.md
gives them), and what pct's, lxc-attach's and ssh's failures mean."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _pct

# ----------------------------------------------------------------------------- vmid


@pytest.mark.parametrize("value, want", [(100, 100), ("101", 101), (999999999, 999999999), ("000000100", 100)])
def test_vmid_integers_and_their_digits(value, want):
    assert _pct.parse_vmid(value) == want


@pytest.mark.parametrize("value", [99, 1000000000, "1234567890", True, 101.0, "101 ", "+101", "1e3", "100; id", "../100", "١٠١", None, [101]])
def test_vmid_anything_else_is_none(value):
    assert _pct.parse_vmid(value) is None


def test_bad_vmid_wording():
    assert _pct.bad_vmid("vmid of ct", "100; id") == "vmid of ct must be an integer from 100 to 999999999, got '100; id'"
    assert _pct.bad_vmid("vmid", 7, "ansible_pct_vmid") == "vmid must be an integer from 100 to 999999999 (ansible_pct_vmid), got 7"


# ----------------------------------------------------------------------------- argv


ENV = ["/usr/bin/env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]


def test_exec_argv_pct_and_lxc_attach():
    assert _pct.exec_argv(101, ["/bin/sh", "-c", "id"]) == ["pct", "exec", "101", "--", *ENV, "/bin/sh", "-c", "id"]
    assert _pct.exec_argv(101, ["true"], pct_path="/usr/sbin/pct") == ["/usr/sbin/pct", "exec", "101", "--", *ENV, "true"]
    assert _pct.exec_argv(101, ["true"], method="lxc-attach") == ["lxc-attach", "-n", "101", "--", *ENV, "true"]
    assert _pct.exec_argv(101, ["true"], method="lxc-attach", lxc_path="/var/lib/lxc x") == [
        "lxc-attach", "-n", "101", "-P", "/var/lib/lxc x", "--", *ENV, "true"]
    # lxc_path is lxc-attach's alone.
    assert _pct.exec_argv(101, ["true"], lxc_path="/x") == ["pct", "exec", "101", "--", *ENV, "true"]


def test_exec_argv_gives_the_command_exactly_its_environment(monkeypatch):
    """What the command in the container meets, run here: EXEC_ENV and nothing of the caller's,
    as with PVE 8's pct exec (which passes the node's environment on) and PVE 9's (which clears it)."""
    monkeypatch.setenv("LEAKED_FROM_NODE", "yes")
    argv = _pct.exec_argv(101, [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"])
    inner = argv[argv.index("--") + 1:]
    env = json.loads(subprocess.run(inner, stdout=subprocess.PIPE, check=True).stdout)
    env.pop("LC_CTYPE", None)  # Python's own locale coercion may add it
    assert env == dict(_pct.EXEC_ENV)
    # Also when the caller's environment is empty (PVE 9): the env tool is found without PATH.
    assert subprocess.run(inner, env={}, stdout=subprocess.PIPE, check=True).stdout == subprocess.run(
        inner, stdout=subprocess.PIPE, check=True).stdout


def test_list_config_status_argv():
    assert _pct.list_argv() == ["pct", "list"]
    assert _pct.config_argv(200, "/opt/pct") == ["/opt/pct", "config", "200"]
    assert _pct.status_argv(200) == ["pct", "status", "200"]
    assert _pct.enter_tool("pct", "/opt/pct") == "/opt/pct" and _pct.enter_tool("lxc-attach", "/opt/pct") == "lxc-attach"


HOSTILE = ["a b", "it's", "$(touch /tmp/x) `id` ${HOME}", "line1\nline2", "back\\slash | & > < * ? ~ #", "-n", "", b"by\xfftes"]


def test_shell_line_gives_every_word_back_through_a_shell():
    line = _pct.shell_line(["printf", "%s\\0"] + HOSTILE)
    out = subprocess.run(["/bin/sh", "-c", line], stdout=subprocess.PIPE, check=True).stdout
    want = [w if isinstance(w, bytes) else w.encode() for w in HOSTILE]
    assert out.split(b"\0")[:-1] == want


def test_configs_line_and_split_configs_round_trip(tmp_path):
    fake = tmp_path / "pct"
    fake.write_text("#!%s\nimport sys\nprint('hostname: ct' + sys.argv[2])\nprint('memory: 512')\n" % sys.executable)
    fake.chmod(0o755)
    line = _pct.configs_line([100, 200], str(fake))
    out = subprocess.run(["/bin/sh", "-c", line], stdout=subprocess.PIPE, check=True, text=True).stdout
    assert _pct.split_configs(out) == {100: "hostname: ct100\nmemory: 512", 200: "hostname: ct200\nmemory: 512"}
    with pytest.raises(ValueError):
        _pct.configs_line(["100; id"])


# ----------------------------------------------------------------------------- pct list


LIST = (
    "VMID       Status     Lock         Name                \n"
    "100        running                 pihole              \n"
    "200        stopped    backup       db                  \n"
    "300        running                                     \n"
)


def test_pct_list_rows_with_blank_lock_and_name():
    assert _pct.parse_list(LIST) == [
        {"vmid": 100, "status": "running", "lock": "", "name": "pihole"},
        {"vmid": 200, "status": "stopped", "lock": "backup", "name": "db"},
        {"vmid": 300, "status": "running", "lock": "", "name": ""},
    ]


def test_pct_list_verbatim_from_the_design():
    text = "VMID       Status     Lock         Name\n100        running                 pihole\n200        stopped    backup       db\n"
    assert [(r["vmid"], r["lock"], r["name"]) for r in _pct.parse_list(text)] == [(100, "", "pihole"), (200, "backup", "db")]


def test_pct_list_ct_vmid_is_no_hostname():
    """Real pct lists a container without a hostname as CT<vmid> (pve-container's vmstatus); only
    its own vmid's CT<n> is that placeholder."""
    text = ("%-10s %-10s %-12s %-20s\n" * 4) % ("VMID", "Status", "Lock", "Name", 300, "running", "", "CT300",
                                                301, "stopped", "backup", "CT301", 302, "running", "", "CT300")
    assert _pct.parse_list(text) == [
        {"vmid": 300, "status": "running", "lock": "", "name": ""},
        {"vmid": 301, "status": "stopped", "lock": "backup", "name": ""},
        {"vmid": 302, "status": "running", "lock": "", "name": "CT300"},
    ]


def test_pct_list_empty_node_has_no_header():
    assert _pct.parse_list("") == []
    assert _pct.parse_list("\n") == []


def test_pct_list_rows_without_a_header():
    assert _pct.parse_list("%-10s %-10s %-12s %-20s\n" % (150, "running", "", "solo")) == [
        {"vmid": 150, "status": "running", "lock": "", "name": "solo"}]


def test_pct_list_vmid_longer_than_nine_digits_is_no_row():
    assert _pct.parse_list("1" * 5000 + " running\n1234567890 running\n100 running\n") == [
        {"vmid": 100, "status": "running", "lock": "", "name": ""}]


# ----------------------------------------------------------------------------- pct config

MOUNT_STYLE = """arch: amd64
hostname: train-100
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia3 dev/nvidia3 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /srv/data mnt/data none bind 0 0
"""

DEV_STYLE = """dev0: /dev/nvidia1
dev1: path=/dev/nvidia2,gid=44,mode=0660
dev2: /dev/nvidiactl
dev3: /dev/dri/renderD128
hostname: train-101
"""

# DESIGN.md's example, both styles in one config.
VERBATIM = """lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
dev0: /dev/nvidia1
"""


def test_pct_config_keys_and_raw_lxc_lists():
    conf = _pct.parse_config(MOUNT_STYLE)
    assert conf["hostname"] == "train-100"
    assert conf["lxc.cgroup2.devices.allow"] == ["c 195:* rwm", "c 508:* rwm"]
    assert len(conf["lxc.mount.entry"]) == 4


def test_gpus_from_mount_entries():
    devices = _pct.nvidia_devices(_pct.parse_config(MOUNT_STYLE))
    assert devices == ["/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl"]
    assert _pct.gpu_indices(devices) == [0, 3]


def test_gpus_from_dev_entries_pve9():
    devices = _pct.nvidia_devices(_pct.parse_config(DEV_STYLE))
    assert devices == ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl"]
    assert _pct.gpu_indices(devices) == [1, 2]


def test_gpus_from_both_styles_at_once():
    devices = _pct.nvidia_devices(_pct.parse_config(VERBATIM))
    assert sorted(devices) == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"]
    assert _pct.gpu_indices(devices) == [0, 1]


def test_no_passthrough():
    conf = _pct.parse_config("arch: amd64\nhostname: web\nmemory: 512\n")
    assert _pct.nvidia_devices(conf) == [] and _pct.gpu_indices([]) == []


# As `pct config` prints an 8-GPU training container passed through the way the Proxmox VE forum
# and wiki write it (no devN:), PVE 8: keys sorted, the raw lxc.* lines last, in file order.
EIGHT_GPU_MOUNT_STYLE = """arch: amd64
cores: 64
features: nesting=1
hostname: train-box
memory: 1048576
net0: name=eth0,bridge=vmbr0,firewall=1,hwaddr=BC:24:11:8A:3C:01,ip=dhcp,type=veth
ostype: ubuntu
rootfs: local-zfs:subvol-105-disk-0,size=500G
swap: 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
lxc.cgroup2.devices.allow: c 236:* rwm
""" + "".join("lxc.mount.entry: /dev/nvidia%d dev/nvidia%d none bind,optional,create=file\n" % (i, i) for i in range(8)) + """\
lxc.mount.entry: /dev/nvidiactl dev/nvidiactl none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm dev/nvidia-uvm none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-uvm-tools dev/nvidia-uvm-tools none bind,optional,create=file
lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir
"""

# The cgroup rule alone: the container may open every NVIDIA device, and its device nodes are made
# inside it (a hook or mknod), so no /dev/nvidiaN is named anywhere.
CGROUP_ONLY = """arch: amd64
hostname: train-106
ostype: debian
unprivileged: 0
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.cgroup2.devices.allow: c 508:* rwm
"""

# Two GPUs by minor in the cgroup rules (PVE 6's cgroup v1 key), no mount entry.
CGROUP_MINORS_V1 = """hostname: old-107
lxc.cgroup.devices.allow: c 195:2 rwm
lxc.cgroup.devices.allow: c 195:3 rwm
lxc.cgroup.devices.allow: c 195:255 rwm
"""

# Mixed: devN: for one GPU, a cgroup2 rule and mount entries for two more.
MIXED = """dev0: /dev/nvidia6,gid=44
dev1: /dev/nvidiactl
hostname: train-108
lxc.cgroup2.devices.allow: c 195:* rwm
lxc.mount.entry: /dev/nvidia4 dev/nvidia4 none bind,optional,create=file
lxc.mount.entry: /dev/nvidia5 dev/nvidia5 none bind,optional,create=file
"""


@pytest.mark.parametrize("text, devices, indices, every", [
    (EIGHT_GPU_MOUNT_STYLE, ["/dev/nvidia%d" % i for i in range(8)]
     + ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-caps"], list(range(8)), False),
    (MOUNT_STYLE, ["/dev/nvidia0", "/dev/nvidia3", "/dev/nvidiactl"], [0, 3], False),
    (DEV_STYLE, ["/dev/nvidia1", "/dev/nvidia2", "/dev/nvidiactl"], [1, 2], False),
    (CGROUP_ONLY, [], [], True),
    (CGROUP_MINORS_V1, [], [2, 3], False),
    (MIXED, ["/dev/nvidia6", "/dev/nvidiactl", "/dev/nvidia4", "/dev/nvidia5"], [4, 5, 6], False),
    ("hostname: web\nlxc.cgroup2.devices.allow: c 10:200 rwm\n", [], [], False),
])
def test_gpu_passthrough_in_every_style(text, devices, indices, every):
    got = _pct.gpu_passthrough(_pct.parse_config(text))
    assert got == {"devices": devices, "indices": indices, "all": every}


@pytest.mark.parametrize("rules, want", [
    (["c 195:* rwm"], "all"),
    (["a"], "all"),
    (["c *:* rwm"], "all"),
    (["c 195:0 rwm", "c 195:7 rw", "c 195:254 rwm", "c 195:255 rwm"], [0, 7]),
    (["c 508:* rwm", "b 195:1 rwm", "c 195:x rwm", "bogus"], []),
])
def test_cgroup_rules_name_gpus(rules, want):
    assert _pct.cgroup_gpus({"lxc.cgroup2.devices.allow": rules}) == want


def test_pct_status():
    assert _pct.parse_status("status: running\n") == "running"
    assert _pct.parse_status("status: stopped") == "stopped"
    assert _pct.parse_status("Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n") is None


# ----------------------------------------------------------------------------- failures


@pytest.mark.parametrize("rc, stderr, method, want", [
    (255, "container '200' not running!\n", "pct", _pct.NOT_RUNNING),
    (255, "Configuration file 'nodes/pve1/lxc/200.conf' does not exist\n", "pct", _pct.NO_CONTAINER),
    (127, "bash: line 1: pct: command not found\n", "pct", _pct.NO_TOOL),
    (127, "sh: 1: pct: not found\n", "pct", _pct.NO_TOOL),
    (127, "sh: 1: lxc-attach: not found\n", "lxc-attach", _pct.NO_TOOL),
    (1, "lxc-attach: 200: attach.c: lxc_attach: 1100 Failed to get init pid\n", "lxc-attach", _pct.ATTACH_REFUSED),
    # Not pct's: another container's message, a command missing inside, lxc-attach's words under pct.
    (1, "container '999' not running!\n", "pct", None),
    (127, "/bin/sh: 1: frobnicate: not found\n", "pct", None),
    (1, "Failed to get init pid\n", "pct", None),
    (255, "Configuration file 'nodes/pve1/lxc/1200.conf' does not exist\n", "pct", None),
])
def test_enter_failure(rc, stderr, method, want):
    assert _pct.enter_failure(200, rc, "", stderr, method) == want


def test_a_missing_tool_with_output_is_the_command_s_own():
    assert _pct.enter_failure(200, 127, "partial", "sh: 1: pct: not found\n") is None


@pytest.mark.parametrize("rc, stdout, stderr, want", [
    (255, "", "ssh: connect to host pve1 port 22: Connection refused\r\n", _pct.UNREACHABLE),
    (255, "", "ssh: Could not resolve hostname pve1: Name or service not known\r\n", _pct.UNREACHABLE),
    (255, "", "root@pve1: Permission denied (publickey).\r\n", _pct.AUTH),
    (255, "", "Host key verification failed.\r\n", _pct.HOST_KEY),
    (255, "", "No ED25519 host key is known for pve1 and you have requested strict checking.\r\n", _pct.HOST_KEY),
    (255, "partial", "Connection refused\n", None),  # output came: the transport worked
    (1, "", "Connection refused\n", None),           # not ssh's exit status
    (255, "", "my tool failed\n", None),
])
def test_ssh_failure(rc, stdout, stderr, want):
    assert _pct.ssh_failure(rc, stdout, stderr) == want


def test_messages_on_the_controller_and_on_the_node():
    node = "node root@pve1:22"
    assert _pct.message(_pct.NOT_RUNNING, vmid=200, node=node) == (
        "container 200 on node root@pve1:22 is not running (stopped); start it (pct start 200) and run again, "
        "or leave it out of the run (--limit)")
    assert _pct.message(_pct.NOT_RUNNING, vmid=200).startswith("container 200 is not running (stopped); start it (pct start 200)")
    fix = (": check the vmid (ansible_pct_vmid) and the node (pve_node, ansible_pct_node_host) the inventory gives it; "
           "pct list on that node lists its containers, and a container migrated to another node is listed there")
    assert _pct.message(_pct.NO_CONTAINER, vmid=200, node=node) == "container 200 does not exist on node root@pve1:22" + fix
    assert _pct.message(_pct.NO_CONTAINER, vmid=200) == "container 200 does not exist on this node" + fix
    # pct's own words name the Proxmox VE node.
    said = "Configuration file 'nodes/pve1/lxc/200.conf' does not exist\n"
    assert _pct.message(_pct.NO_CONTAINER, vmid=200, node=node, detail=said) == (
        "container 200 does not exist on node pve1 (root@pve1:22)" + fix)
    assert _pct.message(_pct.NO_CONTAINER, vmid=200, detail=said) == "container 200 does not exist on node pve1" + fix
    assert _pct.message(_pct.NO_TOOL, tool="pct", node=node) == "pct not found on node root@pve1:22 (is it a Proxmox VE node?)"
    assert _pct.message(_pct.UNREACHABLE, node=node, detail="Connection refused\n") == "node root@pve1:22 is unreachable: Connection refused"
    assert "exit status 137, no output" in _pct.message(_pct.STOPPED_DURING, vmid=200, node=node, rc=137)
    assert "does not answer now: no output." in _pct.message(_pct.CONNECTION_LOST, vmid=200, node=node)


@pytest.mark.parametrize("text, want", [
    ("Configuration file 'nodes/pve1/lxc/999.conf' does not exist\n", "pve1"),
    ("Configuration file 'nodes/gpu-node-07.dc1/lxc/105.conf' does not exist", "gpu-node-07.dc1"),
    ("container '999' not running!\n", None),
    ("", None),
    (None, None),
])
def test_pve_node_named_by_pct(text, want):
    assert _pct.pve_node_named(text) == want
