#!/usr/bin/env bash
# Host packages `make run` and `make test` need, in one apt transaction: a compiler for
# the test wheels' ELF objects, venv, git, tmux, the simulated fleet's LXC and OpenSSH,
# sudo (become tests), and the headless browser for the report test. Idempotent: installs
# only what is missing (needs root then).
set -euo pipefail
pkgs=(gcc python3-venv git tmux lxc openssh-server openssh-client sudo chromium fonts-dejavu-core)
need=()
for pkg in "${pkgs[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${need[*]} (run as root, or apt-get install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
# sshd's privilege-separation directory (absent where no system sshd ever ran).
if [ "$(id -u)" -eq 0 ]; then
  install -d -m 0755 /run/sshd
fi
