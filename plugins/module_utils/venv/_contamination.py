# -*- coding: utf-8 -*-
# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Find packages built for another CUDA major than the venv's reference (the scan).

Contamination is what the read (readiness, node_readiness) and cuda_contamination's scan run; the
removal, with its lock, stash and installer, is venv/_removal.py, which the read never imports.

Private to gpufleet.hygiene (leading underscore): not a public API. Standard library only.
"""

from __future__ import annotations

from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._cuda import reference, scan
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._venv import Venv
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._evcache import EvidenceCache
from ansible_collections.gpufleet.hygiene.plugins.module_utils.venv._restore import RestoreRecord, pending_problem, unrestored


class Contamination(object):
    """The scan of one venv (a path or a Venv); venv/_removal.py's Removal adds the removal."""

    def __init__(self, venv, run, expected_cuda=None, scan_binaries=True, check_mode=False, evidence_cache=True):
        self.env = Venv.of(venv, run)
        self.venv = self.env.path
        self.run_cmd = run
        self.expected_cuda = expected_cuda
        self.scan_binaries = scan_binaries
        self.evidence_cache = evidence_cache
        self.check_mode = check_mode
        self.restore_record = RestoreRecord(self.venv)

    def scan(self):
        dists = self.env.distributions
        ref, warnings = reference(dists, self.expected_cuda)
        cache = EvidenceCache.open(self.evidence_cache, self.venv)
        try:
            contaminants, unknown, clobbered, shared = scan(dists, ref["cuda_major"], self.scan_binaries, cache)
        finally:
            if cache is not None:
                cache.close()
        problems = list(self.env.problems)
        for dist in dists:
            problems.extend(dist.problems)
        pending = self.pending(dists, problems)
        result = {
            "reference": ref,
            "contaminants": contaminants,
            "clobbered": [dict((k, v) for k, v in c.items() if k != "file") for c in clobbered],
            "unknown": unknown,
            "restore_pending": pending,
            "clean": not contaminants and not pending,
            "scanned": len(dists),
            "problems": problems,
            "warnings": warnings,
        }
        return result, dists, clobbered, shared

    def pending(self, dists, problems):
        """The packages a failed restore left without their files, each checked against its
        RECORD (only those: a read stays cheap); the record is cleared once they are back."""
        recorded = self.restore_record.load(problems)
        if not recorded:
            return []
        pending = unrestored(dists, recorded)
        if not pending and not self.check_mode:
            cleared = self.restore_record.store([])
            if cleared:
                problems.append(cleared)
        for item in pending:
            item["problem"] = pending_problem(item)
            problems.append(item["problem"])
        return pending

    def run(self, remove=False):
        """The scan's result, as cuda_contamination returns it without a removal (Removal.run()
        removes)."""
        if remove:
            raise ValueError("Contamination only scans: a removal is venv/_removal.py's Removal")
        result = self.scan()[0]
        result["changed"] = False
        return result
