# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""fleet_report's action: the whole report is made and written on the controller.

The HTML page is rendered with Jinja2, which only the controller has; the other formats are
written beside it. There is no module to send: plugins/modules/fleet_report.py holds the
documentation only, as ansible.builtin.template's does.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._merge import earliest_start, merge_slices
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._phases import load_phases
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._report import FORMATS, FleetReport
from ansible_collections.gpufleet.hygiene.plugins.plugin_utils.report._run import RUN_KINDS

ARGUMENT_SPEC = dict(
    # records: the one name of a host's record (hosts, its name before 0.3.0, an alias for one release).
    records=dict(type="list", elements="dict", aliases=["hosts"]),
    dest=dict(type="path", required=True),
    formats=dict(type="list", elements="str", choices=list(FORMATS), default=list(FORMATS)),
    title=dict(type="str", default="GPU fleet hygiene"),
    run_started=dict(type="str"),
    prometheus_file=dict(type="path"),
    merge_from=dict(type="list", elements="path"),
    merge_missing=dict(type="str", choices=["fail", "warn"], default="fail"),
    run_kind=dict(type="str", choices=list(RUN_KINDS), default="hygiene"),
    phases=dict(type="list", elements="dict", options=dict(label=dict(type="str", required=True), path=dict(type="path", required=True))),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # The files are written on the controller: the task's host is never contacted.
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _validation, p = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC, required_one_of=[["records", "merge_from"]])
        hosts, run_started, merged, origins = p["records"] or [], p["run_started"], [], None
        try:
            if p["merge_from"] is not None:
                origins = []
                hosts, slices, merged = merge_slices(p["merge_from"], hosts, missing=p["merge_missing"], origins=origins)
                result["slices"] = slices
                run_started = run_started or earliest_start(slices)
            phases = load_phases(p["phases"]) if p["phases"] else None
            report = FleetReport(hosts, p["dest"], formats=p["formats"], title=p["title"], run_started=run_started,
                                 prometheus_file=p["prometheus_file"], check_mode=self._task.check_mode, origins=origins,
                                 run_kind=p["run_kind"], phases=phases)
            result.update(report.apply())
        except GpufleetError as exc:
            result.update(failed=True, msg=exc.msg)
            return result
        diff = result.pop("diff")
        if self._task.diff and diff:
            result["diff"] = diff
        if merged or report.warnings:
            result["warnings"] = merged + report.warnings
        return result
