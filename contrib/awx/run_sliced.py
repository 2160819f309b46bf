# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A sliced run without AWX: N concurrent ansible-runner jobs, then one merged fleet report.

The slices are AWX's (job_slice_count): every host of the inventory sorted by name, slice k
(1 to N) holding the hosts at positions k-1, k-1+N, k-1+2N, ... Each slice runs
contrib/awx/slice.yml in its own private_data_dir with --limit to its hosts (and localhost, where
it writes its records), concurrently; then playbooks/merge_reports.yml merges the slices' reports.

    run_sliced.py -i inventory.yml --slices 3 --playbook preflight --out /srv/gpufleet/run-1 \
        [--report-dir DIR] [-e key=value ...]

Exits 0 when the merge wrote the report, whatever the slices' own outcome (a preflight whose
containers are not ready fails its slice; the report says why); 1 when the merge failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SLICE_PLAYBOOK = os.path.join(HERE, "slice.yml")
MERGE_PLAYBOOK = "gpufleet.hygiene.merge_reports"


def slice_hosts(hosts, number, count):
    """The hosts of slice number (1 to count), as AWX's inventory slicing picks them."""
    if not 1 <= number <= count:
        raise ValueError("slice number must be within 1..%d, got %d" % (count, number))
    return sorted(hosts)[number - 1::count]


def inventory_hosts(inventory, env=None):
    """Every host of the inventory (AWX slices them all, not only the playbook's pattern)."""
    out = subprocess.run(["ansible-inventory", "-i", inventory, "--list"], env=env, check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    data = json.loads(out)
    hosts = set(data.get("_meta", {}).get("hostvars", {}))
    for group in data.values():
        if isinstance(group, dict):
            hosts.update(group.get("hosts", []))
    return sorted(hosts)


def private_dir(out, name):
    """A job's own private_data_dir (ansible-runner writes its env/ and artifacts/ there)."""
    path = os.path.join(out, "runner", name)
    os.makedirs(path, exist_ok=True)
    return path


def run_slices(inventory, count, playbook, out, extravars=None, envvars=None):
    """Start every slice at once (ansible_runner.run_async), wait for all; return
    [{"number", "hosts", "report", "status", "rc"}] in slice order."""
    import ansible_runner  # the controller's; AWX's execution environments carry it

    hosts = inventory_hosts(inventory, env=dict(os.environ, **(envvars or {})))
    started = []
    for number in range(1, count + 1):
        mine = slice_hosts(hosts, number, count)
        report = os.path.join(out, "slices", str(number))
        thread, runner = ansible_runner.run_async(
            private_data_dir=private_dir(out, str(number)), playbook=SLICE_PLAYBOOK,
            inventory=os.path.abspath(inventory), limit=",".join(mine + ["localhost"]),
            # hygiene's own report of the slice lands beside the slice's records, not in a shared place.
            extravars=dict(extravars or {}, gpufleet_playbook=playbook, gpufleet_slice_dir=report, gpufleet_report_dir=report),
            envvars=envvars, quiet=True)
        started.append((number, mine, report, thread, runner))
    slices = []
    for number, mine, report, thread, runner in started:
        thread.join()
        slices.append({"number": number, "hosts": mine, "report": report, "status": runner.status, "rc": runner.rc})
    return slices


def merge(slices, out, report_dir, extravars=None, envvars=None):
    """Merge the slices' reports into report_dir; return the ansible-runner result."""
    import ansible_runner

    # No inventory: the merge runs on the implicit localhost alone.
    merge_vars = dict(extravars or {}, gpufleet_slice_reports=[s["report"] for s in slices],
                      gpufleet_slice_count=len(slices), gpufleet_report_dir=report_dir)
    return ansible_runner.run(
        private_data_dir=private_dir(out, "merge"), playbook=MERGE_PLAYBOOK, extravars=merge_vars,
        envvars=envvars, quiet=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-i", "--inventory", required=True)
    ap.add_argument("--slices", type=int, required=True)
    ap.add_argument("--playbook", choices=["preflight", "hygiene"], default="preflight")
    ap.add_argument("--out", required=True, help="the slices' runner directories and reports")
    ap.add_argument("--report-dir", help="the merged report (default: OUT/report)")
    ap.add_argument("-e", "--extra-var", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    if args.slices < 1:
        ap.error("--slices must be at least 1")
    extravars = dict(kv.split("=", 1) for kv in args.extra_var)
    slices = run_slices(args.inventory, args.slices, args.playbook, args.out, extravars)
    for s in slices:
        print("slice %d/%d: %d hosts, %s (rc %s)" % (s["number"], len(slices), len(s["hosts"]), s["status"], s["rc"]))
    merged = merge(slices, args.out, args.report_dir or os.path.join(args.out, "report"), extravars)
    print("merge: %s (rc %s)" % (merged.status, merged.rc))
    return 0 if merged.rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
