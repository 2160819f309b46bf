#!/usr/bin/env bash
# Host packages the tests need. Idempotent; installs only what is missing (needs root then).
set -euo pipefail
need=()
for pkg in gcc python3-venv git tmux; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing Debian packages: ${need[*]} (run as root, or apt-get install them)" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
