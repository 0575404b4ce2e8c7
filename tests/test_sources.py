"""Where a procurement buys (pure): limits, the choice among an offer's sources, and failover through the
state machine. No database, no network."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from procurd.core.machine import Policy, decide
from procurd.core.pricing import build_rule, cost_limit
from procurd.core.procurement import (
    Admit,
    Claim,
    MirroredSku,
    NumberAdded,
    Procurement,
    Reason,
    Retry,
    SourceRef,
    State,
    SubmitRejected,
)
from procurd.core.sources import default_limit, first_available, offer_limits

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
POLICY = Policy()
MAIN = ("main", 12)
BACKUP = ("backup", 70)
THIRD = ("third", 5)


def sku(
    sku_id: int,
    price: str = "9.90",
    *,
    stock: int = 50,
    active: bool = True,
    sell_price: str | None = None,
    sell_currency: str | None = None,
    category_id: int | None = 1,
) -> MirroredSku:
    status = "unlimited" if stock < 0 else "out_of_stock" if stock == 0 else "in_stock"
    return MirroredSku(
        id=sku_id, product_id=sku_id * 10, price_amount=price, fulfillment_type="auto", sku_active=active,
        category_id=category_id, sell_price=sell_price, sell_currency=sell_currency, stock_status=status,
        stock_quantity=stock,
    )  # fmt: skip


MIRROR = {MAIN: sku(12), BACKUP: sku(70, "8.00"), THIRD: sku(5, "9.00")}
SOURCES = (SourceRef(*MAIN, "10.00"), SourceRef(*BACKUP, "10.00"), SourceRef(*THIRD, "10.00"))


def admit_offer(mirror: dict[tuple[str, int], MirroredSku], quantity: int = 1) -> Admit:
    return Admit("A1", 0, quantity, None, None, None, "A1-1", SOURCES, mirror, offer_code="VOUCHER")


def queued_offer(position: int = 0, **changes: object) -> Procurement:
    decision = decide(None, admit_offer(MIRROR), NOW, POLICY)
    p = replace(decision.procurement, id=7)
    if position:
        source = SOURCES[position]
        p = replace(p, upstream=source.upstream, sku_id=source.sku_id, source_position=position)
    return replace(p, **changes)  # type: ignore[arg-type]


def claimed(p: Procurement) -> Procurement:
    decision = decide(p, Claim("w1", 60, MIRROR), NOW, POLICY)
    assert decision.event == "claimed"
    return decision.procurement


# --- limits -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sell_price", "rate", "cost", "limit"),
    [
        ("22.00", "2", "10.00", "11.00"),  # exact
        ("72.99", "7.2", "10.00", "10.13"),  # 10.1375: rounded down, never up
        ("1.37", "0.137", "9.99", "10.00"),
        ("10.00", "3", "3.3333", "3.3333"),  # the cost's own precision when finer than cents
        ("10.00", "1", "3", "10.00"),  # at least cents
    ],
)
def test_the_limit_is_the_selling_price_converted_back_and_rounded_down(
    sell_price: str, rate: str, cost: str, limit: str
) -> None:
    """What a unit may cost is the selling price divided by the exchange rate, rounded down to the cost's
    decimals (at least cents): rounding never lets procurd pay more than it sells for."""
    assert cost_limit(sell_price, Decimal(rate), cost) == limit
    assert Decimal(limit) * Decimal(rate) <= Decimal(sell_price)


def test_default_limit_follows_the_rule_that_prices_the_sku() -> None:
    """The rule that prices the SKU gives the rate; an excluded SKU or one without a selling price has no
    default limit."""
    rules = (
        build_rule(1, exclude=True, category_ids=[9]),
        build_rule(2, exchange_rate="7.2", markup_percent="20", currency="RUB"),
    )
    priced = sku(12, "10.00", sell_price="86.40", sell_currency="RUB")
    assert default_limit("main", priced, rules) == "12.00"
    assert default_limit("main", replace(priced, category_id=9), rules) is None
    assert default_limit("main", replace(priced, sell_price=None), rules) is None
    assert default_limit("main", priced, ()) is None


def test_an_offers_limits_come_from_what_the_shop_charged() -> None:
    """Without max_unit_price every source is limited by the selling price of the source in use when the
    order was accepted, converted with its own rule; one selling in another currency by its own price; a
    given max_unit_price limits them all."""
    rules = (build_rule(1, upstream="backup", exchange_rate="2"), build_rule(2))
    mirror = {
        MAIN: sku(12, "9.00", sell_price="12.00", sell_currency="CNY"),
        BACKUP: sku(70, "5.00", sell_price="10.00", sell_currency="CNY"),
        THIRD: sku(5, "9.00", sell_price="11.00", sell_currency="USD"),
    }
    limits = offer_limits([MAIN, BACKUP, THIRD], mirror, MAIN, None, rules)
    assert [source.limit for source in limits] == ["12.00", "6.00", "11.00"]
    given = offer_limits([MAIN, BACKUP, THIRD], mirror, MAIN, "9.50", rules)
    assert {source.limit for source in given} == {"9.50"}


# --- intake -------------------------------------------------------------------------------------------------


def test_an_offer_takes_the_first_source_that_can_be_bought() -> None:
    """Sources out of stock for the quantity, inactive or over the limit are passed over, each recorded in
    failovers with its reason; the procurement is queued at the first good one."""
    mirror = {MAIN: sku(12, stock=1), BACKUP: sku(70, "10.01"), THIRD: sku(5, "9.00")}
    decision = decide(None, admit_offer(mirror, quantity=2), NOW, POLICY)
    p = decision.procurement
    assert (p.state, p.upstream, p.sku_id, p.source_position) == (State.QUEUED, "third", 5, 2)
    assert (p.unit_price, p.unit_limit, p.offer_code) == ("9.00", "10.00", "VOUCHER")
    assert [(hop["upstream"], hop["reason"]) for hop in p.failovers] == [
        ("main", "out_of_stock"),
        ("backup", "price_above_limit"),
    ]
    assert decision.effects == (NumberAdded("A1-1"),)


def test_an_offer_with_no_source_left_is_an_exception_naming_each_reason() -> None:
    """When no source can be bought the item is exception no_source_available at once, its message giving
    each source's reason."""
    mirror = {MAIN: sku(12, stock=0), BACKUP: sku(70, active=False)}
    decision = decide(None, admit_offer(mirror), NOW, POLICY)
    p = decision.procurement
    assert (p.state, p.exception_reason) == (State.EXCEPTION, Reason.NO_SOURCE_AVAILABLE)
    assert p.last_error_message is not None
    for part in ("main SKU 12: out_of_stock", "backup SKU 70: sku_inactive", "third SKU 5: sku_not_found"):
        assert part in p.last_error_message
    assert (p.upstream, p.sku_id) == MAIN


def test_first_available_starts_where_it_is_told() -> None:
    assert first_available(SOURCES, 1, MIRROR, 1, None) == (1, [])
    assert first_available(SOURCES, 3, MIRROR, 1, None) == (None, [])


# --- failover -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", ["insufficient_stock", "sku_unavailable", "product_unavailable"])
def test_a_refusal_before_money_moved_moves_to_the_next_source(code: str) -> None:
    """The upstream refuses the first source: the procurement is queued at the next one at once, under the
    same number, which the new upstream registers; the hop is in failovers."""
    p = claimed(queued_offer())
    decision = decide(p, SubmitRejected("w1", "business", code, "no"), NOW, POLICY)
    moved = decision.procurement
    assert decision.event == "failover"
    assert (moved.state, moved.upstream, moved.sku_id, moved.source_position) == (
        State.QUEUED,
        "backup",
        70,
        1,
    )
    assert (moved.next_attempt_at, moved.lease_owner, moved.attempts) == (NOW, None, 0)
    assert moved.downstream_order_no == "A1-1"
    assert moved.failovers[-1]["reason"] == code
    assert decision.effects == (NumberAdded("A1-1", again=True),)
    assert decision.detail["from"] == {"upstream": "main", "sku_id": 12, "reason": code}


def test_no_failover_while_an_order_may_exist_under_the_number() -> None:
    """An earlier attempt's answer was lost: the upstream may hold an order under the number, so a refusal
    is an exception for a person, never a second purchase elsewhere."""
    p = replace(claimed(queued_offer()), upstream_may_exist=True)
    decision = decide(p, SubmitRejected("w1", "business", "insufficient_stock", "no"), NOW, POLICY)
    assert (decision.procurement.state, decision.procurement.upstream) == (State.EXCEPTION, "main")


def test_other_refusals_do_not_fail_over() -> None:
    """insufficient_balance is about procurd's wallet, not the source: an exception, not a hop."""
    p = claimed(queued_offer())
    decision = decide(p, SubmitRejected("w1", "business", "insufficient_balance", "no"), NOW, POLICY)
    assert (decision.procurement.state, decision.procurement.exception_reason) == (
        State.EXCEPTION,
        "insufficient_balance",
    )


def test_the_last_source_refused_is_no_source_available() -> None:
    p = claimed(queued_offer(position=2))
    decision = decide(p, SubmitRejected("w1", "business", "insufficient_stock", "no"), NOW, POLICY)
    assert decision.procurement.exception_reason == Reason.NO_SOURCE_AVAILABLE
    assert decision.event == "no_source_available"


def test_a_claim_moves_past_a_source_that_can_no_longer_be_bought() -> None:
    """At claim time the mirror is checked again: a source now over its limit is left for the next good
    one, without claiming; the cost is re-read at every attempt."""
    mirror = {**MIRROR, MAIN: sku(12, "10.50"), BACKUP: sku(70, stock=0)}
    decision = decide(queued_offer(), Claim("w1", 60, mirror), NOW, POLICY)
    moved = decision.procurement
    assert decision.event == "failover"
    assert (moved.upstream, moved.source_position, moved.lease_owner) == ("third", 2, None)
    assert [hop["reason"] for hop in moved.failovers] == ["price_above_limit", "out_of_stock"]


def test_a_sku_item_over_its_limit_at_claim_time_is_an_exception() -> None:
    """A SKU item accepted within its limit whose cost rose before it was sent is never sent: exception
    price_above_limit, the new cost recorded."""
    mirror = {MAIN: sku(12, "9.90")}
    item = Admit("A2", 0, 1, None, None, None, "A2-1", (SourceRef(*MAIN, "10.00"),), mirror)
    p = replace(decide(None, item, NOW, POLICY).procurement, id=8)
    decision = decide(p, Claim("w1", 60, {MAIN: sku(12, "10.01")}), NOW, POLICY)
    refused = decision.procurement
    assert (refused.state, refused.exception_reason, refused.unit_price) == (
        State.EXCEPTION,
        Reason.PRICE_ABOVE_LIMIT,
        "10.01",
    )
    assert refused.attempts == 0
    within = decide(p, Claim("w1", 60, {MAIN: sku(12, "10.00")}), NOW + timedelta(seconds=1), POLICY)
    assert within.event == "claimed"


def test_retry_of_an_exhausted_offer_starts_from_its_first_source() -> None:
    """A person's retry of no_source_available goes back to the first source (stock may be back)."""
    p = claimed(queued_offer(position=2))
    exhausted = decide(p, SubmitRejected("w1", "business", "insufficient_stock", "no"), NOW, POLICY)
    retried = decide(exhausted.procurement, Retry("stock is back"), NOW, POLICY)
    q = retried.procurement
    assert (q.state, q.upstream, q.source_position, q.downstream_order_no) == (
        State.QUEUED,
        "main",
        0,
        "A1-1",
    )
    assert retried.effects == (NumberAdded("A1-1", again=True),)


ACCOUNT = {"key": "account", "type": "text", "required": True, "label": {"zh-CN": "账号"}}
NOTE = {"key": "note", "type": "text", "required": False, "label": {"zh-CN": "备注"}}


@pytest.mark.parametrize(
    ("schema", "form", "code"),
    [
        (None, None, "manual_form_data_required"),
        (None, {}, None),
        ({"fields": []}, {}, None),
        ({"fields": [NOTE]}, {}, None),
        ({"fields": [NOTE]}, None, "manual_form_data_required"),
        ({"fields": [ACCOUNT]}, {}, "manual_form_data_required"),
        ({"fields": [ACCOUNT]}, {"note": "x"}, "manual_form_data_invalid"),
        ({"fields": [ACCOUNT]}, {"account": "a"}, None),
    ],
    ids=[
        "no-inputs-no-form", "no-inputs-empty-form", "no-fields-empty-form", "optional-only-empty-form",
        "optional-only-no-form", "required-empty-form", "required-left-blank", "required-filled",
    ],
)  # fmt: skip
def test_a_manual_item_carries_a_form_with_what_its_schema_requires(
    schema: Any, form: dict[str, Any] | None, code: str | None
) -> None:
    """Seed 000 requires manual_form_data for a manual product and says nothing of its contents: a form
    whose schema requires nothing (goods with no buyer inputs) is taken empty; no form at all, or an empty
    one where fields are required, is manual_form_data_required; a form lacking a required field is
    manual_form_data_invalid."""
    manual = replace(sku(12), fulfillment_type="manual", manual_form_schema=schema)
    problem = manual.problem(form)
    assert (problem[0] if problem else None) == code
