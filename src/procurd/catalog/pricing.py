"""Selling prices in the mirror: repricing from ``[pricing]`` and price holds, on the database.

The arithmetic is :mod:`procurd.core.pricing`; here are the transactions around it. Every repricing reads
the SKUs it prices under row locks (PostgreSQL) in the same transaction that writes their new prices, so two
instances, or a pass and a release, never write prices computed from costs that changed meanwhile.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

import structlog

from procurd.config import PricingSettings
from procurd.core.pricing import NewHold, Pricing, Repricing, reprice, unknown_categories
from procurd.db.database import Database
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.protocol.dujiao.models import PingResult
from procurd.upstream.errors import UpstreamError
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.catalog.pricing")

PRODUCTS_PER_TRANSACTION = 500


class CurrencySource(Protocol):
    """What repricing needs of an upstream client: a ping tells the upstream's currency."""

    async def ping(self, *, priority: Priority = ...) -> PingResult: ...


@dataclass(slots=True)
class RepriceReport:
    """The outcome of repricing one upstream (after a pass, at start-up, or by ``procurd catalog reprice``).

    ``new_holds`` are the SKUs held by this repricing: what alert ``price_held`` reports.
    """

    upstream: str
    priced: int = 0
    sku_prices_changed: int = 0
    product_prices_changed: int = 0
    new_holds: list[NewHold] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(self, repricing: Repricing) -> None:
        self.priced += repricing.priced
        self.sku_prices_changed += sum(1 for change in repricing.changes if change.entity == "sku")
        self.product_prices_changed += sum(1 for change in repricing.changes if change.entity == "product")
        self.new_holds.extend(repricing.new_holds)


async def upstream_currency(database: Database, upstream: str, client: CurrencySource | None) -> str | None:
    """The upstream's currency from its last ping; pings it (and records the currency) when none is known."""
    known = await database.read(lambda tx: tx.health.currency(upstream))
    if known is not None or client is None:
        return known
    try:
        answer = await client.ping(priority=Priority.CATALOG)
    except UpstreamError as exc:
        log.warning("pricing.currency_unknown", upstream=upstream, error=str(exc))
        return None
    now = utcnow()
    await database.write(lambda tx: tx.health.update(upstream, {"currency": answer.currency}, now))
    return answer.currency


def reprice_products(
    tx: Tx,
    upstream: str,
    pricing: Pricing,
    product_ids: Collection[int] | None,
    *,
    cost_rises: Mapping[int, tuple[str, str]] | None = None,
    run_id: int | None = None,
    now: datetime,
    log_changes: bool = True,
) -> Repricing:
    """Reprice the SKUs of ``product_ids`` (all of the upstream's when None) and those products, in ``tx``."""
    skus, products = tx.mirror.pricing_facts(upstream, product_ids)
    repricing = reprice(upstream, skus, products, pricing, cost_rises=cost_rises)
    tx.mirror.write_prices(upstream, repricing, run_id=run_id, now=now, log=log_changes)
    return repricing


async def reprice_upstream(
    database: Database,
    upstream: str,
    settings: PricingSettings,
    *,
    client: CurrencySource | None = None,
    product_ids: Collection[int] | None = None,
    cost_rises: Mapping[int, tuple[str, str]] | None = None,
    run_id: int | None = None,
    log_changes: bool = True,
) -> RepriceReport:
    """Reprice ``product_ids`` of ``upstream`` (every product when None), a few hundred per transaction.

    With no rule for the upstream and no price in its mirror there is nothing to do, and nothing is read.
    """
    report = RepriceReport(upstream)
    pricing = settings.compiled()
    rules = pricing.for_upstream(upstream)
    if product_ids is not None and not product_ids:
        return report
    if not rules and not await database.read(lambda tx: tx.mirror.has_prices(upstream)):
        return report
    currency = None
    if pricing.needs_upstream_currency(upstream):
        currency = await upstream_currency(database, upstream, client)
        if currency is None:
            report.problems.append(
                f"the currency of upstream {upstream} is not known yet (no successful ping): prices in it "
                "are left as they were"
            )
    pricing = Pricing(pricing.rules, currency, pricing.hold_percent)
    if any(rule.category_ids is not None and rule.upstream == upstream for rule in rules):
        known = await database.read(lambda tx: tx.mirror.category_ids(upstream))
        report.problems.extend(unknown_categories(rules, upstream, known))
    if product_ids is None:
        product_ids = await database.read(lambda tx: tx.mirror.product_ids(upstream))
    ordered = sorted(product_ids)
    for start in range(0, len(ordered), PRODUCTS_PER_TRANSACTION):
        chunk = ordered[start : start + PRODUCTS_PER_TRANSACTION]
        repricing = await database.write(
            reprice_products,
            upstream,
            pricing,
            chunk,
            cost_rises=cost_rises,
            run_id=run_id,
            now=utcnow(),
            log_changes=log_changes,
        )
        report.add(repricing)
    for problem in report.problems:
        log.warning("pricing.problem", upstream=upstream, problem=problem)
    for hold in report.new_holds:
        log.warning(
            "pricing.held",
            upstream=upstream,
            sku_id=hold.sku_id,
            sell_price=hold.sell_price,
            old_cost=hold.old_cost,
            new_cost=hold.new_cost,
            percent=str(hold.percent),
        )
    return report


@dataclass(frozen=True, slots=True)
class ReleasedHold:
    upstream: str
    sku_id: int
    sell_price: str | None
    sell_currency: str | None


async def release_hold(
    database: Database,
    upstream: str,
    sku_id: int,
    settings: PricingSettings,
    *,
    client: CurrencySource | None = None,
) -> ReleasedHold | None:
    """Release a SKU's price hold and price it from the rules and its current cost at once (one
    transaction); None when the SKU is not held."""
    pricing = settings.compiled()
    currency = None
    if pricing.needs_upstream_currency(upstream):
        currency = await upstream_currency(database, upstream, client)
    pricing = Pricing(pricing.rules, currency, pricing.hold_percent)
    now = utcnow()

    def release(tx: Tx) -> ReleasedHold | None:
        product_id = tx.mirror.product_of_sku(upstream, sku_id)
        if product_id is None:
            return None
        # The product's rows are locked first, in the order every repricing locks them.
        skus, products = tx.mirror.pricing_facts(upstream, [product_id])
        held = next((sku for sku in skus if sku.id == sku_id and sku.held), None)
        if held is None:
            return None
        tx.mirror.release_hold(upstream, sku_id)
        skus = [replace(sku, held=False) if sku.id == sku_id else sku for sku in skus]
        repricing = reprice(upstream, skus, products, pricing)
        tx.mirror.write_prices(upstream, repricing, run_id=None, now=now)
        price = next((sku for sku in repricing.skus if sku.id == sku_id), None)
        if price is not None:
            return ReleasedHold(upstream, sku_id, price.sell_price, price.sell_currency)
        return ReleasedHold(upstream, sku_id, held.sell_price, held.sell_currency)

    released = await database.write(release)
    if released is not None:
        log.info("pricing.hold_released", upstream=upstream, sku_id=sku_id, sell_price=released.sell_price)
    return released


async def holds(database: Database, upstream: str | None = None) -> list[dict[str, Any]]:
    """Held SKUs as JSON-ready dicts, oldest hold first."""
    rows = await database.read(lambda tx: tx.mirror.holds(upstream))
    return [
        {
            "upstream": row["upstream"],
            "sku_id": row["sku_id"],
            "product_id": row["product_id"],
            "sku_code": row["sku_code"],
            "title": row["title"],
            "cost": row["cost"],
            "held_cost": row["held_cost"],
            "sell_price": row["sell_price"],
            "sell_currency": row["sell_currency"],
            "price_held_at": row["price_held_at"].isoformat() if row["price_held_at"] else None,
        }
        for row in rows
    ]
