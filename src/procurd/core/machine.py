"""The procurement state machine (pure): a procurement and one event in, one decision out.

Every change of a procurement — intake, claim, submission answer, callback, poll, cancel, admin action — is
decided here and written by the store in one transaction with its audit entry. Rules (seed 000 parts 1
and 3):

* nothing cancels or refunds by itself: failures become exceptions for a person;
* a state never moves backwards: a late ``paid`` after ``delivered`` is recorded, not applied;
* an upstream report may heal an exception that was only procurd not knowing the order existed, but a
  report naming an upstream order procurd has not recorded for the procurement changes nothing unless the
  upstream confirmed that order when asked (``verified``), and one naming another order than the recorded
  one never does;
* a procurement a person resolved stays resolved: goods that arrive for it later are recorded with it and
  are a finding for the person;
* the same downstream order number is reused while an upstream order under it may be live; once the
  upstream canceled the order under it, a retry takes a new number.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, assert_never

from procurd.core import backoff
from procurd.core.numbers import retry_number
from procurd.core.procurement import (
    CANCELED_STATUS,
    COMPLETED_STATUS,
    DELIVERED_STATUSES,
    FAILOVER_CODES,
    HEALABLE_REASONS,
    REFUNDED_STATUSES,
    Admit,
    Cancel,
    Claim,
    ClaimAbandoned,
    ClaimRefused,
    Decision,
    Effect,
    Event,
    ExceptionOpened,
    GiveUp,
    GoodsAfterResolution,
    MirroredSku,
    NotAllowed,
    NumberAdded,
    NumberRetired,
    PollClaim,
    PollFailed,
    Procurement,
    Reason,
    Reconciled,
    Resolve,
    Retry,
    SourceRef,
    State,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
    UpstreamReport,
)
from procurd.core.sources import Skipped, first_available, over_limit, source_problem


@dataclass(frozen=True, slots=True)
class Policy:
    """The schedule knobs of ``[procurement]``."""

    max_attempts: int = 6
    retry_base_seconds: float = 1
    retry_max_seconds: float = 300
    poll_initial_seconds: float = 30
    poll_max_seconds: float = 900


def decide(
    procurement: Procurement | None,
    event: Event,
    now: datetime,
    policy: Policy,
    rng: random.Random | None = None,
) -> Decision:
    """The decision for ``event``; ``procurement`` is ``None`` only for :class:`Admit`.

    Raises :class:`NotAllowed` for an action that does not apply to the procurement's state.
    """
    if isinstance(event, Admit):
        if procurement is not None:
            raise NotAllowed("already_admitted", f"procurement {procurement.id} exists")
        return _admit(event, now)
    if procurement is None:
        raise NotAllowed("procurement_not_found", "no such procurement")
    decision = _decide(procurement, event, now, policy, rng)
    return _stamped(procurement, _poll_hold_ended(procurement, event, decision), now)


def _decide(
    p: Procurement, event: Event, now: datetime, policy: Policy, rng: random.Random | None
) -> Decision:
    match event:
        case Admit():
            raise NotAllowed("already_admitted", f"procurement {p.id} exists")
        case Claim():
            return _claim(p, event, now)
        case ClaimAbandoned():
            return _claim_abandoned(p, event, now)
        case SubmitAccepted():
            return _submit_accepted(p, event, now, policy)
        case SubmitRejected():
            return _submit_rejected(p, event, now)
        case SubmitUnavailable():
            return _submit_unavailable(p, event, now, policy, rng)
        case UpstreamReport():
            if event.number is not None and event.number != p.downstream_order_no:
                # About an order under a number the procurement no longer uses (the upstream canceled it).
                detail = {
                    "downstream_order_no": event.number,
                    "status": event.status,
                    "order_id": event.order_id,
                }
                return Decision(p, "status_for_previous_number", detail)
            _check_claim(p, event)
            return _after_amount_fetch(p, event, _upstream_report(p, event, now, policy))
        case Reconciled():
            _check_claim(p, event.report)
            return _reconciled(p, event, now, policy)
        case ClaimRefused():
            detail = {"order_id": event.order_id, "status": event.status, "reason": event.reason}
            return Decision(p, "callback_unverified", detail)
        case PollClaim():
            return _poll_claim(p, event, now)
        case PollFailed():
            return _poll_failed(p, event, now, policy)
        case GiveUp():
            return _give_up(p, event)
        case Retry():
            return _retry(p, event, now)
        case Resolve():
            return _resolve(p, event)
        case Cancel():
            return _cancel(p, event)
        case _:
            assert_never(event)


def _stamped(before: Procurement, decision: Decision, now: datetime) -> Decision:
    """Stamp a changed record with ``now``; an exception newly opened is an effect of the transition."""
    after = decision.procurement
    if after == before:
        return decision
    effects: tuple[Effect, ...] = decision.effects
    if after.state is State.EXCEPTION and before.state is not State.EXCEPTION:
        opened = ExceptionOpened(
            after.exception_reason or "", after.last_error_code, after.last_error_message
        )
        effects = (*effects, opened)
    return replace(decision, procurement=replace(after, updated_at=now), effects=effects)


def is_noop(before: Procurement | None, decision: Decision) -> bool:
    """True when the decision writes nothing at all."""
    return decision.procurement == before and not decision.audited and not decision.effects


# --- helpers ----------------------------------------------------------------------------------------------


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


def _released(p: Procurement, **changes: Any) -> Procurement:
    """``p`` without its submission claim."""
    return replace(p, lease_owner=None, lease_expires_at=None, **changes)


def _exception(
    p: Procurement, reason: str, code: str | None = None, message: str | None = None
) -> Procurement:
    """``p`` as an exception for a person: nothing is scheduled any more."""
    return replace(
        p,
        state=State.EXCEPTION,
        exception_reason=reason,
        last_error_code=code or reason,
        last_error_message=message,
        lease_owner=None,
        lease_expires_at=None,
        next_attempt_at=None,
        next_poll_at=None,
    )


def _ignored(p: Procurement, event: str, **detail: Any) -> Decision:
    return Decision(p, event, detail, audited=False)


def _holds_claim(p: Procurement, owner: str) -> bool:
    return p.state is State.QUEUED and p.lease_owner == owner


def _holds_poll(p: Procurement) -> bool:
    """Whether a poller holds ``p``'s poll (a claim on anything but a queued procurement is a poll's)."""
    return p.state is not State.QUEUED and p.lease_owner is not None


def _poll_hold_ended(before: Procurement, event: Event, decision: Decision) -> Decision:
    """A poll's hold ends with the next change of the procurement that is not a poll claim: its answer, a
    callback that came first, a cancel ..."""
    after = decision.procurement
    if isinstance(event, PollClaim) or not _holds_poll(before) or after == before:
        return decision
    if after.lease_owner != before.lease_owner:
        return decision
    return replace(decision, procurement=_released(after))


# --- intake and claims -------------------------------------------------------------------------------------


def _admit(event: Admit, now: datetime) -> Decision:
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
        refused = _exception(procurement, Reason.NO_SOURCE_AVAILABLE, message=message)
        opened = ExceptionOpened(Reason.NO_SOURCE_AVAILABLE, Reason.NO_SOURCE_AVAILABLE, message)
        return Decision(refused, "no_source_available", detail, effects=(*effects, opened))
    assert sku is not None
    problem = over_limit(sku.price_amount, source.limit, event.max_unit_price is not None)
    if problem is not None:
        refused = _exception(procurement, Reason.PRICE_ABOVE_LIMIT, message=problem[1])
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
        exhausted = _exception(replace(p, failovers=failovers), Reason.NO_SOURCE_AVAILABLE, reason)
        exhausted = replace(exhausted, last_error_message=_no_source_message(failovers))
        return Decision(exhausted, "no_source_available", detail)
    return _moved_to(p, position, failovers, now, detail, "failover")


def _moved_to(
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
    moved = _released(
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


def _claim(p: Procurement, event: Claim, now: datetime) -> Decision:
    if p.state is not State.QUEUED or p.next_attempt_at is None or p.next_attempt_at > now:
        return _ignored(p, "not_due")
    if p.lease_owner is not None and p.lease_expires_at is not None and p.lease_expires_at >= now:
        return _ignored(p, "claimed_elsewhere", owner=p.lease_owner)
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
            refused = _exception(
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
        lease_expires_at=now + _seconds(event.lease_seconds),
        upstream_may_exist=may_exist,
    )
    detail: dict[str, Any] = {"attempt": attempts, "owner": event.owner}
    if expired_claim is not None:
        detail["expired_claim"] = expired_claim
    return Decision(claimed, "claimed", detail)


def _claim_abandoned(p: Procurement, event: ClaimAbandoned, now: datetime) -> Decision:
    owner = p.lease_owner
    if owner is None or not owner.startswith(f"{event.instance}/"):
        return _ignored(p, "claim_not_held")
    detail = {"owner": owner, "instance": event.instance}
    if _holds_poll(p):
        # Nobody will report the poll's answer: it is due again now.
        return Decision(_released(p, next_poll_at=now), "poll_claim_abandoned", detail)
    if not p.submission_in_flight:
        return _ignored(p, "claim_not_held")
    return Decision(replace(p, lease_expires_at=now), "claim_abandoned", detail)


# --- submission answers ------------------------------------------------------------------------------------


def _submit_accepted(p: Procurement, event: SubmitAccepted, now: datetime, policy: Policy) -> Decision:
    detail: dict[str, Any] = {"order_id": event.order_id, "order_no": event.order_no, "status": event.status}
    if not _holds_claim(p, event.owner):
        # Another path settled it first (a callback, or a submitter whose claim outlived ours). Callbacks
        # carry no amount: keep the one this answer brings, without touching the state.
        if p.upstream_order_id == event.order_id and p.amount is None and event.amount:
            known = replace(p, amount=event.amount, currency=event.currency, upstream_order_no=event.order_no)
            if p.state is State.DELIVERED:
                known = replace(known, next_poll_at=None)  # the amount fetch a delivery without it asked for
            return Decision(known, "late_submission_answer", detail)
        return Decision(p, "late_submission_answer", detail)
    submitted = _released(
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
        canceled = _exception(submitted, Reason.UPSTREAM_CANCELED, message=message)
        return Decision(
            replace(canceled, upstream_may_exist=False, number_canceled=True), "upstream_canceled", detail
        )
    if event.status in REFUNDED_STATUSES:
        refunded = _exception(
            submitted, Reason.UPSTREAM_REFUNDED, message=f"the upstream reports {event.status}"
        )
        return Decision(refunded, "upstream_refunded", detail)
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
        else now + _seconds(policy.poll_initial_seconds),
    )
    return Decision(live, "submitted", detail)


def _submit_rejected(p: Procurement, event: SubmitRejected, now: datetime) -> Decision:
    detail: dict[str, Any] = {"code": event.code, "message": event.message}
    if not _holds_claim(p, event.owner):
        return Decision(p, "late_submission_answer", detail)
    if event.kind == "payment_failed":
        failed = _exception(p, Reason.PAYMENT_FAILED, event.code, event.message)
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
    return Decision(_exception(p, event.code, event.code, event.message), f"{event.kind}_error", detail)


def _submit_unavailable(
    p: Procurement, event: SubmitUnavailable, now: datetime, policy: Policy, rng: random.Random | None
) -> Decision:
    detail: dict[str, Any] = {"code": event.code, "message": event.message, "attempt": p.attempts}
    if not _holds_claim(p, event.owner):
        return Decision(p, "late_submission_answer", detail)
    failed = _released(p, last_error_code=event.code, last_error_message=event.message)
    if event.rate_limited:
        # Throttled before the upstream looked at the request: not an attempt, and nothing was created.
        wait = event.retry_after if event.retry_after is not None else policy.retry_base_seconds
        waiting = replace(failed, next_attempt_at=now + _seconds(wait), attempts=max(0, p.attempts - 1))
        return Decision(waiting, "rate_limited", detail)
    # A request that went out may have made the order even though no answer came back.
    failed = replace(failed, upstream_may_exist=p.upstream_may_exist or event.request_sent)
    detail["max_attempts"] = policy.max_attempts
    if p.attempts >= policy.max_attempts:
        exhausted = _exception(failed, Reason.MAX_ATTEMPTS_EXCEEDED, event.code, event.message)
        return Decision(exhausted, "max_attempts_exceeded", detail)
    delay = backoff.retry_delay(p.attempts, policy.retry_base_seconds, policy.retry_max_seconds, rng)
    retry_at = now + _seconds(delay)
    detail.update(retry_in_seconds=round(delay, 3), next_attempt_at=retry_at.isoformat())
    return Decision(replace(failed, next_attempt_at=retry_at), "retry_scheduled", detail)


# --- what the upstream says (callback or poll) ------------------------------------------------------------


def _check_claim(p: Procurement, event: UpstreamReport) -> None:
    """Refuse (:class:`NotAllowed`) a report about the current number that names another upstream order than
    the one recorded, or one that nothing recorded and the upstream did not confirm."""
    if p.upstream_order_id is None:
        if not event.verified:
            raise NotAllowed(
                "unverified_claim",
                f"upstream order {event.order_id} is not recorded for this procurement and was not confirmed",
            )
    elif event.order_id != p.upstream_order_id:
        raise NotAllowed(
            "order_mismatch", f"the report names upstream order {event.order_id}, not {p.upstream_order_id}"
        )


def _upstream_report(p: Procurement, event: UpstreamReport, now: datetime, policy: Policy) -> Decision:
    status = event.status
    detail: dict[str, Any] = {"status": status, "order_id": event.order_id}
    if event.verified:
        detail["verified"] = True
    known = replace(
        p,
        upstream_order_id=event.order_id,
        upstream_order_no=event.order_no or p.upstream_order_no,
        upstream_status=status,
        amount=event.amount if event.amount is not None else p.amount,
        currency=event.currency if event.currency is not None else p.currency,
    )
    same_status = status == p.upstream_status

    if p.state is State.DELIVERED:
        if status in DELIVERED_STATUSES:
            if same_status:
                return _ignored(p, "duplicate")
            if p.upstream_status == COMPLETED_STATUS:
                # A delivered report that arrives after completed is older news: recorded, not applied.
                return Decision(p, "late_status_ignored", detail)
            return Decision(replace(p, upstream_status=status), "status_recorded", detail)
        if status == CANCELED_STATUS:
            conflicting = _exception(p, Reason.CONFLICTING_CALLBACK, message="canceled after delivered")
            return Decision(conflicting, "conflicting_status", detail)
        if status in REFUNDED_STATUSES:
            return _refunded(replace(p, upstream_status=status), event, detail)
        return Decision(p, "late_status_ignored", detail)

    if p.state is State.CANCELED:
        if status == CANCELED_STATUS:
            return _ignored(p, "duplicate")
        if status in DELIVERED_STATUSES:
            conflicting = _exception(p, Reason.CONFLICTING_CALLBACK, message=f"{status} after canceled")
            return Decision(replace(conflicting, fulfillment=event.fulfillment), "conflicting_status", detail)
        return Decision(p, "late_status_ignored", detail)

    if p.state is State.RESOLVED:
        # Never reopened: a person closed it (and may have refunded the buyer). Goods that come anyway are
        # kept with it, and the person hears of them.
        if status in DELIVERED_STATUSES and event.fulfillment and p.fulfillment is None:
            delivered = replace(known, fulfillment=event.fulfillment, delivered_at=now)
            effects = (GoodsAfterResolution(status),)
            return Decision(delivered, "delivered_after_resolution", detail, effects=effects)
        if same_status:
            return _ignored(p, "duplicate")
        return Decision(replace(p, upstream_status=status), "status_after_resolution", detail)

    if p.state is State.EXCEPTION and p.exception_reason not in HEALABLE_REASONS:
        unhealable = (Reason.CONFLICTING_CALLBACK, Reason.UPSTREAM_REFUNDED)
        if status in DELIVERED_STATUSES and event.fulfillment and p.exception_reason not in unhealable:
            return _delivered(p, known, event, now, policy, detail, healed=True)
        if same_status:
            return _ignored(p, "duplicate")
        return Decision(replace(p, upstream_status=status), "status_recorded", detail)

    # queued (the answer to our submission was lost), submitted, or a healable exception
    healing = p.state is State.EXCEPTION
    if status in DELIVERED_STATUSES:
        if event.fulfillment:
            return _delivered(p, known, event, now, policy, detail, healed=healing)
        # Delivered without the content (a status-only report): fetch the order at once, unless this was
        # the fetch itself, which then backs off like any unchanged poll.
        if event.polled:
            return _poll_unchanged(p, known, now, policy, detail)
        if same_status and p.state is State.SUBMITTED:
            # A repeat: the fetch the first report asked for is already scheduled.
            return _ignored(p, "duplicate")
        return _live(p, replace(known, next_poll_at=now), now, detail, healing, "delivery_pending_fetch")
    if status == CANCELED_STATUS:
        canceled = _exception(known, Reason.UPSTREAM_CANCELED, message="the upstream canceled the order")
        return Decision(
            replace(canceled, upstream_may_exist=False, number_canceled=True), "upstream_canceled", detail
        )
    if status in REFUNDED_STATUSES:
        return _refunded(known, event, detail)
    if same_status and p.state is State.SUBMITTED:
        if event.polled:
            return _poll_unchanged(p, known, now, policy, detail)
        return _ignored(p, "duplicate")
    interval = p.poll_interval_seconds or policy.poll_initial_seconds
    scheduled = replace(known, next_poll_at=now + _seconds(interval), poll_interval_seconds=interval)
    return _live(p, scheduled, now, detail, healing, "status_changed")


def _poll_unchanged(
    p: Procurement, known: Procurement, now: datetime, policy: Policy, detail: dict[str, Any]
) -> Decision:
    interval = backoff.next_poll_interval(
        p.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
    )
    scheduled = replace(known, next_poll_at=now + _seconds(interval), poll_interval_seconds=interval)
    if p.state is not State.SUBMITTED:
        return _live(p, scheduled, now, detail, p.state is State.EXCEPTION, "status_changed")
    return Decision(scheduled, "poll_unchanged", detail, audited=False)


def _live(
    p: Procurement, changed: Procurement, now: datetime, detail: dict[str, Any], healing: bool, name: str
) -> Decision:
    """The upstream holds a live order: the procurement is (or becomes) submitted."""
    live = replace(changed, upstream_may_exist=True)
    if p.state is not State.SUBMITTED:
        live = _released(
            live,
            state=State.SUBMITTED,
            submitted_at=p.submitted_at or now,
            next_attempt_at=None,
            exception_reason=None,
        )
        name = "healed" if healing else "found_upstream"
    return Decision(live, name, detail)


def _delivered(
    p: Procurement,
    known: Procurement,
    event: UpstreamReport,
    now: datetime,
    policy: Policy,
    detail: dict[str, Any],
    healed: bool,
) -> Decision:
    # A callback carries no amount: when the submission's answer was lost too (a crash, a timeout), one
    # poll fetches it, unless a late answer brings it first.
    amount_known = known.amount is not None
    delivered = _released(
        known,
        state=State.DELIVERED,
        fulfillment=event.fulfillment,
        delivered_at=now,
        exception_reason=None,
        next_attempt_at=None,
        next_poll_at=None if amount_known else now + _seconds(policy.poll_initial_seconds),
        poll_interval_seconds=None if amount_known else policy.poll_initial_seconds,
        upstream_may_exist=True,
    )
    return Decision(delivered, "healed_delivered" if healed else "delivered", detail)


def _after_amount_fetch(p: Procurement, event: UpstreamReport, decision: Decision) -> Decision:
    """A poll of a delivered procurement is the fetch of its amount: keep the amount, poll no more."""
    if not (event.polled and p.state is State.DELIVERED and decision.procurement.state is State.DELIVERED):
        return decision
    fetched = replace(decision.procurement, next_poll_at=None)
    if p.amount is None and event.amount is not None:
        fetched = replace(fetched, amount=event.amount, currency=event.currency)
    return replace(decision, procurement=fetched)


def _refunded(known: Procurement, event: UpstreamReport, detail: dict[str, Any]) -> Decision:
    refunded = _exception(known, Reason.UPSTREAM_REFUNDED, message=f"the upstream reports {event.status}")
    if event.refunded_amount is not None:
        detail["refunded_amount"] = event.refunded_amount
    return Decision(refunded, "upstream_refunded", detail)


def _reconciled(p: Procurement, event: Reconciled, now: datetime, policy: Policy) -> Decision:
    report = event.report
    detail: dict[str, Any] = {"status": report.status, "order_id": report.order_id}
    if amount_differs(p, report.amount, report.currency) and p.state is not State.EXCEPTION:
        detail.update(
            amount=report.amount, currency=report.currency, recorded=p.amount, recorded_currency=p.currency
        )
        message = (
            f"the upstream charged {report.amount} {report.currency or ''}, procurd recorded {p.amount} "
            f"{p.currency or ''}"
        ).replace("  ", " ")
        return Decision(_exception(p, Reason.AMOUNT_MISMATCH, message=message), "amount_mismatch", detail)
    after_delivery = report.status == CANCELED_STATUS or report.status in REFUNDED_STATUSES
    if p.state is State.DELIVERED and after_delivery:
        known = replace(p, upstream_status=report.status)
        return _refunded(known, report, detail)
    decision = _upstream_report(p, replace(report, polled=True), now, policy)
    # Reconciliation records its own findings: goods after a resolution are one of them already.
    effects = tuple(effect for effect in decision.effects if not isinstance(effect, GoodsAfterResolution))
    return _after_amount_fetch(p, report, replace(decision, effects=effects))


def amount_differs(p: Procurement, amount: str | None, currency: str | None) -> bool:
    """Whether the upstream's amount or currency contradicts the one recorded (unknown ones never do)."""
    if amount is not None and p.amount is not None and Decimal(amount) != Decimal(p.amount):
        return True
    return currency is not None and p.currency is not None and currency != p.currency


# --- polls ------------------------------------------------------------------------------------------------


def _poll_claim(p: Procurement, event: PollClaim, now: datetime) -> Decision:
    due = p.next_poll_at is not None and p.next_poll_at <= now
    if p.state not in (State.SUBMITTED, State.DELIVERED) or not due or p.upstream_order_id is None:
        return _ignored(p, "poll_not_due")
    until = now + _seconds(event.hold_seconds)
    held = replace(p, next_poll_at=until, lease_owner=event.owner, lease_expires_at=until)
    return Decision(held, "poll_claimed", audited=False)


def _poll_failed(p: Procurement, event: PollFailed, now: datetime, policy: Policy) -> Decision:
    interval = backoff.next_poll_interval(
        p.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
    )
    if p.state is State.DELIVERED:
        # The amount fetch failed: again later, backing off; never for an order the upstream does not know.
        retry_at = None if event.not_found else now + _seconds(interval)
        later = replace(p, next_poll_at=retry_at, poll_interval_seconds=interval)
        return Decision(later, "amount_fetch_failed", {"code": event.code}, audited=False)
    if p.state is not State.SUBMITTED:
        return _ignored(p, "poll_not_needed")
    detail = {"code": event.code, "message": event.message}
    if event.not_found:
        missing = _exception(p, Reason.UPSTREAM_ORDER_MISSING, event.code, event.message)
        return Decision(missing, "upstream_order_missing", detail)
    later = replace(p, next_poll_at=now + _seconds(interval), poll_interval_seconds=interval)
    return Decision(later, "poll_failed", detail, audited=False)


def _give_up(p: Procurement, event: GiveUp) -> Decision:
    if p.state is State.DELIVERED:
        return Decision(replace(p, next_poll_at=None), "amount_fetch_given_up", audited=False)
    if p.state is not State.SUBMITTED:
        return _ignored(p, "give_up_not_needed")
    message = f"not delivered after {int(event.waited_seconds)} s"
    return Decision(_exception(p, Reason.STALE, message=message), "stale", {"message": message})


# --- people -----------------------------------------------------------------------------------------------


def _retry(p: Procurement, event: Retry, now: datetime) -> Decision:
    if p.state is not State.EXCEPTION:
        raise NotAllowed("not_an_exception", f"procurement is {p.state.value}, not exception")
    queued = _released(
        p,
        state=State.QUEUED,
        exception_reason=None,
        last_error_code=None,
        last_error_message=None,
        attempts=0,
        next_attempt_at=now,
        next_poll_at=None,
        poll_interval_seconds=None,
    )
    detail: dict[str, Any] = {"previous_reason": p.exception_reason}
    if event.note:
        detail["note"] = event.note
    if p.offer_code is not None and p.source_position > 0 and not p.upstream_may_exist:
        # No upstream order can exist under the number: the offer starts again from its first source.
        if p.number_canceled:
            queued = replace(queued, upstream_order_id=None, upstream_order_no=None, upstream_status=None)
        restarted = _moved_to(queued, 0, p.failovers, now, detail, "retry")
        return _renumbered(p, restarted) if p.number_canceled else restarted
    if not p.number_canceled:
        detail["downstream_order_no"] = p.downstream_order_no
        return Decision(queued, "retry", detail)
    return _renumbered(p, Decision(queued, "retry", detail))


def _renumbered(p: Procurement, decision: Decision) -> Decision:
    """The retry ``decision`` under a new number: the upstream answers the old one with its canceled order
    forever."""
    queued = decision.procurement
    number = retry_number(p.downstream_order_nos[0], len(p.downstream_order_nos))
    renumbered = replace(
        queued,
        downstream_order_no=number,
        downstream_order_nos=(*p.downstream_order_nos, number),
        number_canceled=False,
        upstream_order_id=None,
        upstream_order_no=None,
        upstream_status=None,
        amount=None,
        currency=None,
        upstream_may_exist=False,
    )
    detail = {**decision.detail, "new_downstream_order_no": number}
    detail.pop("downstream_order_no", None)
    # A number added for the old one at another upstream (a move back to the first source) is not needed.
    kept = tuple(effect for effect in decision.effects if not isinstance(effect, NumberAdded))
    effects = (*kept, NumberRetired(p.downstream_order_no, p.upstream_order_id), NumberAdded(number))
    return Decision(renumbered, decision.event, detail, effects=effects)


def _resolve(p: Procurement, event: Resolve) -> Decision:
    if p.state is not State.EXCEPTION:
        raise NotAllowed("not_an_exception", f"procurement is {p.state.value}, not exception")
    resolved = replace(
        p, state=State.RESOLVED, resolution_note=event.note, next_attempt_at=None, next_poll_at=None
    )
    return Decision(resolved, "resolved", {"note": event.note, "previous_reason": p.exception_reason})


def _cancel(p: Procurement, event: Cancel) -> Decision:
    if p.state in (State.CANCELED, State.RESOLVED):
        return _ignored(p, "duplicate")
    unscheduled = _released(p, state=State.CANCELED, next_poll_at=None, next_attempt_at=None)
    if event.upstream_confirmed:
        confirmed = replace(
            unscheduled, upstream_status=CANCELED_STATUS, upstream_may_exist=False, number_canceled=True
        )
        return Decision(confirmed, "canceled_upstream")
    reason = cancel_refusal(p)
    if reason is not None:
        raise NotAllowed("cancel_not_allowed", reason)
    return Decision(unscheduled, "canceled_locally")


def cancel_refusal(p: Procurement) -> str | None:
    """Why the procurement cannot be canceled without the upstream, or ``None`` when it can be locally."""
    if p.state is State.DELIVERED:
        return "delivered"
    if p.submission_in_flight:
        return "a submission is in flight"
    if p.upstream_may_exist:
        if p.upstream_order_id is not None:
            return "the upstream order must be canceled first"
        return "an upstream order may exist (an earlier submission's answer was lost)"
    return None


def needs_upstream_cancel(p: Procurement) -> bool:
    """True when the cancel must go upstream first: a known upstream order that is not canceled."""
    return (
        p.state in (State.SUBMITTED, State.EXCEPTION, State.QUEUED)
        and p.upstream_order_id is not None
        and p.upstream_may_exist
    )
