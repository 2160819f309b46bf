# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""venv/_names: canonical_name, the PEP 503 normal form the dist-info and lock-file readers key
packages by, on the names PEP 503's and packaging's own examples give and against
packaging.utils.canonicalize_name (the reference it copies, a controller-side test dependency)
over generated names."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from packaging.utils import canonicalize_name

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv import _names


@pytest.mark.parametrize("name, want", [
    # packaging's docstring examples
    ("Django", "django"),
    ("oslo.concurrency", "oslo-concurrency"),
    ("requests", "requests"),
    # PEP 503: runs of -, _ and . become one -
    ("friendly-bard", "friendly-bard"),
    ("Friendly-Bard", "friendly-bard"),
    ("FRIENDLY-BARD", "friendly-bard"),
    ("friendly.bard", "friendly-bard"),
    ("friendly_bard", "friendly-bard"),
    ("friendly--bard", "friendly-bard"),
    ("FrIeNdLy-._.-bArD", "friendly-bard"),
    # names this collection meets
    ("flashinfer_python", "flashinfer-python"),
    ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu12"),
    ("zope.interface", "zope-interface"),
    ("Torch", "torch"),
    ("typing_extensions", "typing-extensions"),
    ("ruamel.yaml.clib", "ruamel-yaml-clib"),
])
def test_pep_503_examples(name, want):
    assert _names.canonical_name(name) == want


@pytest.mark.parametrize("name, want", [
    ("a" + "-_." * 10 + "b", "a-b"),  # a long run of mixed separators is one -
    ("a___b", "a-b"),
    ("a...b", "a-b"),
    ("a-----b", "a-b"),  # an odd-length run of - (not halved to -- by one pass)
    ("_leading", "-leading"),  # edges are not stripped: only runs are folded
    ("trailing.", "trailing-"),
    ("-._", "-"),
    ("", ""),
    ("a b", "a b"),  # white space is no separator
])
def test_separator_runs_fold_to_one_dash_and_nothing_else_changes(name, want):
    assert _names.canonical_name(name) == want


def test_the_result_is_a_fixed_point():
    for name in ("Foo__Bar..baz", "X-_-y", "oslo.concurrency", "A"):
        once = _names.canonical_name(name)
        assert _names.canonical_name(once) == once


def test_names_that_differ_only_in_separators_and_case_share_one_key():
    spellings = ["Flash_Infer.Python", "flash-infer-python", "FLASH.INFER_PYTHON", "flash__infer--python"]
    assert {_names.canonical_name(s) for s in spellings} == {"flash-infer-python"}
    assert _names.canonical_name("flashinfer-python") != _names.canonical_name("flash-infer-python")


# Project names as PEP 508 allows them (letters, digits, and -_. inside), and names with
# runs and edges of separators that real metadata should not have but a reader may meet.
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
_NAMEISH = st.text(alphabet=_ALNUM + "-_.", min_size=1, max_size=40)


@settings(max_examples=200, deadline=None)
@given(_NAMEISH)
@example("A.-_b")
@example("a--_--b")
def test_same_as_packaging_on_name_like_strings(name):
    assert _names.canonical_name(name) == canonicalize_name(name)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
@example("İ-Straße")  # lower() lengthens it: U+0130 becomes i + U+0307
@example("ΣΑΣ.x")
def test_same_as_packaging_on_any_text(name):
    assert _names.canonical_name(name) == canonicalize_name(name)


@settings(max_examples=200, deadline=None)
@given(_NAMEISH)
def test_the_result_has_no_upper_case_nor_separator_but_single_dashes(name):
    out = _names.canonical_name(name)
    assert out == out.lower()
    assert "_" not in out and "." not in out and "--" not in out
    assert out.replace("-", "") == name.lower().replace("-", "").replace("_", "").replace(".", "")
