# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A process's /proc files as plain files, for the tests of proc/_proc and proc/_scope: stat,
status, cgroup, cmdline and an empty fd directory under ``<root>/<pid>``."""

from __future__ import annotations


def fake_proc(root, pid, comm="python3", ppid=1, started=777, cgroup="0::/lxc/200/ns/init.scope\n",
              uid=100000, nspid=(48211, 1731), cmdline=b"python3\0train_dflash.py\0"):
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "stat").write_text("%d (%s) S %d 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0"
                            % (pid, comm, ppid, started))
    (d / "status").write_text("Name:\t%s\nUid:\t%d\t%d\t%d\t%d\nNSpid:\t%s\n"
                              % (comm, uid, uid, uid, uid, "\t".join(str(n) for n in nspid)))
    (d / "cgroup").write_text(cgroup)
    (d / "cmdline").write_bytes(cmdline)
    (d / "fd").mkdir()
    return d
