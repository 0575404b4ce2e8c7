"""The systemd notify protocol without a C library: datagrams to ``$NOTIFY_SOCKET``."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger("procurd.systemd")


class Notifier:
    """Sends ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1`` and ``STATUS=...`` when run under systemd."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]  # the abstract namespace
        self.address = address
        self.watchdog_interval = self._watchdog_interval(environ)

    @staticmethod
    def _watchdog_interval(environ: Mapping[str, str]) -> float | None:
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        if not usec.isdigit() or int(usec) == 0:
            return None
        if pid and pid != str(os.getpid()):
            return None  # the watchdog is meant for another process
        return int(usec) / 1_000_000 / 2

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def notify(self, *lines: str) -> bool:
        """Send one datagram; ``False`` when not under systemd or the socket is gone (never raises)."""
        if not self.address:
            return False
        message = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.connect(self.address)
                sock.sendall(message)
        except OSError as exc:
            log.warning("systemd.notify_failed", error=type(exc).__name__)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def stopping(self, status: str = "") -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={status}"] if status else []))

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    async def run_watchdog(self, stop: asyncio.Event) -> None:
        """Ping the watchdog from the event loop itself, so a hung loop stops the pings and gets restarted."""
        if self.watchdog_interval is None:
            return
        while not stop.is_set():
            self.notify("WATCHDOG=1")
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.watchdog_interval)
            except TimeoutError:
                continue
