# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The readiness options: the one table every copy of them is made from.

Each row is one option of the readiness read (the readiness module, and node_readiness for each
container): its name, type and default; the verify role's variable that gives it and the
inventory variable that variable defaults to; when the role gives it; and its description,
written once. From this table come:

* the argument spec the read validates with (``argument_spec()``: readiness, node_readiness,
  gpu_state's GPU options);
* the doc fragments ``gpufleet.hygiene.readiness_options`` and ``gpufleet.hygiene.gpu_read``;
* the verify role's ``defaults/main.yml`` block, the ``read`` entry point's options in
  ``meta/argument_specs.yml`` and ``verify__readiness_args`` in ``vars/main.yml``;
* the relaunch role's ``relaunch__readiness_args`` in its ``vars/main.yml``, the options of its
  check of the libraries the new run maps (``tasks/confirm.yml``);
* the options a node gives each container it reads (plugins/filter/verify.py).

The files are written by ``scripts/readiness_options.py`` and checked by its ``--check`` (part
of ``make lint`` and of the unit tests): change a row here, run the script, commit both.

``given``: when the role passes the option to the read. ``always``: with its value, whatever it
is; ``set``: only when not empty (so that the read's own default applies); ``positive``: only
above 0. An option without ``role`` is the module's alone.

``relaunch``: the relaunch role's variable that gives the option to its libraries check, given
as ``given`` says (as the verify role gives it); the options that check fixes whatever the
variables say (``allow_running_job``, ``caches``, ``job_libraries``) are written in its task. Any
other option is not given by the relaunch role: the read's default applies.

Each number option's range (``least``, ``more_than``) is in its row too: ``bad_option()`` checks
every one, on the target (the read) and on the controller (the fleet plan's checks), which import
this table and not the read's code.

Standard library only: it travels with readiness/_readiness.py. Private to gpufleet.hygiene
(leading underscore): not a public API.
"""

from __future__ import annotations

from collections import namedtuple

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import out_of_range

_FIELDS = ("name", "type", "elements", "default", "role", "inventory", "given", "relaunch", "version_added", "group",
           "no_log", "least", "more_than", "description")
_NONE = object()


class Option(namedtuple("Option", _FIELDS)):
    """One readiness option (see the module's docstring)."""

    __slots__ = ()

    def __new__(cls, name, type, elements=None, default=_NONE, role=None, inventory=None, given=None, relaunch=None,
                version_added=None, group="readiness", no_log=None, least=None, more_than=None, description=()):
        return super(Option, cls).__new__(cls, name, type, elements, default, role, inventory, given, relaunch,
                                          version_added, group, no_log, least, more_than, tuple(description))

    @property
    def has_default(self):
        return self.default is not _NONE

    def out_of_range(self, value):
        """What is wrong with ``value`` (a validated value of this option) against its range, or
        None; no value (None) is in range."""
        if value is None:
            return None
        return out_of_range(self.name, value, least=self.least, more_than=self.more_than)

    def spec(self):
        """This option's entry of an AnsibleModule argument spec."""
        out = {"type": self.type}
        if self.elements:
            out["elements"] = self.elements
        if self.has_default:
            out["default"] = list(self.default) if isinstance(self.default, list) else self.default
        if self.no_log is not None:
            out["no_log"] = self.no_log
        return out


OPTIONS = (
    Option(
        "job_patterns", "list", elements="str", default=[],
        role="verify_job_patterns", inventory="gpufleet_job.patterns", given="always",
        relaunch="relaunch_patterns",
        description=(
            ("Python regular expressions searched in the command line of the training job's processes "
             "(M(gpufleet.hygiene.processes) O(gpufleet.hygiene.processes#module:scope.cmdline))."),
            "When empty the processes are not read (RV(processes) is skipped).",
        ),
    ),
    Option(
        "job_users", "list", elements="str", default=[],
        role="verify_job_users", inventory="gpufleet_job.users", given="always",
        relaunch="relaunch_users",
        description=(
            ("The job's users, to narrow O(job_patterns) (M(gpufleet.hygiene.processes) "
             "O(gpufleet.hygiene.processes#module:scope.users))."),
            ("GPU holders left by a job that is gone (C(job_live)'s C(leftovers)) are only ever processes of these "
             "users and of the owners of the job's processes (or of O(leftover_users)); another user's process never "
             "is."),
        ),
    ),
    Option(
        "leftover_users", "list", elements="str", default=[],
        role="verify_leftover_users", inventory="gpufleet_job.leftover_users", given="set",
        version_added="0.3.0",
        description=(
            ("Whose GPU holders may be C(job_live)'s C(leftovers) (user names or uids), instead of O(job_users) and "
             "the owners of the job's processes. With none of these known (no job running, no O(job_users)), no holder "
             "is a leftover. See docs/checks.md."),
        ),
    ),
    Option(
        "require_gpu", "bool", default=True,
        role="verify_require_gpu", inventory="gpufleet_require_gpu", given="always",
        relaunch="relaunch_require_gpu",
        group="gpu_read",
        description=(
            ("When V(false), a host without a usable GPU (no nvidia-smi, no devices, the driver not loaded, NVML "
             "missing) passes with C(gpu_available=false) instead of failing, so one preflight runs on CPU hosts too. "
             "A GPU fallen off the bus or a hanging nvidia-smi still fails."),
        ),
    ),
    Option(
        "threshold_mib", "int", default=64,
        role="verify_threshold_mib", inventory=None, given="always",
        group="gpu_read",
        description=(
            "A GPU is idle when its memory used is at most this many MiB and no process holds it.",
        ),
    ),
    Option(
        "nvidia_smi", "path",
        role="verify_nvidia_smi", inventory="gpufleet_nvidia_smi", given="set",
        relaunch="relaunch_nvidia_smi",
        group="gpu_read",
        description=(
            "Path of nvidia-smi. Searched on C(PATH) (and the usual sbin directories) when unset.",
        ),
    ),
    Option(
        "command_timeout", "float", default=15, more_than=0,
        role="verify_nvidia_smi_timeout", inventory="gpufleet_nvidia_smi_timeout", given="always",
        relaunch="relaunch_nvidia_smi_timeout",
        group="gpu_read",
        description=(
            ("Seconds one nvidia-smi call may take before it is killed and the module fails (a GPU or driver in "
             "trouble can make nvidia-smi hang)."),
        ),
    ),
    Option(
        "device_patterns", "list", elements="str", default=["/dev/nvidia*"],
        role="verify_gpu_device_patterns", inventory="gpufleet_gpu_device_patterns", given="set",
        relaunch="relaunch_gpu_device_patterns",
        group="gpu_read",
        description=(
            ("Shell patterns of the device files whose open handles make a process a holder (in a container). A file "
             "whose name ends in C(nvidia<N>) belongs to the GPU with device minor N (from "
             "C(/proc/driver/nvidia/gpus/*/information), else index N)."),
        ),
    ),
    Option(
        "venv", "path",
        role="verify_venv", inventory="gpufleet_venv", given="set",
        relaunch="relaunch_venv",
        description=(
            ("The training venv. When unset, the venv, its packages and its caches are not read "
             "(RV(cuda_contamination), RV(pip_inventory) and RV(torch_cache) are skipped)."),
        ),
    ),
    Option(
        "expected_cuda", "str",
        role="verify_expected_cuda", inventory="gpufleet_expected_cuda", given="set",
        relaunch="relaunch_expected_cuda",
        description=(
            "As M(gpufleet.hygiene.cuda_contamination) O(gpufleet.hygiene.cuda_contamination#module:expected_cuda).",
        ),
    ),
    Option(
        "baseline", "path",
        role="verify_baseline", inventory="gpufleet_baseline", given="set",
        description=(
            ("A requirements/lock file to compare the venv's packages with (M(gpufleet.hygiene.pip_inventory) "
             "O(gpufleet.hygiene.pip_inventory#module:baseline))."),
            "The packages are read only when O(baseline) is given or O(verify_files=true).",
        ),
    ),
    Option(
        "verify_files", "bool", default=False,
        role="verify_files", inventory=None, given="always",
        description=(
            "As M(gpufleet.hygiene.pip_inventory) O(gpufleet.hygiene.pip_inventory#module:verify_files).",
        ),
    ),
    Option(
        "caches", "bool", default=True,
        role="verify_caches", inventory=None, given="always",
        description=(
            "Read the compile caches and their fingerprints (M(gpufleet.hygiene.torch_cache) with V(state=present)).",
        ),
    ),
    Option(
        "cache_user", "str",
        role="verify_cache_user", inventory="gpufleet_job.user", given="set",
        description=(
            "As M(gpufleet.hygiene.torch_cache) O(gpufleet.hygiene.torch_cache#module:user).",
        ),
    ),
    Option(
        "cache_environment", "dict",
        role="verify_cache_environment", inventory="gpufleet_job.env", given="set",
        description=(
            "As M(gpufleet.hygiene.torch_cache) O(gpufleet.hygiene.torch_cache#module:environment).",
        ),
    ),
    Option(
        "allow_running_job", "bool", default=False,
        role="verify_allow_running_job", inventory=None, given="always",
        description=(
            ("When V(true), GPUs held only by the job's own processes (O(job_patterns)) pass the C(gpu_idle) check, "
             "e.g. right after the job was relaunched. When V(false), any holder fails it."),
        ),
    ),
    Option(
        "job_log", "path",
        role="verify_job_log", inventory="gpufleet_job.log", given="set",
        version_added="0.2.0",
        description=(
            ("The job's log (what the job appends its output to, C(gpufleet_job.log)). A job whose processes match "
             "O(job_patterns) but whose log has not grown for O(stall_after) seconds is stalled (the C(job_live) check "
             "fails)."),
            "Without it, a job is stalled when every GPU it holds shows 0% utilisation.",
        ),
    ),
    Option(
        "job_workdir", "path",
        role="verify_job_workdir", inventory="gpufleet_job.workdir", given="set",
        version_added="0.3.0",
        description=(
            ("The directory the job is launched in (C(gpufleet_job.workdir)). One that is not a directory of the host "
             "fails the C(job_config) check: the job could not be launched there, and a repair stops nothing."),
        ),
    ),
    Option(
        "job_command", "list", elements="str", default=[],
        role="verify_job_command", inventory="gpufleet_job.command", given="set",
        version_added="0.3.0",
        description=(
            ("The job's command (C(gpufleet_job.command)). Its program, given by an absolute path or one relative to "
             "O(job_workdir), must be a file of the host that may be run, or the C(job_config) check fails; a bare name "
             "is left to the launch's C(PATH)."),
        ),
    ),
    Option(
        "stall_after", "int", default=900, least=1,
        role="verify_stall_after", inventory="gpufleet_stall_after", given="always",
        version_added="0.2.0",
        description=(
            ("Seconds without the log growing after which a job counts as stalled. Raise it for a job that logs less "
             "often, or whose compile phase is longer."),
        ),
    ),
    Option(
        "job_throughput_pattern", "str",
        role="verify_job_throughput_pattern", inventory="gpufleet_job.throughput_regex", given="set",
        version_added="0.3.0",
        description=(
            ("Regular expression reading the job's throughput from O(job_log), as M(gpufleet.hygiene.throughput)'s "
             "O(gpufleet.hygiene.throughput#module:pattern) (a group named C(value), an optional C(unit) K or M); that "
             "module's default when left out."),
            ("The last reading in the log's end is reported in the C(job_live) check's C(throughput); it does not "
             "change the check's verdict."),
        ),
    ),
    Option(
        "job_baseline_tokens_per_s", "float", no_log=False, least=0,
        role="verify_job_baseline_tokens_per_s", inventory="gpufleet_job.baseline_tokens_per_s", given="positive",
        version_added="0.3.0",
        description=(
            ("The job's recorded good throughput (C(gpufleet_job.baseline_tokens_per_s)), reported beside the last "
             "reading with their ratio. V(0) or left out, none."),
        ),
    ),
    Option(
        "strict_baseline", "bool", default=False,
        role="verify_strict_baseline", inventory="gpufleet_strict_baseline", given="always",
        description=(
            ("When V(true), packages installed beyond O(baseline) (the drift's C(extra), such as a leftover C(sglang) "
             "or C(flashinfer-python)) fail the C(packages) check, so the venv must match the baseline exactly. The "
             "installer's own tools (C(pip), C(setuptools), C(wheel)), which C(pip freeze) leaves out, are never "
             "extra."),
            ("When V(false), only packages missing from the venv or at another version than the baseline fail it; the "
             "extra ones are counted in its summary."),
        ),
    ),
    Option(
        "read_timeout", "float", default=120, more_than=0,
        version_added="0.2.0",
        description=(
            ("Seconds all the reads together may take on the target. A read still running then (a stalled file system "
             "under the venv, a hung driver) is reported failed with C(msg) naming this option and is left behind; the "
             "others' results are kept, and the module returns."),
            ("Each file of the venv is read with its own bound besides (a FIFO, a device or a symbolic link is not "
             "read at all, see docs/contamination.md); this one bounds the whole reading."),
        ),
    ),
    Option(
        "evidence_cache", "raw", default=True,
        version_added="0.3.0",
        description=(
            "As M(gpufleet.hygiene.cuda_contamination) O(gpufleet.hygiene.cuda_contamination#module:evidence_cache).",
        ),
    ),
    Option(
        "gpu_health", "bool", default=False,
        role="verify_gpu_health", inventory="gpufleet_gpu_health", given="always",
        version_added="0.3.0",
        description=(
            ("Also read the GPUs' health (uncorrectable ECC errors, pending or failed row remapping and page "
             "retirement, clock slowdowns, PCIe link, persistence mode, MIG, the driver against O(gpu_driver_pin)) and "
             "judge it in the C(gpu_healthy) check (see docs/gpu_health.md). The cheap read - NVML through "
             "C(libnvidia-ml.so.1), else one C(nvidia-smi --query-gpu) run beside the other reads; the kernel log and "
             "C(nvidia-smi -q -x) are M(gpufleet.hygiene.gpu_health)'s, not read here."),
            "Off by default - where NVML cannot be loaded it costs one more nvidia-smi run per container.",
        ),
    ),
    Option(
        "gpu_driver_pin", "str",
        role="verify_gpu_driver_pin", inventory="gpufleet_gpu_driver_pin", given="set",
        version_added="0.3.0",
        description=(
            ("The driver version the fleet pins (V(580.159.04), or a prefix such as V(580)); with O(gpu_health), "
             "another version fails C(gpu_healthy) with the finding C(driver_pin_mismatch)."),
        ),
    ),
    Option(
        "job_libraries", "bool", default=True,
        role="verify_job_libraries", inventory="gpufleet_job_libraries", given="always",
        version_added="0.3.0",
        description=(
            ("Read the CUDA libraries the job's processes (O(job_patterns)) and every GPU holder have mapped "
             "(C(/proc/<pid>/maps)) and judge them in the C(job_libraries) check - a library of another CUDA major "
             "than the venv's reference (torch's, or O(expected_cuda)), one mapped from outside O(venv) where the venv "
             "ships that library, or one deleted under the running job fails it (docs/checks.md)."),
            ("Needs O(venv) and O(job_patterns); read after the others, within what is left of O(read_timeout). A maps "
             "read and the DT_NEEDED of the libraries it names cost milliseconds per process."),
        ),
    ),
)

BY_NAME = dict((o.name, o) for o in OPTIONS)


def argument_spec(group=None):
    """The argument spec of every option (of ``group`` alone: ``gpu_read``, ``readiness``)."""
    return dict((o.name, o.spec()) for o in OPTIONS if group is None or o.group == group)


# The readiness module's options (node_readiness takes the same, per container).
ARGUMENT_SPEC = argument_spec()

# The readiness module's own options on top of those (node_readiness has its own, for all its containers).
BRIEF_OPTION = dict(type="bool", default=False)
# Whose reading it is: the result is then the verify role's record of it (_record.record()).
RECORD_OPTION = dict(type="dict", options=dict(host=dict(type="str", required=True), node=dict(type="raw"), vmid=dict(type="raw")))


def value(p, name):
    """Option ``name`` as ``p`` gives it (options as given, validated or not), or when it gives
    none (left out, or None) the table's default: no caller restates a default."""
    given = p.get(name)
    if given is None and BY_NAME[name].has_default:
        return BY_NAME[name].default
    return given


def bad_option(p):
    """What is wrong with validated options (``p``: name -> value), the first value out of its
    range in the table, or None. The controller's checks (the fleet plan) and the read itself both
    ask this: a range is written once, in its row."""
    for option in OPTIONS:
        if option.least is not None or option.more_than is not None:
            problem = option.out_of_range(p.get(option.name))
            if problem:
                return problem
    return None


def role_options():
    """The options the verify role gives the read, in the table's order."""
    return tuple(o for o in OPTIONS if o.role)


def relaunch_options():
    """The options the relaunch role's variables give its libraries check, in the table's order."""
    return tuple(o for o in OPTIONS if o.relaunch)
