"""An acg-faka supplier as the engine sees every upstream (:class:`procurd.upstream.interface.Upstream`):
its catalogue in seed 000's shape (:mod:`.catalogue`), its trades (:mod:`.trading`) and a ping, over one
:class:`~procurd.protocol.acgfaka.client.AcgFakaClient`."""

from __future__ import annotations

from collections.abc import Container
from datetime import datetime
from decimal import Decimal
from typing import Any, Self, overload

from procurd.config import UpstreamSettings
from procurd.protocol.acgfaka.catalogue import AcgFakaCatalogue
from procurd.protocol.acgfaka.client import AcgFakaClient, Features
from procurd.protocol.acgfaka.ports import ChoiceBook, TradeBook
from procurd.protocol.acgfaka.trading import AcgFakaTrading
from procurd.protocol.transport import RequestObserver
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

CENT = Decimal("0.01")


class AcgFakaUpstream:
    """One acg-faka supplier, as one member account."""

    def __init__(
        self,
        settings: UpstreamSettings,
        *,
        choices: ChoiceBook,
        trades: TradeBook,
        limiter: RateLimiter | None = None,
        observer: RequestObserver | None = None,
    ) -> None:
        self.client = AcgFakaClient(settings, limiter=limiter, observer=observer)
        self.catalogue = AcgFakaCatalogue(
            settings, self.client, choices, requests_per_pass=settings.catalog_requests_per_pass
        )
        self.trading = AcgFakaTrading(settings, self.client, choices, trades)

    def __repr__(self) -> str:
        return f"AcgFakaUpstream({self.client!r})"

    @property
    def name(self) -> str:
        return self.client.name

    @property
    def protocol(self) -> str:
        return "acg-faka"

    @property
    def settings(self) -> UpstreamSettings:
        return self.client.settings

    @property
    def limiter(self) -> RateLimiter:
        return self.client.limiter

    async def close(self) -> None:
        self.catalogue.close()
        await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def ping(self, *, priority: Priority = Priority.PING) -> PingResult:
        """The shop's name and the member's balance, in the block's ``currency`` (acg-faka reports none).
        The member id is the block's ``app_id``; no clock offset (nothing dates its
        answers for a signature)."""
        connected = await self.client.connect(priority=priority)
        return PingResult(
            site_name=connected.shop_name or None,
            protocol_version=None,
            user_id=int(self.settings.app_id),
            balance=_cents(connected.balance),
            currency=self.settings.currency or "",
            latency_ms=connected.latency_ms,
        )

    async def catalog_categories(self, *, priority: Priority = Priority.CATALOG) -> list[dict[str, Any]]:
        return await self.catalogue.catalog_categories(priority=priority)

    def catalog_notes(self) -> list[str]:
        """What the latest listing could not mirror, and why (the pass records them on its run)."""
        return self.catalogue.catalog_notes()

    def catalog_complete(self) -> bool:
        """Whether the latest listing handed on every commodity the shop lists (a pass removes nothing
        after one that did not)."""
        return self.catalogue.catalog_complete()

    async def features(self, *, priority: Priority = Priority.PING, fresh: bool = True) -> Features:
        """Which of the later endpoints the supplier's version has (asked again unless ``fresh`` is
        False and they were asked within the hour)."""
        return await self.catalogue.features(priority=priority, fresh=fresh)

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
    ) -> CatalogPage | SeenPage: ...

    async def catalog_page(
        self,
        page: int = 1,
        page_size: int = 20,
        *,
        updated_after: datetime | None = None,
        priority: Priority = Priority.CATALOG,
        seen: Container[bytes] | None = None,
    ) -> CatalogPage | SeenPage:
        return await self.catalogue.catalog_page(
            page, page_size, updated_after=updated_after, priority=priority, seen=seen
        )

    async def product(self, product_id: int, *, priority: Priority = Priority.CATALOG) -> Product:
        return await self.catalogue.product(product_id, priority=priority)

    async def create_order(
        self, request: CreateOrderRequest, *, priority: Priority = Priority.ORDER
    ) -> OrderCreated:
        return await self.trading.create_order(request, priority=priority)

    async def get_order(self, order_id: int, *, priority: Priority = Priority.POLL) -> UpstreamOrder:
        return await self.trading.get_order(order_id, priority=priority)

    async def cancel_order(self, order_id: int, *, priority: Priority = Priority.ORDER) -> CancelResult:
        return await self.trading.cancel_order(order_id, priority=priority)


def _cents(amount: Decimal) -> Decimal:
    """A balance the shop printed as a float (``1000.0``) with its cents (``1000.00``); never rounded."""
    exponent = amount.as_tuple().exponent
    return amount.quantize(CENT) if isinstance(exponent, int) and exponent > -2 else amount
