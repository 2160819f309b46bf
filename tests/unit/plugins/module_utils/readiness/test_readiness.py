# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""readiness/_readiness: one readiness read resolves its venv once: a REAL venv made with
include-system-site-packages (whose base installation's packages are found from pyvenv.cfg, by
reading files), REAL wheels installed by uv; the run() the read is given counts every start of
the venv's interpreter: none."""

from __future__ import annotations

import os
import subprocess

import pytest
from cachetree import install, make_venv, torch_wheels

from ansible_collections.gpufleet.hygiene.plugins.module_utils.cache._torch_cache import venv_fingerprint
from ansible_collections.gpufleet.hygiene.plugins.module_utils.readiness import _checks, _options, _readiness
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _inventory, _venv
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._contamination import Contamination

OPTIONS = {"job_patterns": [], "job_users": [], "require_gpu": False, "threshold_mib": 64, "nvidia_smi": "/nonexistent/nvidia-smi",
           "command_timeout": 5.0, "device_patterns": ["/nonexistent/nvidia*"], "venv": None, "expected_cuda": None,
           "baseline": None, "verify_files": False, "caches": True, "cache_user": None, "cache_environment": None,
           "allow_running_job": False}


class Counted:
    """run(argv) -> (rc, stdout, stderr), counting the starts of the venv's interpreter."""

    def __init__(self, venv):
        self.python = os.path.join(venv, "bin")
        self.starts = 0

    def __call__(self, argv):
        if os.path.dirname(argv[0]) == self.python:
            self.starts += 1
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def system_venv(tmp_path_factory):
    """A venv that also imports the base interpreter's packages: its sys.path must be asked."""
    root = tmp_path_factory.mktemp("readonce")
    os.makedirs(str(root / "wheels"))
    wheels = torch_wheels(str(root / "wheels"), torch="2.8.0+cu128", cuda="12.8", triton="3.4.0")
    venv = make_venv(str(root / "venv"))
    install(venv, wheels, "torch==2.8.0+cu128", "triton==3.4.0")
    cfg = os.path.join(venv, "pyvenv.cfg")
    with open(cfg) as f:
        text = f.read().replace("include-system-site-packages = false", "include-system-site-packages = true")
    with open(cfg, "w") as f:
        f.write(text)
    baseline = str(root / "requirements.txt")
    with open(baseline, "w") as f:
        f.write("torch==2.8.0+cu128\ntriton==3.4.0\n")
    return {"venv": venv, "baseline": baseline, "caches": str(root / "caches")}


@pytest.fixture
def resolutions(monkeypatch):
    """The venvs resolved (each resolution starts by finding the venv's interpreter)."""
    count = []
    real = _venv.venv_python

    def counted(*args, **kw):
        count.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(_venv, "venv_python", counted)
    return count


def options(rig):
    env = {"HOME": rig["caches"], "USER": "trainer", "TMPDIR": rig["caches"]}
    return dict(OPTIONS, venv=rig["venv"], baseline=rig["baseline"], cache_environment=env)


def base_site_packages(venv):
    """The base interpreter's site directories as it says itself (asked here, by the test)."""
    home = _venv.read_pyvenv_cfg(venv)["home"]
    python = os.path.join(home, "python3")
    out = subprocess.run([python, "-E", "-c", "import json, sys; print(json.dumps(sys.path))"], capture_output=True,
                         text=True, check=True).stdout
    return [p for p in __import__("json").loads(out) if p.endswith(("site-packages", "dist-packages")) and os.path.isdir(p)]


def test_one_read_resolves_the_venv_once_and_never_starts_its_interpreter(system_venv, resolutions):
    os.makedirs(system_venv["caches"], exist_ok=True)
    run = Counted(system_venv["venv"])
    result = _readiness.read(options(system_venv), run, lambda name: None)
    assert run.starts == 0 and resolutions == [system_venv["venv"]]
    # The base installation's directories, derived from pyvenv.cfg, are those its interpreter uses.
    assert result["pip_inventory"]["site_dirs"][1:] == base_site_packages(system_venv["venv"])
    # Each of the three readers read that venv, its base interpreter's packages included.
    inv = result["pip_inventory"]
    assert "failed" not in inv and len(inv["site_dirs"]) > 1
    assert {p["name"] for p in inv["packages"]} >= {"torch", "triton"}
    assert inv["drift"]["missing"] == [] and inv["drift"]["changed"] == []
    assert result["cuda_contamination"]["reference"]["cuda_version"] == "12.8"
    assert result["torch_cache"]["fingerprint"] == {"torch": "2.8.0+cu128", "triton": "3.4.0", "cuda": "12.8", "flashinfer": None}
    # What the readers see is what each sees alone, where each resolves the venv itself.
    alone = Counted(system_venv["venv"])
    assert _inventory.inventory(system_venv["venv"], None, system_venv["baseline"], False, alone) == inv
    assert Contamination(system_venv["venv"], alone).scan()[0]["reference"] == result["cuda_contamination"]["reference"]
    assert venv_fingerprint(system_venv["venv"], alone) == result["torch_cache"]["fingerprint"]
    assert alone.starts == 0 and len(resolutions) == 4


def test_a_venv_that_cannot_be_resolved_fails_each_reader_alike_once(tmp_path, resolutions):
    missing = str(tmp_path / "no-venv")
    asked = dict(OPTIONS, venv=missing, baseline=str(tmp_path / "requirements.txt"),
                 cache_environment={"HOME": str(tmp_path), "USER": "trainer"})
    result = _readiness.read(asked, Counted(missing), lambda name: None)
    msg = "venv %s does not exist" % missing
    for name in ("cuda_contamination", "pip_inventory", "torch_cache"):
        assert result[name]["failed"] is True and result[name]["msg"] == msg, name
    assert resolutions == [missing]


def test_the_job_s_reads_end_by_read_timeout_too(monkeypatch):
    """Liveness and the job's libraries come after the other reads (they need their results):
    one that does not answer (a job log on a stalled file system, a /proc file of a process stuck
    in the kernel) is left behind at read_timeout like the others, never the caller."""
    import threading
    import time

    release = threading.Event()
    monkeypatch.setattr(_readiness, "read_liveness", lambda p, result: release.wait(60))
    p = dict((name, spec.get("default")) for name, spec in _options.ARGUMENT_SPEC.items())
    p.update(require_gpu=False, nvidia_smi="/nonexistent/nvidia-smi", device_patterns=["/nonexistent/nvidia*"], read_timeout=1.0)
    started = time.monotonic()
    try:
        result = _readiness.read(p, lambda argv: (127, "", ""), lambda name: None)
    finally:
        release.set()
    assert time.monotonic() - started < 10
    assert result["liveness"]["failed"] and result["liveness"]["msg"].startswith("liveness did not finish within 1.0s (read_timeout)")
    assert result["job_libraries"]["failed"]


def test_the_job_s_configuration_is_read_before_anything_acts_on_it(tmp_path):
    """job_config: what the read can tell is wrong with the job as the inventory describes it,
    each problem naming the inventory variable to fix (a typo'd venv: gpufleet_venv)."""
    venv = make_venv(str(tmp_path / "venv"))
    (tmp_path / "work").mkdir()
    (tmp_path / "a-file").write_text("")
    good = {"venv": venv, "job_workdir": str(tmp_path / "work"), "job_log": str(tmp_path / "work" / "train.log"),
            "job_command": [os.path.join(venv, "bin", "python"), "train.py"]}
    assert _readiness.read_config(good) == []
    assert _checks.check_config([]) == {"name": "job_config", "severity": "fail", "ok": True, "error": False,
                                        "summary": "the job can be launched as described", "problems": []}
    bad = {"venv": "/opt/venv-typo", "job_workdir": str(tmp_path / "a-file"), "job_log": "/no/such/dir/train.log",
           "job_command": ["bin/train", "--fast"]}
    problems = _readiness.read_config(bad)
    assert [(p["option"], p["variable"], p["value"], p["problem"]) for p in problems] == [
        ("venv", "gpufleet_venv", "/opt/venv-typo", "does not exist"),
        ("job_workdir", "gpufleet_job.workdir", str(tmp_path / "a-file"), "is not a directory"),
        ("job_log", "gpufleet_job.log", "/no/such/dir/train.log", "its directory /no/such/dir does not exist"),
        ("job_command", "gpufleet_job.command", "bin/train", "does not exist"),
    ]
    check = _checks.check_config(problems)
    assert check["ok"] is False and check["summary"].startswith(
        "configuration error: gpufleet_venv=/opt/venv-typo does not exist; gpufleet_job.workdir=")
    # A directory that is no venv, a program that may not be run; a bare name is left to PATH.
    (tmp_path / "work" / "train").write_text("#!/bin/sh\n")
    assert [p["problem"] for p in _readiness.read_config({"venv": str(tmp_path / "work"), "job_workdir": str(tmp_path / "work"),
                                                          "job_command": ["./train"]})] == [
        "has no bin/python: it is not a virtual environment", "is not a file that may be run"]
    assert _readiness.read_config({"job_command": ["python3", "train.py"]}) == []
