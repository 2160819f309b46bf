# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The kill role's wait for the GPUs to drain says what it waits for, on the simulated fleet.

A job holds a container's GPU; the container's nvidia-smi stand-in is told that the driver
releases a dead process's memory only 30 s after it exits (what a GPU that is slow to free its
memory does). The kill role stops the job and waits for the drain: at default verbosity the
operator sees a line at least every 15 s naming the GPU, its memory and that no process holds it
any more, and the role ends when the memory is free.
"""

from __future__ import annotations

import json

import pytest
from conftest import INVENTORY, REPO
from test_relaunch_since import Container, Streamed

PLAYBOOK = "%s/tests/integration/targets/drain_progress/kill.yml" % REPO
RELEASE_DELAY = 30


@pytest.fixture(scope="module")
def drained(fleet):
    running = [(n, ct) for n in fleet["nodes"] for ct in n["containers"] if ct["running"] and ct["gpus"]]
    c = Container(*running[-1])
    config = "/opt/gpufleet/gpu/config.json"
    before = json.loads(c.sh("cat %s" % config))
    used_before = c.used()
    try:
        holder = int(c.sh("cd /root && setsid %s </dev/null >/dev/null 2>&1 & echo $!" % " ".join(c.job(20000, "--tag", "drain-progress")))
                     .strip())
        c.sh("for i in $(seq 100); do [ -n \"$(ls /opt/gpufleet/gpu/claims)\" ] && break; sleep 0.1; done")
        c.sh("cat > %s.new <<'EOF'\n%s\nEOF\nmv %s.new %s" % (config, json.dumps(dict(before, release_delay=RELEASE_DELAY)), config, config))
        res = Streamed(["ansible-playbook", "-i", INVENTORY, PLAYBOOK, "-e", "drain_progress_hosts=%s" % c.name])
        yield {"res": res, "lines": res.lines, "name": c.name, "holder": holder, "alive": holder in c.jobs(),
               "used_after": c.used(), "used_before": used_before}
    finally:
        c.sh("cat > %s.new <<'EOF'\n%s\nEOF\nmv %s.new %s" % (config, json.dumps(before), config, config))
        c.clean(used_before)


def test_the_role_stops_the_job_and_waits_until_the_memory_is_free(drained):
    assert drained["res"].returncode == 0, drained["res"].stdout[-4000:]
    assert not drained["alive"] and drained["used_after"] == drained["used_before"]


def test_the_drain_says_what_it_waits_for_at_least_every_15_s(drained):
    lines = drained["lines"]
    first = next(i for i, (_t, line) in enumerate(lines) if "Terminate the GPU holders still in the job's scope" in line)
    last = next(i for i, (_t, line) in enumerate(lines) if line.startswith("TASK [The drain is over]"))
    gaps = [(lines[i + 1][0] - lines[i][0], lines[i + 1][1]) for i in range(first, last)]
    assert max(g for g, _line in gaps) <= 15, "silent for %.1f s before: %s" % max(gaps)
    assert lines[last][0] - lines[first][0] >= RELEASE_DELAY - 5  # the wait was long enough to need it
    waiting = [line for _t, line in lines[first:last] if line.startswith("%s: waiting for the GPUs to drain, " % drained["name"])]
    assert len(waiting) >= 2, drained["res"].stdout[-4000:]
    assert "of 90 s: GPU 0 (NVIDIA H200" in waiting[0] and waiting[0].endswith("no holder"), waiting[0]
