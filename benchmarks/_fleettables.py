# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The fleet benchmark's tables: its configurations and sizes, the arithmetic over the runs
(medians, fits, floors, slopes), the markdown tables of a results document and the lines below them.

No fleet and no subprocess here: ``benchmarks/bench_fleet.py --table RESULTS.json`` prints the
tables again from the JSON alone, and tests/unit/test_bench_fleet.py checks them.
"""

from __future__ import annotations

import re
import statistics

NAMES = {
    "A": "A seeds' one-liners (ssh + pct exec per container, parallel)",
    "A2": "A2 one-liners over one ssh master per node (lxc-attach, parallel)",
    "P": "P pyinfra 3 (one-liners per container, over ssh to the nodes)",
    "B": "B preflight.yml (every container read from its node)",
    "BC": "BC preflight.yml read by container (gpufleet_read_by=container)",
    "BI": "BI preflight.yml, each container read inside itself (gpufleet_node_read=container)",
    "BL": "BL preflight.yml without the job_libraries check (gpufleet_job_libraries=false)",
    "BH": "BH preflight.yml with GPU health (gpufleet_gpu_health=true)",
    "C": "C shell tasks over proxmox_pct_remote",
    "D": "D preflight.yml under Mitogen (lxc via node)",
    "F": "F Ansible's own floor (ansible-playbook, one ping task on each node of the size, Ansible's defaults)",
    "B0": "B0 preflight.yml before",
    "T": "transport floor (ssh per node + lxc-attach true per container)",
}
CONFIGS = ("A", "A2", "B", "BC", "BH", "BI", "BL", "C", "D", "F", "P")


def parse_sizes(text):
    sizes = []
    for item in text.split(","):
        m = re.match(r"^\s*(\d+)x(\d+)\s*$", item)
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise SystemExit("bench: --sizes takes NODESxCONTAINERS items, e.g. 1x1,2x2,4x4,8x4 (got %r)" % item)
        sizes.append((int(m.group(1)), int(m.group(2))))
    return sorted(set(sizes), key=lambda s: (s[0] * s[1], s))


def label(size):
    return "%dx%d" % size


def fit(points):
    """Least squares wall = k + p_node * nodes + p_ct * containers over [(nodes, containers, wall)]."""
    rows = [(1.0, float(n), float(c)) for n, c, _wall in points]
    ys = [w for _n, _c, w in points]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    # Gaussian elimination on the 3x3 normal equations.
    m = [ata[i] + [aty[i]] for i in range(3)]
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [a - f * b for a, b in zip(m[r], m[col])]
    k, p_node, p_ct = (m[i][3] / m[i][i] for i in range(3))
    return {"fixed_s": k, "per_node_s": p_node, "per_container_s": p_ct}


def slopes(med, sizes, configs):
    """{config: {"NxM->N'xM'": seconds per added container}} between consecutive sizes (by containers)."""
    out = {}
    for c in configs:
        pts = [(n * m, label((n, m)), med.get("%s@%s" % (c, label((n, m))))) for n, m in sizes]
        pts = [p for p in pts if p[2] is not None]
        out[c] = {"%s->%s" % (a[1], b[1]): (b[2] - a[2]) / (b[0] - a[0]) for a, b in zip(pts, pts[1:]) if b[0] > a[0]}
    return out


def floors(med, read_cpu, sizes, cores):
    """{size: {"transport_s", "work_s"}}: T's median, and one read's CPU (the median over the
    sampled containers, its own and nvidia-smi's) times the containers, over the cores."""
    per_read = statistics.median(r["self_s"] + r["children_s"] for r in read_cpu) if read_cpu else None
    out = {}
    for n, m in sizes:
        out[label((n, m))] = {"transport_s": med.get("T@%s" % label((n, m))),
                              "work_s": per_read * n * m / cores if per_read is not None else None}
    return out, per_read


def cell(value, fmt):
    return fmt % value if value is not None else ""


def div(a, b):
    return a / b if a is not None and b else None


def render(doc):
    """The markdown tables of a results document (also: --table results.json)."""
    meta, med, fl = doc["meta"], doc["medians"], doc["floors"]
    sizes = [tuple(int(x) for x in s.split("x")) for s in meta["sizes"]]
    configs = meta["configs"]
    cols = configs + (["B0"] if any(k.startswith("B0@") for k in med) else [])
    lines = ["%s; %s; commit %s; peers %s; B's method %s; sshd's MaxSessions kept by A2: %s; %d rounds, medians of "
             "the wall time of the whole run" % (meta["machine"], meta["ansible_core"], meta["commit"],
                                                 ", ".join("%s %s" % kv for kv in sorted(meta["peers"].items())),
                                                 meta["method"], meta.get("max_sessions"), meta["rounds"]), ""]
    versus = [c for c in ("A", "A2", "F", "P", "BC", "BH", "BI", "BL", "C", "D") if c in configs] if "B" in configs else []
    lines += ["* %s" % NAMES[c] for c in cols + ["T"]] + ["* work floor: one read's CPU x containers / cores", ""]
    head = ["size (nodes x containers)"] + cols + ["T floor", "work floor"] + ["B/%s" % c for c in versus]
    lines += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for s in sizes:
        key = label(s)
        row = ["%s (%d)" % (key, s[0] * s[1])] + [cell(med.get("%s@%s" % (c, key)), "%.2f s") for c in cols]
        row += [cell(fl[key]["transport_s"], "%.2f s"), cell(fl[key]["work_s"], "%.2f s")]
        row += [cell(div(med.get("B@" + key), med.get("%s@%s" % (c, key))), "%.2fx") for c in versus]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Distance to the floors (each configuration's median over the transport floor / over the work floor):", ""]
    lines += ["| size | " + " | ".join(configs) + " |", "| --- |" + " ---: |" * len(configs)]
    for s in sizes:
        key = label(s)
        row = [key]
        for c in configs:
            t = div(med.get("%s@%s" % (c, key)), fl[key]["transport_s"])
            w = div(med.get("%s@%s" % (c, key)), fl[key]["work_s"])
            row.append("%s / %s" % (cell(t, "%.1fx"), cell(w, "%.1fx")) if t or w else "")
        lines.append("| " + " | ".join(row) + " |")
    pairs = sorted({p for c in doc["slopes"].values() for p in c}, key=lambda p: [int(x) for x in re.findall(r"\d+", p)])
    if pairs:
        lines += ["", "Cost per added container (ms, the slope of the medians between two sizes):", ""]
        lines += ["| between | " + " | ".join(configs + ["T"]) + " |", "| --- |" + " ---: |" * (len(configs) + 1)]
        for p in pairs:
            lines.append("| %s | %s |" % (p.replace("->", " → "), " | ".join(
                cell(1000 * doc["slopes"][c][p] if p in doc["slopes"].get(c, {}) else None, "%+.0f") for c in configs + ["T"])))
    if doc.get("read_cpu_s") is not None:
        lines += ["", "Work floor: one container's read costs %.0f ms of CPU in-process (median of %d containers, "
                  "nvidia-smi's stand-in included), times the containers, over %d cores." % (
                      1000 * doc["read_cpu_s"], len(doc["read_cpu"]), meta["cores"])]
    if doc.get("retries"):
        lines += ["", "ssh refused by sshd and tried again: " + ", ".join("%s %d" % kv for kv in sorted(doc["retries"].items()))]
    return "\n".join(lines)


def summarize(results, meta, sizes, configs, verdicts):
    """The results document of a run: the runs, their medians, fits, floors and slopes."""
    runs = results["runs"]
    med = {k: statistics.median(v) for k, v in runs.items()}
    fits = {}
    for c in configs + ["T"]:
        pts = [(n, n * m, med["%s@%s" % (c, label((n, m)))]) for n, m in sizes if "%s@%s" % (c, label((n, m))) in med]
        fits[c] = fit(pts) if len({(n, t) for n, t, _wall in pts}) >= 3 else None
    fl, per_read = floors(med, results.get("read_cpu"), sizes, meta["cores"])
    meta["configs"] = configs
    return {"meta": meta, "runs": runs, "medians": {k: round(v, 3) for k, v in med.items()}, "fits": fits,
            "floors": fl, "read_cpu": results.get("read_cpu", []), "read_cpu_s": per_read,
            "slopes": slopes(med, sizes, configs + ["T"]), "retries": results.get("retries", {}),
            "remediate": results.get("remediate"), "profile": results.get("profile") or {}, "load": results["load"],
            "verdicts": verdicts, "errors": results["errors"]}


def details(doc):
    """The lines printed below the tables: the fits, the clean fleet, the profiles, the failures, the load."""
    configs = doc["meta"]["configs"]
    sizes = [tuple(int(x) for x in s.split("x")) for s in doc["meta"]["sizes"]]
    lines = ["", "Fit wall = fixed + per_node * nodes + per_container * containers (least squares over the sizes):"]
    for c in configs + ["T"]:
        f = doc["fits"][c]
        if f:
            lines.append("  %-2s fixed %.2f s, per node %+.0f ms, per container %+.0f ms" % (
                c, f["fixed_s"], 1000 * f["per_node_s"], 1000 * f["per_container_s"]))
    rem = doc["remediate"]
    if rem and rem["preflight"]:
        p, r = statistics.median(rem["preflight"]), statistics.median(rem["remediate"])
        lines += ["", "Clean fleet (%s): preflight %.2f s, remediate %.2f s (nothing to do): %.2fx" % (
            label(max(sizes, key=lambda s: s[0] * s[1])), p, r, r / p)]
    for name, pr in doc["profile"].items():
        if pr.get("plays"):
            lines += ["", "by play, %s (%.2f s):" % (name, pr["wall_s"])]
            lines += ["  %6.2f s  %s" % (sec, play) for play, sec in pr["plays"]]
        lines += ["", "profile_tasks, %s (%.2f s):" % (name, pr["wall_s"])]
        lines += ["  %6.2f s  %s" % (sec, task) for task, sec in pr["tasks"]]
        if "py_spy" in pr:
            lines.append("py-spy (controller and workers), %s: %d samples; leaf functions:" % (name, pr["py_spy"]["samples"]))
            lines += ["  %5.1f%%  %s" % (100 * share, fn) for fn, share in pr["py_spy"]["top"]]
    for err in doc["errors"]:
        lines += ["", "FAILED: " + err.splitlines()[0]]
    if doc["load"]:
        lines += ["", "load average (1 min) at the start of the counted runs: median %.1f, max %.1f" % (
            statistics.median(doc["load"]), max(doc["load"]))]
    return "\n".join(lines)
