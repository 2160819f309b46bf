#!/usr/bin/env bash
# The headless browser the HTML report test opens the report in (Debian's chromium).
# Idempotent; installs only what is missing (needs root then).
set -euo pipefail
need=()
for pkg in chromium fonts-dejavu-core; do
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
command -v chromium >/dev/null
