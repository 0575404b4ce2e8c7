"""The sandbox acg-faka shop on one listener: the shared API and the control API."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import structlog
from aiohttp import web

from procurd.sandbox.acgfaka.api import ShopApi
from procurd.sandbox.acgfaka.catalogue import generate
from procurd.sandbox.acgfaka.control import add_control_routes
from procurd.sandbox.acgfaka.faults import ShopFaults
from procurd.sandbox.acgfaka.shop import Shop, ShopConfig
from procurd.sandbox.listener import listen

log = structlog.get_logger("procurd.sandbox")
UNKNOWN = "unknown"
ALL = "*"


@dataclass(frozen=True)
class RequestRecord:
    at: float
    endpoint: str  # "unknown" for a path the shop has not
    app_id: int | None
    authenticated: bool | None  # None: never got as far as the signature

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "endpoint": self.endpoint,
            "app_id": self.app_id,
            "authenticated": self.authenticated,
        }


class AcgFakaSandbox:
    """A faithful acg-faka shop on loopback. ``async with AcgFakaSandbox(ShopConfig(...)) as sandbox:``
    starts it on a free port of 127.0.0.1; ``sandbox.base_url`` is the shop's root (the API is under
    ``/shared``). ``sandbox.shop`` holds its goods, members and orders, ``sandbox.faults`` its knobs."""

    def __init__(
        self,
        config: ShopConfig | None = None,
        clock: Callable[[], float] | None = None,
        *,
        catalogue: bool = True,
    ) -> None:
        self.config = config if config is not None else ShopConfig()
        self.shop = Shop(self.config, clock or time.time)
        if catalogue:
            generate(self.shop, self.config.commodities, self.config.seed)
        self.faults = ShopFaults()
        self.requests: list[RequestRecord] = []
        self.request_counts: Counter[str] = Counter()
        self.base_url = ""
        self._closing = asyncio.Event()
        self._runner: web.AppRunner | None = None

    @property
    def started(self) -> bool:
        return self._runner is not None

    def record(self, endpoint: str | None, app_id: int | None, authenticated: bool | None) -> None:
        """Count one request to the shared API (refused ones included)."""
        name = endpoint or UNKNOWN
        self.request_counts[name] += 1
        self.request_counts[ALL] += 1
        self.requests.append(RequestRecord(self.shop.clock(), name, app_id, authenticated))

    def reset_requests(self) -> None:
        self.requests.clear()
        self.request_counts.clear()

    async def wait_closing(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (forever for ``None``); True when the shop started closing meanwhile."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def build_app(self) -> web.Application:
        app = web.Application()
        add_control_routes(app, self)
        # Every other path reaches the shop's kernel, as its rewrite rule sends it there.
        app.router.add_route("*", "/{tail:[\\s\\S]*}", ShopApi(self).handle)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 = a free port) and return ``base_url``."""
        if self._runner is not None:
            raise RuntimeError("the sandbox is already started")
        self._runner, self.base_url = await listen(self.build_app(), host, port)
        log.info(
            "sandbox.listening", base_url=self.base_url, protocol="acg-faka", version=self.config.version
        )
        return self.base_url

    async def close(self) -> None:
        """Stop listening; requests held by a knob end now."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> AcgFakaSandbox:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
