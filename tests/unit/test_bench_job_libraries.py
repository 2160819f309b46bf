# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""benchmarks/bench_job_libraries.py, small: two rounds over the real seed venv and a real job."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_the_check_is_measured_on_a_job_that_maps_the_venv_s_libraries():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "bench_job_libraries.py"), "--rounds", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, check=True).stdout
    # The job really mapped the venv's CUDA runtime and NCCL, so the "on" reads judged them.
    assert "the job maps 2 CUDA libraries of the venv" in out, out
    rows = dict(re.findall(r"\| job_libraries (on|off) \| ([0-9.]+) ms \|", out))
    assert set(rows) == {"on", "off"} and all(float(v) > 0 for v in rows.values()), out
    assert re.search(r"on/off: CPU [0-9.]+x, wall [0-9.]+x; the check's CPU: -?[0-9.]+ ms a container", out), out
