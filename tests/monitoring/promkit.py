# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the monitoring tests share: promtool, the metric names a PromQL expression reads, and the
metrics the hygiene run writes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RULES = os.path.join(ROOT, "contrib", "monitoring", "gpufleet-hygiene.rules.yml")
DASHBOARD = os.path.join(ROOT, "contrib", "monitoring", "gpufleet-hygiene.dashboard.json")
SETUP = "tests/monitoring/setup-host.sh"

# gpu_healthy's families, written by the report's Prometheus file beside those of
# plugin_utils/report/_prometheus.METRICS (docs/reports.md lists them all).
GPU_HEALTH_METRICS = frozenset("gpufleet_hygiene_gpu_" + n for n in (
    "healthy", "xid_events", "ecc_uncorrected", "remapped_rows", "throttle", "pcie_degraded"))

_KEYWORDS = frozenset(("by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                       "offset", "inf", "nan"))


def promtool(*args, stdin=None):
    path = shutil.which("promtool")
    if not path:
        raise RuntimeError("promtool is not installed: run `sudo bash %s`" % SETUP)
    return subprocess.run([path, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False)


def exporter_metrics():
    """Every family name the report's Prometheus file can hold."""
    from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._prometheus import METRICS

    return frozenset("gpufleet_hygiene_" + name for name, _help in METRICS) | GPU_HEALTH_METRICS


def metric_names(expr):
    """The metric names a PromQL expression reads (Grafana's $variables taken out first)."""
    text = re.sub(r"\$\{?\w+\}?", "1", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if m.group(2) or m.group(1) in _KEYWORDS:
            continue  # a function, or a keyword
        names.add(m.group(1))
    return names


def alert_rules():
    with open(RULES) as f:
        return [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]]
