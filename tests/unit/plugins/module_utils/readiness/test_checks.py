# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""readiness/_checks: the verdicts of a reading, each check alone and judge() over all of them. The
reads that fill a reading are test_readiness.py's; each check is also seen through the readiness
module in tests/unit/plugins/modules."""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _checks

IDLE = {"gpus": [{"index": 0, "idle": True, "processes": [], "memory_used_mib": 0}], "gpu_available": True, "idle": True}
SKIPPED = {"skipped": True}


def reading(**parts):
    out = {"gpu_state": IDLE, "processes": SKIPPED, "cuda_contamination": SKIPPED, "pip_inventory": SKIPPED,
           "torch_cache": SKIPPED}
    out.update(parts)
    return out


def test_judge_makes_a_check_of_each_read_that_ran_in_the_role_s_order():
    assert [c["name"] for c in _checks.judge(reading(), False)] == ["gpu_idle"]
    full = reading(cuda_contamination={"reference": {"cuda_version": "12.8"}, "contaminants": [], "scanned": 3},
                   pip_inventory={"packages": [], "count": 3}, torch_cache={"caches": []}, job_config=[])
    assert [c["name"] for c in _checks.judge(full, False)] == ["gpu_idle", "venv_clean", "packages", "caches_fresh",
                                                               "job_config"]
    assert all(c["ok"] for c in _checks.judge(full, False))


def test_venv_clean_names_each_contaminant_with_its_cuda_and_what_it_overwrote():
    check = _checks.check_venv({"reference": {"cuda_version": "12.8"}, "scanned": 9, "clobbered": [{}, {}],
                                "contaminants": [{"name": "nvidia-nccl-cu13", "version": "2.28.9", "cuda_major": 13}]})
    assert (check["ok"], check["error"]) == (False, False)
    assert check["summary"] == ("1 package(s) built for another CUDA than 12.8: nvidia-nccl-cu13 2.28.9 (CUDA 13); "
                                "2 file(s) of other packages overwritten")
    failed = _checks.check_venv({"failed": True, "msg": "venv /opt/venv does not exist"})
    assert (failed["ok"], failed["error"], failed["summary"]) == (False, True, "venv /opt/venv does not exist")


def test_packages_fail_on_what_is_missing_or_changed_and_on_extras_only_when_strict():
    drift = {"missing": [], "changed": [], "extra": [{"name": "sglang"}, {"name": "pip"}]}
    lenient = _checks.check_packages({"packages": [], "count": 12, "drift": drift})
    assert lenient["ok"] is True and "2 not in the baseline" in lenient["summary"]
    strict = _checks.check_packages({"packages": [], "count": 12, "drift": drift}, strict=True)
    # The installer's own tools are never extra.
    assert strict["ok"] is False and strict["summary"].endswith("; strict, so these fail: sglang")
    missing = dict(drift, missing=[{"name": "torch"}], extra=[])
    assert _checks.check_packages({"packages": [], "count": 11, "drift": missing})["ok"] is False


def test_caches_fresh_lists_the_stale_caches_and_counts_the_fresh_ones():
    fresh = {"name": "inductor", "path": "/tmp/torchinductor_root", "entries": 2, "stale": False, "exists": True}
    stale = dict(fresh, name="flashinfer", path="/root/.cache/flashinfer", entries=9, stale=True)
    assert _checks.check_caches({"caches": [fresh]})["summary"] == "1 cache(s), built for this venv"
    check = _checks.check_caches({"caches": [fresh, stale]})
    assert check["ok"] is False and check["summary"] == (
        "built for another torch/Triton/CUDA/FlashInfer: flashinfer /root/.cache/flashinfer (9 entries)")


def test_gpu_idle_names_who_holds_a_busy_gpu_and_lets_the_job_s_own_run_when_allowed():
    held = {"gpus": [{"index": 0, "idle": False, "memory_used_mib": 4096,
                      "processes": [{"pid": 41, "name": "python3"}]}], "gpu_available": True, "idle": False}
    stale = _checks.check_gpu(held, {"processes": []}, allow_running_job=True)
    assert (stale["ok"], stale["summary"], stale["others"]) == (False, "GPU 0: 4096 MiB used, held by pid 41 python3", [41])
    job = {"processes": [{"pid": 41}]}
    assert _checks.check_gpu(held, job, allow_running_job=True)["summary"] == "held by the running job (pid 41)"
    assert _checks.check_gpu(held, job, allow_running_job=False)["ok"] is False
