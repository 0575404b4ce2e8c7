"""Selling prices from pricing rules: exact rounding, currency conversion, cost tiers, exclusions, holds, and
the checks that refuse unusable rules."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from procurd.core.pricing import (
    PriceChange,
    PricedEntity,
    Pricing,
    PricingRule,
    ProductFacts,
    ReleasedHold,
    RuleError,
    SkuFacts,
    build_rule,
    price_of,
    release,
    reprice,
    unknown_categories,
)


def sku(
    identity: int = 1,
    cost: str = "10.00",
    *,
    product_id: int = 100,
    category_id: int | None = 12,
    live: bool = True,
    sell_price: str | None = None,
    sell_currency: str | None = None,
    held: bool = False,
) -> SkuFacts:
    return SkuFacts(identity, product_id, category_id, cost, live, sell_price, sell_currency, held)


def priced(cost: str, currency: str | None = "CNY", **rule: Any) -> tuple[str | None, str | None]:
    return price_of("main", sku(cost=cost), Pricing((build_rule(1, **rule),), currency))


@pytest.mark.parametrize(
    ("rounding", "cost", "expected"),
    [
        ("0.01", "10.00", "12.00"),
        ("0.01", "9.99", "11.99"),  # 11.988 up to the cent
        ("0.01", "0.01", "0.02"),  # 0.012
        ("0.1", "9.99", "12.00"),  # 11.988 up to a tenth
        ("0.1", "10.00", "12.00"),  # already a multiple: unchanged
        ("1", "10.01", "13.00"),  # 12.012
        ("1", "10.00", "12.00"),
        ("5", "10.00", "15.00"),
        ("5", "12.50", "15.00"),  # exactly 15
        ("x.99", "10.00", "12.99"),
        ("x.99", "9.99", "11.99"),  # 11.988 -> 11.99
        ("x.99", "10.825", "12.99"),  # exactly 12.99
        ("x.99", "0.10", "0.99"),
        ("X.99", "10.00", "12.99"),
    ],
)
def test_rounding_goes_up_to_the_step(rounding: str, cost: str, expected: str) -> None:
    """A 20 % markup rounded up to the rule's step, or to the next price ending in .99, with two decimals."""
    assert priced(cost, markup_percent="20", rounding=rounding) == (expected, "CNY")


def test_exchange_rate_fixed_markup_and_currency() -> None:
    """cost x rate x (1 + percent) + fixed, in the rule's currency."""
    assert priced(
        "100.00", exchange_rate="0.1385", markup_percent="10", markup_fixed="0.50", currency="USD"
    ) == (
        "15.74",  # 100 x 0.1385 x 1.1 + 0.5 = 15.735 -> 15.74
        "USD",
    )


def test_upstream_currency_is_used_when_the_rule_names_none() -> None:
    """currency "" sells in the upstream's currency; unknown yet, the price has no currency."""
    assert priced("1.00", "CNY") == ("1.00", "CNY")
    assert priced("1.00", None) == ("1.00", None)


def test_arithmetic_is_exact() -> None:
    """No binary float anywhere: 0.10 x 3 is 0.30 (a float gives 0.30000000000000004, rounded up to 0.31),
    and a markup of many digits keeps them all until the rounding."""
    assert priced("0.10", exchange_rate="3") == ("0.30", "CNY")
    assert priced("123456789.99", markup_percent="0.3333333333333333333333333") == ("123868312.63", "CNY")


def test_first_matching_rule_wins_and_tiers_by_cost() -> None:
    """Rules are tried in order; min_cost and max_cost are inclusive; no match is no price."""
    rules = (
        build_rule(1, max_cost="10.00", markup_percent="50"),
        build_rule(2, min_cost="10.00", max_cost="100", markup_percent="20"),
        build_rule(3, category_ids=[99], markup_percent="5"),
    )
    pricing = Pricing(rules, "CNY")
    assert price_of("main", sku(cost="10.00"), pricing) == ("15.00", "CNY")
    assert price_of("main", sku(cost="10.01"), pricing) == ("12.02", "CNY")
    assert price_of("main", sku(cost="100.00"), pricing) == ("120.00", "CNY")
    assert price_of("main", sku(cost="100.01"), pricing) == (None, None)
    assert price_of("main", sku(cost="200", category_id=99), pricing) == ("210.00", "CNY")


def test_filters_by_upstream_category_product_and_sku() -> None:
    """Every filter narrows the match; a SKU matched by an exclude rule has no price."""
    pricing = Pricing(
        (
            build_rule(1, sku_ids=[7], exclude=True),
            build_rule(2, upstream="other", markup_percent="100"),
            build_rule(3, product_ids=[100], category_ids=[12], markup_percent="10"),
        ),
        "CNY",
    )
    assert price_of("main", sku(7), pricing) == (None, None)
    assert price_of("other", sku(8), pricing) == ("20.00", "CNY")
    assert price_of("main", sku(8), pricing) == ("11.00", "CNY")
    assert price_of("main", sku(8, product_id=101), pricing) == (None, None)
    assert price_of("main", sku(8, category_id=13), pricing) == (None, None)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"markup_percent": "-30"}, "markup_percent: -30 sells under cost once the cost is high enough"),
        (
            {"markup_percent": "-30", "max_cost": "10", "markup_fixed": "2"},
            "markup_percent: sells under cost",
        ),
        ({"markup_fixed": "-1"}, "markup_fixed: sells under cost (at a cost of 0)"),
        ({"markup_fixed": "-1", "markup_percent": "10", "min_cost": "5"}, "markup_fixed: sells under cost"),
        ({"markup_percent": "abc"}, "markup_percent: 'abc' is not a decimal number"),
        ({"markup_percent": 1.5}, "markup_percent: must be a decimal number written as text"),
        ({"markup_percent": True}, "markup_percent: must be a decimal number written as text"),
        ({"exchange_rate": "0"}, "exchange_rate: must be above 0"),
        ({"rounding": "nearest"}, "rounding: 'nearest' is not a step"),
        ({"rounding": "0.001"}, "rounding: '0.001': the step must be a positive whole number of cents"),
        ({"rounding": "-1"}, "rounding: '-1': the step must be a positive whole number of cents"),
        ({"min_cost": "5", "max_cost": "1"}, "max_cost: 1 is below min_cost 5"),
        ({"min_cost": "-1"}, "min_cost: must not be negative"),
        ({"category_ids": []}, "category_ids: must name at least one id"),
        ({"currency": "US$"}, "currency: 'US$' is not a currency code"),
        ({"markup_percent": "NaN"}, "markup_percent: 'NaN' is not a finite number"),
    ],
)
def test_unusable_rules_are_refused_naming_the_key(rule: dict[str, Any], message: str) -> None:
    """A rule that would sell under cost, or holds a bad decimal, rounding or filter, is refused."""
    with pytest.raises(RuleError) as raised:
        build_rule(2, **rule)
    assert str(raised.value).startswith(message)


def test_negative_markup_is_fine_when_the_fixed_part_covers_the_cost_range() -> None:
    """A discount is allowed where markup_fixed keeps every price in the range above cost."""
    rule = build_rule(1, markup_percent="-10", markup_fixed="1", max_cost="10")
    assert rule.price(Decimal("10")) == Decimal("10.00")
    assert build_rule(1, markup_fixed="-1", markup_percent="10", min_cost="10").price(Decimal(10)) == Decimal(
        "10.00"
    )


def test_excluding_rule_may_carry_any_markup() -> None:
    """An exclude rule prices nothing, so its markup is not checked."""
    assert build_rule(1, exclude=True, markup_percent="-90").exclude


def test_unknown_categories_are_reported_per_rule() -> None:
    """Rules of an upstream naming categories it does not have are reported with the rule's number."""
    rules = [
        build_rule(1, upstream="main", category_ids=[1, 998, 999]),
        build_rule(2, category_ids=[5]),  # every upstream: not checkable against one of them
    ]
    assert unknown_categories(rules, "main", [1, 2]) == [
        "[[pricing.rules]] #1: category_ids: 998, 999 is not a category of upstream main"
    ]


def changes(result: Any) -> list[tuple[PricedEntity, int, str | None, str | None]]:
    return [(c.entity, c.entity_id, c.old_value, c.new_value) for c in result.changes]


RULE_20 = (build_rule(1, markup_percent="20"),)


def test_reprice_sets_sku_and_cheapest_product_prices() -> None:
    """SKUs get their prices; the product takes its cheapest live priced SKU's; inactive SKUs are priced but
    never the product's price."""
    skus = [sku(1, "10.00"), sku(2, "5.00"), sku(3, "1.00", live=False)]
    result = reprice("main", skus, {100: ProductFacts(100, None, None)}, Pricing(RULE_20, "CNY"))
    assert [(s.id, s.sell_price, s.sell_currency) for s in result.skus] == [
        (1, "12.00", "CNY"),
        (2, "6.00", "CNY"),
        (3, "1.20", "CNY"),
    ]
    assert [(p.id, p.sell_price, p.sell_currency) for p in result.products] == [(100, "6.00", "CNY")]
    assert changes(result) == [
        ("sku", 1, None, "12.00"),
        ("sku", 2, None, "6.00"),
        ("sku", 3, None, "1.20"),
        ("product", 100, None, "6.00"),
    ]
    assert result.priced == 3


def test_unchanged_prices_write_nothing() -> None:
    """Repricing SKUs already at their prices changes nothing and logs nothing."""
    skus = [sku(1, "10.00", sell_price="12.00", sell_currency="CNY")]
    products = {100: ProductFacts(100, "12.00", "CNY")}
    result = reprice("main", skus, products, Pricing(RULE_20, "CNY"))
    assert (result.skus, result.products, result.changes) == ([], [], [])


def test_product_price_is_none_when_its_skus_sell_in_different_currencies() -> None:
    """Live priced SKUs in two currencies leave the product without a price."""
    rules = (build_rule(1, sku_ids=[1], currency="USD"), build_rule(2))
    result = reprice("main", [sku(1), sku(2)], {100: ProductFacts(100, "1.00", "CNY")}, Pricing(rules, "CNY"))
    assert [(p.id, p.sell_price, p.sell_currency) for p in result.products] == [(100, None, None)]
    assert ("product", 100, "1.00", None) in changes(result)


def test_rules_removed_clear_the_prices() -> None:
    """Without a matching rule a priced SKU and its product lose their prices (logged)."""
    skus = [sku(1, sell_price="12.00", sell_currency="CNY")]
    result = reprice("main", skus, {100: ProductFacts(100, "12.00", "CNY")}, Pricing((), "CNY"))
    assert changes(result) == [("sku", 1, "12.00", None), ("product", 100, "12.00", None)]


HOLD = Pricing(RULE_20, "CNY", hold_percent=Decimal("10"))


def test_steep_cost_rise_holds_the_old_price() -> None:
    """A cost rising more than the threshold in one pass keeps the price and holds the SKU."""
    stored = sku(1, "11.01", sell_price="12.00", sell_currency="CNY")
    result = reprice("main", [stored], {}, HOLD, cost_rises={1: ("10.00", "11.01")})
    assert [(s.id, s.sell_price, s.hold_cost) for s in result.skus] == [(1, "12.00", "11.01")]
    assert result.changes == []
    (hold,) = result.new_holds
    assert (hold.sku_id, hold.old_cost, hold.new_cost, hold.percent) == (
        1,
        "10.00",
        "11.01",
        Decimal("10.10"),
    )


@pytest.mark.parametrize(
    ("rise", "held"),
    [
        (("10.00", "11.00"), False),  # exactly 10 %: not more than the threshold
        (("10.00", "9.00"), False),  # a fall
        (("0.00", "1.00"), True),  # from nothing: any rise is steep
        (None, False),  # no cost change in this pass
    ],
)
def test_hold_threshold_edges(rise: tuple[str, str] | None, held: bool) -> None:
    """Only a rise of strictly more than the threshold holds."""
    stored = sku(1, rise[1] if rise else "10.00", sell_price="12.00", sell_currency="CNY")
    result = reprice("main", [stored], {}, HOLD, cost_rises={1: rise} if rise else {})
    assert bool(result.new_holds) == held


def test_held_sku_keeps_its_price_and_unpriced_skus_are_not_held() -> None:
    """A held SKU is left alone; a SKU without a price has nothing to hold."""
    held = sku(1, "50.00", sell_price="12.00", sell_currency="CNY", held=True)
    unpriced = sku(2, "50.00")
    result = reprice("main", [held, unpriced], {}, HOLD, cost_rises={2: ("10.00", "50.00")})
    assert [(s.id, s.sell_price, s.hold_cost) for s in result.skus] == [(2, "60.00", None)]
    assert result.new_holds == []
    assert result.changes == [PriceChange("sku", 2, None, "60.00")]


def test_a_released_hold_prices_the_sku_and_its_product_from_the_current_cost() -> None:
    """Released, a held SKU sells at what the rules make of its current cost, and its product at its cheapest
    SKU's; a SKU that is not held has no hold to release."""
    held = sku(1, "50.00", sell_price="12.00", sell_currency="CNY", held=True)
    other = sku(2, "80.00", sell_price="96.00", sell_currency="CNY")
    product = {100: ProductFacts(100, "12.00", "CNY")}
    released = release("main", 1, [held, other], product, HOLD)
    assert released is not None
    repricing, hold = released
    assert hold == ReleasedHold("main", 1, "60.00", "CNY")
    assert repricing.changes == [
        PriceChange("sku", 1, "12.00", "60.00"),
        PriceChange("product", 100, "12.00", "60.00"),
    ]
    assert release("main", 2, [held, other], product, HOLD) is None


def test_unknown_upstream_currency_keeps_the_stored_price() -> None:
    """While the upstream's currency is unknown, prices in it are left as they are."""
    stored = sku(1, "20.00", sell_price="12.00", sell_currency="CNY")
    result = reprice("main", [stored], {}, Pricing(RULE_20, None))
    assert (result.skus, result.changes) == ([], [])


def test_rule_label_names_its_position() -> None:
    """Messages name a rule as the configuration file does."""
    assert PricingRule(3).label == "[[pricing.rules]] #3"
