#!/usr/bin/env bash
# promtool, which the alerting-rule tests run (Debian's prometheus package). Only the tool is
# wanted: when this script installs the package, the server it enables is stopped and disabled
# (one already installed is left as it was). Idempotent; needs root when it installs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! dpkg -s prometheus >/dev/null 2>&1; then
  bash "$here/../../scripts/install-debs.sh" prometheus
  if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service
  fi
fi
command -v promtool >/dev/null
