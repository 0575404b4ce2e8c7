"""The sandbox upstream site without its listener: catalogue and orders, fault knobs, the rate limit, and the
order moves that send callbacks. The signed API and the control API are two faces of one site."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from decimal import Decimal

from procurd.protocol.dujiao.ratelimit import RateLimiter
from procurd.sandbox.callbacks import CallbackAttempt, CallbackSender, TaskTracker
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.faults import FaultPlan
from procurd.sandbox.state import SandboxOrder, SandboxState
from procurd.sandbox.traffic import ALL_ENDPOINTS, RequestLog, RequestRecord


class SandboxSite:
    """One upstream site in memory, with the background work its orders cause (deliveries, callbacks).

    ``clock`` replaces the wall clock (``time.time``) for everything the site times: its own clock (plus
    ``clock_offset_seconds``), timestamps, the request log and the rate limit, so tests can move time on
    instead of waiting. Without it the rate limit runs on ``time.monotonic``.
    """

    def __init__(self, config: SandboxConfig | None = None, clock: Callable[[], float] | None = None) -> None:
        self.config = config if config is not None else SandboxConfig()
        self.state = SandboxState(self.config, clock or time.time)
        self.faults = FaultPlan()
        self.request_counts: Counter[str] = Counter()
        self.requests = RequestLog()
        self.callbacks = CallbackSender(self.config, self.state, self.faults)
        self.rate_limiter = RateLimiter(clock or time.monotonic)
        self._closing = asyncio.Event()
        self._deliveries = TaskTracker()

    @property
    def callback_log(self) -> list[CallbackAttempt]:
        """Every callback try, in the order they finished."""
        return self.callbacks.log

    def begin_closing(self) -> None:
        """Hanging and delayed requests end now."""
        self._closing.set()

    async def wait_closing(self, seconds: float | None) -> bool:
        """Wait ``seconds`` (forever for ``None``); True when the site started closing meanwhile."""
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def stop_background(self) -> None:
        """Cancel pending deliveries and callbacks."""
        await self._deliveries.cancel_all()
        await self.callbacks.close()

    # -- requests -------------------------------------------------------------------------------------

    def record_request(
        self, endpoint: str, api_key: str, rate_limited: bool, authenticated: bool | None = None
    ) -> None:
        """Count one request to the signed API (refused ones included)."""
        self.request_counts[endpoint] += 1
        self.request_counts[ALL_ENDPOINTS] += 1
        self.requests.add(RequestRecord(self.state.now(), api_key, endpoint, rate_limited, authenticated))

    def reset_requests(self) -> None:
        """Forget the requests counted so far."""
        self.request_counts.clear()
        self.requests.clear()

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

    def refund(
        self, order_id: int, amount: Decimal | str | None = None, reason: str = "refunded by the site"
    ) -> SandboxOrder:
        """Refund all or part of the order to the wallet; no callback, like the real sites."""
        return self.state.refund(order_id, amount, reason)

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
