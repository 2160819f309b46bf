# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""view/_accounts: accounts and owners as the host being read sees them - the C library's on a host
read as itself, the container's own /etc/passwd (parsed, never through the C library) and its uid
map in a thread that reads a container from its node."""

from __future__ import annotations

import os
import pwd

import pytest

from ansible_collections.gpufleet.hygiene.plugins.module_utils.proc import _proc
from ansible_collections.gpufleet.hygiene.plugins.module_utils.view import _accounts, _view

# A view's read takes milliseconds; the deadline is a safety net for a busy machine.
DEADLINE = 300
# Proxmox VE's default for an unprivileged container: root is 100000 on the node.
UNPRIVILEGED = "         0     100000      65536\n"


@pytest.mark.parametrize("text, want", [
    ("root:x:0:0:root:/root:/bin/bash\n", [("root", 0, 0, "/root")]),
    ("trainer:x:1000:1001:T, Rainer:/home/trainer:/bin/sh", [("trainer", 1000, 1001, "/home/trainer")]),
    # comments, NIS markers, a field short or over, a name or id missing, ids that are no plain number
    ("# root:x:0:0::/:/bin/sh\n+nis:x:1:1::/:/bin/sh\n-nis:x:1:1::/:/bin/sh\n", []),
    ("a:x:1:1::/\nb:x:1:1::/:/bin/sh:extra\n:x:1:1::/:/bin/sh\n", []),
    ("c:x::1::/:/bin/sh\nd:x:-1:1::/:/bin/sh\ne:x:1:\u0661::/:/bin/sh\nf:x:99999999999:1::/:/bin/sh\n", []),
    ("ok:x:7:7::/home/ok:/bin/sh\r\nbroken line\n", [("ok", 7, 7, "/home/ok")]),
])
def test_passwd_lines_that_are_not_accounts_are_skipped(text, want):
    assert [(a.pw_name, a.pw_uid, a.pw_gid, a.pw_dir) for a in _accounts.parse_passwd(text)] == want


def test_an_account_spells_its_fields_as_pwd_does():
    (a,) = _accounts.parse_passwd("trainer:x:1000:1000:Trainer:/home/trainer:/bin/bash\n")
    assert (a.pw_name, a.pw_passwd, a.pw_uid, a.pw_gid, a.pw_gecos, a.pw_dir, a.pw_shell) == (
        "trainer", "x", 1000, 1000, "Trainer", "/home/trainer", "/bin/bash")
    assert not hasattr(a, "pw_age")  # a field pwd does not have is an AttributeError, as there


def test_a_host_read_as_itself_asks_the_c_library():
    me = pwd.getpwuid(os.geteuid())
    assert _accounts.getpwuid(me.pw_uid) == me and _accounts.getpwnam(me.pw_name) == me
    assert len(_accounts.getpwall()) == len(pwd.getpwall())
    assert _accounts.acting_uid() == os.geteuid() and _accounts.seen_uid(100000) == 100000


def test_in_a_container_s_thread_ids_are_its_own(tmp_path):
    """An unprivileged container read from its node: it acts as its root, and a file the node sees
    owned by 101000 is its uid 1000's."""
    os.makedirs(tmp_path / "etc")
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    id_map = _view.parse_id_map(UNPRIVILEGED)
    view = _view.ContainerView(5, 1, root_fd, {}, {}, id_map, id_map, None)
    try:
        got = _view.run(view, lambda: (_accounts.acting_uid(), _accounts.seen_uid(101000), _accounts.seen_uid(100000),
                                       _accounts.current_view() is view), DEADLINE)
    finally:
        view.close()
    assert got == (0, 1000, 0, True)
    assert _accounts.current_view() is None  # outside the view's thread


def test_its_accounts_are_its_own_passwd(tmp_path):
    os.makedirs(tmp_path / "etc")
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n# a comment\nbroken line\n"
                                             "trainer:x:1000:1000:Trainer:/home/trainer:/bin/bash\n"
                                             "huge:x:99999999999:1:x:/:/bin/sh\n")
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(5, 1, root_fd, {}, {}, [], [], None)
    seen = {}

    def work():
        seen["trainer"] = _accounts.getpwnam("trainer")
        seen["root"] = _accounts.getpwuid(0)
        seen["all"] = [a.pw_name for a in _accounts.getpwall()]
        seen["name"] = _proc.user_name(1000)
        with pytest.raises(KeyError):
            _accounts.getpwnam("nobody-here")

    try:
        _view.run(view, work, DEADLINE)
    finally:
        view.close()
    assert (seen["trainer"].pw_uid, seen["trainer"].pw_dir) == (1000, "/home/trainer")
    assert seen["root"].pw_dir == "/root" and seen["all"] == ["root", "trainer"] and seen["name"] == "trainer"


def test_a_container_s_accounts_never_reach_the_c_library(tmp_path, monkeypatch):
    """The account lookups of a view's thread parse its /etc/passwd: pwd (the C library's NSS,
    which would read the container's nsswitch.conf and load the modules it names) is never asked."""
    import pwd

    os.makedirs(tmp_path / "etc")
    (tmp_path / "etc" / "passwd").write_text("trainer:x:1000:1000::/home/trainer:/bin/sh\n")
    (tmp_path / "etc" / "nsswitch.conf").write_text("passwd: /../tmp/evil files\n")
    asked = []
    for name in ("getpwnam", "getpwuid", "getpwall"):
        monkeypatch.setattr(pwd, name, lambda *a, _n=name: asked.append(_n))
    root_fd = os.open(str(tmp_path), os.O_RDONLY | os.O_DIRECTORY)
    view = _view.ContainerView(5, 1, root_fd, {}, {}, [], [], None)
    try:
        got = _view.run(view, lambda: (_accounts.getpwnam("trainer").pw_uid, _accounts.getpwuid(1000).pw_name,
                                       len(_accounts.getpwall()), _proc.user_name(1000)), DEADLINE)
    finally:
        view.close()
    assert got == (1000, "trainer", 1, "trainer") and asked == []
