"""The state machine (pure), getting a procurement bought: its admission at intake, claims for submission,
an offer's move to its next source, and the upstream's answer to a submission (accepted, refused, or none).

Decided through :func:`procurd.core.machine.decide`, the one entry."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from procurd.core import backoff
from procurd.core.machine_records import (
    Policy,
    holds_claim,
    holds_poll,
    ignored,
    released,
    seconds,
    to_exception,
)
from procurd.core.procurement import (
    CANCELED_STATUS,
    DELIVERED_STATUSES,
    FAILOVER_CODES,
    REFUNDED_STATUSES,
    Admit,
    Claim,
    ClaimAbandoned,
    Decision,
    Effect,
    ExceptionOpened,
    MirroredSku,
    NumberAdded,
    Procurement,
    Reason,
    SourceRef,
    State,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
)
from procurd.core.sources import Skipped, first_available, over_limit, source_problem

# --- intake and claims -------------------------------------------------------------------------------------


def admit(event: Admit, now: datetime) -> Decision:
    number = event.downstream_order_no
    sources = event.sources
    position: int | None = 0
    skipped: list[Skipped] = []
    if event.offer_code is not None:
        given = event.max_unit_price is not None
        position, skipped = first_available(
            sources, 0, event.mirror, event.quantity, event.manual_form_data, given
        )
    source = sources[position or 0]
    sku = event.mirror.get((source.upstream, source.sku_id))
    procurement = Procurement(
        id=0,
        order_no=event.order_no,
        position=event.position,
        upstream=source.upstream,
        sku_id=source.sku_id,
        product_id=None if sku is None else sku.product_id,
        quantity=event.quantity,
        manual_form_data=event.manual_form_data,
        max_unit_price=event.max_unit_price,
        unit_price=None if sku is None else sku.price_amount,
        fulfillment_type=None if sku is None else sku.fulfillment_type,
        trace_id=event.trace_id,
        downstream_order_no=number,
        downstream_order_nos=(number,),
        state=State.QUEUED,
        next_attempt_at=now,
        unit_limit=source.limit,
        offer_code=event.offer_code,
        sources=sources if event.offer_code is not None else (),
        source_position=position or 0,
        failovers=tuple(_hop(skip.source, skip.reason, skip.message, number, now) for skip in skipped),
        created_at=now,
        updated_at=now,
        sell_price=None if event.sell is None else event.sell[0],
        sell_currency=None if event.sell is None else event.sell[1],
        sell_rate=None if event.sell is None else event.sell[2],
    )
    detail: dict[str, Any] = {"downstream_order_no": number, "unit_price": procurement.unit_price}
    if source.limit is not None:
        detail["unit_limit"] = source.limit
    if event.offer_code is not None:
        detail.update(offer=event.offer_code, upstream=source.upstream, sku_id=source.sku_id)
        if skipped:
            detail["skipped"] = [_hop_detail(skip.source, skip.reason) for skip in skipped]
    effects: tuple[Effect, ...] = (NumberAdded(number),)
    if position is None:
        message = _no_source_message(procurement.failovers)
        refused = to_exception(procurement, Reason.NO_SOURCE_AVAILABLE, message=message)
        opened = ExceptionOpened(Reason.NO_SOURCE_AVAILABLE, Reason.NO_SOURCE_AVAILABLE, message)
        return Decision(refused, "no_source_available", detail, effects=(*effects, opened))
    assert sku is not None
    problem = over_limit(sku.price_amount, source.limit, event.max_unit_price is not None)
    if problem is not None:
        refused = to_exception(procurement, Reason.PRICE_ABOVE_LIMIT, message=problem[1])
        opened = ExceptionOpened(Reason.PRICE_ABOVE_LIMIT, Reason.PRICE_ABOVE_LIMIT, problem[1])
        return Decision(refused, "price_above_limit", detail, effects=(*effects, opened))
    return Decision(procurement, "accepted", detail, effects=effects)


def _hop(source: SourceRef, reason: str, message: str, number: str, now: datetime) -> dict[str, Any]:
    """A ``failovers`` entry: the source left (or passed over), why, under which number, when."""
    return {
        "upstream": source.upstream,
        "sku_id": source.sku_id,
        "reason": reason,
        "message": message,
        "downstream_order_no": number,
        "at": now.isoformat(),
    }


def _hop_detail(source: SourceRef, reason: str) -> dict[str, Any]:
    return {"upstream": source.upstream, "sku_id": source.sku_id, "reason": reason}


def _no_source_message(failovers: Sequence[Mapping[str, Any]]) -> str:
    """Each source's last reason, in the offer's order of trying them."""
    last: dict[tuple[str, int], str] = {}
    for hop in failovers:
        last[(hop["upstream"], hop["sku_id"])] = f"{hop['reason']} ({hop['message']})"
    reasons = "; ".join(f"{upstream} SKU {sku_id}: {why}" for (upstream, sku_id), why in last.items())
    return f"no source of the offer can be bought: {reasons}"


def _current_source(p: Procurement) -> SourceRef:
    return p.sources[p.source_position] if p.sources else SourceRef(p.upstream, p.sku_id, p.unit_limit)


def _fail_over(
    p: Procurement,
    reason: str,
    message: str,
    now: datetime,
    mirror: Mapping[tuple[str, int], MirroredSku] | None,
) -> Decision:
    """Leave the current source for the next one that can be bought (``mirror`` checks them now; without it
    the next one is taken and checked when it is claimed), or become exception ``no_source_available``.

    Only called when no upstream order may exist under the current number.
    """
    number = p.downstream_order_no
    left = _current_source(p)
    failovers = (*p.failovers, _hop(left, reason, message, number, now))
    start = p.source_position + 1
    if mirror is None:
        position: int | None = start if start < len(p.sources) else None
        skipped: list[Skipped] = []
    else:
        given = p.max_unit_price is not None
        position, skipped = first_available(p.sources, start, mirror, p.quantity, p.manual_form_data, given)
    failovers = (*failovers, *(_hop(skip.source, skip.reason, skip.message, number, now) for skip in skipped))
    detail: dict[str, Any] = {
        "from": _hop_detail(left, reason),
        "downstream_order_no": number,
    }
    if skipped:
        detail["skipped"] = [_hop_detail(skip.source, skip.reason) for skip in skipped]
    if position is None:
        exhausted = to_exception(replace(p, failovers=failovers), Reason.NO_SOURCE_AVAILABLE, reason)
        exhausted = replace(exhausted, last_error_message=_no_source_message(failovers))
        return Decision(exhausted, "no_source_available", detail)
    return moved_to(p, position, failovers, now, detail, "failover")


def moved_to(
    p: Procurement,
    position: int,
    failovers: tuple[Mapping[str, Any], ...],
    now: datetime,
    detail: dict[str, Any],
    event: str,
    effects: tuple[Effect, ...] = (),
) -> Decision:
    """``p`` queued at source ``position`` of its offer, due now, under its current number."""
    source = p.sources[position]
    moved = released(
        p,
        upstream=source.upstream,
        sku_id=source.sku_id,
        unit_limit=source.limit,
        source_position=position,
        failovers=failovers,
        state=State.QUEUED,
        attempts=0,
        next_attempt_at=now,
        exception_reason=None,
        upstream_may_exist=False,
    )
    detail["to"] = {"upstream": source.upstream, "sku_id": source.sku_id}
    if source.upstream != p.upstream:
        # The number is new to that upstream unless the offer went there before under it.
        effects = (*effects, NumberAdded(p.downstream_order_no, again=True))
    return Decision(moved, event, detail, effects=effects)


def claim(p: Procurement, event: Claim, now: datetime) -> Decision:
    if p.state is not State.QUEUED or p.next_attempt_at is None or p.next_attempt_at > now:
        return ignored(p, "not_due")
    if p.lease_owner is not None and p.lease_expires_at is not None and p.lease_expires_at >= now:
        return ignored(p, "claimed_elsewhere", owner=p.lease_owner)
    # A claim that expired means its submitter died mid-request: the upstream may hold an order.
    expired_claim = p.lease_owner
    may_exist = p.upstream_may_exist or expired_claim is not None
    sku = event.mirror.get((p.upstream, p.sku_id))
    if sku is not None:
        if p.offer_code is not None and not may_exist:
            given = p.max_unit_price is not None
            problem = source_problem(_current_source(p), sku, p.quantity, p.manual_form_data, given)
            if problem is not None:
                return _fail_over(p, *problem, now, event.mirror)
        problem = over_limit(sku.price_amount, p.unit_limit, p.max_unit_price is not None)
        if problem is not None:
            # Checked at every attempt: the cost may have risen since the order was accepted.
            refused = to_exception(
                replace(p, unit_price=sku.price_amount, upstream_may_exist=may_exist),
                Reason.PRICE_ABOVE_LIMIT,
                message=problem[1],
            )
            return Decision(
                refused, "price_above_limit", {"unit_price": sku.price_amount, "unit_limit": p.unit_limit}
            )
        p = replace(
            p, unit_price=sku.price_amount, product_id=sku.product_id, fulfillment_type=sku.fulfillment_type
        )
    attempts = p.attempts + 1
    claimed = replace(
        p,
        attempts=attempts,
        lease_owner=event.owner,
        lease_expires_at=now + seconds(event.lease_seconds),
        upstream_may_exist=may_exist,
    )
    detail: dict[str, Any] = {"attempt": attempts, "owner": event.owner}
    if expired_claim is not None:
        detail["expired_claim"] = expired_claim
    return Decision(claimed, "claimed", detail)


def claim_abandoned(p: Procurement, event: ClaimAbandoned, now: datetime) -> Decision:
    owner = p.lease_owner
    if owner is None or not owner.startswith(f"{event.instance}/"):
        return ignored(p, "claim_not_held")
    detail = {"owner": owner, "instance": event.instance}
    if holds_poll(p):
        # Nobody will report the poll's answer: it is due again now.
        return Decision(released(p, next_poll_at=now), "poll_claim_abandoned", detail)
    if not p.submission_in_flight:
        return ignored(p, "claim_not_held")
    return Decision(replace(p, lease_expires_at=now), "claim_abandoned", detail)


# --- submission answers ------------------------------------------------------------------------------------


def submit_accepted(p: Procurement, event: SubmitAccepted, now: datetime, policy: Policy) -> Decision:
    detail: dict[str, Any] = {"order_id": event.order_id, "order_no": event.order_no, "status": event.status}
    if not holds_claim(p, event.owner):
        # Another path settled it first (a callback, or a submitter whose claim outlived ours). Callbacks
        # carry no amount: keep the one this answer brings, without touching the state.
        if p.upstream_order_id == event.order_id and p.amount is None and event.amount:
            known = replace(p, amount=event.amount, currency=event.currency, upstream_order_no=event.order_no)
            if p.state is State.DELIVERED:
                known = replace(known, next_poll_at=None)  # the amount fetch a delivery without it asked for
            return Decision(known, "late_submission_answer", detail)
        return Decision(p, "late_submission_answer", detail)
    submitted = released(
        p,
        upstream_order_id=event.order_id,
        upstream_order_no=event.order_no,
        upstream_status=event.status,
        amount=event.amount,
        currency=event.currency,
        next_attempt_at=None,
        upstream_may_exist=True,
    )
    if event.status == CANCELED_STATUS:
        # A repeated number answers with the order it already holds, canceled ones included.
        message = "the upstream holds this number as canceled"
        canceled = to_exception(submitted, Reason.UPSTREAM_CANCELED, message=message)
        return Decision(
            replace(canceled, upstream_may_exist=False, number_canceled=True), "upstream_canceled", detail
        )
    if event.status in REFUNDED_STATUSES:
        refunded = to_exception(
            submitted, Reason.UPSTREAM_REFUNDED, message=f"the upstream reports {event.status}"
        )
        return Decision(refunded, "upstream_refunded", detail)
    if event.fulfillment is not None and event.status in DELIVERED_STATUSES:
        # The purchase delivered in its answer (acg-faka's card goods): delivered now, nothing to poll.
        delivered = replace(
            submitted,
            state=State.DELIVERED,
            submitted_at=now,
            delivered_at=now,
            fulfillment=event.fulfillment,
            last_error_code=None,
            last_error_message=None,
            exception_reason=None,
            next_poll_at=None,
            poll_interval_seconds=None,
        )
        return Decision(delivered, "delivered", detail)
    live = replace(
        submitted,
        state=State.SUBMITTED,
        submitted_at=now,
        last_error_code=None,
        last_error_message=None,
        exception_reason=None,
        poll_interval_seconds=policy.poll_initial_seconds,
        # Already delivered (a repeat of a delivered order): the answer carries no fulfillment, fetch it now.
        next_poll_at=now
        if event.status in DELIVERED_STATUSES
        else now + seconds(policy.poll_initial_seconds),
    )
    return Decision(live, "submitted", detail)


def submit_rejected(p: Procurement, event: SubmitRejected, now: datetime) -> Decision:
    detail: dict[str, Any] = {"code": event.code, "message": event.message}
    if not holds_claim(p, event.owner):
        return Decision(p, "late_submission_answer", detail)
    if event.kind == "payment_failed":
        failed = to_exception(p, Reason.PAYMENT_FAILED, event.code, event.message)
        failed = replace(
            failed,
            upstream_order_id=event.order_id,
            upstream_order_no=event.order_no,
            upstream_status=event.status or CANCELED_STATUS,
            upstream_may_exist=False,
            number_canceled=True,
        )
        detail.update(order_id=event.order_id, order_no=event.order_no)
        return Decision(failed, "payment_failed", detail)
    if event.kind == Reason.OUTCOME_UNKNOWN:
        # Money may have moved: never sent again by itself, nor under a new number, nor at another source.
        detail.update(event.details)
        unknown = to_exception(p, Reason.OUTCOME_UNKNOWN, event.code, event.message)
        return Decision(replace(unknown, upstream_may_exist=True), "outcome_unknown", detail)
    if event.kind == Reason.NOT_DELIVERED:
        # Made and charged, nothing usable delivered: the order exists, a person settles it upstream.
        undelivered = to_exception(p, Reason.NOT_DELIVERED, event.code, event.message)
        undelivered = replace(
            undelivered,
            upstream_order_id=event.order_id,
            upstream_order_no=event.order_no,
            upstream_status=event.status,
            amount=event.amount,
            currency=event.currency,
            submitted_at=now,
            upstream_may_exist=True,
        )
        detail.update(order_id=event.order_id, order_no=event.order_no)
        return Decision(undelivered, "not_delivered", detail)
    # A definite refusal proves this request created nothing; an earlier attempt whose answer was lost
    # may still have, so upstream_may_exist keeps its value.
    detail["kind"] = event.kind
    if (
        p.offer_code is not None
        and event.kind == "business"
        and event.code in FAILOVER_CODES
        and not p.upstream_may_exist
    ):
        # Before any money moved, and no order can exist under the number: try the offer's next source.
        return _fail_over(p, event.code, event.message, now, None)
    return Decision(to_exception(p, event.code, event.code, event.message), f"{event.kind}_error", detail)


def submit_unavailable(
    p: Procurement, event: SubmitUnavailable, now: datetime, policy: Policy, rng: random.Random | None
) -> Decision:
    detail: dict[str, Any] = {"code": event.code, "message": event.message, "attempt": p.attempts}
    if not holds_claim(p, event.owner):
        return Decision(p, "late_submission_answer", detail)
    failed = released(p, last_error_code=event.code, last_error_message=event.message)
    if event.rate_limited:
        # Throttled before the upstream looked at the request: not an attempt, and nothing was created.
        wait = event.retry_after if event.retry_after is not None else policy.retry_base_seconds
        waiting = replace(failed, next_attempt_at=now + seconds(wait), attempts=max(0, p.attempts - 1))
        return Decision(waiting, "rate_limited", detail)
    # A request that went out may have made the order even though no answer came back.
    failed = replace(failed, upstream_may_exist=p.upstream_may_exist or event.request_sent)
    detail["max_attempts"] = policy.max_attempts
    if p.attempts >= policy.max_attempts:
        exhausted = to_exception(failed, Reason.MAX_ATTEMPTS_EXCEEDED, event.code, event.message)
        return Decision(exhausted, "max_attempts_exceeded", detail)
    delay = backoff.retry_delay(p.attempts, policy.retry_base_seconds, policy.retry_max_seconds, rng)
    retry_at = now + seconds(delay)
    detail.update(retry_in_seconds=round(delay, 3), next_attempt_at=retry_at.isoformat())
    return Decision(replace(failed, next_attempt_at=retry_at), "retry_scheduled", detail)
