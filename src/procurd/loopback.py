"""Ports for listeners on 127.0.0.1 that the demo, the tests and the benchmarks configure ahead of time."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10_000
_choice = random.SystemRandom()


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out by itself (to ``bind(0)`` and outgoing connections)."""
    try:
        return int(EPHEMERAL_RANGE_FILE.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def unused_ports(count: int) -> list[int]:
    """``count`` different ports free on 127.0.0.1, below the kernel's ephemeral range.

    A port is configured now and bound later, so it is taken outside the range the kernel picks from:
    a listener bound to port 0 or an outgoing connection made in between cannot land on it. The ports are
    held open together while chosen, so the same call never returns one twice.
    """
    ceiling = _ephemeral_floor()
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        while len(ports) < count:
            candidate = _choice.randrange(LOWEST_PORT, ceiling)
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            ports.append(candidate)
        return ports
