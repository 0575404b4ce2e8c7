"""What the engine needs of an upstream, whatever protocol it speaks.

The catalogue pass, the state path (submitters, pollers, claim confirmation, upstream-first cancel), pings,
the probe and reconciliation hold an :class:`Upstream` and nothing more specific. Dujiao-Next's client
(:class:`procurd.protocol.dujiao.client.UpstreamClient`) meets it as it is; an acg-faka supplier is met by
its adapter in :mod:`procurd.protocol.acgfaka`. The runtime builds the one each ``[[upstreams]]`` block's
``protocol`` names; nothing above it asks which protocol an upstream speaks except to name it
(:attr:`Upstream.protocol`: status, the console, the metrics).

Every answer is in :mod:`procurd.upstream.models` (seed 000's vocabulary); every failure is an
:class:`~procurd.upstream.errors.UpstreamError`.
"""

from __future__ import annotations

from collections.abc import Container
from datetime import datetime
from typing import Any, Protocol, overload, runtime_checkable

from procurd.upstream.models import (
    CancelResult,
    CatalogPage,
    CreateOrderRequest,
    OrderCreated,
    PingResult,
    Product,
    SeenPage,
    UpstreamOrder,
)
from procurd.upstream.ratelimit import Priority, RateLimiter


@runtime_checkable
class Upstream(Protocol):
    """One upstream as the engine sees it."""

    @property
    def name(self) -> str: ...

    @property
    def protocol(self) -> str:
        """``"dujiao"`` or ``"acg-faka"``: what the settings name, for people to read."""

    @property
    def limiter(self) -> RateLimiter: ...

    async def close(self) -> None: ...

    async def ping(self, *, priority: Priority = ...) -> PingResult:
        """Balance, currency, site, version, latency and, where the protocol tells it, the clock offset."""

    async def catalog_categories(self, *, priority: Priority = ...) -> list[dict[str, Any]]: ...

    @overload
    async def catalog_page(
        self,
        page: int = ...,
        page_size: int = ...,
        *,
        updated_after: datetime | None = ...,
        priority: Priority = ...,
        seen: None = ...,
    ) -> CatalogPage: ...

    @overload
    async def catalog_page(
        self,
        page: int = ...,
        page_size: int = ...,
        *,
        updated_after: datetime | None = ...,
        priority: Priority = ...,
        seen: Container[bytes],
    ) -> CatalogPage | SeenPage:
        """Page ``page`` of the products in seed 000's shape, or :class:`SeenPage` when its body's digest is
        among ``seen`` (a protocol without pages answers its whole listing as page 1)."""

    async def product(self, product_id: int, *, priority: Priority = ...) -> Product: ...

    async def create_order(self, request: CreateOrderRequest, *, priority: Priority = ...) -> OrderCreated:
        """Buy one procurement. Raises :class:`~procurd.upstream.errors.OutcomeUnknown` when the protocol
        cannot tell whether the purchase happened (never sent again automatically)."""

    async def get_order(self, order_id: int, *, priority: Priority = ...) -> UpstreamOrder: ...

    async def cancel_order(self, order_id: int, *, priority: Priority = ...) -> CancelResult: ...
