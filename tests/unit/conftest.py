# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args


@pytest.fixture
def run_module(capsys):
    """Run a module's main() with args; return (failed, result) parsed from its JSON."""

    def _run(main, args, check_mode=False, diff=False):
        args = dict(args)
        if check_mode:
            args["_ansible_check_mode"] = True
        if diff:
            args["_ansible_diff"] = True
        with patch_module_args(args), pytest.raises(SystemExit) as exc:
            main()
        out = capsys.readouterr().out
        result = json.loads(out)
        assert bool(result.get("failed")) == (exc.value.code != 0)
        return result

    return _run
