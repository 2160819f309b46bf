# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The repair role's decision for one host's record (docs: repair_plan.yml): whether to repair it
and which steps it needs, in Python so that the role's tasks test a fact, not a template."""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError
from ansible.module_utils.parsing.convert_bool import boolean

# The checks that purging the venv and the compile caches can make pass.
PURGED = ("venv_clean", "caches_fresh", "packages")
# Where leftovers are stopped: on a host the role repairs, or beside a job left running too.
LEFTOVERS = ("repaired", "always")


def repair_plan(record, allow_running_job=False, repair_stalled=False, leftovers="repaired", keep_healthy_job=False,
                start_job=False):
    """{repair, start, left, purge, failed, gpu_errors, config_errors, stalled, leftovers, leftover_pids} of a verify_record: a
    host is repaired unless it is ready, the job's configuration is wrong (a repair could stop what it
    cannot start again: ``config_errors``, job_config's problems), its GPUs cannot be read (a node fault no
    step repairs, and a repair could not be checked), or a job runs on it and running jobs are allowed
    (never touched then) - unless that job is stalled (job_live) and repair_stalled is true. With
    ``keep_healthy_job`` (remediate: the inventory's job running on a clean environment is its desired
    state), a job that runs, makes progress at its floor and fails nothing else is left running too,
    whatever allow_running_job says. ``leftovers`` are the GPU holders whose job is gone that the repair
    stops, by PID and start time: on a host repaired, and with ``leftovers="always"`` beside a job left
    running too; ``leftover_pids`` is their scope.pids. With ``start_job`` (remediate, a job described
    with a command and the patterns that tell whether it runs), a host that is ready but whose job does
    not run is to have it started (``start``): nothing to repair, the job down is what differs from the
    desired state."""
    if not isinstance(record, Mapping) or "checks" not in record:
        raise AnsibleFilterError("repair_plan: expects a verify_record (with its checks)")
    flags = {}
    for name, value in (("allow_running_job", allow_running_job), ("repair_stalled", repair_stalled),
                        ("keep_healthy_job", keep_healthy_job), ("start_job", start_job)):
        try:
            flags[name] = boolean(value, strict=True)
        except TypeError:
            raise AnsibleFilterError("repair_plan: %s must be true or false, got %r" % (name, value)) from None
    if leftovers not in LEFTOVERS:
        raise AnsibleFilterError("repair_plan: leftovers must be one of %s, got %r" % (", ".join(LEFTOVERS), leftovers))
    checks = record["checks"]
    live = next((c for c in checks if c.get("name") == "job_live"), {})
    config = next((c for c in checks if c.get("name") == "job_config"), {})
    stalled = live.get("state") == "stalled"
    failed = [c["name"] for c in checks if not c["ok"]]
    gpu_errors = [c["summary"] for c in checks if c["name"] == "gpu_idle" and c.get("error")]
    config_errors = ["%s=%s %s" % (p.get("variable") or p.get("option"), p.get("value"), p.get("problem"))
                     for p in config.get("problems") or ()]
    # The job runs as described: at its pace, nothing else failing once its leftovers are stopped
    # beside it (job_live fails for them, gpu_idle for their memory).
    gpu = next((c for c in checks if c.get("name") == "gpu_idle"), {})
    left_pids = set(h.get("pid") for h in live.get("leftovers") or ())
    only_leftovers = {"job_live": not live.get("namespace_inits"),
                      "gpu_idle": not gpu.get("error") and bool(gpu.get("others")) and set(gpu.get("others")) <= left_pids}
    healthy = (bool(record.get("running_job")) and live.get("state") == "running" and not live.get("slow")
               and not live.get("error") and all(only_leftovers.get(name, False) for name in failed))
    if record.get("ready"):
        left = "ready"
    elif config_errors:
        left = "with a configuration error"
    elif gpu_errors:
        left = "with GPUs that cannot be read"
    elif flags["keep_healthy_job"] and healthy:
        left = "running its job, healthy"
    elif flags["allow_running_job"] and record.get("running_job") and not (stalled and flags["repair_stalled"]):
        left = "running a stalled job" if stalled else "running a job"
    else:
        left = None
    beside = ("running a job", "running a stalled job", "running its job, healthy")
    stop = left is None or (leftovers == "always" and left in beside)
    found = list(live.get("leftovers") or []) if stop else []
    start = flags["start_job"] and left == "ready" and not record.get("running_job")
    return {"repair": left is None, "start": start, "left": "ready, its job not running" if start else left,
            "purge": any(name in PURGED for name in failed),
            "failed": failed, "gpu_errors": gpu_errors, "config_errors": config_errors, "stalled": stalled,
            "leftovers": found, "leftover_pids": [{"pid": h["pid"], "start_time": h["start_time"]} for h in found]}


class FilterModule(object):
    def filters(self):
        return {"repair_plan": repair_plan}
