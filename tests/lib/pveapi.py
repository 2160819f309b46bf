# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the Proxmox VE API STAND-IN (tests/standins/pve_api.py) over a fleet's state directory.

    with pveapi.running(state) as api:
        api["url"], api["cafile"], api["token_id"], api["secret"], api["header"]
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys

STANDIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "standins", "pve_api.py")
USER = "gpufleet@pve"
TOKEN = "hygiene"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(state, cert_dir=None, port=None, log=None, plain=False):
    """Start the stand-in over state; yield its url, CA file and token; stop it at the end.
    ``plain``: over plain HTTP (no CA file then), which pveproxy never serves."""
    secret = secrets.token_hex(16)
    token = "%s!%s=%s" % (USER, TOKEN, secret)
    argv = [sys.executable, STANDIN, "--state", str(state), "--port", str(port or free_port()), "--token", token]
    if cert_dir:
        argv += ["--cert-dir", str(cert_dir)]
    if plain:
        argv.append("--plain-http")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log if log is not None else subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the Proxmox VE API stand-in did not start (rc=%s)" % proc.wait(timeout=10))
        info = json.loads(line)
        info.update(user=USER, token_name=TOKEN, token_id="%s!%s" % (USER, TOKEN), secret=secret,
                    header="PVEAPIToken=" + token)
        yield info
    finally:
        proc.terminate()
        proc.wait(timeout=10)
