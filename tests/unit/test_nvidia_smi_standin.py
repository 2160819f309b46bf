# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The nvidia-smi stand-in's report (-q -x, -q) and health fields, against the real H200's
output (tests/fixtures/h200/), without a fleet."""

from __future__ import annotations

import os
import re
import subprocess
import xml.etree.ElementTree as ET

import pytest

from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "h200")


def paths(el, prefix=""):
    out = set()
    for child in el:
        out.add(prefix + "/" + child.tag)
        out |= paths(child, prefix + "/" + child.tag)
    return out


@pytest.fixture
def rig(tmp_path):
    health = tmp_path / "health.json"
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2, release_delay=0.2, health_file=str(health))
    uuids = [g["uuid"] for g in gpu_standin.read_config(state)["gpus"]]
    gpu_standin.set_health(health, uuids[1], ecc={"volatile": {"dram_uncorrectable": 3}},
                           clocks_event_reasons=["hw_slowdown"], pcie={"gen": 4, "width": 8}, persistence_mode=False,
                           mig={"instances": [{"gpu_instance_id": 1, "compute_instance_id": 0},
                                              {"gpu_instance_id": 2, "compute_instance_id": 0}]})
    smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", state)

    def run(*args):
        res = subprocess.run([smi, *args], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=30, check=False)
        return res.returncode, res.stdout

    with gpu_standin.Trainers(state) as trainers:
        trainers.start(gpu=0, mib=4096)
        trainers.start(gpu=1, mib=2048, tag="mig")  # then marked as made on GI 2 below
        claims = tmp_path / "gpu" / "claims"
        for claim in claims.glob("*.json"):
            text = claim.read_text()
            if '"tag": "mig"' in text:
                claim.write_text(text.replace('"tag": "mig"', '"tag": "mig", "gpu_instance_id": 2, "compute_instance_id": 0'))
        yield run, uuids


def test_q_x_keeps_the_h200_element_paths(rig):
    run, uuids = rig
    rc, out = run("-q", "-x")
    assert rc == 0
    assert out.startswith('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n')
    root = ET.fromstring(out.encode())
    fixture = ET.parse(os.path.join(FIXTURES, "nvidia-smi-q-x.xml")).getroot()
    want = paths(fixture.find("gpu"))
    gpus = root.findall("gpu")
    assert [g.findtext("uuid") for g in gpus] == uuids and root.findtext("attached_gpus") == "2"
    for g in gpus:
        extra = {p for p in paths(g) if p.startswith(("/processes/process_info", "/mig_devices/mig_device"))}
        assert paths(g) - extra == want
    assert gpus[0].findtext("fb_memory_usage/used") == "4096 MiB" and gpus[0].findtext("mig_devices").strip() == "None"
    assert gpus[0].findtext("processes/process_info/gpu_instance_id") == "N/A"
    assert gpus[1].findtext("ecc_errors/volatile/dram_uncorrectable") == "3"
    assert gpus[1].findtext("clocks_event_reasons/clocks_event_reason_hw_slowdown") == "Active"
    assert gpus[1].findtext("pci/pci_gpu_link_info/link_widths/current_link_width") == "8x"
    assert gpus[1].findtext("persistence_mode") == "Disabled"
    assert [(d.findtext("gpu_instance_id"), d.findtext("fb_memory_usage/used"))
            for d in gpus[1].findall("mig_devices/mig_device")] == [("1", "0 MiB"), ("2", "2048 MiB")]
    assert gpus[1].findtext("processes/process_info/gpu_instance_id") == "2"


def test_q_text_keeps_the_h200_lines(rig):
    run, uuids = rig
    rc, out = run("-q", "-i", "1")
    assert rc == 0
    with open(os.path.join(FIXTURES, "nvidia-smi-q.txt")) as f:
        fixture = f.read()
    # Every label of the H200's report is there, in its order and at its indentation (the
    # processes and MIG devices add lines of their own); the values are this GPU's.
    labels = [line.split(" : ")[0].rstrip() for line in fixture.splitlines()[1:] if line.strip() and not line.startswith("GPU ")]
    got = iter(line.split(" : ")[0].rstrip() for line in out.splitlines())
    missing = [label for label in labels if label != "    Processes" and not any(g == label for g in got)]
    assert not missing, missing
    assert re.search(r"^    GPU UUID +: %s$" % uuids[1], out, re.MULTILINE)
    assert re.search(r"^        HW Slowdown +: Active$", out, re.MULTILINE)
    assert re.search(r"^            DRAM Uncorrectable +: 3$", out, re.MULTILINE)
    assert re.search(r"^    MIG Devices$", out, re.MULTILINE)


def test_query_gpu_health_fields_in_nvidia_smi_formats(rig):
    run, _uuids = rig
    rc, out = run("--query-gpu=index,persistence_mode,ecc.errors.uncorrected.volatile.total,"
                  "ecc.errors.uncorrected.aggregate.total,clocks_event_reasons.active,clocks_throttle_reasons.hw_slowdown,"
                  "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,mig.mode.current,retired_pages.pending,"
                  "driver_version", "--format=csv")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == ("index, persistence_mode, ecc.errors.uncorrected.volatile.total, ecc.errors.uncorrected.aggregate.total, "
                        "clocks_event_reasons.active, clocks_event_reasons.hw_slowdown, pcie.link.gen.current, "
                        "pcie.link.gen.max, pcie.link.width.current, mig.mode.current, retired_pages.pending, driver_version")
    assert lines[1] == "0, Enabled, 0, 0, 0x0000000000000000, Not Active, 5, 5, 16, Disabled, [N/A], 580.159.04"
    assert lines[2] == "1, Disabled, 3, 0, 0x0000000000000008, Active, 4, 5, 8, Enabled, [N/A], 580.159.04"
    assert run("--query-gpu=ecc.errors.bogus", "--format=csv")[0] == 2
    assert run("-x")[0] == 2


@pytest.mark.parametrize("option, fields, bad", [
    ("--query-gpu", "index,memory.used,ecc.errors.uncorrected.volatile.totl,bogus", "ecc.errors.uncorrected.volatile.totl"),
    ("--query-gpu", "clocks_event_reason.active", "clocks_event_reason.active"),
    ("--query-gpu", "device_minor,gpu_uuid,pci.bus_id", "device_minor"),
    ("--query-compute-apps", "pid,used_memory,gpu_instance_id", "gpu_instance_id"),
    ("--query-remapped-rows", "gpu_uuid,remapped_rows.pendng", "remapped_rows.pendng"),
], ids=["misspelt_total_first_of_two", "reasons_singular", "device_minor", "apps_gpu_instance_id", "remapped_misspelt"])
def test_a_field_nvidia_smi_does_not_know_fails_as_nvidia_smi_fails(tmp_path, option, fields, bad):
    """As nvidia-smi 580 answers it: the first unknown field named on stdout and a blank line,
    nothing on stderr, no header and no rows, exit status 2 (a supplied argument is invalid)."""
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2)
    smi = gpu_standin.install_nvidia_smi(tmp_path / "bin", state)
    res = subprocess.run([smi, "%s=%s" % (option, fields), "--format=csv"], text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, timeout=30, check=False)
    assert (res.returncode, res.stdout, res.stderr) == (2, 'Field "%s" is not a valid field to query.\n\n' % bad, "")
    # the same list without the unknown fields is answered: the refusal was the field's alone
    known = ",".join(f for f in fields.split(",") if f not in (bad, "bogus"))
    if known:
        ok = subprocess.run([smi, "%s=%s" % (option, known), "--format=csv"], text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout=30, check=False)
        assert ok.returncode == 0 and ok.stdout.splitlines()[0].count(",") == known.count(","), ok.stdout
