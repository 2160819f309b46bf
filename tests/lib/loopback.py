# Copyright (c) gpufleet.hygiene contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A TCP server on 127.0.0.1 for the tests of what the collection's SSH clients do with a node
that answers badly: each connection is handed to ``handle`` on a thread that accepts them in
turn (tests/unit/plugins/connection, tests/unit/plugins/inventory)."""

from __future__ import annotations

import contextlib
import socket
import threading


@contextlib.contextmanager
def loopback_server(handle):
    """Yields the port; ``handle(client)`` is called for every connection, in the order they
    come. The listening socket is closed on the way out (the accepting thread then ends)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)

    def serve():
        while True:
            try:
                client, _addr = server.accept()
            except OSError:
                return
            handle(client)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
