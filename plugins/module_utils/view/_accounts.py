# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Accounts and file owners as the host being read sees them.

On a host read as itself, the C library's account lookup (pwd). In a thread that reads a
container from its node (fs/_root's current root belongs to a view), the container's own
/etc/passwd, parsed here as bytes through its root, bounded: the C library is never asked,
since it would read the container's nsswitch.conf and load the modules it names into the
node's process. File owners and process users are turned into the container's ids through its
uid map (an unprivileged container's root is 100000 on the node).

Every module the node read reaches asks here, never ``pwd``/``grp`` directly (a unit test
checks it).

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

import os
import pwd

from ansible_collections.gpufleet.hygiene.plugins.module_utils.fs import _root


class Account(tuple):
    """One line of a container's /etc/passwd, as pwd.struct_passwd spells its fields."""

    __slots__ = ()
    _FIELDS = ("pw_name", "pw_passwd", "pw_uid", "pw_gid", "pw_gecos", "pw_dir", "pw_shell")

    def __getattr__(self, name):
        try:
            return self[self._FIELDS.index(name)]
        except ValueError:
            raise AttributeError(name) from None


def _number(text):
    return text.isascii() and text.isdigit() and len(text) <= 10


def parse_passwd(text):
    """Accounts of a passwd file's text; lines that are not name:x:uid:gid:gecos:home:shell skipped."""
    out = []
    for line in text.splitlines():
        fields = line.split(":")
        if len(fields) != 7 or not fields[0] or line.startswith(("#", "+", "-")):
            continue
        if not (_number(fields[2]) and _number(fields[3])):
            continue
        out.append(Account((fields[0], fields[1], int(fields[2]), int(fields[3]), fields[4], fields[5], fields[6])))
    return out


def current_view():
    """The view of the container this thread reads (fs/_root's current root's), or None."""
    root = _root.current()
    return None if root is None else root.view


def getpwnam(name):
    """pwd.getpwnam(), from the container's /etc/passwd in a view's thread."""
    view = current_view()
    if view is None:
        return pwd.getpwnam(name)
    for account in view.accounts():
        if account.pw_name == name:
            return account
    raise KeyError("getpwnam(): name not found: %r" % (name,))


def getpwuid(uid):
    view = current_view()
    if view is None:
        return pwd.getpwuid(uid)
    for account in view.accounts():
        if account.pw_uid == uid:
            return account
    raise KeyError("getpwuid(): uid not found: %r" % (uid,))


def getpwall():
    view = current_view()
    return pwd.getpwall() if view is None else list(view.accounts())


def acting_uid():
    """The uid this read acts as on the host it reads: in a container read from its node, its root
    (whom ``pct exec`` enters as); elsewhere this process's."""
    return 0 if current_view() is not None else os.geteuid()


def seen_uid(uid):
    """A file owner's uid (stat's st_uid) as the host being read sees it: an unprivileged
    container's root (100000 on the node, say) is 0 in its view's thread; unchanged elsewhere."""
    view = current_view()
    return uid if view is None else view.uid(uid)
