# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The relaunch role's wait for the job's ready line (docs: log_search_since.yml): a search that
ansible.builtin.wait_for runs over the whole log, matching only what was written after the launch."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

# The largest repeat Python's re accepts is 2**32 - 1; larger offsets are skipped in chunks.
_CHUNK = 1 << 20
# Global inline flags must open a pattern: the ready regex's own go before the skip.
_FLAGS = re.compile(r"\A\(\?([aiLmsux]+)\)")


def _offset(at_launch, now):
    """Bytes of the log written before the launch, as the throughput gate reads it: 0 when the log
    did not exist at launch, or was rotated (another inode) or truncated (shorter) since."""
    for name, stat in (("at_launch", at_launch), ("now", now)):
        if not isinstance(stat, Mapping):
            raise AnsibleFilterError("log_search_since: %s must be a stat result (ansible.builtin.stat's stat), got %r"
                                     % (name, stat))
    if not at_launch.get("exists") or not now.get("exists"):
        return 0
    if now.get("inode") != at_launch.get("inode") or int(now.get("size", 0)) < int(at_launch.get("size", 0)):
        return 0
    return int(at_launch.get("size", 0))


def log_search_since(regex, at_launch, now):
    """A search_regex for ansible.builtin.wait_for that finds ``regex`` only past the part of the
    log an earlier run wrote: the log's first bytes (its size at launch) are skipped, unless it
    was rotated or truncated since (``now``: the log's stat after the launch)."""
    if not isinstance(regex, str) or not regex:
        raise AnsibleFilterError("log_search_since: expects the ready regex, got %r" % (regex,))
    try:
        re.compile(regex.encode("utf-8"), re.MULTILINE)  # as wait_for compiles it
    except re.error as exc:
        raise AnsibleFilterError("log_search_since: %r is not a valid regular expression: %s" % (regex, exc)) from None
    flags = _FLAGS.match(regex)
    if flags:
        regex = regex[flags.end():]
    chunks, rest = divmod(_offset(at_launch, now), _CHUNK)
    skip = ("(?s:.{%d}){%d}" % (_CHUNK, chunks) if chunks else "") + ("(?s:.{%d})" % rest if rest else "")
    return "%s\\A%s(?s:.*?)(?:%s)" % ("(?%s)" % flags.group(1) if flags else "", skip, regex)


class FilterModule(object):
    def filters(self):
        return {"log_search_since": log_search_since}
