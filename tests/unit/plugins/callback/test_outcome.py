# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The outcome callback: the end of a repair run, one line per container it changed (or would,
under --check), from the modules' own results; the others counted."""

from __future__ import annotations

import importlib

_outcome = importlib.import_module("ansible_collections.gpufleet.hygiene.plugins.callback.outcome")

PLAN = {
    "ansible_facts": {
        "repair__plan": {"repair": True, "leftovers": []},
        "repair__relaunch_command": ["/opt/venv/bin/python", "/opt/gpufleet/train_dflash.py", "--state", "/opt/gpufleet/gpu", "--gpu", "0", "--mib", "40960"],
    }
}
JOB = "/usr/bin/python3 /opt/gpufleet/train_dflash.py --state /opt/gpufleet/gpu --gpu 0 --tag stale"


def host(*results):
    h = _outcome.Host()
    for action, result, name in results:
        h.take(action, result, name)
    return h


def test_a_check_run_says_what_it_would_do_on_each_container_and_counts_the_rest():
    hosts = {
        "train-200": host(
            ("set_fact", PLAN, "Decide what this host needs"),
            (
                "cuda_contamination",
                {
                    "removed": [{"name": "nvidia-nccl-cu13", "version": "2.28.9"}, {"name": "sglang-kernel", "version": "0.3.21+cu130"}],
                    "restored": [{"name": "nvidia-nccl-cu12", "version": "2.27.3"}],
                },
                "Remove",
            ),
            (
                "torch_cache",
                {
                    "caches": [
                        {"name": "inductor", "path": "/tmp/torchinductor_root", "action": "record", "entries": 0, "size": 0},
                        {"name": "triton", "path": "/root/.triton/cache", "action": "clear_and_record", "entries": 3, "size": 3072},
                    ]
                },
                "Make the caches fresh",
            ),
        ),
        "train-201": host(
            ("set_fact", PLAN, "Decide what this host needs"),
            ("processes", {"terminated": [{"pid": 121, "cmdline": JOB, "outcome": "would_terminate"}]}, "Terminate"),
            ("gpu_state", {"terminated": [{"pid": 121, "cmdline": JOB}]}, "Free the GPUs"),
        ),
        "train-100": host(("set_fact", {"ansible_facts": {"repair__plan": {"repair": False}}}, "Decide")),
    }
    lines = _outcome.summary(hosts, ["train-100", "train-200", "train-201", "train-202"], check=True)
    assert lines == [
        "PLAN (check mode: nothing was changed): 2 of 4 container(s) would change",
        (
            "  train-200: would remove nvidia-nccl-cu13 2.28.9, sglang-kernel 0.3.21+cu130; would restore nvidia-nccl-cu12 "
            "2.27.3; would clear triton /root/.triton/cache (3 entries, 3.0 KiB); would relaunch "
            "`/opt/venv/bin/python /opt/gpufleet/train_dflash.py --stat...`"
        ),
        (
            "  train-201: would stop pid 121 /usr/bin/python3 /opt/gpufleet/train_...; would relaunch "
            "`/opt/venv/bin/python /opt/gpufleet/train_dflash.py --stat...`"
        ),
        "  2 container(s): nothing to do",
    ]


def test_a_real_run_says_what_it_did_the_gate_s_verdict_and_where_it_failed():
    done = host(
        ("set_fact", PLAN, "Decide"),
        ("processes", {"terminated": [{"pid": 121, "cmdline": JOB, "outcome": "terminated"}]}, "Terminate"),
        # no_log: the launch's command line carries the job's environment
        ("command", {"censored": "the output has been hidden due to the fact that 'no_log: true' was specified"}, "Launch in tmux session train"),
        # a real clear: what was removed is in removed and freed, the entries left are 0
        (
            "torch_cache",
            {
                "caches": [
                    {
                        "name": "inductor",
                        "path": "/tmp/torchinductor_root",
                        "action": "clear_and_record",
                        "entries": 0,
                        "size": 0,
                        "removed": 12,
                        "freed": 49152,
                    }
                ]
            },
            "Make the caches fresh",
        ),
        ("command", {"cmd": ["tmux", "new-session"]}, "Open tmux session train"),
        ("throughput", {"median": 19800.0, "floor": 18000.0, "readings": [19000, 19800, 20000], "passed": True, "skip": 2}, "Throughput gate"),
    )
    broken = host(("set_fact", PLAN, "Decide"))
    broken.fail("Remove packages built for another CUDA major", {"msg": "venv /opt/venv: uv failed"})
    lines = _outcome.summary({"a": done, "b": broken}, ["a", "b"], check=False)
    assert lines == [
        "OUTCOME: 2 of 2 container(s) changed",
        (
            "  a: stopped pid 121 /usr/bin/python3 /opt/gpufleet/train_...; cleared inductor /tmp/torchinductor_root (12 entries, "
            "48.0 KiB); relaunched `/opt/venv/bin/python /opt/gpufleet/train_dflash.py --stat...`; throughput 19800.0 tok/s "
            "against a floor of 18000.0 (3 readings, 2 skipped)"
        ),
        "  b: FAILED at Remove packages built for another CUDA major: venv /opt/venv: uv failed",
    ]


def test_a_cache_whose_content_stays_is_no_clear():
    """state fresh records a missing cache's fingerprint (it creates the root): that clears nothing."""
    h = host(
        ("set_fact", PLAN, "Decide"),
        (
            "torch_cache",
            {
                "caches": [
                    {"name": "cuda", "path": "/root/.nv/ComputeCache", "action": "record", "entries": 0, "size": 0},
                    {"name": "inductor", "path": "/tmp/torchinductor_root", "action": "clear_and_record", "entries": 0, "size": 0},
                ]
            },
            "Fresh",
        ),
    )
    assert h.cleared == [] and _outcome.summary({"x": h}, ["x"], check=False) == ["OUTCOME: 0 of 1 container(s) changed", "  1 container(s): nothing to do"]


def test_the_outcome_file_holds_every_container_of_the_run(tmp_path):
    """outcome_file: the same lines as JSON, every container of the run (those with nothing to do too), for the
    phases of a later fleet report."""
    import json

    from ansible.plugins.loader import callback_loader

    # Loaded as Ansible loads it, its options from its documentation.
    cb = callback_loader.get("gpufleet.hygiene.outcome")
    cb.set_options(direct={"outcome_file": str(tmp_path / "outcome.json")})
    broken = host(("set_fact", PLAN, "Decide"))
    broken.fail("Remove packages built for another CUDA major", {"msg": "venv /opt/venv: uv failed"})
    cb._hosts = {"a": host(("set_fact", PLAN, "Decide"), ("processes", {"terminated": [{"pid": 121, "cmdline": JOB}]}, "Terminate")),
                 "b": broken}
    cb._write(cb.get_option("outcome_file"), ["a", "b", "c"], False)
    data = json.loads((tmp_path / "outcome.json").read_text())
    assert data["kind"] == "gpufleet.hygiene.outcome" and data["version"] == 1 and data["check"] is False
    assert data["hosts"] == [
        {"host": "a", "actions": ["stopped pid 121 /usr/bin/python3 /opt/gpufleet/train_..."], "failed": None},
        {"host": "b", "actions": [], "failed": "Remove packages built for another CUDA major: venv /opt/venv: uv failed"},
        {"host": "c", "actions": [], "failed": None},
    ]
    assert [p.name for p in tmp_path.iterdir()] == ["outcome.json"]  # no temporary file left


def test_an_outcome_file_that_cannot_be_written_is_a_warning(tmp_path):
    warnings = []
    cb = _outcome.CallbackModule()
    cb._display.warning = warnings.append
    cb._hosts = {"a": host(("set_fact", PLAN, "Decide"))}
    cb._write(str(tmp_path / "no" / "such" / "dir" / "outcome.json"), ["a"], False)
    assert len(warnings) == 1 and "cannot write outcome_file" in warnings[0] and "No such file or directory" in warnings[0]
