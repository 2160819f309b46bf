#!/usr/bin/env bash
# ansible-builder in a throwaway venv under build/ (not a development requirement of the collection).
set -euo pipefail
venv=${1:-build/ee-tool/venv}
if [ ! -x "$venv/bin/ansible-builder" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check ansible-builder
fi
"$venv/bin/ansible-builder" --version
