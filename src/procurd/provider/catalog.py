"""The offered catalogue: the mirror as the provider shows it, kept in step after every catalogue pass and
repricing.

Each product of an offered upstream has a document (seed 000's Product with its SKUs under offered ids, at
the selling prices ``[pricing]`` set in ``[provider] currency``) and an ``updated_at`` that moves whenever the
document does, so downstream sites can ask for what changed (``updated_after``). A refresh rebuilds the
products whose mirror rows were written, removed or repriced since the last one: it follows the mirror's
write times and its change log (two watermarks per upstream). Ids are given once and kept forever
(``provider_ids``). One process refreshes at a time (a lease); another waits for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_UP, Decimal
from typing import Any

import structlog

from procurd.config import Settings
from procurd.core.clock import utcnow
from procurd.core.orders import iso
from procurd.core.pricing import PricingRule, SkuFacts, exchange_rate_of
from procurd.core.provider import CENT, OfferedProduct, OfferedSku, allocate_ids, canonical, offered_document
from procurd.db.database import Database
from procurd.db.views import WithOffered

log = structlog.get_logger("procurd.provider")

LEASE = "provider-catalog"
LEASE_SECONDS = 300.0
LEASE_WAIT_SECONDS = 120.0
CHUNK = 200
# Mirror rows written this long before the last refresh began are read again: a write that committed while
# that refresh read is taken in by the next one.
OVERLAP = timedelta(seconds=60)


@dataclass
class RefreshReport:
    upstreams: list[str]
    products: int = 0  # rebuilt
    changed: int = 0  # whose document changed (or that are new)
    seconds: float = 0.0
    by_upstream: dict[str, int] = field(default_factory=dict)


def _micros(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000)


def _moment(micros: int) -> datetime:
    return datetime.fromtimestamp(micros / 1_000_000, UTC)


class OfferedCatalog:
    """Refreshes the offered catalogue of one installation from its mirror."""

    def __init__(self, database: Database, settings: Settings, holder: str) -> None:
        self.database = database
        self.settings = settings
        self.holder = holder
        self.currency = settings.provider.currency
        self.rules: tuple[PricingRule, ...] = settings.pricing.compiled().rules

    async def refresh(self, upstreams: Sequence[str] | None = None, *, full: bool = False) -> RefreshReport:
        """Bring the offered products of ``upstreams`` (every offered one by default) in step with the
        mirror; ``full`` rebuilds every product (at start-up: the configuration may have changed)."""
        offered = self.settings.offered_upstreams()
        chosen = [name for name in offered if upstreams is None or name in upstreams]
        report = RefreshReport(chosen)
        started = time.perf_counter()
        await self._take_lease()
        try:
            for upstream in chosen:
                rebuilt = await self._refresh_upstream(upstream, full, report)
                report.by_upstream[upstream] = rebuilt
        finally:
            await self.database.write(lambda tx: tx.leases.release(LEASE, self.holder))
        report.seconds = time.perf_counter() - started
        log.info(
            "provider.catalog_refreshed",
            upstreams=chosen,
            products=report.products,
            changed=report.changed,
            full=full,
            seconds=round(report.seconds, 3),
        )
        return report

    async def _take_lease(self) -> None:
        deadline = time.monotonic() + LEASE_WAIT_SECONDS
        while not await self.database.write(
            lambda tx: tx.leases.acquire(LEASE, self.holder, utcnow(), LEASE_SECONDS)
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("another process has been refreshing the offered catalogue too long")
            await asyncio.sleep(0.1)

    async def _refresh_upstream(self, upstream: str, full: bool, report: RefreshReport) -> int:
        began = utcnow()

        def changed(tx: WithOffered) -> tuple[int, list[int]]:
            offered = tx.offered
            up_to = offered.last_change()
            after = offered.state(f"seq:{upstream}")
            since = offered.state(f"since:{upstream}")
            if full or after is None or since is None:
                return up_to, offered.product_ids(upstream)
            return up_to, sorted(offered.changed_products(upstream, after, up_to, _moment(since) - OVERLAP))

        up_to, product_ids = await self.database.read(changed)
        await self.database.write(self._number_categories, upstream)
        taken: dict[str, set[int]] | None = (
            None  # read once, kept up to date while this refresh holds the lease
        )
        rebuilt = 0
        for start in range(0, len(product_ids), CHUNK):
            chunk = product_ids[start : start + CHUNK]
            if taken is None:
                taken = await self.database.read(lambda tx: tx.offered.taken_ids())
            rebuilt_here, changed_here = await self.database.write(self._rebuild, upstream, chunk, taken)
            rebuilt += rebuilt_here
            report.changed += changed_here
        report.products += rebuilt

        def advance(tx: WithOffered) -> None:
            tx.offered.set_state(f"seq:{upstream}", up_to)
            tx.offered.set_state(f"since:{upstream}", _micros(began))

        await self.database.write(advance)
        return rebuilt

    def _number_categories(self, tx: WithOffered, upstream: str) -> None:
        """Give an offered id to every category of the upstream's mirror not numbered yet: a parent with
        no product of its own is offered too, so the downstream sees the same two levels."""
        wanted = [("category", upstream, identity) for identity in tx.offered.category_ids(upstream)]
        known = tx.offered.ids(wanted)
        if len(known) < len(wanted):
            tx.offered.add_ids(allocate_ids(wanted, known, tx.offered.taken_ids()))

    def _rebuild(
        self, tx: WithOffered, upstream: str, product_ids: Sequence[int], taken: dict[str, set[int]]
    ) -> tuple[int, int]:
        """Rebuild the documents of these products (one transaction); how many, and how many changed."""
        rows, skus = tx.offered.mirror_rows(upstream, product_ids)
        products = [self._product(upstream, row, skus.get(int(row["id"]), [])) for row in rows]
        wanted = [("category", upstream, p.category_upstream_id) for p in products]
        wanted += [("product", upstream, p.upstream_id) for p in products]
        wanted += [("sku", upstream, sku.upstream_id) for p in products for sku in p.skus]
        known = tx.offered.ids(wanted)
        if len(known) < len(set(wanted)):
            new = allocate_ids(wanted, known, taken)
            tx.offered.add_ids(new)
            for (entity, _, _), identity in new.items():
                taken.setdefault(entity, set()).add(identity)
            known = {**known, **new}
        ids = {(entity, identity): known[(entity, source, identity)] for entity, source, identity in wanted}
        now = utcnow()
        stamp = iso(now) or ""
        documents = [(product, offered_document(product, ids, stamp)) for product in products]
        digests = tx.offered.digests([known[("product", upstream, p.upstream_id)] for p in products])
        new_rows: list[dict[str, Any]] = []
        changed_rows: list[dict[str, Any]] = []
        for product, built in documents:
            offered_id = built.document["id"]
            values = {
                "category_id": built.document["category_id"],
                "listed": built.listed,
                "document": canonical(built.document),
                "floors": built.floors or None,
                "digest": built.digest,
                "updated_at": now,
            }
            if offered_id not in digests:
                new_rows.append(
                    {"id": offered_id, "upstream": upstream, "upstream_id": product.upstream_id, **values}
                )
            elif digests[offered_id] != built.digest:
                changed_rows.append({"b_id": offered_id, **values})
        tx.offered.write_products(new_rows, changed_rows)
        return len(products), len(new_rows) + len(changed_rows)

    def _product(
        self, upstream: str, row: Mapping[str, Any], skus: Sequence[Mapping[str, Any]]
    ) -> OfferedProduct:
        live_product = bool(row["is_active"]) and row["removed_at"] is None
        offered_skus = [self._sku(upstream, row, sku) for sku in skus]
        fields = {
            name: row[name]
            for name in (
                "slug",
                "title",
                "description",
                "content",
                "seo_meta",
                "images",
                "tags",
                "fulfillment_type",
                "manual_form_schema",
                "created_at",
            )
        }
        return OfferedProduct(
            upstream, int(row["id"]), int(row["category_id"]), fields, live_product, offered_skus
        )

    def _sku(self, upstream: str, product: Mapping[str, Any], sku: Mapping[str, Any]) -> OfferedSku:
        live = bool(sku["is_active"]) and sku["removed_at"] is None
        price = sku["sell_price"] if sku["sell_currency"] == self.currency else None
        floor = None
        if price is not None:
            facts = SkuFacts(
                id=int(sku["id"]),
                product_id=int(sku["product_id"]),
                category_id=int(product["category_id"]),
                cost=str(sku["price_amount"]),
                live=live,
                sell_price=price,
                sell_currency=sku["sell_currency"],
                held=sku["price_held_at"] is not None,
            )
            rate = exchange_rate_of(upstream, facts, self.rules)
            if rate is not None:
                floor = format((Decimal(facts.cost) * rate).quantize(CENT, rounding=ROUND_UP), "f")
        return OfferedSku(
            upstream_id=int(sku["id"]),
            sku_code=str(sku["sku_code"]),
            spec_values=sku["spec_values"],
            price=price,
            floor=floor,
            stock_status=str(sku["stock_status"]),
            stock_quantity=int(sku["stock_quantity"]),
            active=live,
        )
