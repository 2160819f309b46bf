#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_report
short_description: Write a fleet hygiene report as JSON, JUnit XML, Prometheus metrics and one HTML page
version_added: 0.1.0
author: gpufleet.hygiene maintainers (@gpufleet)
description:
  - Takes the per-host results of a hygiene run (the fact the C(verify) role sets on every host)
    and writes the report of the whole run into O(dest).
  - C(report.json) holds the whole run. C(report.junit.xml) has one test suite for the run and a
    test case per host and check; failed checks are failures with the check's summary as message,
    warnings pass with the summary in C(system-out), an unreachable host is an error.
  - C(gpufleet_hygiene.prom) is in the Prometheus text exposition format, for the node_exporter
    textfile collector (see O(prometheus_file)).
  - C(report.html) is one self-contained page (inline CSS, no external fetches) - the fleet as a
    matrix of hosts grouped by node against checks, each host's GPUs with memory used and holders,
    summary counts, and what needs attention. It is rendered from a Jinja2 template shipped with
    the collection.
  - An action that runs on the controller and writes the files there, whatever host the task runs
    for; it opens no connection. Run it once, with C(run_once=true).
  - Every host result is checked before any file is written (a record comes from a container's read
    or a slice's file, and is not trusted) - numbers are numbers, findings are dicts with a code,
    names and texts are bounded, and only the keys the reports know are kept. A record that fails
    is that host's C(unreadable record) row in every format (not ready, no check, its error naming
    the key and what is wrong, and the slice's file for a merged one) and a warning; the other
    hosts are reported as usual. Two records of one host fail the task.
  - A file is written only when its content differs from what is on disk, through a temporary
    file in the same directory and a rename, with mode C(0644).
extends_documentation_fragment:
  - gpufleet.hygiene.attributes
  - ansible.builtin.action_common_attributes.flow
attributes:
  action:
    support: full
    details:
      - The whole report is made and written on the controller; nothing runs on the task's host.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
    details:
      - Reports which files would be written (RV(files)); writes nothing, creates no directory.
  diff_mode:
    support: full
    details:
      - The text of each changed file before and after; for the HTML page only its size.
  idempotent:
    support: partial
    details:
      - With the same O(records) and O(run_started), a second run changes nothing.
      - Without O(run_started) the module stamps the report with the current time, so every
        call is a new run and reports a change. Pass the run's start time to make re-running the
        report task for the same run idempotent.
options:
  records:
    description:
      - One record per host, as the C(verify) role produces it (C(verify_record), P(gpufleet.hygiene.fleet_records#filter)). Keys - C(host) (str), C(node)
        (str or null), C(vmid) (int or null), C(ready), C(running_job), C(remediated) (bools),
        C(checks) (list of C(name), C(ok), C(severity) V(fail) or V(warn), C(summary)), C(gpus)
        (list of C(index), C(name), C(uuid), C(memory_used_mib), C(memory_total_mib),
        C(utilization_pct), C(processes) with C(pid), C(name), C(used_memory_mib)),
        C(contaminants) (C(name), C(version), C(cuda_major)), C(caches) (C(name), C(path),
        C(size_bytes), C(entries), C(fresh)), C(error) (str or null), C(repair_error) (str or null -
        what a repair that failed left, the repair role records it with C(repair_fail_on_error=false)).
      - The full schema is in the collection's C(docs/reports.md).
      - Required unless O(merge_from) is given; with it, these records are merged with the slices'.
      - Named O(hosts) before version 0.3.0; that name stays an alias for one release.
    type: list
    elements: dict
    aliases: [hosts]
    version_added: 0.3.0
  dest:
    description: Directory the report files are written to. Created when missing.
    type: path
    required: true
  formats:
    description: Which files to write.
    type: list
    elements: str
    choices: [json, junit, prometheus, html]
    default: [json, junit, prometheus, html]
  title:
    description: Title of the report (HTML heading, JUnit suite name, JSON C(title)).
    type: str
    default: GPU fleet hygiene
  run_started:
    description:
      - When the run started, in ISO 8601 (V(2025-06-01T03:00:00Z); no offset means UTC). It
        identifies the run - it is written into every file and into
        C(gpufleet_hygiene_last_run_timestamp_seconds).
      - Defaults to the current time, which makes every call a new run. The C(hygiene)
        playbook passes the play's start time.
    type: str
  prometheus_file:
    description:
      - Also write the metrics here, for example into the directory the node_exporter textfile
        collector reads (C(--collector.textfile.directory)). A directory gets
        C(gpufleet_hygiene.prom) inside it. The collector reads only files ending in C(.prom);
        the temporary file never does.
      - Requires V(prometheus) in O(formats).
    type: path
  merge_from:
    description:
      - The reports of the slices of one sliced run (AWX job slicing, or concurrent
        ansible-runner jobs each over a part of the inventory), merged into the report of the
        whole run - each a C(report.json) the module wrote for one slice, or the directory
        holding it.
      - Every host must be in exactly one slice (or in O(records)); a host reported twice fails
        the task and names both places. A file that is not a fleet report (not JSON, nesting
        arrays and objects more than 32 deep, another schema) fails the task and names the file.
      - The merged records are the slices' records unchanged, in the report's usual order, so
        the merged C(report.json) holds for every host what one unsliced run would have written.
      - Without O(run_started), the merged report takes the earliest of the slices' C(run_started).
    type: list
    elements: path
    version_added: 0.3.0
  merge_missing:
    description:
      - What a path of O(merge_from) that does not exist does (a slice that never finished).
      - V(fail) fails the task, naming every missing slice, and writes nothing.
      - V(warn) writes the report from the slices found and names the missing ones in a warning
        and in RV(slices).
    type: str
    choices: [fail, warn]
    default: fail
    version_added: 0.3.0
  run_kind:
    description:
      - What kind of run the report is of, which decides the counts on top of the page.
      - V(preflight) (a run that changes nothing) - ready, not ready, checks failed and warned.
      - V(remediate) and V(hygiene) (runs that repair) - ready, not ready, running jobs left alone, remediated
        this run.
      - Written into C(report.json) as C(run_kind).
    type: str
    choices: [preflight, remediate, hygiene]
    default: hygiene
    version_added: 0.3.0
  phases:
    description:
      - Earlier runs of the same incident, shown on the page side by side with this one - a table with a row per
        host and a column per phase (what preflight found, what remediate did), this run's verdict last.
      - Each phase is a C(report.json) this module wrote (a preflight's, for example) or its directory, or the file
        the C(gpufleet.hygiene.outcome) callback wrote for a repair run (its C(outcome_file)) - what that run did on
        each container, or under C(--check) would do.
      - Each file is read as untrusted input and checked as O(merge_from)'s are; one that is missing or is neither
        fails the task and names it. C(report.json) holds the phases under C(phases).
    type: list
    elements: dict
    version_added: 0.3.0
    suboptions:
      label:
        description: The phase's column heading, for example V(preflight found).
        type: str
        required: true
      path:
        description: The phase's C(report.json), its directory, or an outcome file.
        type: path
        required: true
notes:
  - The timestamp is the only value that differs between two runs over an unchanged fleet; that
    is deliberate - a new run is a change, and C(gpufleet_hygiene_last_run_timestamp_seconds) must
    move for staleness alerts to work.
seealso:
  - name: Reports (schema, formats, Prometheus set-up)
    description: docs/reports.md in the collection.
    link: https://example.invalid/gpufleet/hygiene/blob/main/docs/reports.md
"""

EXAMPLES = r"""
- name: Record when this run started (once, so every report file carries the same time)
  ansible.builtin.set_fact:
    hygiene_run_started: "{{ now(utc=true).strftime('%Y-%m-%dT%H:%M:%SZ') }}"
  run_once: true
  delegate_to: localhost
  delegate_facts: false

- name: Write the fleet report
  gpufleet.hygiene.fleet_report:
    records: "{{ ansible_play_hosts_all | map('extract', hostvars, 'verify_record') | select('defined') | selectattr('host', 'defined') | list }}"
    dest: /var/lib/gpufleet-hygiene/report
    title: Nightly GPU hygiene
    run_started: "{{ hygiene_run_started }}"
    prometheus_file: /var/lib/prometheus/node-exporter
  run_once: true
  register: report

- name: Merge the reports of a run sliced three ways into the report of the whole run
  gpufleet.hygiene.fleet_report:
    merge_from:
      - /srv/gpufleet/slices/1
      - /srv/gpufleet/slices/2
      - /srv/gpufleet/slices/3
    dest: /var/lib/gpufleet-hygiene/report
  run_once: true

- name: The incident on one page - what preflight found, what remediate did, the verdict now
  gpufleet.hygiene.fleet_report:
    records: "{{ records }}"
    dest: /var/lib/gpufleet-hygiene/report
    phases:
      - label: preflight found
        path: /var/lib/gpufleet-hygiene/incident/preflight
      - label: remediate did
        path: /var/lib/gpufleet-hygiene/incident/remediate.outcome.json
  run_once: true

- name: Only the metrics and the JUnit file, for CI
  gpufleet.hygiene.fleet_report:
    records: "{{ results }}"
    dest: "{{ playbook_dir }}/out"
    formats: [junit, prometheus]
  run_once: true
"""

RETURN = r"""
files:
  description: Every file of the report, whether it changed (in check mode, would change), and its size.
  returned: success
  type: list
  elements: dict
  contains:
    format:
      description: V(json), V(junit), V(prometheus) or V(html).
      type: str
    path:
      description: Where it is written.
      type: str
    changed:
      description: Its content differed from the file on disk (or there was none).
      type: bool
    size:
      description: Size in bytes.
      type: int
  sample:
    - {"format": "json", "path": "/var/lib/gpufleet-hygiene/report/report.json", "changed": true, "size": 18232}
summary:
  description: Counts over the run.
  returned: success
  type: dict
  contains:
    hosts:
      description: Hosts in the report.
      type: int
    ready:
      description: Hosts ready.
      type: int
    not_ready:
      description: Hosts not ready.
      type: int
    running_job:
      description: Hosts with a healthy running job, left alone.
      type: int
    remediated:
      description: Hosts this run changed.
      type: int
    error:
      description: Hosts unreachable or whose checks failed to run.
      type: int
    repair_failed:
      description: Hosts whose repair failed in this run (their C(repair_error)).
      type: int
      version_added: 0.3.0
    checks_failed:
      description: Failed checks (severity V(fail)) over all hosts.
      type: int
    checks_warned:
      description: Checks that warned over all hosts.
      type: int
    nodes:
      description: Proxmox nodes the hosts live on.
      type: int
    gpus:
      description: GPUs reported over all hosts.
      type: int
    contaminants:
      description: Contaminant packages over all hosts.
      type: int
  sample: {"hosts": 12, "ready": 9, "not_ready": 3, "running_job": 1, "remediated": 0, "error": 0,
           "repair_failed": 0, "checks_failed": 3, "checks_warned": 0, "nodes": 3, "gpus": 12, "contaminants": 4}
not_ready:
  description: Names of the hosts that are not ready, in report order.
  returned: success
  type: list
  elements: str
  sample: [ct-pve1-102, ct-pve2-201]
slices:
  description: With O(merge_from), each slice's report, whether it was found and how many hosts it held.
  returned: when O(merge_from) is given
  type: list
  elements: dict
  contains:
    path:
      description: The slice's C(report.json).
      type: str
    found:
      description: Whether it exists (V(false) only with O(merge_missing=warn)).
      type: bool
    hosts:
      description: Hosts it held.
      type: int
    run_started:
      description: The slice's own C(run_started), or null when it was not found.
      type: str
  sample:
    - {"path": "/srv/gpufleet/slices/1/report.json", "found": true, "hosts": 334, "run_started": "2025-06-01T03:00:00Z"}
run_started:
  description: The run's timestamp as written into the files (UTC, whole seconds).
  returned: success
  type: str
  sample: "2025-06-01T03:00:00Z"
"""
