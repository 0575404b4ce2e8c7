"""A sandbox's listener: an aiohttp application served on ``host:port``, and the URL it is reached at."""

from __future__ import annotations

import ipaddress

from aiohttp import web

SHUTDOWN_TIMEOUT_SECONDS = 2.0


def url_host(host: str) -> str:
    """The host to put in a URL for a listener bound to ``host``."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]"
    except ValueError:
        pass
    return host


async def listen(
    app: web.Application, host: str, port: int, *, shutdown_timeout: float = SHUTDOWN_TIMEOUT_SECONDS
) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on ``host:port`` (0 = a free port); the runner (its ``cleanup()`` stops it) and the
    URL of its root, ``http://host:port``."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, f"http://{url_host(host)}:{runner.addresses[0][1]}"
