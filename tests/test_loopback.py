"""Ports chosen ahead of time for listeners on 127.0.0.1."""

from __future__ import annotations

import socket

from procurd.loopback import _ephemeral_floor, unused_ports


def test_ports_are_distinct_free_and_outside_the_kernels_own_range() -> None:
    """Every port of one call differs from the others, can be bound, and lies below the range the kernel
    gives to port-0 listeners, so a server bound to port 0 afterwards cannot take one of them."""
    ports = unused_ports(50)
    assert len(set(ports)) == 50
    assert all(1024 < port < _ephemeral_floor() for port in ports)
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
