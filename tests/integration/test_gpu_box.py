# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The 8-GPU box (the simulated fleet's `gpubox` scenario, tests/sim/fleet) on its own fleet.

pve1: one container (train-box, 100) whose job holds memory on all 8 GPUs from one process.
pve2: 8 GPUs split 2 per container (200-203), each job holding both of its GPUs, but 201's whose
second GPU is in MIG mode with a worker on GPU instance 1. Checked: gpu_state maps every GPU's
holders from the node (host PIDs, vmid, PID inside the container) and from each container
(open device files); the nvidia-smi stand-in's `-q -x` has the real H200's element paths
(tests/fixtures/h200/) and its injected health; the inventory finds the GPUs of containers
passed through with lxc.cgroup2.devices.allow + lxc.mount.entry lines (no devN:).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import socket
import subprocess
import xml.etree.ElementTree as ET

import pytest
import simfleet  # tests/lib, on pytest's pythonpath (pytest.ini)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
VENV_BIN = os.path.join(REPO, ".venv", "bin")
FIXTURE = os.path.join(REPO, "tests", "fixtures", "h200", "nvidia-smi-q-x.xml")
# Its own fleet; overridable so that two checkouts can run this test at once.
STATE = os.environ.get("GPUFLEET_GPUBOX_TEST_STATE", "/var/tmp/gpufleet-sim-gpubox-test")
PORT = os.environ.get("GPUFLEET_GPUBOX_TEST_PORT", "2542")
JOB_MIB = 40960
MIG_MIB = 8192
SPLIT = {200: [0, 1], 201: [2, 3], 202: [4, 5], 203: [6, 7]}


@pytest.fixture(scope="module")
def box(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("gpubox") / "inventory"
    with simfleet.running(STATE, nodes=2, containers=1, scenario="gpubox", inventory=inventory, port=PORT) as (info, env):
        info["env"] = dict(env, ANSIBLE_CALLBACK_RESULT_FORMAT="json", ANSIBLE_NOCOLOR="1")
        info["inventory"] = str(inventory)
        info["uuids"] = {n: [line.split("UUID: ")[1].rstrip(")") for line in simfleet.node_nvidia_smi(STATE, n, "-L").splitlines()]
                         for n in ("pve1", "pve2")}
        yield info


def module(box, host, name, args):
    res = subprocess.run([os.path.join(VENV_BIN, "ansible"), "-i", os.path.join(box["inventory"], "fleet.yml"), host,
                          "-m", name, "-a", args], cwd=REPO, env=box["env"], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=180, check=False)
    assert " | SUCCESS => " in res.stdout, res.stdout
    return json.loads(res.stdout.split(" => ", 1)[1])


def node_gpus(box, node):
    res = module(box, node, "gpufleet.hygiene.gpu_state", "vantage=node nvidia_smi=%s/bin/nvidia-smi" % STATE)
    assert res["vantage"] == "node"
    return res["gpus"]


def container_gpus(box, host):
    res = module(box, host, "gpufleet.hygiene.gpu_state", "vantage=container nvidia_smi=/opt/gpufleet/bin/nvidia-smi")
    assert res["vantage"] == "container"
    return res["gpus"]


def in_container(node, vmid, script):
    return simfleet.sh(simfleet.lxcpath(STATE, node), vmid, script)


def test_eight_gpus_held_by_one_container_from_the_node(box):
    gpus = node_gpus(box, "pve1")
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["uuid"] for g in gpus] == box["uuids"]["pve1"]
    holders = [g["processes"] for g in gpus]
    assert all(len(h) == 1 for h in holders), holders
    # One process, seen under its host PID, holds all eight: the job of container 100.
    assert {(p["pid"], p["vmid"], p["container_pid"]) for [p] in holders} == {(holders[0][0]["pid"], 100, holders[0][0]["container_pid"])}
    assert holders[0][0]["pid"] != holders[0][0]["container_pid"]
    assert all(p["used_memory_mib"] == JOB_MIB and "train_dflash.py" in p["cmdline"] for [p] in holders)
    assert all(g["memory_used_mib"] == JOB_MIB and not g["idle"] for g in gpus)


def test_eight_gpus_held_by_one_process_from_the_container(box):
    gpus = container_gpus(box, "train-box")
    assert [g["uuid"] for g in gpus] == box["uuids"]["pve1"]
    holders = [g["processes"] for g in gpus]
    assert all(len(h) == 1 for h in holders), holders
    assert len({p["pid"] for [p] in holders}) == 1
    # Each GPU is mapped through the device file its holder has open, /dev/nvidia<index>.
    assert [p["devices"] for [p] in holders] == [["/dev/nvidia%d" % i] for i in range(8)]
    node_view = node_gpus(box, "pve1")
    assert holders[0][0]["pid"] == node_view[0]["processes"][0]["container_pid"]


def test_two_gpus_per_container_from_the_node(box):
    gpus = node_gpus(box, "pve2")
    assert [g["uuid"] for g in gpus] == box["uuids"]["pve2"]
    for vmid, indexes in SPLIT.items():
        for i in indexes:
            assert [p["vmid"] for p in gpus[i]["processes"]] == [vmid], (i, gpus[i]["processes"])
    # One process holds both GPUs of 200, 202 and 203 (a job on several GPUs at once).
    for vmid in (200, 202, 203):
        a, b = SPLIT[vmid]
        assert gpus[a]["processes"][0]["pid"] == gpus[b]["processes"][0]["pid"]
    # 201: the job on its first GPU, the MIG worker (GPU instance 1) on the second.
    job, mig = gpus[2]["processes"][0], gpus[3]["processes"][0]
    assert job["pid"] != mig["pid"] and "mig-worker" in mig["cmdline"]
    assert (job["used_memory_mib"], mig["used_memory_mib"], gpus[3]["memory_used_mib"]) == (JOB_MIB, MIG_MIB, MIG_MIB)


@pytest.mark.parametrize("vmid", sorted(SPLIT))
def test_two_gpus_per_container_from_each_container(box, vmid):
    gpus = container_gpus(box, "train-%d" % vmid)
    # The container numbers its GPUs from 0; they are the node's GPUs passed through to it.
    assert [g["index"] for g in gpus] == [0, 1]
    assert [g["uuid"] for g in gpus] == [box["uuids"]["pve2"][i] for i in SPLIT[vmid]]
    for g, node_index in zip(gpus, SPLIT[vmid]):
        assert [p["devices"] for p in g["processes"]] == [["/dev/nvidia%d" % node_index]], g
    held = [g["processes"][0]["pid"] for g in gpus]
    if vmid == 201:
        assert held[0] != held[1] and "mig-worker" in gpus[1]["processes"][0]["cmdline"]
    else:
        assert held[0] == held[1]


def element_paths(el, prefix=""):
    """Every element path under el, once each."""
    out = set()
    for child in el:
        path = prefix + "/" + child.tag
        out.add(path)
        out |= element_paths(child, path)
    return out


def fixture_gpu_paths():
    return element_paths(ET.parse(FIXTURE).getroot().find("gpu"))


def added(paths):
    """The paths a GPU has beyond the idle H200 fixture's: its processes and MIG devices."""
    return {p for p in paths if p.startswith(("/processes/process_info", "/mig_devices/mig_device"))}


def test_q_x_has_the_h200_schema_on_the_node(box):
    root = ET.fromstring(simfleet.node_nvidia_smi(STATE, "pve2", "-q", "-x").encode())
    fixture = ET.parse(FIXTURE).getroot()
    assert root.tag == fixture.tag and [c.tag for c in root if c.tag != "gpu"] == [c.tag for c in fixture if c.tag != "gpu"]
    assert root.findtext("attached_gpus") == "8" and root.findtext("driver_version") == fixture.findtext("driver_version")
    want = fixture_gpu_paths()
    gpus = root.findall("gpu")
    assert [g.findtext("uuid") for g in gpus] == box["uuids"]["pve2"]
    for g in gpus:
        paths = element_paths(g)
        assert paths - added(paths) == want, g.findtext("uuid")
        assert [c.tag for c in g] == [c.tag for c in fixture.find("gpu")]
    assert "/processes/process_info/pid" in element_paths(gpus[0])
    # MIG on GPU 3: two instances, the worker's memory on instance 1, its process there.
    mig = gpus[3]
    assert mig.findtext("mig_mode/current_mig") == "Enabled" and gpus[2].findtext("mig_mode/current_mig") == "Disabled"
    devices = mig.findall("mig_devices/mig_device")
    assert [(d.findtext("gpu_instance_id"), d.findtext("fb_memory_usage/used")) for d in devices] == [
        ("1", "%d MiB" % MIG_MIB), ("2", "0 MiB")]
    [proc] = mig.findall("processes/process_info")
    assert (proc.findtext("gpu_instance_id"), proc.findtext("compute_instance_id"), proc.findtext("used_memory")) == (
        "1", "0", "%d MiB" % MIG_MIB)
    assert gpus[2].find("processes/process_info/gpu_instance_id").text == "N/A"


def test_injected_health_in_q_x_query_and_kernel_log(box):
    root = ET.fromstring(simfleet.node_nvidia_smi(STATE, "pve1", "-q", "-x").encode())
    gpus = root.findall("gpu")
    assert gpus[3].findtext("ecc_errors/volatile/dram_uncorrectable") == "2"
    assert gpus[3].findtext("remapped_rows/remapped_row_pending") == "Yes"
    assert gpus[5].findtext("clocks_event_reasons/clocks_event_reason_hw_slowdown") == "Active"
    assert all(g.findtext("ecc_errors/volatile/dram_uncorrectable") == "0" for i, g in enumerate(gpus) if i != 3)
    fields = ("index,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,clocks_event_reasons.active,"
              "clocks_throttle_reasons.hw_slowdown,pcie.link.gen.current,pcie.link.width.max,persistence_mode,mig.mode.current,"
              "retired_pages.pending")
    out = simfleet.node_nvidia_smi(STATE, "pve1", "--query-gpu=" + fields, "--format=csv,noheader")
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines()]
    assert rows[3][:3] == ["3", "2", "2"] and rows[5][3:5] == ["0x0000000000000048", "Active"]
    assert rows[0] == ["0", "0", "0", "0x0000000000000000", "Not Active", "5", "16", "Enabled", "Disabled", "[N/A]"]
    # The Xid the node's kernel log holds names GPU 3's PCI address, in the driver's form.
    with open(simfleet.node_path(STATE, "pve1", "kernel.log")) as f:
        log = f.read()
    assert re.search(r"^\S+ NVRM: Xid \(PCI:0000:1b:00\): 48, ", log, re.MULTILINE), log
    assert gpus[3].get("id") == "00000000:1B:00.0"
    # -q prints the same state as text.
    text = simfleet.node_nvidia_smi(STATE, "pve1", "-q", "-i", "5")
    assert re.search(r"^        HW Slowdown +: Active$", text, re.MULTILINE), text


def test_health_injected_while_up_reaches_node_and_container(box):
    uuid = box["uuids"]["pve2"][6]
    try:
        simfleet.inject_health(STATE, "pve2", uuid, persistence_mode=False, pcie={"gen": 3, "width": 8})
        line = simfleet.inject_xid(STATE, "pve2", "00000000:1E:00.0", 79)
        q = "--query-gpu=uuid,persistence_mode,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current --format=csv,noheader"
        node = simfleet.node_nvidia_smi(STATE, "pve2", *q.split())
        ct = in_container("pve2", 203, "/opt/gpufleet/bin/nvidia-smi " + q)
        assert "%s, Disabled, 3, 5, 8" % uuid in node.splitlines()
        assert ct.splitlines()[0] == "%s, Disabled, 3, 5, 8" % uuid
        assert "NVRM: Xid (PCI:0000:1e:00): 79, " in line
    finally:
        simfleet.inject_health(STATE, "pve2", uuid, persistence_mode=None, pcie=None)
    assert "Enabled" in simfleet.node_nvidia_smi(STATE, "pve2", "--query-gpu=persistence_mode", "--format=csv,noheader", "-i", "6")


def test_q_x_in_a_container_lists_its_own_gpus(box):
    root = ET.fromstring(in_container("pve2", 201, "/opt/gpufleet/bin/nvidia-smi -q -x").encode())
    gpus = root.findall("gpu")
    assert [g.findtext("uuid") for g in gpus] == [box["uuids"]["pve2"][i] for i in SPLIT[201]]
    # The minor number is the node's: the container holds /dev/nvidia2 and /dev/nvidia3.
    assert [g.findtext("minor_number") for g in gpus] == ["2", "3"]
    want = fixture_gpu_paths()
    for g in gpus:
        paths = element_paths(g)
        assert paths - added(paths) == want
    assert gpus[1].findtext("mig_mode/current_mig") == "Enabled"


def test_inventory_finds_gpus_passed_through_as_proxmox_writes_them(box):
    res = subprocess.run([os.path.join(VENV_BIN, "ansible-inventory"), "-i",
                          os.path.join(box["inventory"], "discovered.proxmox_lxc.yml"), "--list"],
                         cwd=REPO, env=box["env"], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    # Text from a node is marked unsafe (never templated): {"__ansible_unsafe": text} in the JSON.
    inv = json.loads(res.stdout, object_hook=lambda d: d["__ansible_unsafe"] if set(d) == {"__ansible_unsafe"} else d)
    hostvars = inv["_meta"]["hostvars"]
    assert sorted(inv["pve_gpu"]["hosts"]) == ["train-200", "train-201", "train-202", "train-203", "train-box"]
    assert "pve_no_gpu" not in inv or not inv["pve_no_gpu"].get("hosts")
    assert hostvars["train-box"]["pve_gpu_indices"] == list(range(8))
    for vmid, indexes in SPLIT.items():
        assert hostvars["train-%d" % vmid]["pve_gpu_indices"] == indexes
    # How each was written: no devN: for the box, 200 and 202; 203 mixes both styles.
    for host in ("train-box", "train-200", "train-202"):
        conf = hostvars[host]["pve_config"]
        assert not [k for k in conf if re.fullmatch(r"dev\d+", k)] and "c 195:* rwm" in conf["lxc.cgroup2.devices.allow"]
    conf = hostvars["train-203"]["pve_config"]
    assert conf["dev0"] == "/dev/nvidia6" and "/dev/nvidia7 dev/nvidia7 none bind,optional,create=file" in conf["lxc.mount.entry"]
    assert not any(hostvars[h]["pve_gpu_all"] for h in inv["pve_gpu"]["hosts"])


def kmsg_xid(bus_id, code):
    """One Xid line in this machine's real kernel log as the driver writes it - a message of the
    kernel facility that starts with ``NVRM: Xid`` (every simulated node shares this kernel): the
    gpu_health module reads /dev/kmsg, not the stand-in's file. A line written to /dev/kmsg is the
    user facility whatever it asks, and is not read as an event (tests/unit/.../test_xid.py); the
    kernel logs this one itself, as root may make it: a netfilter log rule whose prefix is the line,
    hit by one UDP datagram on the loopback, then removed."""
    domain, bus, device = bus_id.lower().split(":")
    line = "NVRM: Xid (PCI:%s:%s:%s): %d, pid=4242, name=python3, injected by test_gpu_box " % (
        domain[-4:], bus, device.split(".")[0], code)
    table = "gpufleet_xid_%d" % os.getpid()
    rules = ("add table inet %s\nadd chain inet %s out { type filter hook output priority 0; }\n"
             "add rule inet %s out ip daddr 127.0.0.1 udp dport 9 log prefix \"%s\"\n" % (table, table, table, line))
    subprocess.run(["nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.sendto(b"x", ("127.0.0.1", 9))
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=True)
    return line


def findings(gpu):
    return sorted(f["code"] for f in gpu["findings"])


def test_gpu_health_from_the_node_finds_the_injected_faults(box):
    """The node's health read: pve1's GPU 3 (uncorrectable ECC, a pending row remap, and an Xid 48 in
    the kernel log since the read's start) is unhealthy, GPU 5 (hardware slowdowns) warns, each
    finding with its action; the other six have none. The query and the -q -x reads agree."""
    # The kernel's record times are boot time plus its own clock, which drifts from the wall clock
    # by up to a second or so here: a margin keeps the injected line inside the window.
    started = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)).isoformat()
    kmsg_xid("00000000:1B:00.0", 48)
    smi = "%s/bin/nvidia-smi" % STATE
    by_source = {}
    for source in ("query", "xml"):
        res = module(box, "pve1", "gpufleet.hygiene.gpu_health",
                     "source=%s nvidia_smi=%s kernel_log=true since=%s driver_pin=580" % (source, smi, started))
        assert res["source"] == source and res["healthy"] is False and not res["error"], res
        gpus = res["gpus"]
        assert [g["index"] for g in gpus] == list(range(8))
        assert [g["healthy"] for g in gpus] == [True, True, True, False, True, True, True, True], gpus
        assert {"ecc_uncorrected_volatile", "remapped_rows_pending", "xid_48"} <= set(findings(gpus[3])), gpus[3]
        assert [e["xid"] for e in gpus[3]["xid"]] == [48]
        # A slowdown warns (drain if it persists under load), it does not make the GPU unhealthy.
        assert {"throttle_hw_slowdown", "throttle_hw_thermal_slowdown"} <= set(findings(gpus[5])), gpus[5]
        assert {f["severity"] for f in gpus[5]["findings"]} == {"warn"}
        assert [findings(g) for i, g in enumerate(gpus) if i not in (3, 5)] == [[]] * 6
        assert all(f["action"] for g in gpus for f in g["findings"])
        assert res["driver"] == {"version": "580.159.04", "pin": "580"}
        by_source[source] = [(g["uuid"], g["healthy"], findings(g)) for g in gpus]
    assert by_source["query"] == by_source["xml"]


def test_gpu_healthy_check_in_the_container_that_holds_all_eight(box):
    """readiness inside train-box with gpu_health: gpu_healthy fails on the faulty GPUs and passes
    the rest; without gpu_health the check is not there (the read is asked for, never implied)."""
    args = "nvidia_smi=/opt/gpufleet/bin/nvidia-smi caches=false allow_running_job=true"
    res = module(box, "train-box", "gpufleet.hygiene.readiness", args + " gpu_health=true")
    [check] = [c for c in res["checks"] if c["name"] == "gpu_healthy"]
    assert check["ok"] is False and check["severity"] == "fail"
    assert [g["healthy"] for g in check["gpus"]] == [True, True, True, False, True, True, True, True]
    assert "ecc_uncorrected_volatile" in findings(check["gpus"][3])
    res = module(box, "train-box", "gpufleet.hygiene.readiness", args)
    assert "gpu_healthy" not in [c["name"] for c in res["checks"]]


def node_read(box, node, gpu_read, vmids, **extra):
    """node_readiness with each container read inside itself (read_from=container), its GPUs read
    once on the node (gpu_read=node) or by its own nvidia-smi (gpu_read=container). The node read
    (read_from=node) is compared with the read inside each container in test_node_read.py."""
    args = dict({"nvidia_smi": "/opt/gpufleet/bin/nvidia-smi", "caches": False}, **extra)
    containers = [{"host": "train-%d" % v if v != 100 else "train-box", "vmid": v, "args": args} for v in vmids]
    res = module(box, node, "gpufleet.hygiene.node_readiness",
                 json.dumps({"containers": containers, "gpu_read": gpu_read, "brief": True, "read_from": "container",
                             "nvidia_smi": "%s/bin/nvidia-smi" % STATE}))
    assert res["read"]["failed"] == 0, res
    return res


@pytest.mark.parametrize("node,vmids", [("pve1", [100]), ("pve2", sorted(SPLIT))])
def test_gpus_read_once_by_the_node_give_each_container_its_own_reading(box, node, vmids):
    """node_readiness with gpu_read=node runs nvidia-smi once on the node and hands each container
    the GPUs passed through to it, holders mapped by cgroup and named by their PID inside: every
    container's checks and GPUs are those its own nvidia-smi gives (gpu_read=container)."""
    by_node = node_read(box, node, "node", vmids)
    by_container = node_read(box, node, "container", vmids)
    assert (by_node["read"]["gpus"], by_container["read"]["gpus"]) == ("node", "container")
    for host, mine in by_container["containers"].items():
        theirs = by_node["containers"][host]
        assert theirs["gpus"] == mine["gpus"], host
        assert [(c["name"], c["ok"], c["summary"]) for c in theirs["checks"]] == \
            [(c["name"], c["ok"], c["summary"]) for c in mine["checks"]], host
    # Holders really there: every GPU of every container held (the job, or 201's MIG worker).
    assert all(g["processes"] for r in by_node["containers"].values() for g in r["gpus"])


def test_the_node_s_xid_events_reach_the_container_that_uses_the_gpu(box):
    """An Xid 79 (fallen off the bus) of pve1's GPU 6 in the kernel log: read on the node, it makes
    GPU 6 of train-box (the container that holds it) unhealthy and the container not ready; the
    container's own read, without the kernel log, does not see it."""
    kmsg_xid("00000000:1E:00.0", 79)
    by_node = node_read(box, "pve1", "node", [100], gpu_health=True)
    assert by_node["read"]["gpus"] == "node" and by_node["read"]["xid_events"] >= 1
    reading = by_node["containers"]["train-box"]
    [check] = [c for c in reading["checks"] if c["name"] == "gpu_healthy"]
    gpu6 = check["gpus"][6]
    assert gpu6["uuid"] == box["uuids"]["pve1"][6] and gpu6["xid_events"].get("79", 0) >= 1
    assert "xid_79" in findings(gpu6) and not gpu6["healthy"]
    assert check["ok"] is False and "xid_79" in check["summary"] and reading["ready"] is False
    by_container = node_read(box, "pve1", "container", [100], gpu_health=True)
    [own] = [c for c in by_container["containers"]["train-box"]["checks"] if c["name"] == "gpu_healthy"]
    assert own["gpus"][6]["healthy"] and "xid_79" not in findings(own["gpus"][6])
    assert by_container["read"].get("xid_events") is None
