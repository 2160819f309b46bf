# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The run as metrics in the Prometheus text exposition format (for node_exporter's textfile collector).

Private to gpufleet.hygiene (not a public API).
"""

from __future__ import annotations

import math

from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._reading import THROTTLE_REASONS
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import started
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._schema import ReportError

MIB = 1024 * 1024
HOST_STATES = ("ready", "not_ready", "running_job", "remediated", "error")
# Every family, in the order written; a family without samples is left out.
METRICS = (
    ("last_run_timestamp_seconds", "Start of the last hygiene run, in seconds since the epoch."),
    ("hosts", "Hosts of the last run by state (ready, not_ready, running_job, remediated, error)."),
    ("host_ready", "1 when the host passed every fail-severity check of the last run."),
    ("host_running_job", "1 when a healthy training job was running on the host (hygiene leaves it alone)."),
    ("host_remediated", "1 when the last run changed something on the host."),
    ("host_error", "1 when the host was unreachable or a check failed to run."),
    ("host_repair_failed", "1 when the last run's repair of the host failed (its report says what failed)."),
    ("check_ok", "1 when the check passed on the host, 0 when it failed or warned."),
    ("job_tokens_per_second", "The training job's last throughput reading in its log (job_live), in tokens per second."),
    ("job_baseline_tokens_per_second", "The job's recorded good throughput (gpufleet_job.baseline_tokens_per_s), in tokens per second."),
    ("job_libraries_wrong", ("Libraries the running job maps of another CUDA major than torch's, from outside the venv or "
                             "deleted (the job_libraries check).")),
    ("contaminants", "Packages built for another CUDA major than the venv's torch."),
    ("gpu_memory_used_bytes", "GPU memory in use."),
    ("gpu_memory_total_bytes", "GPU memory in total."),
    ("gpu_utilization_ratio", "GPU utilization (0 to 1), where the driver reports it."),
    ("gpu_processes", "Processes holding the GPU."),
    ("cache_size_bytes", "Size of a compile cache."),
    ("cache_fresh", "1 when the compile cache matches the environment it was built for (absent when unknown)."),
    ("gpu_healthy", "1 when the GPU has no health finding of severity fail (the gpu_healthy check), 0 otherwise."),
    ("gpu_xid_events", "Xid events of the GPU in the kernel log read, by Xid code."),
    ("gpu_ecc_uncorrected", "Uncorrectable ECC errors of the GPU, volatile (since the last reset) and aggregate (lifetime)."),
    ("gpu_remapped_rows", "1 when a row remapping of the GPU is pending (state=pending) or has failed (state=failed)."),
    ("gpu_throttle", "1 when the clock event (throttle) reason is active on the GPU, 0 when not."),
    ("gpu_pcie_degraded", "1 when the GPU's PCIe link runs below its maximum width, or generation while busy."),
)
PCIE_FINDINGS = ("pcie_width_degraded", "pcie_gen_degraded")


def label_value(value):
    return ("" if value is None else str(value)).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _help(text):
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _labels(pairs):
    return "{" + ",".join('%s="%s"' % (k, label_value(v)) for k, v in pairs) + "}" if pairs else ""


def _num(v):
    """A sample's value: only a number is ever written (the records are checked before; this is
    the last guard, so that no text can end a sample line and start another)."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float) and math.isfinite(v):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    raise ReportError("a Prometheus sample's value must be a finite number, got %s" % type(v).__name__)


def _host_samples(add, h):
    base = [("host", h["host"]), ("node", h["node"]), ("vmid", h["vmid"])]
    add("host_ready", base, h["ready"])
    add("host_running_job", base, h["running_job"])
    add("host_remediated", base, h["remediated"])
    add("host_error", base, bool(h["error"]))
    add("host_repair_failed", base, bool(h["repair_error"]))
    for c in h["checks"]:
        add("check_ok", base + [("check", c["name"]), ("severity", c["severity"])], c["ok"])
    add("contaminants", base, len(h["contaminants"]))
    for g in h["gpus"]:
        gl = base + [("gpu", g["index"]), ("name", g["name"])]
        add("gpu_memory_used_bytes", gl, g["memory_used_mib"] * MIB)
        add("gpu_memory_total_bytes", gl, g["memory_total_mib"] * MIB)
        if g["utilization_pct"] is not None:
            add("gpu_utilization_ratio", gl, g["utilization_pct"] / 100.0)
        add("gpu_processes", gl, len(g["processes"]))
    for c in h["checks"]:
        if c["name"] == "gpu_healthy":
            _health_samples(add, h, c)
        elif c["name"] == "job_libraries":
            add("job_libraries_wrong", base, len(c.get("libraries") or ()))
    for c in h["caches"]:
        cl = base + [("cache", c["name"])]
        add("cache_size_bytes", cl, c["size_bytes"])
        if c["fresh"] is not None:
            add("cache_fresh", cl, c["fresh"])


def _health_samples(add, h, check):
    """The gpu_healthy check's GPUs, labelled {host, node, gpu} (the dashboards and alerts key on these)."""
    for g in check.get("gpus", []):
        gl = [("host", h["host"]), ("node", h["node"]), ("gpu", g.get("index"))]
        add("gpu_healthy", gl, bool(g.get("healthy")))
        for xid, count in sorted((g.get("xid_events") or {}).items(), key=lambda kv: int(kv[0])):
            add("gpu_xid_events", gl + [("xid", xid)], count)
        ecc = g.get("ecc") or {}
        for kind in ("volatile", "aggregate"):
            if ecc.get(kind + "_uncorrected") is not None:
                add("gpu_ecc_uncorrected", gl + [("kind", kind)], ecc[kind + "_uncorrected"])
        rows = g.get("remapped_rows") or {}
        for state in ("pending", "failed"):
            if rows.get(state) is not None:
                add("gpu_remapped_rows", gl + [("state", state)], bool(rows[state]))
        active = g.get("throttle") or []
        for reason in THROTTLE_REASONS:  # every reason of each GPU, so an alert can match on == 1
            add("gpu_throttle", gl + [("reason", reason)], reason in active)
        pcie = g.get("pcie") or {}
        if pcie.get("width") is not None or pcie.get("gen") is not None:
            add("gpu_pcie_degraded", gl, any(f.get("code") in PCIE_FINDINGS for f in g.get("findings", [])))


def _job_samples(add, h):
    """The job's last tok/s and its baseline, from job_live's throughput (absent when unknown)."""
    rate = next((c.get("throughput") for c in h["checks"] if c["name"] == "job_live"), None) or {}
    labels = [("host", h["host"]), ("node", h["node"])]
    if rate.get("tokens_per_s") is not None:
        add("job_tokens_per_second", labels, float(rate["tokens_per_s"]))
    if rate.get("baseline") is not None:
        add("job_baseline_tokens_per_second", labels, float(rate["baseline"]))


def render_prometheus(run):
    samples = dict((name, []) for name, _help_text in METRICS)

    def add(name, labels, value):
        samples[name].append((labels, value))

    add("last_run_timestamp_seconds", [], int(started(run).timestamp()))
    for state in HOST_STATES:
        add("hosts", [("state", state)], run["summary"][state])
    for h in run["hosts"]:
        _host_samples(add, h)
        _job_samples(add, h)
    lines = []
    for name, help_text in METRICS:
        if not samples[name]:
            continue
        full = "gpufleet_hygiene_" + name
        lines.append("# HELP %s %s" % (full, _help(help_text)))
        lines.append("# TYPE %s gauge" % full)
        lines.extend("%s%s %s" % (full, _labels(labels), _num(value)) for labels, value in samples[name])
    return "\n".join(lines) + "\n"
