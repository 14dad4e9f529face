"""Free TCP ports for the servers tests start, taken where no outgoing connection can take them first.

A port the kernel hands out for ``bind(0)`` comes from its ephemeral range, the same range it draws the local
ports of outgoing connections from. Between choosing such a port and the server binding it (seconds, while
Ray starts), any process's outgoing connection may take it: a CI run once saw Serve's proxy fail with "Address
already in use" that way. So the ports come from below the ephemeral range instead, above Ray's worker ports
(10002-19999) and clear of Serve's direct-ingress ports (30000 and up).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST, HIGHEST = 20000, 29999
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(rng: random.Random | None = None) -> int:
    """A port on 127.0.0.1 that is free now and below the ephemeral range (the kernel's own pick if none is)."""
    rng = rng or random.Random()
    highest = min(HIGHEST, _ephemeral_start() - 1)
    for port in rng.sample(range(LOWEST, highest + 1), min(200, max(0, highest - LOWEST + 1))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
