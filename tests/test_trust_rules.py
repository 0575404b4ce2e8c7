"""The pure rules behind "nothing taken on trust": when an upstream's answer confirms a claim, what the state
machine does with a report it cannot trust, and how long an address that sent wrong admin tokens waits."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from procurd.core.claims import claim_problem, supports
from procurd.core.machine import Policy, decide, is_noop
from procurd.core.procurement import (
    ClaimRefused,
    GoodsAfterResolution,
    NotAllowed,
    Procurement,
    Reconciled,
    State,
    UpstreamReport,
)
from procurd.core.throttle import (
    BACKOFF_CAP_SECONDS,
    FORGET_AFTER_SECONDS,
    FREE_FAILURES,
    after_failure,
    backoff_seconds,
    retry_after,
    wait_seconds,
)

NOW = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
POLICY = Policy()
GOODS = {"type": "auto", "status": "delivered", "payload": "CARD-9", "delivered_at": "2026-11-28T10:00:00Z"}
QUEUED = Procurement(
    id=3,
    order_no="T1",
    position=0,
    upstream="main",
    sku_id=12,
    product_id=4,
    quantity=1,
    manual_form_data=None,
    max_unit_price=None,
    unit_price="9.90",
    fulfillment_type="auto",
    trace_id=None,
    downstream_order_no="T1",
    downstream_order_nos=("T1",),
    state=State.QUEUED,
    upstream_may_exist=True,
    created_at=NOW,
    updated_at=NOW,
)
SUBMITTED = replace(QUEUED, state=State.SUBMITTED, upstream_order_id=55, upstream_status="paid")
RESOLVED = replace(QUEUED, state=State.RESOLVED, exception_reason="max_attempts_exceeded")


@pytest.mark.parametrize(
    ("claimed", "answered", "confirmed"),
    [
        ("delivered", "delivered", True),
        ("delivered", "completed", True),
        ("completed", "delivered", True),
        ("delivered", "paid", False),
        ("canceled", "canceled", True),
        ("canceled", "paid", False),
        ("refunded", "partially_refunded", True),
        ("refunded", "delivered", False),
        ("paid", "paid", True),
        ("paid", "delivered", True),
        ("fulfilling", "canceled", False),
        ("paid", "refunded", False),
    ],
)
def test_a_status_supports_a_claim_of_its_kind(claimed: str, answered: str, confirmed: bool) -> None:
    """A delivery is supported by a delivered order, a cancel by a canceled one, a refund by a refunded one,
    a live status by any order that is not canceled or refunded."""
    assert supports(claimed, answered) is confirmed


def problem(order_id: int = 55, number: str | None = "T1", status: str = "completed") -> str:
    """What is wrong with the answer (order ``order_id`` under ``number``, ``status``) to a claim of a
    delivery of order 55 under T1; "" when it confirms it."""
    return (
        claim_problem(
            number="T1",
            claimed_order_id=55,
            claimed_status="delivered",
            answered_order_id=order_id,
            answered_number=number,
            answered_status=status,
        )
        or ""
    )


def test_an_answer_confirms_only_that_order_under_that_number() -> None:
    """The answer must be the order claimed, under the number claimed, in a status that supports it."""
    assert problem() == ""
    assert "answered order 56" in problem(order_id=56)
    assert "another downstream_order_no" in problem(number="X")
    assert "names no downstream_order_no" in problem(number=None)
    assert "is paid, not delivered" in problem(status="paid")


def test_a_report_of_an_order_nothing_recorded_needs_the_upstreams_confirmation() -> None:
    """Without a recorded upstream order a report changes nothing unless verified; with one, a report naming
    another order is refused whatever it says, a poll's or reconciliation's included."""
    claim = UpstreamReport(order_id=55, status="delivered", fulfillment=GOODS)
    with pytest.raises(NotAllowed) as unverified:
        decide(QUEUED, claim, NOW, POLICY)
    assert unverified.value.code == "unverified_claim"
    assert decide(QUEUED, replace(claim, verified=True), NOW, POLICY).procurement.state is State.DELIVERED
    other = UpstreamReport(order_id=56, status="delivered", fulfillment=GOODS, polled=True, verified=True)
    for event in (other, Reconciled(other)):
        with pytest.raises(NotAllowed) as mismatch:
            decide(SUBMITTED, event, NOW, POLICY)
        assert mismatch.value.code == "order_mismatch"


def test_a_refused_claim_is_an_audit_entry_and_nothing_else() -> None:
    """A claim the upstream did not confirm is recorded (``callback_unverified``) without changing a field."""
    decision = decide(QUEUED, ClaimRefused(777777, "delivered", "no such order"), NOW, POLICY)
    assert decision.procurement is QUEUED
    assert (decision.event, decision.audited, decision.effects) == ("callback_unverified", True, ())
    assert decision.detail == {"order_id": 777777, "status": "delivered", "reason": "no such order"}
    assert not is_noop(QUEUED, decision)


def test_goods_for_a_resolved_procurement_are_kept_and_reported() -> None:
    """A resolved procurement stays resolved when confirmed goods arrive: they are kept with it and the
    decision asks for a finding; reconciliation, which records its own, asks for none."""
    delivered = UpstreamReport(order_id=55, status="delivered", fulfillment=GOODS, verified=True)
    decision = decide(RESOLVED, delivered, NOW, POLICY)
    assert (decision.procurement.state, decision.procurement.fulfillment) == (State.RESOLVED, GOODS)
    assert decision.effects == (GoodsAfterResolution("delivered"),)
    reconciled = decide(RESOLVED, Reconciled(delivered), NOW, POLICY)
    assert reconciled.procurement.state is State.RESOLVED
    assert reconciled.effects == ()


def test_the_wait_doubles_after_the_free_tries_up_to_the_cap() -> None:
    """The first wrong tokens cost nothing; then 1 s, 2 s, 4 s ... up to the cap."""
    assert [backoff_seconds(n) for n in range(1, FREE_FAILURES + 4)] == [0.0] * FREE_FAILURES + [
        1.0,
        2.0,
        4.0,
    ]
    assert backoff_seconds(FREE_FAILURES + 40) == BACKOFF_CAP_SECONDS
    assert (retry_after(0.2), retry_after(1.0), retry_after(1.01)) == (1, 1, 2)


def test_a_try_while_waiting_counts_for_nothing_and_a_burst_is_told_once() -> None:
    """Counting one address: the try that starts the wait starts the burst (told once); a try made while it
    waits does not count; after the wait the next wrong token doubles it without a new burst; an address
    quiet long enough starts afresh, and its next burst is told again."""
    state = None
    bursts: list[bool] = []
    for n in range(FREE_FAILURES + 1):
        counted = after_failure(state, "192.0.2.1", NOW + timedelta(milliseconds=n))
        state, bursts = counted.failures, [*bursts, counted.burst]
    assert bursts == [False] * FREE_FAILURES + [True]
    assert state is not None
    at = NOW + timedelta(milliseconds=10)
    assert wait_seconds(state, at) == pytest.approx(0.995)
    waiting = after_failure(state, "192.0.2.1", at)
    assert (waiting.counted, waiting.failures) == (False, state)
    later = after_failure(state, "192.0.2.1", NOW + timedelta(seconds=2))
    assert (later.counted, later.burst, later.failures.failures) == (True, False, FREE_FAILURES + 2)
    assert wait_seconds(later.failures, NOW + timedelta(seconds=2)) == 2.0
    quiet = NOW + timedelta(seconds=FORGET_AFTER_SECONDS + 10)
    fresh = after_failure(later.failures, "192.0.2.1", quiet)
    assert (fresh.failures.failures, fresh.failures.alerted, wait_seconds(fresh.failures, quiet)) == (
        1,
        False,
        0,
    )
