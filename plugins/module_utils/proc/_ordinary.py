# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Everyday processes of a node or a container: what no job's scope pattern may match.

Each row is ``(comm, command line)`` as /proc shows them on Debian, Ubuntu, RHEL-likes,
Proxmox VE and their LXC containers. A scope pattern that matches one of them would put
that process, and all like it, in scope (``.``, ``\\S``, ``^.``, ``python``). Kept as data:
add a row when a machine shows a process that belongs here.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

ORDINARY = (
    # init, as the node and as containers run it
    ("systemd", "/sbin/init"),
    ("systemd", "/sbin/init splash"),
    ("systemd", "/lib/systemd/systemd --system --deserialize=35"),
    ("systemd", "/usr/lib/systemd/systemd rhgb --switched-root --system --deserialize 31"),
    ("init", "/sbin/init"),
    ("init.lxc", "/usr/sbin/init.lxc -- /usr/sbin/sshd"),
    ("tini", "/usr/bin/tini -- /docker-entrypoint.sh"),
    ("dumb-init", "/usr/bin/dumb-init -- /bin/sh -c /start.sh"),
    ("systemd", "/lib/systemd/systemd --user"),
    ("(sd-pam)", "(sd-pam)"),
    # daemons
    ("systemd-journal", "/lib/systemd/systemd-journald"),
    ("systemd-udevd", "/lib/systemd/systemd-udevd"),
    ("systemd-logind", "/lib/systemd/systemd-logind"),
    ("systemd-network", "/lib/systemd/systemd-networkd"),
    ("systemd-resolve", "/lib/systemd/systemd-resolved"),
    ("systemd-timesyn", "/lib/systemd/systemd-timesyncd"),
    ("sshd", "sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"),
    ("sshd", "sshd: /usr/sbin/sshd -D -f /etc/ssh/sshd_config [listener] 1 of 10-100 startups"),
    ("sshd", "/usr/sbin/sshd -D"),
    ("sshd", "sshd: root@pts/0"),
    ("sshd", "sshd: root@notty"),
    ("sshd", "sshd: trainer [priv]"),
    ("cron", "/usr/sbin/cron -f"),
    ("cron", "/usr/sbin/cron -f -P"),
    ("crond", "/usr/sbin/crond -n"),
    ("agetty", "/sbin/agetty -o -p -- \\u --noclear tty1 linux"),
    ("agetty", "/sbin/agetty -o -p -- \\u --keep-baud 115200,57600,38400,9600 - vt220"),
    ("dbus-daemon",
     "/usr/bin/dbus-daemon --system --address=systemd: --nofork --nopidfile --systemd-activation --syslog-only"),
    ("dbus-daemon", "@dbus-daemon --system --address=systemd: --nofork --nopidfile --systemd-activation"),
    ("rsyslogd", "/usr/sbin/rsyslogd -n -iNONE"),
    ("chronyd", "/usr/sbin/chronyd -F 1"),
    ("master", "/usr/lib/postfix/sbin/master -w"),
    ("qmgr", "qmgr -l -t unix -u"),
    ("polkitd", "/usr/lib/polkit-1/polkitd --no-debug"),
    ("networkd-dispat", "/usr/bin/python3 /usr/bin/networkd-dispatcher --run-startup-triggers"),
    ("unattended-upgr",
     "/usr/bin/python3 /usr/share/unattended-upgrades/unattended-upgrade-shutdown --wait-for-signal"),
    ("lxcfs", "/usr/bin/lxcfs /var/lib/lxcfs"),
    ("lxc-start", "/usr/bin/lxc-start -F -n 100"),
    ("pvedaemon", "pvedaemon"),
    ("pvedaemon worke", "pvedaemon worker"),
    ("pveproxy", "pveproxy"),
    ("pve-firewall", "pve-firewall"),
    ("pvestatd", "pvestatd"),
    ("pmxcfs", "/usr/bin/pmxcfs"),
    ("containerd", "/usr/bin/containerd"),
    ("dockerd", "/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock"),
    ("node_exporter", "/usr/local/bin/node_exporter --web.listen-address=0.0.0.0:9100 --collector.textfile"),
    ("zabbix_agentd", "/usr/sbin/zabbix_agentd -c /etc/zabbix/zabbix_agentd.conf"),
    ("nv-hostengine", "/usr/bin/nv-hostengine -n --service-account nvidia-dcgm"),
    ("containerd-shim",
     "/usr/bin/containerd-shim-runc-v2 -namespace moby -id 3f2a9c -address /run/containerd/containerd.sock"),
    ("nvidia-persiste", "/usr/bin/nvidia-persistenced --user nvidia-persistenced --no-persistence-mode --verbose"),
    # people's shells and tools
    ("bash", "-bash"),
    ("bash", "/bin/bash"),
    ("bash", "bash"),
    ("bash", "/bin/bash --login"),
    ("sh", "/bin/sh"),
    ("sh", "/bin/sh -c sleep 0"),
    ("zsh", "-zsh"),
    ("login", "/bin/login -p --"),
    ("su", "su - trainer"),
    ("sudo", "sudo -i"),
    ("tmux: server", "tmux new-session -d -s main"),
    ("tmux: server", "tmux"),
    ("screen", "SCREEN -S work"),
    ("vim", "vim notes.md"),
    ("less", "less /var/log/syslog"),
    ("tail", "tail -F /var/log/syslog"),
    ("sleep", "sleep 60"),
    ("top", "top"),
    # this collection's own run, as Ansible starts it on a target
    ("python3", "/usr/bin/python3"),
    ("python3", "/usr/bin/python3 /root/.ansible/tmp/ansible-tmp-1764600000.12-4242-1/AnsiballZ_processes.py"),
    ("python3", "/usr/bin/python3 -I -B -c import sys;exec(sys.stdin.buffer.read())"),
    ("sh", "/bin/sh -c /usr/bin/python3 && sleep 0"),
)

# The table's daemons: names no training job runs under (shells, interpreters and tools such as
# python3, bash, sleep or tmux are left out: a job runs as those). A root process of one of these
# names running now counts as everyday with its own command line (ordinary_processes()).
DAEMONS = frozenset((
    "sshd", "cron", "crond", "agetty", "dbus-daemon", "rsyslogd", "chronyd", "polkitd",
    "systemd-journal", "systemd-logind", "systemd-network", "systemd-resolve", "systemd-timesyn", "systemd-udevd",
    "containerd", "containerd-shim", "dockerd", "lxcfs", "lxc-start",
    "pmxcfs", "pve-firewall", "pvedaemon", "pvedaemon worke", "pveproxy", "pvestatd",
    "node_exporter", "nv-hostengine", "nvidia-persiste", "zabbix_agentd",
))
