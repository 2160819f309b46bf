#!/usr/bin/env bash
# Host packages `make run` and `make test` need, in one apt transaction: a compiler for
# the test wheels' ELF objects, venv, git, tmux, the simulated fleet's LXC and OpenSSH,
# sudo (become tests), and the headless browser for the report test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/install-debs.sh" gcc python3-venv git tmux lxc openssh-server openssh-client sudo chromium fonts-dejavu-core systemd
# promtool for the alerting-rule tests (its own script: the package's server is not wanted).
bash "$here/../tests/monitoring/setup-host.sh"
# sshd's privilege-separation directory (absent where no system sshd ever ran).
if [ "$(id -u)" -eq 0 ]; then
  install -d -m 0755 /run/sshd
fi
