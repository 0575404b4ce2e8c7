"""The sandbox upstream on one listener: the site, its signed API and its control API."""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import structlog
from aiohttp import web

from procurd.sandbox.api import API_PREFIX, signed_api
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.control import add_control_routes
from procurd.sandbox.listener import listen
from procurd.sandbox.site import SandboxSite

log = structlog.get_logger("procurd.sandbox")


class Sandbox(SandboxSite):
    """A faithful upstream site on loopback. ``async with Sandbox(config) as sandbox:`` starts it on a free
    port of 127.0.0.1; ``sandbox.base_url`` is the site root (the API is under ``/api/v1/upstream``)."""

    def __init__(self, config: SandboxConfig | None = None, clock: Callable[[], float] | None = None) -> None:
        super().__init__(config, clock)
        self.base_url = ""
        self._runner: web.AppRunner | None = None

    @property
    def api_url(self) -> str:
        """``base_url`` plus ``/api/v1/upstream``."""
        return self.base_url + API_PREFIX

    @property
    def started(self) -> bool:
        return self._runner is not None

    def build_app(self) -> web.Application:
        app = web.Application()
        # Any character after the prefix, a newline (a decoded %0A) included: the API answers every path.
        app.router.add_route("*", API_PREFIX + "{tail:(/[\\s\\S]*)?}", signed_api(self).dispatch)
        add_control_routes(app, self)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 = a free port) and return ``base_url``."""
        if self._runner is not None:
            raise RuntimeError("the sandbox is already started")
        self._runner, self.base_url = await listen(self.build_app(), host, port)
        log.info("sandbox.listening", base_url=self.base_url, products=self.config.products)
        return self.base_url

    async def close(self) -> None:
        """Stop listening, end hanging requests, cancel pending deliveries and callbacks."""
        self.begin_closing()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.stop_background()

    async def __aenter__(self) -> Sandbox:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
