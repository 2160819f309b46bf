# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A role file's values as ansible-core loads them - their templates trusted - for tests that
template a role's variables with ansible-core's own Templar."""

from __future__ import annotations

from ansible.template import trust_as_template


def trusted(value):
    """value with every string in it trusted as a template, as ansible-core trusts a role's files."""
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value
