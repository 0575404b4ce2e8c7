"""The pure procurement state machine: every rule of seed 000 parts 1 and 3, without I/O."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from procurd.core.backoff import next_poll_interval, retry_delay
from procurd.core.machine import Policy, cancel_refusal, decide, is_noop, needs_upstream_cancel
from procurd.core.numbers import item_number, retry_number
from procurd.core.orders import derive_status, event_for
from procurd.core.procurement import (
    Admit,
    Cancel,
    Claim,
    ClaimAbandoned,
    Decision,
    ExceptionOpened,
    GiveUp,
    MirroredSku,
    NotAllowed,
    NumberAdded,
    NumberRetired,
    PollClaim,
    PollFailed,
    Procurement,
    Reason,
    Resolve,
    Retry,
    SourceRef,
    State,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
    UpstreamReport,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
POLICY = Policy(
    max_attempts=3, retry_base_seconds=1, retry_max_seconds=8, poll_initial_seconds=30, poll_max_seconds=900
)
FULFILLMENT = {
    "type": "auto",
    "status": "delivered",
    "payload": "CARD-1",
    "delivery_data": None,
    "delivered_at": "2026-11-22T12:00:00Z",
}
EARLIER = NOW - timedelta(minutes=5)
POLLER = "host:1/main/poll"
NEW = Procurement(
    id=7,
    order_no="A1001",
    position=0,
    upstream="main",
    sku_id=12,
    product_id=3,
    quantity=1,
    manual_form_data=None,
    max_unit_price=None,
    unit_price="9.90",
    fulfillment_type="auto",
    trace_id=None,
    downstream_order_no="A1001",
    downstream_order_nos=("A1001",),
    state=State.QUEUED,
    next_attempt_at=EARLIER,
    created_at=EARLIER,
    updated_at=EARLIER,
)
QUEUED_CLAIMED = replace(
    NEW, attempts=1, upstream_may_exist=True, lease_owner="w1", lease_expires_at=NOW + timedelta(seconds=60)
)
SUBMITTED = replace(
    NEW,
    state=State.SUBMITTED,
    attempts=1,
    upstream_may_exist=True,
    upstream_order_id=101,
    upstream_order_no="DJ1",
    upstream_status="paid",
    amount="9.90",
    currency="CNY",
    next_attempt_at=None,
    submitted_at=EARLIER,
    poll_interval_seconds=30,
    next_poll_at=NOW + timedelta(seconds=30),
)
DELIVERED = replace(
    SUBMITTED, state=State.DELIVERED, upstream_status="delivered", fulfillment=FULFILLMENT, next_poll_at=None
)


def accepted(status: str = "paid", worker: str = "w1") -> SubmitAccepted:
    return SubmitAccepted(worker, 101, "DJ1", status, "9.90", "CNY")


def report(status: str, fulfillment: Mapping[str, object] | None = None) -> UpstreamReport:
    """The upstream's word on order 101 (confirmed by the upstream when procurd had not recorded it)."""
    return UpstreamReport(order_id=101, status=status, order_no="DJ1", fulfillment=fulfillment, verified=True)


def changes(before: Procurement, decision: Decision) -> dict[str, object]:
    """The fields the decision changes (its stamp aside)."""
    after = decision.procurement
    return {
        name: getattr(after, name)
        for name in Procurement.__dataclass_fields__
        if name != "updated_at" and getattr(after, name) != getattr(before, name)
    }


def test_success_submits_with_upstream_ids_and_schedules_first_poll() -> None:
    """A paid answer makes the procurement submitted with the upstream's ids, amount and currency."""
    decision = decide(QUEUED_CLAIMED, accepted(), NOW, POLICY)
    assert decision.procurement.state is State.SUBMITTED
    assert decision.procurement.upstream_order_id == 101
    assert decision.procurement.amount == "9.90"
    assert decision.procurement.lease_owner is None
    assert decision.procurement.next_poll_at == NOW + timedelta(seconds=30)


def test_success_answer_with_canceled_status_is_an_exception() -> None:
    """A repeated number answered with a canceled order is exception upstream_canceled, number burned."""
    decision = decide(QUEUED_CLAIMED, accepted("canceled"), NOW, POLICY)
    assert decision.procurement.state is State.EXCEPTION
    assert decision.procurement.exception_reason == Reason.UPSTREAM_CANCELED
    assert decision.procurement.number_canceled


def test_success_answer_already_delivered_fetches_at_once() -> None:
    """A repeat of a delivered order is submitted and polled immediately to fetch its fulfillment."""
    decision = decide(QUEUED_CLAIMED, accepted("delivered"), NOW, POLICY)
    assert decision.procurement.state is State.SUBMITTED
    assert decision.procurement.next_poll_at == NOW


def test_payment_failed_is_exception_keeping_upstream_ids() -> None:
    """payment_failed keeps the canceled upstream order's ids and burns the number."""
    event = SubmitRejected("w1", "payment_failed", "payment_failed", "balance", 7, "DJ7", "canceled")
    decision = decide(QUEUED_CLAIMED, event, NOW, POLICY)
    assert decision.procurement.state is State.EXCEPTION
    assert decision.procurement.exception_reason == "payment_failed"
    assert (decision.procurement.upstream_order_id, decision.procurement.upstream_order_no) == (7, "DJ7")
    assert decision.procurement.number_canceled


@pytest.mark.parametrize(
    "code",
    [
        "insufficient_balance",
        "insufficient_stock",
        "sku_unavailable",
        "product_unavailable",
        "bad_request",
        "invalid_callback_url",
    ],
)
def test_business_errors_are_exceptions_at_once(code: str) -> None:
    """Business errors become an exception with the upstream's code on the first answer."""
    decision = decide(QUEUED_CLAIMED, SubmitRejected("w1", "business", code, "no"), NOW, POLICY)
    assert decision.procurement.state is State.EXCEPTION
    assert decision.procurement.exception_reason == code
    assert not decision.procurement.number_canceled


def test_auth_error_is_exception() -> None:
    """An auth error becomes an exception with its code."""
    decision = decide(QUEUED_CLAIMED, SubmitRejected("w1", "auth", "invalid_signature", "bad"), NOW, POLICY)
    assert decision.procurement.state is State.EXCEPTION
    assert decision.procurement.exception_reason == "invalid_signature"


def test_unavailable_retries_with_backoff_then_gives_up() -> None:
    """Network errors requeue with backoff until max_attempts, then max_attempts_exceeded."""
    first = decide(QUEUED_CLAIMED, SubmitUnavailable("w1", "timeout", "t"), NOW, POLICY, random.Random(1))
    assert first.procurement.state is State.QUEUED
    assert first.procurement.next_attempt_at is not None
    assert NOW < first.procurement.next_attempt_at <= NOW + timedelta(seconds=1)
    assert first.procurement.upstream_may_exist is True
    last = decide(replace(QUEUED_CLAIMED, attempts=3), SubmitUnavailable("w1", "timeout", "t"), NOW, POLICY)
    assert last.procurement.state is State.EXCEPTION
    assert last.procurement.exception_reason == Reason.MAX_ATTEMPTS_EXCEEDED


def test_a_request_never_sent_does_not_mark_the_order_as_maybe_made() -> None:
    """No connection opened: the attempt counts, but upstream_may_exist keeps its earlier value."""
    refused = SubmitUnavailable("w1", "network_error", "cannot connect", request_sent=False)
    fresh = replace(QUEUED_CLAIMED, upstream_may_exist=False)
    retried = decide(fresh, refused, NOW, POLICY, random.Random(1))
    assert (retried.procurement.state, retried.procurement.upstream_may_exist) == (State.QUEUED, False)
    given_up = decide(replace(fresh, attempts=3), refused, NOW, POLICY)
    assert (given_up.procurement.state, given_up.procurement.upstream_may_exist) == (State.EXCEPTION, False)
    earlier_timeout = decide(replace(QUEUED_CLAIMED, attempts=3), refused, NOW, POLICY)
    assert earlier_timeout.procurement.upstream_may_exist is True


def test_rate_limited_is_not_an_attempt() -> None:
    """Being rate limited waits retry_after and gives the attempt back."""
    event = SubmitUnavailable("w1", "rate_limited", "slow down", rate_limited=True, retry_after=30)
    decision = decide(replace(QUEUED_CLAIMED, attempts=3), event, NOW, POLICY)
    assert decision.procurement.state is State.QUEUED
    assert decision.procurement.attempts == 2
    assert decision.procurement.next_attempt_at == NOW + timedelta(seconds=30)


def test_outcome_of_a_lost_claim_changes_nothing_but_is_recorded() -> None:
    """A worker whose claim is gone (settled by a callback meanwhile) changes nothing; its answer is still
    recorded in the audit trail."""
    decision = decide(SUBMITTED, accepted(worker="w1"), NOW, POLICY)
    assert decision.procurement == SUBMITTED
    assert (decision.event, decision.audited) == ("late_submission_answer", True)
    other = decide(replace(QUEUED_CLAIMED, lease_owner="w2"), accepted(), NOW, POLICY)
    assert other.procurement.state is State.QUEUED
    assert other.event == "late_submission_answer"


def test_delivery_report_delivers_with_fulfillment() -> None:
    """delivered or completed with a fulfillment makes the procurement delivered."""
    for status in ("delivered", "completed"):
        decision = decide(SUBMITTED, report(status, FULFILLMENT), NOW, POLICY)
        assert decision.procurement.state is State.DELIVERED
        assert decision.procurement.fulfillment == FULFILLMENT


def test_delivery_without_content_fetches_order() -> None:
    """A delivered status without fulfillment stays submitted and is polled at once."""
    decision = decide(SUBMITTED, report("delivered"), NOW, POLICY)
    assert decision.procurement.state is State.SUBMITTED
    assert decision.procurement.next_poll_at == NOW


def test_duplicate_report_changes_nothing() -> None:
    """The same status twice is a no-op."""
    assert is_noop(SUBMITTED, decide(SUBMITTED, report("paid"), NOW, POLICY))
    assert is_noop(DELIVERED, decide(DELIVERED, report("delivered", FULFILLMENT), NOW, POLICY))


def test_late_paid_after_delivered_is_recorded_not_applied() -> None:
    """A state never moves backwards: a late paid is recorded in the audit only."""
    decision = decide(DELIVERED, report("paid"), NOW, POLICY)
    assert decision.procurement.state is State.DELIVERED
    assert decision.audited
    assert decision.procurement == DELIVERED


def test_canceled_after_delivered_is_conflicting() -> None:
    """canceled after delivered is an exception conflicting_callback for a person."""
    decision = decide(DELIVERED, report("canceled"), NOW, POLICY)
    assert decision.procurement.state is State.EXCEPTION
    assert decision.procurement.exception_reason == Reason.CONFLICTING_CALLBACK


def test_upstream_cancel_seen_is_exception_not_local_cancel() -> None:
    """An order the upstream canceled by itself becomes an exception (no automatic local cancel)."""
    decision = decide(SUBMITTED, report("canceled"), NOW, POLICY)
    assert decision.procurement.state is State.EXCEPTION
    assert decision.procurement.exception_reason == Reason.UPSTREAM_CANCELED
    assert decision.procurement.number_canceled


@pytest.mark.parametrize("status", ["refunded", "partially_refunded"])
def test_refund_is_exception(status: str) -> None:
    """A refund reported upstream is an exception upstream_refunded."""
    for snapshot in (SUBMITTED, DELIVERED):
        decision = decide(snapshot, report(status), NOW, POLICY)
        assert decision.procurement.state is State.EXCEPTION
        assert decision.procurement.exception_reason == Reason.UPSTREAM_REFUNDED


def test_report_heals_timed_out_exception() -> None:
    """A callback for an order whose submission timed out heals max_attempts_exceeded."""
    lost = replace(
        QUEUED_CLAIMED, state=State.EXCEPTION, exception_reason="max_attempts_exceeded", lease_owner=None
    )
    assert decide(lost, report("paid"), NOW, POLICY).procurement.state is State.SUBMITTED
    assert decide(lost, report("delivered", FULFILLMENT), NOW, POLICY).procurement.state is State.DELIVERED


def test_report_while_queued_means_the_order_exists() -> None:
    """A callback that arrives before the worker's answer settles the procurement as submitted."""
    decision = decide(QUEUED_CLAIMED, report("paid"), NOW, POLICY)
    assert decision.procurement.state is State.SUBMITTED
    assert decision.procurement.upstream_order_id == 101
    assert decision.procurement.lease_owner is None


def test_poll_failures_back_off_and_missing_order_is_exception() -> None:
    """Failed polls double the interval up to the cap; an order the upstream does not know is an exception."""
    decision = decide(SUBMITTED, PollFailed("timeout", "t"), NOW, POLICY)
    assert decision.procurement.poll_interval_seconds == 60
    assert not decision.audited
    missing = decide(SUBMITTED, PollFailed("order_not_found", "gone", not_found=True), NOW, POLICY)
    assert missing.procurement.exception_reason == Reason.UPSTREAM_ORDER_MISSING


def test_give_up_makes_stale_exception() -> None:
    """A submitted order not delivered in time becomes exception stale."""
    decision = decide(SUBMITTED, GiveUp(604801), NOW, POLICY)
    assert decision.procurement.exception_reason == Reason.STALE


def test_retry_keeps_number_while_upstream_order_may_live() -> None:
    """Retry of an exception whose number is not canceled upstream reuses the same number."""
    lost = replace(
        QUEUED_CLAIMED, state=State.EXCEPTION, exception_reason="max_attempts_exceeded", attempts=6
    )
    decision = decide(lost, Retry(), NOW, POLICY)
    assert decision.procurement.state is State.QUEUED
    assert decision.procurement.downstream_order_no == "A1001"
    assert decision.effects == ()
    assert decision.procurement.attempts == 0


def test_retry_after_upstream_cancel_takes_derived_number() -> None:
    """Retry once the upstream canceled the number uses a new number derived from the first."""
    burned = replace(
        SUBMITTED,
        state=State.EXCEPTION,
        exception_reason="payment_failed",
        number_canceled=True,
        upstream_may_exist=False,
    )
    decision = decide(burned, Retry(), NOW, POLICY)
    assert decision.procurement.downstream_order_no == "A1001-r2"
    assert decision.procurement.downstream_order_nos == ("A1001", "A1001-r2")
    assert decision.effects == (NumberRetired("A1001", 101), NumberAdded("A1001-r2"))
    assert decision.procurement.upstream_order_id is None
    again = replace(burned, downstream_order_no="A1001-r2", downstream_order_nos=("A1001", "A1001-r2"))
    assert decide(again, Retry(), NOW, POLICY).procurement.downstream_order_no == "A1001-r3"


def test_retry_and_resolve_only_apply_to_exceptions() -> None:
    """Admin actions on a procurement that is not an exception are refused."""
    with pytest.raises(NotAllowed):
        decide(SUBMITTED, Retry(), NOW, POLICY)
    with pytest.raises(NotAllowed):
        decide(DELIVERED, Resolve("done"), NOW, POLICY)


def test_resolve_is_terminal_with_note() -> None:
    """Resolve closes the exception with the person's note."""
    exception = replace(SUBMITTED, state=State.EXCEPTION, exception_reason="stale")
    decision = decide(exception, Resolve("refunded the buyer"), NOW, POLICY)
    assert decision.procurement.state is State.RESOLVED
    assert decision.procurement.resolution_note == "refunded the buyer"


def test_cancel_rules() -> None:
    """Never-sent procurements cancel locally; whatever may exist upstream is canceled there first."""
    never_sent = replace(QUEUED_CLAIMED, attempts=0, lease_owner=None, upstream_may_exist=False)
    assert (
        decide(never_sent, Cancel(upstream_confirmed=False), NOW, POLICY).procurement.state is State.CANCELED
    )
    assert cancel_refusal(QUEUED_CLAIMED) == "a submission is in flight"
    lost = replace(QUEUED_CLAIMED, lease_owner=None)
    assert cancel_refusal(lost) is not None
    assert cancel_refusal(DELIVERED) == "delivered"
    assert needs_upstream_cancel(SUBMITTED)
    with pytest.raises(NotAllowed):
        decide(SUBMITTED, Cancel(upstream_confirmed=False), NOW, POLICY)
    assert decide(SUBMITTED, Cancel(upstream_confirmed=True), NOW, POLICY).procurement.state is State.CANCELED


def test_backoff_schedule() -> None:
    """Retry delays grow exponentially with jitter and stay under the cap; polls double to the cap."""
    rng = random.Random(3)
    for attempt, step in [(1, 1), (2, 2), (3, 4), (4, 8), (9, 8)]:
        delay = retry_delay(attempt, 1, 8, rng)
        assert step / 2 <= delay <= step
    assert next_poll_interval(None, 30, 900) == 30
    assert next_poll_interval(600, 30, 900) == 900


def test_numbers_are_deterministic() -> None:
    """Downstream numbers derive from the order number and item position."""
    assert item_number("A1001", 0) == "A1001"
    assert item_number("A1001", 2) == "A1001-3"
    assert retry_number("A1001", 1) == "A1001-r2"


def test_order_status_derivation() -> None:
    """Seed 001 order statuses follow from the procurements."""
    queued = replace(NEW, attempts=0)
    submitted = SUBMITTED
    delivered = DELIVERED
    canceled = replace(NEW, state=State.CANCELED)
    exception = replace(NEW, state=State.EXCEPTION)
    assert derive_status([queued]) == ("paid", False)
    assert derive_status([submitted, queued]) == ("fulfilling", False)
    assert derive_status([delivered, submitted]) == ("partially_delivered", False)
    assert derive_status([delivered, delivered]) == ("delivered", False)
    assert derive_status([delivered, canceled]) == ("delivered", False)
    assert derive_status([canceled, canceled]) == ("canceled", False)
    assert derive_status([exception]) == ("paid", True)
    assert derive_status([delivered, exception]) == ("partially_delivered", True)


def test_an_order_where_nothing_was_bought_stays_paid() -> None:
    """An order is ``fulfilling`` only once the upstream holds, or may hold, a live order for an item: an
    item being sent for the first time, or refused before any live upstream order (a business refusal,
    ``payment_failed`` with the canceled order's ids), leaves it ``paid`` (with ``exception`` after the
    refusal); a request whose answer never came, or an accepted one, makes it ``fulfilling``."""
    claimed = decide(NEW, Claim("w1", 60), NOW, POLICY).procurement
    assert derive_status([claimed]) == ("paid", False)
    for refusal in (
        SubmitRejected("w1", "business", "insufficient_stock", "sold out"),
        SubmitRejected("w1", "business", "invalid_callback_url", "host 127.0.0.1 is a loopback address"),
        SubmitRejected("w1", "payment_failed", "payment_failed", "no money", order_id=101, order_no="DJ1"),
    ):
        refused = decide(claimed, refusal, NOW, POLICY).procurement
        assert refused.state is State.EXCEPTION
        assert derive_status([refused]) == ("paid", True), refusal
        retried = decide(refused, Retry(), NOW, POLICY).procurement
        assert derive_status([retried]) == ("paid", False), refusal
    lost = decide(claimed, SubmitUnavailable("w1", "timeout", "no answer"), NOW, POLICY).procurement
    assert derive_status([lost]) == ("fulfilling", False)
    never_left = SubmitUnavailable("w1", "connection_refused", "refused", request_sent=False)
    assert derive_status([decide(claimed, never_left, NOW, POLICY).procurement]) == ("paid", False)
    bought = decide(claimed, accepted(), NOW, POLICY).procurement
    assert derive_status([bought]) == ("fulfilling", False)
    canceled_upstream = decide(bought, report("canceled"), NOW, POLICY).procurement
    assert canceled_upstream.exception_reason == "upstream_canceled"
    assert derive_status([canceled_upstream]) == ("paid", True)


def test_storefront_event_names() -> None:
    """Each change of status or exception flag maps to one storefront event."""
    assert event_for(("paid", False), ("paid", False)) is None
    assert event_for(("fulfilling", False), ("delivered", False)) == "order.delivered"
    assert event_for(("fulfilling", False), ("partially_delivered", False)) == "order.partially_delivered"
    assert event_for(("paid", False), ("canceled", False)) == "order.canceled"
    assert event_for(("paid", False), ("paid", True)) == "order.exception"
    assert event_for(("paid", False), ("fulfilling", False)) == "order.status_changed"
    assert event_for(("paid", True), ("fulfilling", False)) == "order.status_changed"


def test_unchanged_poll_backs_off() -> None:
    """A poll that sees the same status schedules the next poll at double the interval, without audit."""
    event = UpstreamReport(order_id=101, status="paid", order_no="DJ1", polled=True)
    decision = decide(SUBMITTED, event, NOW, POLICY)
    assert decision.procurement.state is State.SUBMITTED
    assert not decision.audited
    assert decision.procurement.poll_interval_seconds == 60
    assert decision.procurement.next_poll_at == NOW + timedelta(seconds=60)


def test_late_answer_fills_in_the_amount_a_callback_lacked() -> None:
    """A callback settled the order first; the worker's late answer still records amount and currency."""
    settled = replace(DELIVERED, amount=None, currency=None)
    decision = decide(settled, accepted(), NOW, POLICY)
    assert decision.procurement.state is State.DELIVERED
    assert changes(settled, decision) == {"amount": "9.90", "currency": "CNY"}
    assert decision.event == "late_submission_answer"


def test_delivery_without_an_amount_schedules_one_fetch() -> None:
    """A callback delivers a procurement whose submission answer was lost: one poll fetches the amount."""
    decision = decide(QUEUED_CLAIMED, report("delivered", FULFILLMENT), NOW, POLICY)
    assert decision.procurement.state is State.DELIVERED
    assert decision.procurement.next_poll_at == NOW + timedelta(seconds=30)
    known = decide(SUBMITTED, report("delivered", FULFILLMENT), NOW, POLICY)
    assert known.procurement.next_poll_at is None


def test_poll_of_a_delivery_records_its_amount_and_stops() -> None:
    """The fetch of a delivered procurement records the amount it lacked, polls no more, audits nothing."""
    polled = UpstreamReport(order_id=101, status="delivered", order_no="DJ1", amount="9.90", currency="CNY",
                            fulfillment=FULFILLMENT, polled=True)  # fmt: skip
    decision = decide(replace(DELIVERED, amount=None, currency=None), polled, NOW, POLICY)
    assert decision.procurement.state is State.DELIVERED
    assert changes(replace(DELIVERED, amount=None, currency=None), decision) == {
        "amount": "9.90",
        "currency": "CNY",
    }
    assert not decision.audited


def test_failed_fetch_of_a_delivery_backs_off_or_stops() -> None:
    """A failed amount fetch is tried again later, never for an order the upstream does not know."""
    delivered = replace(DELIVERED, amount=None, poll_interval_seconds=30)
    later = decide(delivered, PollFailed("timeout", "no answer"), NOW, POLICY)
    assert later.procurement.next_poll_at == NOW + timedelta(seconds=60)
    unknown = decide(delivered, PollFailed("order_not_found", "gone", not_found=True), NOW, POLICY)
    assert unknown.procurement.next_poll_at is None
    assert later.procurement.state is unknown.procurement.state is State.DELIVERED
    assert not later.audited
    assert not unknown.audited


def admit(max_unit_price: str | None = None) -> Admit:
    sku = MirroredSku(id=12, product_id=3, price_amount="9.90", fulfillment_type="auto")
    source = SourceRef("main", 12, max_unit_price)
    return Admit("A1001", 0, 1, None, max_unit_price, None, "A1001", (source,), {("main", 12): sku})


def test_intake_queues_the_item_under_its_number() -> None:
    """An admitted item is queued, due now, under its number, which the store registers."""
    decision = decide(None, admit(), NOW, POLICY)
    admitted = decision.procurement
    assert (admitted.state, admitted.attempts, admitted.next_attempt_at) == (State.QUEUED, 0, NOW)
    assert (admitted.downstream_order_nos, admitted.unit_price) == (("A1001",), "9.90")
    assert (decision.event, decision.effects) == ("accepted", (NumberAdded("A1001"),))


def test_intake_above_the_price_limit_is_an_exception_never_sent() -> None:
    """A mirrored price above max_unit_price makes the item an exception at once, nothing scheduled."""
    decision = decide(None, admit(max_unit_price="9.89"), NOW, POLICY)
    refused = decision.procurement
    assert (refused.state, refused.exception_reason) == (State.EXCEPTION, Reason.PRICE_ABOVE_LIMIT)
    assert refused.next_attempt_at is None
    assert decision.effects[0] == NumberAdded("A1001")
    assert isinstance(decision.effects[1], ExceptionOpened)
    assert decide(None, admit(max_unit_price="9.90"), NOW, POLICY).procurement.state is State.QUEUED


def test_a_claim_counts_the_attempt_and_holds_the_procurement() -> None:
    """A claim is the attempt: counted, leased to its owner, recorded; a claim of a claimed one is ignored."""
    decision = decide(NEW, Claim("w9", 60), NOW, POLICY)
    assert changes(NEW, decision) == {
        "attempts": 1,
        "lease_owner": "w9",
        "lease_expires_at": NOW + timedelta(seconds=60),
    }
    assert (decision.event, decision.audited) == ("claimed", True)
    held = decide(decision.procurement, Claim("w10", 60), NOW, POLICY)
    assert is_noop(decision.procurement, held)


def test_a_claim_taken_over_after_expiry_means_the_order_may_exist() -> None:
    """An expired claim means its submitter died mid-request: the new claim marks that the upstream may
    hold an order."""
    expired = replace(NEW, attempts=1, lease_owner="dead", lease_expires_at=NOW - timedelta(seconds=1))
    decision = decide(expired, Claim("w9", 60), NOW, POLICY)
    assert (decision.procurement.attempts, decision.procurement.upstream_may_exist) == (2, True)
    assert decision.detail["expired_claim"] == "dead"


def test_a_procurement_not_due_is_not_claimed() -> None:
    """Claims take only queued procurements whose time has come."""
    later = replace(NEW, next_attempt_at=NOW + timedelta(seconds=1))
    assert is_noop(later, decide(later, Claim("w9", 60), NOW, POLICY))
    assert is_noop(SUBMITTED, decide(SUBMITTED, Claim("w9", 60), NOW, POLICY))


def test_a_poll_claim_moves_the_next_poll_out_without_audit() -> None:
    """A claimed poll pushes the next one out until the answer comes, held by its poller; nothing is
    audited."""
    due = replace(SUBMITTED, next_poll_at=NOW)
    decision = decide(due, PollClaim(60, POLLER), NOW, POLICY)
    until = NOW + timedelta(seconds=60)
    assert changes(due, decision) == {"next_poll_at": until, "lease_owner": POLLER, "lease_expires_at": until}
    assert not decision.audited
    assert is_noop(SUBMITTED, decide(SUBMITTED, PollClaim(60, POLLER), NOW, POLICY))


def test_a_poll_held_by_a_vanished_instance_is_due_again_at_once() -> None:
    """When the instance whose poller holds a poll is found gone, the poll is due now and the hold is gone
    (audited); another instance's going changes nothing."""
    held = decide(replace(SUBMITTED, next_poll_at=NOW), PollClaim(60, POLLER), NOW, POLICY).procurement
    later = NOW + timedelta(seconds=5)
    assert is_noop(held, decide(held, ClaimAbandoned("other-host:9"), later, POLICY))
    decision = decide(held, ClaimAbandoned("host:1"), later, POLICY)
    assert decision.event == "poll_claim_abandoned"
    assert decision.audited
    assert changes(held, decision) == {"next_poll_at": later, "lease_owner": None, "lease_expires_at": None}


def test_a_poll_hold_ends_with_the_next_change() -> None:
    """The poll's answer (or a callback that came first) ends its hold; a vanished poller then changes
    nothing."""
    held = decide(replace(SUBMITTED, next_poll_at=NOW), PollClaim(60, POLLER), NOW, POLICY).procurement
    answered = decide(held, report("delivered", fulfillment=FULFILLMENT), NOW, POLICY).procurement
    assert answered.state is State.DELIVERED
    assert (answered.lease_owner, answered.lease_expires_at) == (None, None)
    assert is_noop(answered, decide(answered, ClaimAbandoned("host:1"), NOW, POLICY))
    failed = decide(held, PollFailed("timeout", "no answer"), NOW, POLICY).procurement
    assert (failed.lease_owner, failed.next_poll_at is not None) == (None, True)


def test_opening_an_exception_is_an_effect_of_the_transition() -> None:
    """Every move into exception carries the reason as an effect (alerts hang from it); staying does not."""
    decision = decide(
        QUEUED_CLAIMED, SubmitRejected("w1", "business", "sku_unavailable", "gone"), NOW, POLICY
    )
    assert decision.effects == (ExceptionOpened("sku_unavailable", "sku_unavailable", "gone"),)
    again = decide(decision.procurement, report("paid"), NOW, POLICY)
    assert not any(isinstance(effect, ExceptionOpened) for effect in again.effects)


def test_a_report_about_a_previous_number_is_recorded_only() -> None:
    """A report naming a number the procurement no longer uses changes nothing and is audited."""
    renumbered = replace(
        SUBMITTED, downstream_order_no="A1001-r2", downstream_order_nos=("A1001", "A1001-r2")
    )
    old = UpstreamReport(order_id=55, status="canceled", number="A1001")
    decision = decide(renumbered, old, NOW, POLICY)
    assert decision.procurement == renumbered
    assert (decision.event, decision.audited) == ("status_for_previous_number", True)


def test_every_change_is_stamped() -> None:
    """A decision that changes the record stamps it with the time of the decision."""
    assert decide(NEW, Claim("w9", 60), NOW, POLICY).procurement.updated_at == NOW
