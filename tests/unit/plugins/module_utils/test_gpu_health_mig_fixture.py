# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_health reads the MIG part of ``nvidia-smi -q -x`` in the shape real MIG-enabled GPUs print
it (tests/fixtures/mig/, its sources in tests/fixtures/README.md)."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu import _health
from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._health import parse_xml

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "mig", "nvidia-smi-q-x-mig.xml")
with open(FIXTURE) as _f:
    MIG_XML = _f.read()


def read(text):
    driver, gpus = parse_xml(text)
    host = _health.assess(gpus, driver)
    return gpus, host


def test_two_gpu_instances_with_their_memory_and_the_process_of_each():
    [gpu], host = read(MIG_XML)
    assert host == [] and gpu["mig"]["current"] is True and gpu["mig"]["pending"] is True
    assert gpu["mig"]["instances"] == [
        {"gpu_instance_id": 1, "compute_instance_id": 0, "memory_used_mib": 20778, "memory_total_mib": 71424,
         "holders": [{"pid": 4242, "name": "python3", "used_memory_mib": 20480}]},
        {"gpu_instance_id": 5, "compute_instance_id": 0, "memory_used_mib": 13, "memory_total_mib": 35584, "holders": []},
    ]
    assert gpu["healthy"] is True and [f["code"] for f in gpu["findings"]] == []


def test_mig_on_with_every_instance_destroyed_is_a_finding():
    start, end = MIG_XML.index("<mig_devices>"), MIG_XML.index("</mig_devices>")
    text = MIG_XML[:start] + "<mig_devices>\n\t\t\tNone\n\t\t" + MIG_XML[end:]
    [gpu], _host = read(text)
    assert gpu["mig"]["instances"] == []
    assert [f["code"] for f in gpu["findings"]] == ["mig_no_instances"] and gpu["healthy"] is False


def test_a_gpu_that_cannot_partition_reads_mig_as_unknown_not_off():
    text = MIG_XML.replace("<current_mig>Enabled</current_mig>", "<current_mig>N/A</current_mig>").replace(
        "<pending_mig>Enabled</pending_mig>", "<pending_mig>N/A</pending_mig>")
    [gpu], _host = read(text)
    assert gpu["mig"] == {"current": None, "pending": None, "instances": None}
    assert not [f for f in gpu["findings"] if f["code"].startswith("mig_")]


def test_a_pending_disable_is_a_warning():
    [gpu], _host = read(MIG_XML.replace("<pending_mig>Enabled</pending_mig>", "<pending_mig>Disabled</pending_mig>"))
    assert [(f["code"], f["severity"]) for f in gpu["findings"]] == [("mig_pending", "warn")]
