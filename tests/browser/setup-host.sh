#!/usr/bin/env bash
# The headless browser the HTML report test opens the report in (Debian's chromium).
# Idempotent; installs only what is missing (needs root then).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/../../scripts/install-debs.sh" chromium fonts-dejavu-core
command -v chromium >/dev/null
