# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The Grafana dashboard, without Grafana: importable as Grafana exports it (the data source an
input, schemaVersion, unique ids, panels on the grid), and every query reads metrics the hygiene
run writes (or ALERTS, which the rules make) in PromQL that Prometheus's own parser accepts."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from promkit import DASHBOARD, alert_rules, exporter_metrics, metric_names, promtool

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


@pytest.fixture(scope="module")
def dash():
    with open(DASHBOARD) as f:
        return json.load(f)


def panels(dash):
    for p in dash["panels"]:
        yield p
        yield from p.get("panels", [])


def queries(dash):
    """(where, PromQL) of every panel target and template variable."""
    for p in panels(dash):
        for t in p.get("targets", []):
            yield "panel %r %s" % (p["title"], t["refId"]), t["expr"]
    for v in dash["templating"]["list"]:
        m = re.match(r"label_values\((.*),\s*\w+\)$", v["query"]["query"])
        assert m, v["query"]
        yield "variable %s" % v["name"], m.group(1)


def test_it_imports_as_grafana_exports_it(dash):
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    assert dash["uid"] == "gpufleet-hygiene" and dash["title"] and dash["id"] is None
    [ds] = dash["__inputs"]
    assert ds == dict(ds, name="DS_PROMETHEUS", type="datasource", pluginId="prometheus")
    kinds = {r["id"] for r in dash["__requires"] if r["type"] == "panel"}
    assert kinds == {p["type"] for p in panels(dash) if p["type"] != "row"}
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids))
    for p in panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == DS and p["targets"], p["title"]
        assert all(t["datasource"] == DS for t in p["targets"]), p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        assert p["description"], p["title"]
    for v in dash["templating"]["list"]:
        assert v["datasource"] == DS and v["type"] == "query"


def test_panels_lie_on_the_grid_without_overlap(dash):
    taken = set()
    for p in panels(dash):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] >= 1 and g["x"] + g["w"] <= 24 and g["h"] >= 1, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, "%s overlaps another panel" % p["title"]
        taken |= cells


def test_every_query_reads_metrics_the_run_or_the_rules_make(dash):
    known = exporter_metrics() | {"ALERTS"}
    used = set()
    for where, expr in queries(dash):
        names = metric_names(expr)
        assert names and names <= known, (where, sorted(names - known))
        used |= names
    # What an operator looks at: readiness, checks, each GPU's health, Xid, ECC, throttle, the job's
    # tok/s against its baseline, the last run's age, and the alerts.
    for name in ("hosts", "host_ready", "check_ok", "contaminants", "gpu_healthy", "gpu_xid_events", "gpu_ecc_uncorrected",
                 "gpu_remapped_rows", "gpu_throttle", "gpu_pcie_degraded", "job_tokens_per_second",
                 "job_baseline_tokens_per_second", "last_run_timestamp_seconds"):
        assert "gpufleet_hygiene_" + name in used, name
    assert "ALERTS" in used


def test_every_query_parses_as_promql(dash, tmp_path):
    """Each query, Grafana's variables given values, as a recording rule: promtool parses it."""
    values = {"$node": ".*", "$host": ".*", "$__range": "1h", "$__interval": "1m", "$__rate_interval": "5m"}
    rules = []
    for i, (where, query) in enumerate(queries(dash)):
        expr = re.sub(r"\$\w+", lambda m: values[m.group(0)], query)
        assert "$" not in expr, where
        rules.append({"record": "dashboard:query_%d" % i, "expr": expr})
    path = tmp_path / "queries.rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    proc = promtool("check", "rules", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The parser is not blind: a broken query is refused.
    path.write_text(yaml.safe_dump({"groups": [{"name": "x", "rules": [{"record": "x:y", "expr": "sum by (host (x)"}]}]}))
    assert promtool("check", "rules", str(path)).returncode != 0


def test_the_alert_thresholds_and_the_dashboards_agree(dash):
    """The throughput panel's red line and the rules' gate are the same fraction."""
    [gate] = [r for r in alert_rules() if r["alert"] == "GpuFleetThroughputBelowGate"]
    fraction = float(re.search(r"< ([\d.]+) \*", gate["expr"]).group(1))
    [gauge] = [p for p in panels(dash) if p["title"] == "Throughput / baseline"]
    steps = gauge["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps if s["color"] == "green"] == [fraction]
