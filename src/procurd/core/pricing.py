"""Selling prices from pricing rules, in exact decimal arithmetic, free of I/O.

A rule (``[[pricing.rules]]``) matches SKUs by upstream, category, product, SKU and cost range; the first
matching rule prices a SKU as ``round_up(cost * exchange_rate * (1 + markup_percent / 100) + markup_fixed)``
to a step (``"0.01"``, ``"0.1"``, ``"1"``, ``"5"`` ...) or to the next price ending in ``.99`` (``"x.99"``),
in the rule's currency or the upstream's. :func:`reprice` applies the rules to SKUs as the mirror holds them:
new selling prices, price holds on steep cost increases, the products' cheapest prices, and every change;
:func:`release` prices a held SKU once its hold is released.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_DOWN, Decimal, InvalidOperation
from typing import Final, Literal

X99: Final = "x.99"
CENT: Final = Decimal("0.01")
_NINETY_NINE: Final = Decimal("0.99")
_HUNDRED: Final = Decimal(100)
_CURRENCY = re.compile(r"[A-Za-z0-9]{1,16}")
_MAX_DIGITS = 30
# Wide enough that no sum or product of amounts of up to 30 digits is ever rounded.
_EXACT = decimal.Context(prec=120, traps=[InvalidOperation, decimal.DivisionByZero, decimal.Overflow])

PricedEntity = Literal["sku", "product"]


class RuleError(ValueError):
    """A rule that cannot be used: ``key`` is the offending key, the message says why."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


def parse_amount(key: str, value: object) -> Decimal:
    """A decimal from configuration: text or an integer (a TOML float arrives as a ``Decimal``)."""
    if isinstance(value, bool) or not isinstance(value, str | int | Decimal):
        raise RuleError(key, f'must be a decimal number written as text, like "1.5" (got {value!r})')
    try:
        number = Decimal(value.strip() if isinstance(value, str) else value)
    except InvalidOperation:
        raise RuleError(key, f"{value!r} is not a decimal number") from None
    if not number.is_finite():
        raise RuleError(key, f"{value!r} is not a finite number")
    if len(number.as_tuple().digits) > _MAX_DIGITS:
        raise RuleError(key, f"{value!r} has more than {_MAX_DIGITS} digits")
    return number


@dataclass(frozen=True, slots=True)
class Rounding:
    """Round up to a multiple of ``step``, or (``step`` None) up to the next price ending in .99."""

    step: Decimal | None

    @classmethod
    def parse(cls, text: object) -> Rounding:
        if isinstance(text, str) and text.strip().lower() == X99:
            return cls(None)
        try:
            step = parse_amount("rounding", text)
        except RuleError:
            raise RuleError(
                "rounding", f'{text!r} is not a step such as "0.01", "0.1", "1" or "5", nor "x.99"'
            ) from None
        if step <= 0 or step % CENT != 0:
            raise RuleError("rounding", f"{text!r}: the step must be a positive whole number of cents")
        return cls(step)

    def up(self, amount: Decimal) -> Decimal:
        if self.step is None:
            whole = _EXACT.subtract(amount, _NINETY_NINE).to_integral_value(rounding=ROUND_CEILING)
            return max(whole, Decimal(0)) + _NINETY_NINE
        steps = _EXACT.divide(amount, self.step).to_integral_value(rounding=ROUND_CEILING)
        return _EXACT.multiply(steps, self.step)

    def __str__(self) -> str:
        return X99 if self.step is None else str(self.step)


@dataclass(frozen=True, slots=True)
class PricingRule:
    """One ``[[pricing.rules]]`` entry; ``number`` is its 1-based position in the file."""

    number: int
    upstream: str | None = None
    category_ids: frozenset[int] | None = None
    product_ids: frozenset[int] | None = None
    sku_ids: frozenset[int] | None = None
    min_cost: Decimal | None = None
    max_cost: Decimal | None = None
    exchange_rate: Decimal = Decimal(1)
    markup_percent: Decimal = Decimal(0)
    markup_fixed: Decimal = Decimal(0)
    rounding: Rounding = field(default_factory=lambda: Rounding(CENT))
    currency: str = ""
    exclude: bool = False
    multiplier: Decimal = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        factor = _EXACT.add(1, _EXACT.divide(self.markup_percent, _HUNDRED))
        object.__setattr__(self, "multiplier", _EXACT.multiply(self.exchange_rate, factor))

    @property
    def label(self) -> str:
        return f"[[pricing.rules]] #{self.number}"

    def applies_to(self, upstream: str) -> bool:
        return self.upstream is None or self.upstream == upstream

    def matches(self, upstream: str, sku: SkuFacts, cost: Decimal) -> bool:
        return (
            self.applies_to(upstream)
            and (self.category_ids is None or sku.category_id in self.category_ids)
            and (self.product_ids is None or sku.product_id in self.product_ids)
            and (self.sku_ids is None or sku.id in self.sku_ids)
            and (self.min_cost is None or cost >= self.min_cost)
            and (self.max_cost is None or cost <= self.max_cost)
        )

    def price(self, cost: Decimal) -> Decimal:
        """The selling price of ``cost``, rounded up, with two decimals."""
        factor = _EXACT.add(1, _EXACT.divide(self.markup_percent, _HUNDRED))
        raw = _EXACT.add(
            _EXACT.multiply(_EXACT.multiply(cost, self.exchange_rate), factor), self.markup_fixed
        )
        return self.rounding.up(raw).quantize(CENT, context=_EXACT)

    def margin(self, cost: Decimal) -> Decimal:
        """What the rule adds to ``cost`` (converted) before rounding: negative sells under cost."""
        converted = _EXACT.multiply(cost, self.exchange_rate)
        return _EXACT.add(
            _EXACT.divide(_EXACT.multiply(converted, self.markup_percent), _HUNDRED), self.markup_fixed
        )


def build_rule(
    number: int,
    *,
    upstream: str | None = None,
    category_ids: Iterable[int] | None = None,
    product_ids: Iterable[int] | None = None,
    sku_ids: Iterable[int] | None = None,
    min_cost: object = None,
    max_cost: object = None,
    exchange_rate: object = "1",
    markup_percent: object = "0",
    markup_fixed: object = "0",
    rounding: object = "0.01",
    currency: str = "",
    exclude: bool = False,
) -> PricingRule:
    """A checked rule; :class:`RuleError` names the first key that is wrong and why."""
    ids = {
        name: _ids(name, values)
        for name, values in (
            ("category_ids", category_ids),
            ("product_ids", product_ids),
            ("sku_ids", sku_ids),
        )
    }
    low = None if min_cost is None else parse_amount("min_cost", min_cost)
    high = None if max_cost is None else parse_amount("max_cost", max_cost)
    for key, bound in (("min_cost", low), ("max_cost", high)):
        if bound is not None and bound < 0:
            raise RuleError(key, "must not be negative")
    if low is not None and high is not None and low > high:
        raise RuleError("max_cost", f"{high} is below min_cost {low}")
    rate = parse_amount("exchange_rate", exchange_rate)
    if rate <= 0:
        raise RuleError("exchange_rate", "must be above 0")
    if currency and not _CURRENCY.fullmatch(currency):
        raise RuleError("currency", f"{currency!r} is not a currency code (letters and digits, up to 16)")
    rule = PricingRule(
        number=number,
        upstream=upstream or None,
        category_ids=ids["category_ids"],
        product_ids=ids["product_ids"],
        sku_ids=ids["sku_ids"],
        min_cost=low,
        max_cost=high,
        exchange_rate=rate,
        markup_percent=parse_amount("markup_percent", markup_percent),
        markup_fixed=parse_amount("markup_fixed", markup_fixed),
        rounding=Rounding.parse(rounding),
        currency=currency,
        exclude=exclude,
    )
    if not exclude:
        _check_never_under_cost(rule, low or Decimal(0), high)
    return rule


def _ids(key: str, values: Iterable[int] | None) -> frozenset[int] | None:
    if values is None:
        return None
    ids = frozenset(values)
    if not ids:
        raise RuleError(key, "must name at least one id (leave the key out to match every one)")
    return ids


def _check_never_under_cost(rule: PricingRule, low: Decimal, high: Decimal | None) -> None:
    """The margin is linear in the cost: checking both ends of the cost range covers all of it."""
    key = "markup_percent" if rule.markup_percent < 0 else "markup_fixed"
    if rule.margin(low) < 0:
        raise RuleError(key, f"sells under cost (at a cost of {low})")
    if high is None:
        if rule.markup_percent < 0:
            raise RuleError(
                "markup_percent",
                f"{rule.markup_percent} sells under cost once the cost is high enough (set max_cost, or a "
                "markup_fixed that covers the whole cost range)",
            )
    elif rule.margin(high) < 0:
        raise RuleError(key, f"sells under cost (at a cost of {high})")


def unknown_categories(rules: Sequence[PricingRule], upstream: str, known: Iterable[int]) -> list[str]:
    """Problems of rules of ``upstream`` naming categories the upstream does not have."""
    categories = set(known)
    problems = []
    for rule in rules:
        if rule.category_ids is None or rule.upstream != upstream:
            continue
        missing = sorted(rule.category_ids - categories)
        if missing:
            listed = ", ".join(map(str, missing))
            problems.append(f"{rule.label}: category_ids: {listed} is not a category of upstream {upstream}")
    return problems


# --- repricing --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkuFacts:
    """A mirrored SKU as pricing sees it. ``cost`` is its ``price_amount``; ``live`` is active and listed."""

    id: int
    product_id: int
    category_id: int | None
    cost: str
    live: bool
    sell_price: str | None
    sell_currency: str | None
    held: bool


@dataclass(frozen=True, slots=True)
class ProductFacts:
    id: int
    sell_price: str | None
    sell_currency: str | None


@dataclass(frozen=True, slots=True)
class SkuPrice:
    """What to store on a SKU. ``hold_cost`` set: the SKU is held from now on at its old price."""

    id: int
    sell_price: str | None
    sell_currency: str | None
    hold_cost: str | None = None


@dataclass(frozen=True, slots=True)
class ProductPrice:
    id: int
    sell_price: str | None
    sell_currency: str | None


@dataclass(frozen=True, slots=True)
class PriceChange:
    """A ``mirror_changes`` entry of field ``sell_price``."""

    entity: PricedEntity
    entity_id: int
    old_value: str | None
    new_value: str | None


@dataclass(frozen=True, slots=True)
class NewHold:
    """A SKU held in this repricing: its cost rose from ``old_cost`` to ``new_cost`` by ``percent``."""

    sku_id: int
    product_id: int
    sell_price: str
    old_cost: str
    new_cost: str
    percent: Decimal


@dataclass(slots=True)
class Repricing:
    skus: list[SkuPrice] = field(default_factory=list)
    products: list[ProductPrice] = field(default_factory=list)
    changes: list[PriceChange] = field(default_factory=list)
    new_holds: list[NewHold] = field(default_factory=list)
    priced: int = 0


@dataclass(frozen=True, slots=True)
class Pricing:
    """Everything :func:`reprice` needs besides the facts: the rules, the upstream's currency (from its last
    ping; None when unknown), and the hold threshold (None: holds are off)."""

    rules: tuple[PricingRule, ...]
    upstream_currency: str | None = None
    hold_percent: Decimal | None = None

    def for_upstream(self, upstream: str) -> tuple[PricingRule, ...]:
        return tuple(rule for rule in self.rules if rule.applies_to(upstream))

    def needs_upstream_currency(self, upstream: str) -> bool:
        return any(not rule.currency and not rule.exclude for rule in self.for_upstream(upstream))


def _decimal(text: str | None) -> Decimal | None:
    if text is None:
        return None
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _money(amount: Decimal) -> str:
    return format(amount, "f")


def price_of(upstream: str, sku: SkuFacts, pricing: Pricing) -> tuple[str | None, str | None]:
    """The selling price and currency the rules give ``sku`` (None, None: no price). A price in the
    upstream's currency while that currency is unknown is ``(price, None)``."""
    cost = _decimal(sku.cost)
    if cost is None or cost < 0:
        return None, None
    for rule in pricing.rules:
        if rule.matches(upstream, sku, cost):
            if rule.exclude:
                return None, None
            return _money(rule.price(cost)), rule.currency or pricing.upstream_currency
    return None, None


def reprice(
    upstream: str,
    skus: Sequence[SkuFacts],
    products: Mapping[int, ProductFacts],
    pricing: Pricing,
    *,
    cost_rises: Mapping[int, tuple[str, str]] | None = None,
) -> Repricing:
    """New selling prices for ``skus`` and for the ``products`` they belong to (every SKU of each product
    must be among ``skus``).

    A held SKU keeps its price. An unheld, priced SKU whose cost rose (``cost_rises``: id to old and new
    cost, from this pass) by more than ``pricing.hold_percent`` keeps its price and is held. A product's
    price is its cheapest live priced SKU's, none when those sell in different currencies.
    """
    result = Repricing()
    rises = cost_rises or {}
    current: dict[int, tuple[str | None, str | None]] = {}
    live_by_product: dict[int, list[int]] = {}
    for sku in skus:
        price, currency = price_of(upstream, sku, pricing)
        if price is not None and currency is None:
            price, currency = sku.sell_price, sku.sell_currency  # the upstream's currency is not known yet
        stored = (sku.sell_price, sku.sell_currency)
        if sku.held:
            price, currency = stored
        else:
            hold = _hold(sku, price, rises.get(sku.id), pricing.hold_percent)
            if hold is not None:
                result.new_holds.append(hold)
                result.skus.append(SkuPrice(sku.id, sku.sell_price, sku.sell_currency, hold.new_cost))
                price, currency = stored
            elif (price, currency) != stored:
                result.skus.append(SkuPrice(sku.id, price, currency))
                if price != sku.sell_price:
                    result.changes.append(PriceChange("sku", sku.id, sku.sell_price, price))
        if price is not None:
            result.priced += 1
        current[sku.id] = (price, currency)
        if sku.live:
            live_by_product.setdefault(sku.product_id, []).append(sku.id)
    for product in products.values():
        price, currency = _cheapest(current[sku_id] for sku_id in live_by_product.get(product.id, ()))
        if (price, currency) != (product.sell_price, product.sell_currency):
            result.products.append(ProductPrice(product.id, price, currency))
            if price != product.sell_price:
                result.changes.append(PriceChange("product", product.id, product.sell_price, price))
    return result


@dataclass(frozen=True, slots=True)
class ReleasedHold:
    """A SKU whose price hold was released, and the price it sells at now."""

    upstream: str
    sku_id: int
    sell_price: str | None
    sell_currency: str | None


def release(
    upstream: str,
    sku_id: int,
    skus: Sequence[SkuFacts],
    products: Mapping[int, ProductFacts],
    pricing: Pricing,
) -> tuple[Repricing, ReleasedHold] | None:
    """SKU ``sku_id``'s hold released: the prices of its product (``skus``: every SKU of the product, as
    stored) from the rules and its current cost; None when the SKU is not held."""
    held = next((sku for sku in skus if sku.id == sku_id and sku.held), None)
    if held is None:
        return None
    unheld = [replace(sku, held=False) if sku.id == sku_id else sku for sku in skus]
    repricing = reprice(upstream, unheld, products, pricing)
    price = next((sku for sku in repricing.skus if sku.id == sku_id), None)
    if price is not None:
        return repricing, ReleasedHold(upstream, sku_id, price.sell_price, price.sell_currency)
    return repricing, ReleasedHold(upstream, sku_id, held.sell_price, held.sell_currency)


def _hold(
    sku: SkuFacts, new_price: str | None, rise: tuple[str, str] | None, percent: Decimal | None
) -> NewHold | None:
    if percent is None or rise is None or sku.sell_price is None or new_price is None:
        return None
    old_cost, new_cost = (_decimal(text) for text in rise)
    if old_cost is None or new_cost is None or new_cost <= old_cost:
        return None
    if old_cost <= 0:
        increase = None
    else:
        increase = _EXACT.divide(_EXACT.multiply(new_cost - old_cost, _HUNDRED), old_cost)
        if increase <= percent:
            return None
    shown = increase.quantize(CENT, rounding=ROUND_CEILING) if increase is not None else Decimal(0)
    return NewHold(sku.id, sku.product_id, sku.sell_price, rise[0], rise[1], shown)


def _cheapest(prices: Iterable[tuple[str | None, str | None]]) -> tuple[str | None, str | None]:
    priced = [(Decimal(price), price, currency) for price, currency in prices if price is not None]
    if not priced:
        return None, None
    if len({currency for _, _, currency in priced}) > 1:
        return None, None
    _, price, currency = min(priced, key=lambda item: item[0])
    return price, currency


# --- what a unit may cost ---------------------------------------------------------------------------------


def exchange_rate_of(upstream: str, sku: SkuFacts, rules: Sequence[PricingRule]) -> Decimal | None:
    """The exchange rate of the rule that prices ``sku`` (None: no rule prices it, or one excludes it)."""
    cost = _decimal(sku.cost)
    if cost is None or cost < 0:
        return None
    for rule in rules:
        if rule.matches(upstream, sku, cost):
            return None if rule.exclude else rule.exchange_rate
    return None


def cost_limit(sell_price: str, exchange_rate: Decimal, cost: str) -> str:
    """What a unit may cost upstream for selling it at ``sell_price`` not to be a loss: the selling price
    converted back (divided by the exchange rate), rounded down to the cost's decimals (at least cents)."""
    converted = _EXACT.divide(Decimal(sell_price), exchange_rate)
    cost_exponent = Decimal(cost).as_tuple().exponent
    exponent = min(cost_exponent if isinstance(cost_exponent, int) else -2, -2)
    return _money(converted.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_DOWN, context=_EXACT))
