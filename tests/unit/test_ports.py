"""Test servers get ports below the kernel's ephemeral range, where no outgoing connection takes them first."""

import random
import socket

from tests.support import ports


def test_a_port_is_free_and_below_the_ephemeral_range() -> None:
    port = ports.free_port(random.Random(7))
    assert ports.LOWEST <= port < min(ports.HIGHEST + 1, ports._ephemeral_start())
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free


def test_a_taken_port_is_skipped_and_a_range_without_room_falls_back_to_the_kernel(monkeypatch) -> None:
    first = ports.free_port(random.Random(3))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first))
        assert ports.free_port(random.Random(3)) != first
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports.LOWEST)  # no room below the ephemeral range
    assert ports.free_port() > 0
