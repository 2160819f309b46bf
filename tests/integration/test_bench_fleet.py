# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""benchmarks/bench_fleet.py end to end at 1x1 and 2x2, one round: every configuration's row,
both floors and the slopes come out. Structure only: no figure is asserted (speed is the
benchmark's business, never a test's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO, VENV_BIN

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import bench_fleet  # noqa: E402 - benchmarks/ is no package: its directory is put on sys.path above

STATE = "/var/tmp/gpufleet-sim-bench-test"  # a fleet of its own: never the session's, never the benchmark's


def test_bench_fleet_small(tmp_path):
    results = tmp_path / "results.json"
    argv = [os.path.join(VENV_BIN, "python"), os.path.join(REPO, "benchmarks", "bench_fleet.py"),
            "--sizes", "1x1,2x2", "--rounds", "1", "--remediate-rounds", "0", "--read-samples", "2",
            "--plot", "", "--results", str(results), "--state", STATE, "--port", "2780"]
    res = subprocess.run(argv, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=1800,
                         check=False)
    assert res.returncode == 0, res.stderr[-4000:]
    assert not os.path.exists(STATE), "the benchmark left its fleet up"
    doc = json.loads(results.read_text())
    assert doc["errors"] == []
    every = list(bench_fleet.CONFIGS) + ["T"]
    for size in ("1x1", "2x2"):
        for config in every:
            assert len(doc["runs"]["%s@%s" % (config, size)]) == 1, (config, size)
            assert doc["medians"]["%s@%s" % (config, size)] > 0
        assert doc["floors"][size]["transport_s"] == doc["medians"]["T@" + size]
        assert doc["floors"][size]["work_s"] > 0
        # Every container of the size answered in every configuration.
        hosts = {"1x1": {"train-100"}, "2x2": {"train-100", "train-101", "train-200", "train-201"}}[size]
        assert {c: set(v) for c, v in doc["verdicts"][size].items()} == {c: hosts for c in every}
    # The contaminated container: found by the preflight and by the one-liners' grep alike.
    assert all(doc["verdicts"]["2x2"][c]["train-100"] for c in ("A", "A2", "B", "BI", "BL", "D"))
    assert set(doc["slopes"]) == set(every)
    assert all(set(v) == {"1x1->2x2"} for v in doc["slopes"].values())
    assert len(doc["read_cpu"]) == 2 and all(r["failed_reads"] == [] for r in doc["read_cpu"])
    # The markdown printed is the one --table renders from the results file.
    table = bench_fleet.render(doc)
    assert table in res.stdout
    header = next(line for line in table.splitlines() if line.startswith("| size (nodes x containers)"))
    assert [c.strip() for c in header.strip("|").split("|")][1:] == list(bench_fleet.CONFIGS) + [
        "T floor", "work floor", "B/A", "B/A2", "B/F", "B/P", "B/BC", "B/BH", "B/BI", "B/BL", "B/C", "B/D"]
    rows = [line for line in table.splitlines() if line.startswith(("| 1x1 (1) |", "| 2x2 (4) |"))]
    assert len(rows) == 2 and all("" not in [c.strip() for c in row.split("|")[1:-1]] for row in rows)
    rerendered = subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "bench_fleet.py"), "--table", str(results)],
                                text=True, stdout=subprocess.PIPE, check=True).stdout
    assert rerendered.strip() == table.strip()
