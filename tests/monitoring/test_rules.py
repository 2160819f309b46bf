# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The alerting rules under promtool: they load, every alert fires on recorded series where it
should and stays quiet where it should not (tests/monitoring/*.test.yml), they read only metrics
the hygiene run writes, and the file the report writes passes promtool's metrics linter.

Needs promtool (Debian's prometheus package): `sudo bash tests/monitoring/setup-host.sh`.
Without it these tests fail (they do not skip).
"""

from __future__ import annotations

import glob
import os

import pytest
import yaml
from fleet_sample import RUN_STARTED, realistic_fleet
from promkit import HERE, RULES, alert_rules, exporter_metrics, metric_names, promtool

from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._report import FleetReport

TESTS = sorted(glob.glob(os.path.join(HERE, "*.test.yml")))


def test_promtool_checks_the_rules():
    proc = promtool("check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: %d rules found" % len(alert_rules()) in proc.stdout


@pytest.mark.parametrize("path", TESTS, ids=os.path.basename)
def test_promtool_tests_the_rules_on_recorded_series(path):
    proc = promtool("test", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_is_tested_firing_and_quiet():
    fired, quiet = set(), set()
    for path in TESTS:
        with open(path) as f:
            for case in yaml.safe_load(f)["tests"]:
                for t in case.get("alert_rule_test", []):
                    (fired if t["exp_alerts"] else quiet).add(t["alertname"])
    names = {r["alert"] for r in alert_rules()}
    assert len(names) == 14
    assert names - fired == set(), "never seen firing"
    assert names - quiet == set(), "never seen quiet"


def test_the_rules_read_only_metrics_the_run_writes():
    known = exporter_metrics()
    for rule in alert_rules():
        used = metric_names(rule["expr"])
        assert used and used <= known, (rule["alert"], sorted(used - known))
        assert rule["labels"]["severity"] in ("warning", "critical") and rule["annotations"]["summary"]


def test_metric_names_of_promql():
    expr = ('sum by (node) (gpufleet_hygiene_host_ready{check="x{y}"}) / on (node) group_left '
            'count(max_over_time(gpufleet_hygiene_hosts[$__range])) and ignoring(a) time() - foo:bar offset 1h')
    assert metric_names(expr) == {"gpufleet_hygiene_host_ready", "gpufleet_hygiene_hosts", "foo:bar"}


def test_the_report_file_passes_promtools_metrics_linter(tmp_path):
    FleetReport(realistic_fleet(), str(tmp_path), run_started=RUN_STARTED, formats=["prometheus"]).apply()
    text = (tmp_path / "gpufleet_hygiene.prom").read_text()
    assert "gpufleet_hygiene_job_tokens_per_second{" in text
    proc = promtool("check", "metrics", stdin=text)
    assert proc.returncode == 0 and not proc.stdout.strip() and not proc.stderr.strip(), proc.stdout + proc.stderr
    # The linter is not blind: a counter without _total is one of its findings.
    bad = promtool("check", "metrics", stdin="# HELP x_bytes y\n# TYPE x_bytes counter\nx_bytes 1\n")
    assert bad.returncode != 0 and "_total" in bad.stdout + bad.stderr
