# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The real-GPU proof of the health read (tests/device/gpu_health_proof.sh), run against the
nvidia-smi STAND-IN: its comparisons and its verdict, not the GPU (its figures prove nothing
about GPUs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "tests", "device", "gpu_health_proof.sh")


def _run(tmp_path, smi_dir):
    env = dict(os.environ, OUT=str(tmp_path / "out"), PYTHON=sys.executable, GPU_HEALTH_PROOF_STANDIN="1",
               PATH=os.pathsep.join([smi_dir, "/usr/bin", "/bin"]))  # no ansible: the module_utils read only
    res = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=300, check=False)
    with open(tmp_path / "out" / "gpu_health_proof.json") as f:
        return res, json.load(f)


def _rig(tmp_path):
    health = tmp_path / "health.json"
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=2, health_file=str(health))
    uuids = [g["uuid"] for g in gpu_standin.read_config(state)["gpus"]]
    gpu_standin.set_health(health, uuids[1], persistence_mode=False, ecc={"volatile": {"dram_uncorrectable": 2}},
                           remapped_rows={"uncorrectable": 1, "pending": True}, clocks_event_reasons=["hw_slowdown"],
                           pcie={"gen": 4, "width": 8},
                           memory_faults={"unrepairable_memory": True, "sram_sources": {"l2": 3},
                                          "row_remapper_histogram": {"max": 3071, "none": 1}})
    return state, gpu_standin.install_nvidia_smi(tmp_path / "bin", state)


def test_every_field_of_query_and_xml_matches_nvidia_smi_even_on_a_faulty_gpu(tmp_path):
    _state, smi = _rig(tmp_path)
    res, out = _run(tmp_path, os.path.dirname(smi))
    assert res.returncode == 0, res.stdout + res.stderr
    assert out["ok"] is True and set(out["sources"]) == {"query", "xml"}
    xml = out["sources"]["xml"]
    fields = set(f["field"] for f in xml["fields"])
    assert {"memory_faults.unrepairable_memory", "memory_faults.row_remapper_histogram", "remapped_rows.pending",
            "ecc.volatile_uncorrected", "throttle", "pcie.width"} <= fields
    assert len(out["gpus"]) == 2 and all(f["match"] for s in out["sources"].values() for f in s["fields"])
    # the faulty GPU's faults were read, and compared equal to what nvidia-smi printed
    flagged = [f for f in xml["fields"] if f["field"] == "memory_faults.unrepairable_memory" and f["source_value"] is True]
    assert len(flagged) == 1 and flagged[0]["nvidia_smi"] is True
    assert "unrepairable_memory" in xml["findings"] and out["sources"]["query"]["error"] is None
    assert "every field matched" in (tmp_path / "out" / "gpu_health_proof.md").read_text()


def test_a_source_that_disagrees_with_nvidia_smi_fails_the_proof(tmp_path):
    _state, smi = _rig(tmp_path)
    # An nvidia-smi whose -q -x names another driver than its --query-gpu: the xml source's
    # driver then differs from the reference, and the proof must say so.
    wrapper = tmp_path / "wrap" / "nvidia-smi"
    wrapper.parent.mkdir()
    wrapper.write_text('#!/bin/sh\nif [ "$1" = "-q" ]; then "%s" "$@" | sed "s/580.159.04/999.1.2/"; else exec "%s" "$@"; fi\n'
                       % (smi, smi))
    wrapper.chmod(0o755)
    res, out = _run(tmp_path, str(wrapper.parent))
    assert res.returncode == 1 and out["ok"] is False
    bad = [f for f in out["sources"]["xml"]["fields"] if not f["match"]]
    assert set(f["field"] for f in bad) == {"driver"} and bad[0]["source_value"] == "999.1.2"
    assert out["sources"]["query"]["ok"] is True
    assert "MISMATCH" in (tmp_path / "out" / "gpu_health_proof.md").read_text()
