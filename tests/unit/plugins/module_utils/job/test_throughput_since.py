# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""job/_throughput, the gate's ``since`` where it matters: while the new run is still writing.

A log that already holds more of the old run's readings than the gate's window, a new run that
has written only its first lines when the gate starts and writes the rest while the gate waits
(each wait of the gate appends the next line, as the job would). Judged from the launch, the
gate waits for the new run's readings; judged from the log's end, it would take the old run's
readings at once. Once the new run has written all its lines the two agree, which is why a test
that appends the whole run before the gate reads cannot tell them apart."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError
from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import Gate

OLD_SLOW = ["step %d loss 1.0 12800 tok/s\n" % i for i in range(20)]
OLD_GOOD = ["step %d loss 1.0 20000 tok/s\n" % i for i in range(20)]
COMPILE = ["compile start\n", "compiled in 5 s\n"]


def _new_run(rate):
    """Two compile lines, three warm-up readings at a quarter of rate, then rate."""
    return COMPILE + ["step %d loss 1.0 %g tok/s\n" % (i, rate / 4 if i < 3 else rate) for i in range(12)]


def _gate_while_writing(tmp_path, old, new, written_at_start=3):
    log = tmp_path / "train.log"
    log.write_text("".join(old))
    since = {"inode": os.stat(log).st_ino, "offset": os.path.getsize(log)}
    pending = list(new)
    with open(log, "a") as f:
        f.write("".join(pending[:written_at_start]))
    del pending[:written_at_start]
    now = [0.0]

    def sleep(seconds):  # the job writes its next line while the gate waits
        now[0] += seconds
        if pending:
            with open(log, "a") as f:
                f.write(pending.pop(0))

    gate = Gate(str(log), samples=5, skip=3, wait=60, baseline=20000, since=since)
    return gate, sleep, lambda: now[0]


def test_a_healthy_run_over_slow_old_readings_is_judged_on_its_own_readings(tmp_path):
    gate, sleep, clock = _gate_while_writing(tmp_path, OLD_SLOW, _new_run(20000))
    result = gate.run(sleep=sleep, clock=clock)
    assert result["passed"] is True and result["readings"] == [20000.0] * 5
    assert result["read_from"]["from"] == "launch" and result["waited"] > 0


def test_a_slow_run_appended_after_good_old_readings_fails(tmp_path):
    gate, sleep, clock = _gate_while_writing(tmp_path, OLD_GOOD, _new_run(12800))
    with pytest.raises(GpufleetError, match=r"throughput 12800 tok/s \(median of 5\) is below the floor of 18000") as err:
        gate.run(sleep=sleep, clock=clock)
    # The failed gate's result, as the module reports it: nothing was changed.
    assert err.value.partial["changed"] is False and err.value.partial["passed"] is False
    assert err.value.partial["readings"] == [12800.0] * 5 and err.value.partial["floor"] == 18000


@pytest.mark.parametrize("delta", [-1, 1], ids=["older_inode_number", "newer_inode_number"])
def test_a_log_rotated_since_the_launch_is_read_from_its_start_whichever_its_new_inode(tmp_path, delta):
    log = tmp_path / "train.log"
    log.write_text("".join("step %d loss 1.0 20000 tok/s\n" % i for i in range(5)))
    st = os.stat(log)
    # The launch saw another file (inode differs either way) at this same size: all of it is the new run's.
    result = Gate(str(log), samples=5, since={"inode": st.st_ino + delta, "offset": st.st_size}).run()
    assert result["read_from"] == {"offset": 0, "inode": st.st_ino, "from": "rotated"} and result["readings"] == [20000.0] * 5


def test_a_pattern_whose_first_group_is_the_value_reads_that_group(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join("it %d | speed (%d) tokens per second\n" % (i, 20000 + i) for i in range(5)))
    result = Gate(str(log), pattern=r"speed \((\d+)\) tokens", samples=5).run()
    assert result["readings"] == [20000.0, 20001.0, 20002.0, 20003.0, 20004.0]


def test_units_k_either_case_and_m_scale_the_reading(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("a 19.5k tok/s\nb 20.5K tok/s\nc 0.02M tokens/s\nd 20000 tok/s\n")
    assert Gate(str(log), samples=4).run()["readings"] == [19500.0, 20500.0, 20000.0, 20000.0]


def test_a_match_whose_value_group_is_empty_is_no_reading(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("step 1 20000 tok/s\nstep 2 idle\nstep 3 20001 tok/s\n")
    result = Gate(str(log), pattern=r"(?:(?P<value>\d+) tok/s|idle)", samples=2).run()
    assert result["readings"] == [20000.0, 20001.0]


def test_a_log_that_cannot_be_read_names_it_and_the_reason(tmp_path, monkeypatch):
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _tail

    log = tmp_path / "train.log"
    log.write_text("step 1 | 20000 tok/s\n")

    def broken(*_args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_tail.os, "pread", broken)
    with pytest.raises(GpufleetError, match=r"^cannot read log \S+train\.log: \S+train\.log cannot be read: Input/output error; "):
        Gate(str(log), samples=1).run()


def test_a_unit_group_that_matched_empty_leaves_the_reading_unscaled(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("speed 20000 tok/s\nspeed 20.5K tok/s\n")
    result = Gate(str(log), pattern=r"speed (?P<value>[\d.]+)(?P<unit>[kKM]?) tok/s", samples=2).run()
    assert result["readings"] == [20000.0, 20500.0]


def test_waited_is_the_time_since_the_gate_started_to_the_hundredth(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(OLD_GOOD))
    times = iter([1000.0, 1001.23456])  # a monotonic clock does not start at 0
    result = Gate(str(log), samples=5, baseline=20000).run(sleep=None, clock=lambda: next(times))
    assert result["waited"] == 1.23 and result["passed"] is True


def test_the_gate_s_defaults_are_the_module_s_documented_ones():
    """module_utils' Gate is called with every option by the module; its own defaults (what a
    caller of the Gate gets) are the module's documented ones, not a second table."""
    import inspect

    import yaml

    from ansible_collections.gpufleet.hygiene.plugins.doc_fragments import progress
    from ansible_collections.gpufleet.hygiene.plugins.modules import throughput

    options = yaml.safe_load(throughput.DOCUMENTATION)["options"]
    assert "gpufleet.hygiene.progress" in yaml.safe_load(throughput.DOCUMENTATION)["extends_documentation_fragment"]
    options.update(yaml.safe_load(progress.ModuleDocFragment.DOCUMENTATION)["options"])
    params = inspect.signature(Gate).parameters
    assert set(params) == set(options)
    for name, param in params.items():
        if name != "log":
            assert param.default == options[name].get("default"), name


@pytest.mark.parametrize("option, value", [
    ("samples", 0), ("skip", -1), ("wait", -1), ("baseline", 0), ("min_fraction", 0), ("min_fraction", 1.01),
])
def test_an_option_out_of_its_range_is_refused_by_name(tmp_path, option, value):
    kwargs = {"baseline": 20000} if option == "min_fraction" else {}
    kwargs[option] = value
    with pytest.raises(GpufleetError) as err:
        Gate(str(tmp_path / "train.log"), **kwargs)
    assert err.value.msg.startswith(option) and str(value) in err.value.msg, err.value.msg


def test_a_window_of_hundreds_of_samples_is_judged(tmp_path):
    """The window's size against samples by value (a count above 256 is no cached small int)."""
    log = tmp_path / "train.log"
    log.write_text("".join("step %d loss 1.0 20000 tok/s\n" % i for i in range(300)))
    result = Gate(str(log), samples=300, baseline=20000).run()
    assert len(result["readings"]) == 300 and result["passed"] is True


def test_a_unit_the_table_does_not_know_reads_the_number_as_it_is():
    import re

    from ansible_collections.gpufleet.hygiene.plugins.module_utils.job._throughput import readings

    regex = re.compile(r"(?P<value>\d+) (?P<unit>[A-Za-z]?)tok/s")
    assert readings("a 20000 Gtok/s b 3 ktok/s c 7 tok/s", regex) == [20000.0, 3000.0, 7.0]


def test_a_gate_without_min_value_or_baseline_has_a_floor_of_zero(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(OLD_SLOW))
    result = Gate(str(log), samples=5).run()
    assert result["floor"] == 0.0 and result["passed"] is True and result["median"] == 12800.0


def test_the_gate_stops_waiting_as_soon_as_it_has_exactly_its_readings(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("".join(OLD_GOOD[:7]))  # skip 2 + samples 5, not one more

    def sleep(seconds):
        raise AssertionError("the gate waited with its readings in hand")
    result = Gate(str(log), samples=5, skip=2, wait=60, baseline=20000).run(sleep=sleep, clock=lambda: 5.0)
    assert result["passed"] is True and result["waited"] == 0.0 and len(result["readings"]) == 5
