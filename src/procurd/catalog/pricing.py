"""Selling prices in the mirror: repricing from ``[pricing]``, through the pricing port.

The arithmetic is :mod:`procurd.core.pricing`; here is the order of the steps around it: the upstream's
currency (asked of it once when unknown), what the rules need to know of the mirror, and the products
repriced a few hundred per transaction (:meth:`procurd.catalog.ports.PricingStorage.reprice`: every repricing
reads the SKUs it prices under row locks in the transaction that writes their new prices, so two instances,
or a pass and a release, never write prices computed from costs that changed meanwhile).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import structlog

from procurd.catalog.ports import CurrencySource, PriceWrite, PricingStorage
from procurd.config import PricingSettings
from procurd.core.clock import utcnow
from procurd.core.pricing import NewHold, Pricing, Repricing, unknown_categories
from procurd.upstream.errors import UpstreamError
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.catalog.pricing")

PRODUCTS_PER_TRANSACTION = 500


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


async def upstream_currency(
    storage: PricingStorage, upstream: str, client: CurrencySource | None
) -> str | None:
    """The upstream's currency from its last ping; pings it (and records the currency) when none is known."""
    known = await storage.currency(upstream)
    if known is not None or client is None:
        return known
    try:
        answer = await client.ping(priority=Priority.CATALOG)
    except UpstreamError as exc:
        log.warning("pricing.currency_unknown", upstream=upstream, error=str(exc))
        return None
    await storage.record_currency(upstream, answer.currency, utcnow())
    return answer.currency


async def reprice_products(
    storage: PricingStorage,
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
    if not rules and not await storage.has_prices(upstream):
        return report
    pricing = await with_currency(storage, upstream, pricing, client)
    if pricing.upstream_currency is None and pricing.needs_upstream_currency(upstream):
        report.problems.append(
            f"the currency of upstream {upstream} is not known yet (no successful ping): prices in it are "
            "left as they were"
        )
    if any(rule.category_ids is not None and rule.upstream == upstream for rule in rules):
        known = await storage.category_ids(upstream)
        report.problems.extend(unknown_categories(rules, upstream, known))
    if product_ids is None:
        product_ids = await storage.product_ids(upstream)
    ordered = sorted(product_ids)
    for start in range(0, len(ordered), PRODUCTS_PER_TRANSACTION):
        chunk = ordered[start : start + PRODUCTS_PER_TRANSACTION]
        write = PriceWrite(utcnow(), cost_rises, run_id, log_changes)
        repricing = await storage.reprice(upstream, pricing, chunk, write)
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


async def with_currency(
    storage: PricingStorage, upstream: str, pricing: Pricing, client: CurrencySource | None
) -> Pricing:
    """``pricing`` with the upstream's currency, when a rule of the upstream prices in it (None while it is
    not known)."""
    currency = None
    if pricing.needs_upstream_currency(upstream):
        currency = await upstream_currency(storage, upstream, client)
    return Pricing(pricing.rules, currency, pricing.hold_percent)
