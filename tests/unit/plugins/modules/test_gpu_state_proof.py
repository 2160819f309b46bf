# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The real-GPU proof script (tests/device/gpu_state_proof.sh), run against the GPU STAND-IN.

This tests the script's logic (holder lifecycle, module calls, checks, report) on a machine
without a GPU; its figures prove nothing about GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ansible_collections.gpufleet.hygiene.tests.standins import gpu_standin

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
SCRIPT = os.path.join(ROOT, "tests", "device", "gpu_state_proof.sh")


def _env(tmp_path, state, **extra):
    bin_dir = os.path.dirname(gpu_standin.install_nvidia_smi(tmp_path / "bin", state))
    env = dict(os.environ)
    env.update({
        "PATH": os.pathsep.join([bin_dir, os.path.dirname(sys.executable), env.get("PATH", "")]),
        "ANSIBLE_COLLECTIONS_PATH": os.path.join(ROOT, ".ansible", "collections"),
        "OUT": str(tmp_path / "out"), "GPU_STATE_PROOF_STANDIN": state, "GPU_PROOF_REPS": "1",
        "GPU_PROOF_GIB": "2", "PYTHON": sys.executable,
        "GPU_PROOF_MODULE_ARGS": json.dumps({"device_patterns": [os.path.join(state, "dev", "nvidia*")]}),
    })
    env.update(extra)
    return env


@pytest.mark.slow
def test_proof_script_passes_on_the_standin(tmp_path):
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=1, release_delay=0.3)
    res = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=_env(tmp_path, state), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=300, check=False)
    log = res.stdout.decode()
    assert res.returncode == 0, log
    data = json.loads((tmp_path / "out" / "gpu_state_proof.json").read_text())
    assert data["passed"] is True and len(data["checks"]) == 13
    holder = data["holder"]["pid"]
    assert data["drain"]["outcome"] == [[holder, ["SIGTERM"], "terminated"]]
    assert data["drain"]["module_drain_seconds"] >= 0.3  # the stand-in's release delay
    assert data["timing"]["bare_pair_median"] > 0 and data["timing"]["module_ansible_median"] > 0
    md = (tmp_path / "out" / "gpu_state_proof.md").read_text()
    assert "Result: **PASS** (13/13 checks)" in md and "STAND-IN RUN" in md
    assert not os.path.exists("/proc/%d/fd" % holder) or not os.listdir("/proc/%d/fd" % holder)


def test_proof_script_fails_and_cleans_up_when_the_holder_never_starts(tmp_path):
    state = gpu_standin.make_state(tmp_path / "gpu", gpus=1)
    env = _env(tmp_path, state, GPU_STATE_PROOF_STANDIN=str(tmp_path / "no-such-state"))
    res = subprocess.run(["bash", SCRIPT], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         timeout=120, check=False)
    assert res.returncode == 1, res.stdout.decode()
    assert b"did not become ready" in res.stdout
    assert not (tmp_path / "out" / "gpu_state_proof.md").exists()
