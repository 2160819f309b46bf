#!/bin/sh
# Runs the Molecule scenarios of the roles (extensions/molecule/<role>) one after another, each
# on its own tiny simulated fleet (tests/sim/fleet, 1 node x 2 containers), brought up by the
# scenario's create step and down by its destroy step. Needs root (tests/sim/setup-host.sh).
#
#   tests/molecule/run.sh            # kill, purge, verify, relaunch and repair
#   tests/molecule/run.sh kill       # one scenario
set -eu
cd "$(dirname "$0")/../.."
PATH="$PWD/.venv/bin:$PATH"
export PATH
[ "$#" -gt 0 ] || set -- kill purge verify relaunch repair
start=$(date +%s)
for scenario in "$@"; do
    molecule test --scenario-name "$scenario"
done
echo "molecule: $* passed in $(( $(date +%s) - start )) s"
