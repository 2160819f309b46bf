# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""proxmox/_tags, a container's `tags` as Proxmox VE reads and keeps them: the split on `;`, `,`
and white space (PVE::Tools::split_list), the pve-tag format ([a-z0-9_][a-z0-9_-+.]*, any case),
the default list (lower-cased, sorted, once each: PVE::GuestHelpers::get_unique_tags), the merge
the pve_tags module writes, and the `pct set` argv that writes it or drops the key."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proxmox import _tags

# ----------------------------------------------------------------------------- split


@pytest.mark.parametrize("text, want", [
    ("gpufleet-ok;team-a", ["gpufleet-ok", "team-a"]),  # as pct config writes it
    ("gpufleet-ok,team-a", ["gpufleet-ok", "team-a"]),
    ("gpufleet-ok team-a", ["gpufleet-ok", "team-a"]),
    ("gpufleet-ok\tteam-a\nx", ["gpufleet-ok", "team-a", "x"]),
    (" ;a ;; b,,c ,\t; d; ", ["a", "b", "c", "d"]),  # runs of separators and separators at the edges
    ("single", ["single"]),
])
def test_split_on_semicolons_commas_and_white_space(text, want):
    assert _tags.split(text) == want


@pytest.mark.parametrize("text", ["", None, ";", " ; , \t\n"])
def test_split_of_nothing_is_an_empty_list(text):
    assert _tags.split(text) == []


def test_split_keeps_order_case_and_repeats_as_written():
    assert _tags.split("Team-B;gpufleet-OK;team-b;Team-B") == ["Team-B", "gpufleet-OK", "team-b", "Team-B"]


def test_split_leaves_other_characters_inside_a_tag():
    # Only ; , and white space separate: what else is there is the tag's, for bad() to judge.
    assert _tags.split("a|b;c/d;e:f") == ["a|b", "c/d", "e:f"]


# ----------------------------------------------------------------------------- bad


@pytest.mark.parametrize("tag", [
    "gpufleet-ok", "gpufleet-dirty", "gpufleet-unhealthy", "team_a", "_private", "0", "9lives",
    "a+b", "v1.2.3", "a-", "a.", "a+", "ABC", "Team-A", "x" * 200,
])
def test_pve_tag_format_is_accepted(tag):
    assert _tags.bad([tag]) is None


@pytest.mark.parametrize("tag", [
    "-x", "+x", ".x",  # may not start with - + or .
    "", "a b", "a;b", "a,b", "a/b", "a:b", "a|b", "a=b", "a@b", "a\n", "é", "tag✓",
])
def test_anything_else_is_bad(tag):
    assert _tags.bad([tag]) == tag


@pytest.mark.parametrize("tag", [5, b"gpufleet-ok", ["x"]])
def test_a_value_that_is_no_string_is_bad(tag):
    assert _tags.bad([tag]) == repr(tag)  # shown as what it is, never None


def test_bad_names_the_first_bad_tag():
    assert _tags.bad(["ok", "-first", "also_ok", "+second"]) == "-first"
    assert _tags.bad(["ok", "fine"]) is None
    assert _tags.bad([]) is None


# Perl's pve-tag regex (/[a-z0-9_][a-z0-9_\-\+\.]*/i) refuses these under byte and Unicode rules
# alike; Python's re.IGNORECASE without re.ASCII case-folds them onto i and I.
@pytest.mark.parametrize("tag", ["\u0130", "\u0131", "gpu\u0130"])
def test_non_ascii_letters_that_fold_to_ascii_are_bad(tag):
    assert _tags.bad([tag]) == tag


# ----------------------------------------------------------------------------- normalize, merged


def test_normalize_is_lower_case_sorted_and_once_each():
    assert _tags.normalize(["Team-B", "gpufleet-ok", "team-b", "A", "a", "_x"]) == ["_x", "a", "gpufleet-ok", "team-b"]
    assert _tags.normalize([]) == []


def test_normalize_sorts_by_code_point_as_perl_sort_does():
    # - (0x2d) . (0x2e) digits (0x30-) _ (0x5f) letters (0x61-)
    assert _tags.normalize(["b", "_", "a.b", "a-b", "1", "a+b", "a"]) == ["1", "_", "a", "a+b", "a-b", "a.b", "b"]


def test_merged_sets_the_verdict_and_keeps_every_other_tag():
    current = _tags.split("Team-A;gpufleet-dirty;prod")
    assert _tags.merged(current, add=["gpufleet-ok"], remove=["gpufleet-dirty", "gpufleet-unhealthy"]) == [
        "gpufleet-ok", "prod", "team-a"]


def test_merged_removes_without_regard_to_case():
    assert _tags.merged(["GPUFLEET-Dirty", "keep"], remove=["gpufleet-DIRTY"]) == ["keep"]


def test_merged_adds_once_whatever_the_case():
    assert _tags.merged(["gpufleet-ok"], add=["GPUFLEET-OK", "New"]) == ["gpufleet-ok", "new"]


def test_merged_with_nothing_to_do_is_the_normal_form_of_the_current_list():
    assert _tags.merged(["b", "A", "a"]) == ["a", "b"]
    assert _tags.merged([], remove=["absent"]) == []
    assert _tags.merged(["only"], remove=["ONLY"]) == []


def test_merged_takes_any_iterable_and_changes_none_of_its_arguments():
    current, add, remove = ["x", "y"], ("z",), ("y",)
    assert _tags.merged(current, add, remove) == ["x", "z"]
    assert _tags.merged(current, iter(["w"]), iter(["x"])) == ["w", "y"]
    assert current == ["x", "y"] and add == ("z",) and remove == ("y",)


# ----------------------------------------------------------------------------- set_argv


def test_set_argv_writes_the_list_semicolon_joined():
    assert _tags.set_argv(100, ["gpufleet-ok", "team-a"]) == ["pct", "set", "100", "--tags", "gpufleet-ok;team-a"]
    assert _tags.set_argv("101", ["x"], "/usr/sbin/pct") == ["/usr/sbin/pct", "set", "101", "--tags", "x"]


def test_set_argv_drops_the_key_when_no_tag_is_left():
    assert _tags.set_argv(100, []) == ["pct", "set", "100", "--delete", "tags"]
    assert _tags.set_argv(999999999, (), pct_path="/opt/pct") == ["/opt/pct", "set", "999999999", "--delete", "tags"]


# ----------------------------------------------------------------------------- round trips

_FIRST = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
TAG = st.builds(lambda a, b: a + b, st.sampled_from(_FIRST), st.text(alphabet=_FIRST + "-+.", max_size=12))
TAGS = st.lists(TAG, max_size=8)


@settings(max_examples=200, deadline=None)
@given(TAGS)
def test_what_set_argv_writes_reads_back_as_the_same_list(tags):
    assert _tags.bad(tags) is None
    after = _tags.normalize(tags)
    written = _tags.set_argv(100, after)
    read_back = _tags.split(written[4]) if written[3] == "--tags" else []
    assert read_back == after
    assert _tags.normalize(read_back) == after  # the normal form is a fixed point
    assert _tags.bad(after) is None


@settings(max_examples=200, deadline=None)
@given(TAGS, TAGS, TAGS)
def test_merged_has_every_added_tag_and_no_removed_one_that_was_not_added(current, add, remove):
    after = _tags.merged(current, add, remove)
    assert after == sorted(set(after)) and all(t == t.lower() for t in after)
    low = {t.lower() for t in after}
    assert {t.lower() for t in add} <= low
    added = {t.lower() for t in add}
    assert not ({t.lower() for t in remove} - added) & low
    assert {t.lower() for t in current} - {t.lower() for t in remove} <= low


def test_a_tag_that_is_no_text_is_bad_and_hides_no_later_one():
    """bad() says None when every tag is good: a None among the tags was taken for that, hiding the rest."""
    assert _tags.bad([None]) == "None"
    assert _tags.bad(["ok", None, "-x"]) == "None"
    assert _tags.bad([7]) == "7"
