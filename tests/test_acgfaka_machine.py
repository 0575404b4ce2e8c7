"""The state machine (pure) for purchases that answer synchronously (acg-faka): goods in the answer, a paid
order without its goods, an unknown outcome, and a price refused before money moved."""

from __future__ import annotations

from dataclasses import replace

import pytest

from procurd.core.machine import decide, needs_upstream_cancel
from procurd.core.procurement import (
    ExceptionOpened,
    NotAllowed,
    Reason,
    Retry,
    SourceRef,
    State,
    SubmitAccepted,
    SubmitRejected,
)
from test_procurement_machine import FULFILLMENT, NOW, POLICY, QUEUED_CLAIMED

# An offer's item at its first source, claimed, no order possible under its number yet.
OFFERED = replace(
    QUEUED_CLAIMED,
    offer_code="MONTH",
    sources=(SourceRef("main", 12), SourceRef("acg", 1)),
    upstream_may_exist=False,
)


def test_goods_in_the_answer_deliver_at_once() -> None:
    """A purchase answered with its goods is delivered now, with them and the amount: nothing to poll."""
    event = SubmitAccepted("w1", 101, "DJ1", "delivered", "9.90", "CNY", FULFILLMENT)
    after = decide(QUEUED_CLAIMED, event, NOW, POLICY).procurement
    assert after.state is State.DELIVERED
    assert (after.fulfillment, after.amount, after.delivered_at, after.next_poll_at) == (
        FULFILLMENT,
        "9.90",
        NOW,
        None,
    )
    assert after.lease_owner is None


def test_an_unknown_outcome_is_an_exception_that_never_moves_on() -> None:
    """Nobody can tell whether it was bought: exception outcome_unknown, the order may exist (never canceled
    locally), not moved to the offer's next source, and a person's retry is refused."""
    event = SubmitRejected("w1", "outcome_unknown", "outcome_unknown", "lost", details={"request_no": "PC1"})
    decision = decide(OFFERED, event, NOW, POLICY)
    after = decision.procurement
    assert (after.state, after.exception_reason, after.source_position) == (
        State.EXCEPTION,
        "outcome_unknown",
        0,
    )
    assert after.upstream_may_exist
    assert decision.detail["request_no"] == "PC1"
    assert any(isinstance(effect, ExceptionOpened) for effect in decision.effects)
    with pytest.raises(NotAllowed) as refused:
        decide(after, Retry(), NOW, POLICY)
    assert refused.value.code == Reason.OUTCOME_UNKNOWN


def test_a_person_who_found_nothing_bought_sends_it_again_under_the_same_number() -> None:
    """Retry with nothing_bought (the person's word after checking the upstream): queued under the same
    number, at the same source, still maybe made upstream (never canceled locally meanwhile)."""
    event = SubmitRejected("w1", "outcome_unknown", "outcome_unknown", "lost")
    unknown = decide(OFFERED, event, NOW, POLICY).procurement
    decision = decide(unknown, Retry("no purchase in the records", nothing_bought=True), NOW, POLICY)
    after = decision.procurement
    assert (after.state, after.downstream_order_no, after.source_position) == (State.QUEUED, "A1001", 0)
    assert after.upstream_may_exist
    assert decision.detail["nothing_bought"] is True


def test_a_paid_order_without_goods_keeps_the_upstream_order() -> None:
    """not_delivered keeps the upstream's order and amount; the order exists (a cancel must go upstream) and
    a retry is refused."""
    event = SubmitRejected(
        "w1", "not_delivered", "not_delivered", "sold out", 101, "DJ1", "paid", "5.00", "CNY"
    )
    after = decide(QUEUED_CLAIMED, event, NOW, POLICY).procurement
    assert (after.state, after.exception_reason) == (State.EXCEPTION, "not_delivered")
    assert (after.upstream_order_id, after.upstream_order_no, after.amount) == (101, "DJ1", "5.00")
    assert needs_upstream_cancel(after)
    with pytest.raises(NotAllowed) as refused:
        decide(after, Retry("checked", nothing_bought=True), NOW, POLICY)
    assert refused.value.code == Reason.NOT_DELIVERED


def test_a_price_refused_before_money_moved_moves_an_offer_on() -> None:
    """price_above_limit from the upstream's own quote, right before the purchase: the offer's next source."""
    event = SubmitRejected("w1", "business", "price_above_limit", "asks 15.00")
    after = decide(OFFERED, event, NOW, POLICY).procurement
    assert (after.state, after.upstream, after.sku_id) == (State.QUEUED, "acg", 1)
    assert [hop["reason"] for hop in after.failovers] == ["price_above_limit"]
