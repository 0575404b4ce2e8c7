"""Where a procurement buys (pure): the limit a unit may cost, and which of an offer's sources can be bought.

A SKU item has one source. An offer's item has several, in the operator's order: it takes the first whose
mirrored SKU and product are active, in stock for the quantity and within the limit, and moves on to the
next one when the upstream refuses a source before any money moved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from procurd.core.pricing import PricingRule, SkuFacts, cost_limit, exchange_rate_of
from procurd.core.procurement import MirroredSku, SourceRef


@dataclass(frozen=True, slots=True)
class Skipped:
    """A source passed over, and why (``reason`` is a code, ``message`` says it for a person)."""

    source: SourceRef
    reason: str
    message: str


def over_limit(price: str, limit: str | None, given: bool = False) -> tuple[str, str] | None:
    """``price_above_limit`` when ``price`` is above ``limit`` (``given``: the item's own max_unit_price)."""
    if limit is not None and Decimal(price) > Decimal(limit):
        what = "max_unit_price" if given else "the limit from the selling price"
        return "price_above_limit", f"mirrored unit price {price} is above {what} {limit}"
    return None


def source_problem(
    source: SourceRef,
    sku: MirroredSku | None,
    quantity: int,
    manual_form_data: Mapping[str, Any] | None,
    limit_given: bool = False,
) -> tuple[str, str] | None:
    """Why ``source`` cannot be bought now as the mirror knows it, or ``None``."""
    if sku is None:
        return "sku_not_found", f"SKU {source.sku_id} of {source.upstream} is not in the mirrored catalogue"
    return (
        sku.problem(manual_form_data)
        or sku.stock_problem(quantity)
        or over_limit(sku.price_amount, source.limit, limit_given)
    )


def listing_problem(source: SourceRef, sku: MirroredSku | None) -> tuple[str, str] | None:
    """Why ``source`` cannot be sold now (not mirrored, inactive, out of stock), whatever the order."""
    if sku is None:
        return "sku_not_found", f"SKU {source.sku_id} of {source.upstream} is not in the mirrored catalogue"
    problem = sku.problem(None)
    if problem is not None and problem[0] == "manual_form_data_required":
        problem = None  # the buyer's form comes with the order
    return problem or sku.stock_problem(1)


def first_available(
    sources: Sequence[SourceRef],
    start: int,
    mirror: Mapping[tuple[str, int], MirroredSku],
    quantity: int,
    manual_form_data: Mapping[str, Any] | None,
    limit_given: bool = False,
) -> tuple[int | None, list[Skipped]]:
    """The position of the first source from ``start`` on that can be bought, and the ones passed over."""
    skipped: list[Skipped] = []
    for position in range(start, len(sources)):
        source = sources[position]
        sku = mirror.get((source.upstream, source.sku_id))
        problem = source_problem(source, sku, quantity, manual_form_data, limit_given)
        if problem is None:
            return position, skipped
        skipped.append(Skipped(source, *problem))
    return None, skipped


def default_limit(upstream: str, sku: MirroredSku, rules: Sequence[PricingRule]) -> str | None:
    """The limit of an item that names none: the SKU's selling price converted back to the upstream's
    currency (``None`` when no rule prices it)."""
    return _limit_from(upstream, sku, sku.sell_price, rules)


def offer_limits(
    sources: Sequence[tuple[str, int]],
    mirror: Mapping[tuple[str, int], MirroredSku],
    in_use: tuple[str, int] | None,
    max_unit_price: str | None,
    rules: Sequence[PricingRule],
) -> tuple[SourceRef, ...]:
    """Each source of an offer with its limit: ``max_unit_price`` when given; otherwise the selling price of
    the source in use when the order was accepted (what the shop charged), converted back with each source's
    own rule; a source that sells in another currency is limited by its own selling price."""
    reference = mirror.get(in_use) if in_use is not None else None
    refs = []
    for upstream, sku_id in sources:
        limit = max_unit_price
        sku = mirror.get((upstream, sku_id))
        if limit is None and sku is not None:
            if (
                reference is not None
                and reference.sell_price
                and sku.sell_currency == reference.sell_currency
            ):
                limit = _limit_from(upstream, sku, reference.sell_price, rules)
            else:
                limit = default_limit(upstream, sku, rules)
        refs.append(SourceRef(upstream, sku_id, limit))
    return tuple(refs)


def selling_terms(
    upstream: str,
    sku: MirroredSku | None,
    rules: Sequence[PricingRule],
    charged: tuple[str, str] | None = None,
) -> tuple[str, str | None, str | None] | None:
    """The selling price known when an item bought as ``sku`` is taken in, as ``(unit price, currency,
    exchange rate)``: ``charged`` (what a downstream site paid a unit, and its currency) or the SKU's selling
    price, with the exchange rate of the rule that prices the SKU (``None`` when no rule does). ``None`` when
    no price is known."""
    price, currency = charged or (None if sku is None else sku.sell_price, None)
    if not price:
        return None
    if sku is None:
        return price, currency, None
    rate = exchange_rate_of(upstream, _facts(sku), rules)
    return price, currency or sku.sell_currency, None if rate is None else str(rate)


def _facts(sku: MirroredSku) -> SkuFacts:
    return SkuFacts(
        id=sku.id, product_id=sku.product_id, category_id=sku.category_id, cost=sku.price_amount, live=True,
        sell_price=sku.sell_price, sell_currency=sku.sell_currency, held=False,
    )  # fmt: skip


def _limit_from(
    upstream: str, sku: MirroredSku, sell_price: str | None, rules: Sequence[PricingRule]
) -> str | None:
    if not sell_price:
        return None
    rate = exchange_rate_of(upstream, _facts(sku), rules)
    return None if rate is None else cost_limit(sell_price, rate, sku.price_amount)
