# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""common/_errors: one error tree (every exception class of the collection is a GpufleetError,
no two share a name), and the one wording of a number option out of its range."""

from __future__ import annotations

import importlib
import math
import os

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.common._errors import GpufleetError, check_range, out_of_range

PLUGINS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "..", "plugins")
PREFIX = "ansible_collections.gpufleet.hygiene.plugins"
# Outside the tree still, in a file changed with the node read; drop the entry once it is a GpufleetError.


def exception_classes():
    """{"<module>.<class>": class} of every exception class the collection's Python files define."""
    found = {}
    for top, dirs, files in os.walk(PLUGINS):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py") or name == "__init__.py":
                continue
            rel = os.path.relpath(os.path.join(top, name[:-3]), PLUGINS).replace(os.sep, ".")
            module = importlib.import_module(PREFIX + "." + rel)
            for value in vars(module).values():
                if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                    found[rel + "." + value.__name__] = value
    return found


def test_every_exception_class_of_the_collection_is_a_gpufleet_error():
    classes = exception_classes()
    # What the tree was missing: the NVML reader's error, a skipped file, the health read's failure.
    for known in ("module_utils.gpu._nvml.NvmlError", "module_utils.fs._files.Skipped", "module_utils.gpu._health._Failed",
                  "module_utils.common._hostlock.LockError", "module_utils.venv._lockfile.BaselineError"):
        assert known in classes
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, GpufleetError))
    assert outside == []


def test_no_two_exception_classes_share_a_name():
    by_name = {}
    for name, cls in exception_classes().items():
        by_name.setdefault(cls.__name__, []).append(name)
    assert [names for names in by_name.values() if len(names) > 1] == []


def test_an_nvml_error_carries_its_code_and_a_message():
    from ansible_collections.gpufleet.hygiene.plugins.module_utils.gpu._nvml import NvmlError

    exc = NvmlError(15, "nvmlDeviceGetCount_v2")
    assert exc.rc == 15 and exc.msg == str(exc) and exc.msg.startswith("nvmlDeviceGetCount_v2: ")
    assert exc.partial == {}


@pytest.mark.parametrize("args, problem", [
    (("command_timeout", 0.0), {"more_than": 0}),
    (("command_timeout", -1.5), {"more_than": 0}),
    (("stall_after", 0), {"least": 1}),
    (("max_parallel", -1), {"least": 0}),
    (("read_timeout", math.nan), {"more_than": 0}),
    (("since.offset", math.nan), {"least": 0}),
])
def test_out_of_range_has_one_wording(args, problem):
    name, value = args
    ((bound, low),) = problem.items()
    want = "%s must be %s %s (got %s)" % (name, "more than" if bound == "more_than" else "at least", low, value)
    assert out_of_range(name, value, **problem) == want
    with pytest.raises(GpufleetError) as exc:
        check_range(name, value, **problem)
    assert exc.value.msg == want


def test_at_most_is_the_upper_bound():
    assert out_of_range("min_fraction", 1.5, more_than=0, at_most=1) == "min_fraction must be at most 1 (got 1.5)"
    assert out_of_range("min_fraction", math.nan, at_most=1) == "min_fraction must be at most 1 (got nan)"
    assert out_of_range("min_fraction", 1, more_than=0, at_most=1) is None


@pytest.mark.parametrize("value, bounds", [(0.1, {"more_than": 0}), (0, {"least": 0}), (1, {"least": 1}), (5, {})])
def test_in_range_is_no_problem(value, bounds):
    assert out_of_range("x", value, **bounds) is None
    check_range("x", value, **bounds)
