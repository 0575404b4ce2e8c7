"""Who this process is: the ``host:pid`` that names it in claims, leases, heartbeats and logs."""

from __future__ import annotations

import os
import socket


def instance_id() -> str:
    """``host:pid`` of this process."""
    return f"{socket.gethostname()}:{os.getpid()}"
