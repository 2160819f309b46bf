#!/usr/bin/env bash
# Host packages the simulated fleet (tests/sim/fleet) needs: LXC, OpenSSH server and
# client, sudo (become tests). Idempotent; installs only what is missing (needs root then).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/../../scripts/install-debs.sh" lxc openssh-server openssh-client sudo tmux
# sshd's privilege-separation directory (absent where no system sshd ever ran).
if [ "$(id -u)" -eq 0 ]; then
  install -d -m 0755 /run/sshd
fi
