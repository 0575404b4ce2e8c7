"""The sandbox upstream site: state, fault knobs, the signed API and the control API on one listener."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import Counter
from decimal import Decimal
from types import TracebackType

import structlog
from aiohttp import web

from procurd.sandbox.api import API_PREFIX, SignedApi
from procurd.sandbox.callbacks import CallbackAttempt, CallbackSender, TaskTracker
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.control import add_control_routes
from procurd.sandbox.faults import FaultPlan
from procurd.sandbox.ratelimit import RateLimiter
from procurd.sandbox.state import SandboxOrder, SandboxState

log = structlog.get_logger("procurd.sandbox")
SHUTDOWN_TIMEOUT_SECONDS = 2.0


def _url_host(host: str) -> str:
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


class Sandbox:
    """A faithful upstream site on loopback. ``async with Sandbox(config) as sandbox:`` starts it on a free
    port of 127.0.0.1; ``sandbox.base_url`` is the site root (the API is under ``/api/v1/upstream``)."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config if config is not None else SandboxConfig()
        self.state = SandboxState(self.config)
        self.faults = FaultPlan()
        self.request_counts: Counter[str] = Counter()
        self.callbacks = CallbackSender(self.config, self.state, self.faults)
        self.rate_limiter = RateLimiter(time.monotonic)
        self.base_url = ""
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        self._deliveries = TaskTracker()

    @property
    def api_url(self) -> str:
        """``base_url`` plus ``/api/v1/upstream``."""
        return self.base_url + API_PREFIX

    @property
    def callback_log(self) -> list[CallbackAttempt]:
        """Every callback try, in the order they finished."""
        return self.callbacks.log

    @property
    def started(self) -> bool:
        return self._runner is not None

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", API_PREFIX + "{tail:(/.*)?}", SignedApi(self).dispatch)
        add_control_routes(app, self)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 = a free port) and return ``base_url``."""
        if self._runner is not None:
            raise RuntimeError("the sandbox is already started")
        runner = web.AppRunner(self.build_app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_SECONDS)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        bound_port = runner.addresses[0][1]
        self.base_url = f"http://{_url_host(host)}:{bound_port}"
        log.info("sandbox listening", base_url=self.base_url, products=self.config.products)
        return self.base_url

    async def close(self) -> None:
        """Stop listening, end hanging requests, cancel pending deliveries and callbacks."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self._deliveries.cancel_all()
        await self.callbacks.close()

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

    async def wait_closing(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (forever for ``None``); True when the sandbox started closing meanwhile."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return False
        return True

    # -- orders ---------------------------------------------------------------------------------------

    def orders_for(self, downstream_order_no: str, api_key: str | None = None) -> list[SandboxOrder]:
        """Every order created under ``downstream_order_no`` (by any key, or by ``api_key``)."""
        return self.state.orders_for(downstream_order_no, api_key)

    def order_created(self, order: SandboxOrder) -> None:
        """A new order exists: paid auto orders are delivered right after, in the background."""
        if self.state.needs_auto_delivery(order):
            self._deliveries.spawn(self._auto_deliver(order.order_id))

    async def _auto_deliver(self, order_id: int) -> None:
        await asyncio.sleep(0)  # let the order's own answer go out first
        order = self.state.orders.get(order_id)
        if order is None or not self.state.needs_auto_delivery(order):
            return
        self.state.deliver(order_id)
        self.callbacks.notify(order)

    async def pay(self, order_id: int) -> SandboxOrder:
        """Pay a ``pending_payment`` order (canceled when the wallet is short); auto orders then deliver."""
        order = self.state.pay(order_id)
        self.order_created(order)
        return order

    async def deliver(self, order_id: int, payload: str | None = None) -> SandboxOrder:
        """Deliver a manual or held order: status ``delivered``, a fulfillment, and a callback."""
        order = self.state.deliver(order_id, payload)
        self.callbacks.notify(order)
        return order

    async def complete(self, order_id: int) -> SandboxOrder:
        """``delivered`` to ``completed``, with a callback."""
        order = self.state.complete(order_id)
        self.callbacks.notify(order)
        return order

    def cancel_upstream(self, order_id: int) -> SandboxOrder:
        """The site cancels the order (paid money back to the wallet); real sites send no callback."""
        return self.state.cancel_upstream(order_id)

    def refund(self, order_id: int, amount: Decimal | str | None = None) -> SandboxOrder:
        """Refund all or part of the order to the wallet; no callback, like the real sites."""
        return self.state.refund(order_id, amount)

    async def set_status(self, order_id: int, status: str, callback: bool = True) -> SandboxOrder:
        """Force a status, with a callback unless ``callback`` is False."""
        order = self.state.set_status(order_id, status)
        if callback:
            self.callbacks.notify(order)
        return order

    async def wait_callbacks_idle(self, timeout: float = 10) -> None:
        """Wait until no delivery is pending and no callback is queued, in flight or waiting to retry."""
        async with asyncio.timeout(timeout):
            while True:
                await self._deliveries.wait_idle()
                await self.callbacks.wait_idle()
                if not self._deliveries.busy and not self.callbacks.tasks.busy:
                    return
