#!/usr/bin/env bash
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Mutation testing of the safety-critical module_utils with cosmic-ray (pinned in
# requirements/dev.txt): every mutant of a module (an operator flipped, a constant changed, a
# condition negated, ...) is run against that module's unit tests; a mutant no test fails on
# ("survived") is a behaviour nothing pins. `make mutation` runs it; it is not part of `make test`
# (every module: hours on two cores).
#
#   scripts/mutation.sh                 # every module of the table below
#   scripts/mutation.sh liveness xid    # some of them
#   MUTATION_RESUME=1 scripts/mutation.sh verdict   # go on with a stopped run (nothing changed)
#   MUTATION_RECHECK=1 scripts/mutation.sh scope    # a run's survivors (and the mutants it had
#       not reached) against the tests as they are now; the module must be the one the run
#       mutated, so that every mutant keeps its line and occurrence
#
# The mutants are made in copies of the checkout (build/mutation/trees.<pid>/<n>: the files git tracks
# plus the collection link), never in the working tree, and the venv is the checkout's. Each copy
# has its own cosmic-ray http-worker on a loopback port, and cosmic-ray's http distributor hands
# every worker one mutant at a time: MUTATION_WORKERS of them (default: one per CPU). Results per
# module under build/mutation/<name>/: session.sqlite, session-report.txt (cr-report),
# session-survivors.txt; a recheck writes recheck.sqlite and recheck-*.txt beside them.
# Exit status 0 only when no mutant survived (or a survivor is listed in
# docs/reliability.md's table of explained survivors, by module, line and operator).

set -eu -o pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
BUILD="$ROOT/build/mutation"
BIN="$ROOT/.venv/bin"
CR="${COSMIC_RAY:-$BIN/cosmic-ray}"
CR_REPORT="${CR_REPORT:-$(dirname "$CR")/cr-report}"

# name | module under plugins/module_utils | the unit tests that pin it, the quickest first. Each
# mutant's tests run in two steps, the first file alone and then the others, each stopping at its
# first failure: most mutants are killed by the first file, and pytest's start (the collection of
# every file it is given) is paid for the others only by the mutants the first lets through.
# The rows of venv/_contamination.py and the three files split from it (the removal, its stash and
# the record of failed restores) take their plain-file tests alone: test_cuda_contamination.py (real
# venvs, a minute a mutant) killed none of the 66 mutants those let through (docs/reliability.md).
TABLE="
contamination|venv/_contamination.py|tests/unit/plugins/module_utils/venv/test_contamination.py tests/unit/plugins/module_utils/venv/test_removal.py
removal|venv/_removal.py|tests/unit/plugins/module_utils/venv/test_removal.py
stash|venv/_stash.py|tests/unit/plugins/module_utils/venv/test_stash.py tests/unit/plugins/module_utils/venv/test_removal.py
restore|venv/_restore.py|tests/unit/plugins/module_utils/venv/test_restore.py tests/unit/plugins/module_utils/venv/test_removal.py
verdict|venv/_cuda.py|tests/unit/plugins/module_utils/venv/test_cuda.py tests/unit/plugins/modules/test_cuda_mixed_major.py tests/unit/plugins/modules/test_cuda_contamination.py
record|venv/_dist.py|tests/unit/plugins/module_utils/venv/test_dist_functions.py tests/unit/plugins/module_utils/venv/test_dist.py tests/unit/plugins/module_utils/venv/test_dist_hostile.py tests/unit/plugins/modules/test_pip_inventory.py
sites|venv/_venv.py|tests/unit/plugins/module_utils/venv/test_venv.py tests/unit/plugins/module_utils/venv/test_dist_hostile.py
inventory|venv/_inventory.py|tests/unit/plugins/module_utils/venv/test_inventory.py tests/unit/plugins/modules/test_pip_inventory.py
proc|proc/_proc.py|tests/unit/plugins/module_utils/proc/test_proc.py tests/unit/plugins/module_utils/view/test_view.py tests/unit/plugins/module_utils/proc/test_scope.py tests/unit/plugins/modules/test_processes.py
scope|proc/_scope.py|tests/unit/plugins/module_utils/proc/test_scope.py tests/unit/plugins/modules/test_processes.py
ordinary|proc/_ordinary.py|tests/unit/plugins/module_utils/proc/test_scope.py
throughput|job/_throughput.py|tests/unit/plugins/module_utils/job/test_throughput_since.py tests/unit/plugins/module_utils/job/test_throughput.py tests/unit/plugins/filter/test_log_search.py tests/unit/plugins/modules/test_host_lock_throughput.py
liveness|job/_liveness.py|tests/unit/plugins/module_utils/job/test_liveness.py tests/unit/plugins/module_utils/job/test_liveness_thresholds.py tests/unit/plugins/module_utils/job/test_liveness_paths.py tests/unit/plugins/module_utils/job/test_liveness_leftovers.py
xid|gpu/_xid.py|tests/unit/plugins/module_utils/gpu/test_xid.py tests/unit/plugins/module_utils/gpu/test_findings.py tests/unit/plugins/module_utils/gpu/test_health.py
"

[ -x "$CR" ] || { echo "cosmic-ray not found at $CR: run make setup (requirements/dev.txt pins it)" >&2; exit 2; }
# The modules named, in the order given (every one of the table's, in its order, when none is).
names=$(printf '%s\n' "$TABLE" | grep '|' | cut -d'|' -f1 | xargs)
rows=${*:-$names}
for name in $rows; do
    [[ " $names " == *" $name "* ]] || { echo "no such module: $name; choose from: $names" >&2; exit 2; }
done

WORKERS="${MUTATION_WORKERS:-$(nproc)}"
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "MUTATION_WORKERS must be a whole number above 0, not '$WORKERS'" >&2; exit 2; }

# The copies the mutants are made in, one per worker (a worker mutates its copy's file in place
# for the length of one test run), this run's own: two runs of different modules can go at once.
# Copy 0 also makes the session and runs the baseline. All go when the run ends.
TREES="$BUILD/trees.$$"
worker_pids=()
# shellcheck disable=SC2329  # called by the EXIT trap below, which shellcheck does not follow
cleanup() {
    set +e  # every step, whatever the one before it returned
    [ "${#worker_pids[@]}" -eq 0 ] || kill "${worker_pids[@]}" 2>/dev/null
    # A worker ends once its test run has: those runs are in sessions of their own (cosmic-ray
    # starts them so), found here by their working directory, one of this run's copies.
    local proc cwd
    for proc in /proc/[0-9]*; do
        cwd=$(readlink "$proc/cwd" 2>/dev/null) || continue
        case " ${worker_pids[*]} " in *" ${proc#/proc/} "*) continue ;; esac  # a worker: TERM above
        case "$cwd" in "$TREES"/*) kill -KILL "${proc#/proc/}" 2>/dev/null ;; esac
    done
    [ "${#worker_pids[@]}" -eq 0 ] || wait "${worker_pids[@]}" 2>/dev/null
    rm -rf "$TREES"
}
trap cleanup EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
for i in $(seq 0 $((WORKERS - 1))); do
    tree="$TREES/$i"
    mkdir -p "$tree"
    git ls-files -z | (cd "$ROOT" && xargs -0 cp --parents -t "$tree")
    ln -s "$ROOT/.venv" "$tree/.venv"
    mkdir -p "$tree/.ansible/collections/ansible_collections/gpufleet"
    ln -s ../../../.. "$tree/.ansible/collections/ansible_collections/gpufleet/hygiene"
done
TREE="$TREES/0"

# The workers: each serves one mutate-and-test request at a time, in its own copy. Ports are
# the kernel's free ones on loopback; the workers end with this script.
urls=()
for i in $(seq 0 $((WORKERS - 1))); do
    port=$("$BIN/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (cd "$TREES/$i" && exec "$CR" http-worker --port "$port" >"$TREES/worker.$i.log" 2>&1) &
    worker_pids+=("$!")
    urls+=("'http://127.0.0.1:$port'")
    for _ in $(seq 100); do
        "$BIN/python" -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()' "$port" 2>/dev/null && break
        kill -0 "$!" 2>/dev/null || { echo "cosmic-ray http-worker $i did not start: $(cat "$TREES/worker.$i.log")" >&2; exit 2; }
        sleep 0.1
    done
done
WORKER_URLS=$(IFS=,; echo "${urls[*]}")

sqlite3_count() {  # session [pending]: its mutants, or those not run yet
    "$BIN/python" - "$@" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
where = " WHERE job_id NOT IN (SELECT job_id FROM work_results)" if sys.argv[2:] == ["pending"] else ""
print(db.execute("SELECT count(*) FROM mutation_specs" + where).fetchone()[0])
PY
}

report() {  # name module out [session]: the report, the survivors, and whether each is explained
    local name=$1 module=$2 out=$3 session=${4:-session}
    "$CR_REPORT" --show-pending "$out/$session.sqlite" >"$out/$session-report.txt"
    # One line per survivor: module, line, operator, occurrence.
    "$TREE/.venv/bin/python" - "$out/$session.sqlite" "$module" >"$out/$session-survivors.txt" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute(
    "SELECT m.module_path, m.start_pos_row, m.operator_name, m.occurrence FROM mutation_specs m "
    "JOIN work_results r ON r.job_id = m.job_id WHERE r.test_outcome = 'SURVIVED' ORDER BY m.start_pos_row").fetchall()
for path, row, op, occ in rows:
    print("%s:%s %s #%s" % (path, row, op, occ))
PY
    tail -3 "$out/$session-report.txt"
    while read -r survivor; do
        [ -n "$survivor" ] || continue
        if grep -qF "\`$survivor\`" docs/reliability.md; then
            echo "survived, explained in docs/reliability.md: $survivor"
        else
            echo "SURVIVED: $survivor"
            status=1
        fi
    done <"$out/$session-survivors.txt"
}

crun() {  # cosmic-ray in copy 0, waited for in the background: a signal to this script
    # (TERM, INT) runs the trap at once, ending the run and its workers, not after the session
    (cd "$TREE" && exec "$CR" "$@") &
    cr_pid=$!
    worker_pids+=("$cr_pid")
    wait "$cr_pid"
}

status=0
for name in $rows; do
    line=$(printf '%s\n' "$TABLE" | grep "^$name|")
    module="plugins/module_utils/$(echo "$line" | cut -d'|' -f2)"
    tests="$(echo "$line" | cut -d'|' -f3)"
    out="$BUILD/$name"
    # pytest without the plugins no test here needs (their imports are most of its start: the
    # hypothesis plugin imports all of hypothesis), stopping at the first failure. A mutant that
    # makes a loop endless fails the test it hangs (pytest-timeout): 20 s a test of the first
    # file (each takes well under a second), 120 s of the others (real venvs, real installers),
    # rather than the whole run's timeout below.
    pytest="$BIN/pytest -p no:cacheprovider -p no:randomly -p no:xdist -p no:xdist.looponfail -p no:hypothesispytest -p no:platformdirs -x -q"
    read -r first others <<< "$tests"
    test_command="$pytest --timeout=20 $first"
    [ -z "${others:-}" ] || test_command="bash -c '$pytest --timeout=20 $first && $pytest --timeout=120 $others'"
    write_config() {  # timeout: the session's config, with the workers of this sitting
        cat >"$out/config.toml" <<TOML
[cosmic-ray]
module-path = "$module"
timeout = $1
excluded-modules = []
test-command = "$test_command"

[cosmic-ray.distributor]
name = "http"

[cosmic-ray.distributor.http]
worker-urls = [$WORKER_URLS]
TOML
    }
    # What the session's mutants were made from: a resumed run must see the same module and tests.
    read -r -a test_files <<< "$tests"
    fingerprint=$(cd "$ROOT" && sha256sum "$module" "${test_files[@]}" | sha256sum | cut -d' ' -f1)
    if [ "${MUTATION_RECHECK:-}" = 1 ]; then
        [ -f "$out/session.sqlite" ] || { echo "$name: no run to recheck in $out" >&2; exit 2; }
        if [ "$(cat "$out/module.sha256" 2>/dev/null)" != "$(sha256sum <"$module" | cut -d' ' -f1)" ]; then
            echo "$name: $module changed since its run: the run's mutants no longer fit it; run it again in full" >&2
            exit 2
        fi
        # The run's session is kept; the copy forgets its survivors' results, so that they (and
        # the mutants never reached) are what cosmic-ray runs now.
        cp "$out/session.sqlite" "$out/recheck.sqlite"
        "$BIN/python" - "$out/recheck.sqlite" <<'PY'
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
db.execute("DELETE FROM work_results WHERE test_outcome = 'SURVIVED' OR test_outcome IS NULL")
db.commit()
PY
        echo "== $name: recheck, $(sqlite3_count "$out/recheck.sqlite" pending) of $(sqlite3_count "$out/recheck.sqlite") mutants against $tests"
        write_config "$(cat "$out/timeout")"
        started=$(date +%s)
        crun exec "$out/config.toml" "$out/recheck.sqlite"
        echo "run time (recheck): $(( $(date +%s) - started )) s"
        report "$name" "$module" "$out" recheck
        continue
    fi
    if [ "${MUTATION_RESUME:-}" = 1 ] && [ -f "$out/session.sqlite" ]; then
        if [ "$(cat "$out/fingerprint" 2>/dev/null)" != "$fingerprint" ]; then
            echo "$name: $module or its tests changed since the stopped run began: run it again without MUTATION_RESUME" >&2
            exit 2
        fi
        echo "== $name: resuming, $(sqlite3_count "$out/session.sqlite" pending) of $(sqlite3_count "$out/session.sqlite") mutants left"
        write_config "$(cat "$out/timeout")"  # the stopped run's timeout; this sitting's workers
        started=$(date +%s)
        crun exec "$out/config.toml" "$out/session.sqlite"
        echo "run time (this sitting): $(( $(date +%s) - started )) s"
        report "$name" "$module" "$out"
        continue
    fi
    rm -rf "$out" && mkdir -p "$out"
    echo "$fingerprint" >"$out/fingerprint"
    sha256sum <"$module" | cut -d' ' -f1 >"$out/module.sha256"
    echo "== $name: $module against $tests"
    started=$(date +%s)
    write_config 600.0
    crun init "$out/config.toml" "$out/session.sqlite" && crun baseline "$out/config.toml"
    # A mutant that makes a test wait forever (a read without O_NONBLOCK, a loop that no longer
    # ends) is killed by the timeout: ten times the unmutated run, at least 30 s, not a fixed
    # 300 s that a module with a few such mutants would spend most of its run waiting on.
    # At most 280 s: the http distributor's request gives up after 300 s (aiohttp's default) and
    # would hand the next mutant to a worker still running the last one.
    baseline=$(( $(date +%s) - started ))
    timeout=$(( baseline * 10 > 30 ? baseline * 10 : 30 ))
    timeout=$(( timeout > 280 ? 280 : timeout ))
    echo "$timeout.0" >"$out/timeout"
    write_config "$timeout.0"
    echo "$(sqlite3_count "$out/session.sqlite") mutants; baseline ${baseline} s, timeout ${timeout} s"
    crun exec "$out/config.toml" "$out/session.sqlite"
    echo "run time: $(( $(date +%s) - started )) s"
    report "$name" "$module" "$out"
done
exit $status
