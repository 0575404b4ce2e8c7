"""The state machine (pure), what the upstream says of an order: a callback or a poll's report, a
reconciliation's comparison, and the fallback polls themselves (claimed, failed, given up).

Decided through :func:`procurd.core.machine.decide`, the one entry."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from procurd.core import backoff
from procurd.core.machine_records import Policy, ignored, released, seconds, to_exception
from procurd.core.procurement import (
    CANCELED_STATUS,
    COMPLETED_STATUS,
    DELIVERED_STATUSES,
    HEALABLE_REASONS,
    REFUNDED_STATUSES,
    Decision,
    GiveUp,
    GoodsAfterResolution,
    NotAllowed,
    PollClaim,
    PollFailed,
    Procurement,
    Reason,
    Reconciled,
    State,
    UpstreamReport,
)

# --- what the upstream says (callback or poll) ------------------------------------------------------------


def check_claim(p: Procurement, event: UpstreamReport) -> None:
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


def upstream_report(p: Procurement, event: UpstreamReport, now: datetime, policy: Policy) -> Decision:
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
                return ignored(p, "duplicate")
            if p.upstream_status == COMPLETED_STATUS:
                # A delivered report that arrives after completed is older news: recorded, not applied.
                return Decision(p, "late_status_ignored", detail)
            return Decision(replace(p, upstream_status=status), "status_recorded", detail)
        if status == CANCELED_STATUS:
            conflicting = to_exception(p, Reason.CONFLICTING_CALLBACK, message="canceled after delivered")
            return Decision(conflicting, "conflicting_status", detail)
        if status in REFUNDED_STATUSES:
            return _refunded(replace(p, upstream_status=status), event, detail)
        return Decision(p, "late_status_ignored", detail)

    if p.state is State.CANCELED:
        if status == CANCELED_STATUS:
            return ignored(p, "duplicate")
        if status in DELIVERED_STATUSES:
            conflicting = to_exception(p, Reason.CONFLICTING_CALLBACK, message=f"{status} after canceled")
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
            return ignored(p, "duplicate")
        return Decision(replace(p, upstream_status=status), "status_after_resolution", detail)

    if p.state is State.EXCEPTION and p.exception_reason not in HEALABLE_REASONS:
        unhealable = (Reason.CONFLICTING_CALLBACK, Reason.UPSTREAM_REFUNDED)
        if status in DELIVERED_STATUSES and event.fulfillment and p.exception_reason not in unhealable:
            return _delivered(p, known, event, now, policy, detail, healed=True)
        if same_status:
            return ignored(p, "duplicate")
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
            return ignored(p, "duplicate")
        return _live(p, replace(known, next_poll_at=now), now, detail, healing, "delivery_pending_fetch")
    if status == CANCELED_STATUS:
        canceled = to_exception(known, Reason.UPSTREAM_CANCELED, message="the upstream canceled the order")
        return Decision(
            replace(canceled, upstream_may_exist=False, number_canceled=True), "upstream_canceled", detail
        )
    if status in REFUNDED_STATUSES:
        return _refunded(known, event, detail)
    if same_status and p.state is State.SUBMITTED:
        if event.polled:
            return _poll_unchanged(p, known, now, policy, detail)
        return ignored(p, "duplicate")
    interval = p.poll_interval_seconds or policy.poll_initial_seconds
    scheduled = replace(known, next_poll_at=now + seconds(interval), poll_interval_seconds=interval)
    return _live(p, scheduled, now, detail, healing, "status_changed")


def _poll_unchanged(
    p: Procurement, known: Procurement, now: datetime, policy: Policy, detail: dict[str, Any]
) -> Decision:
    interval = backoff.next_poll_interval(
        p.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
    )
    scheduled = replace(known, next_poll_at=now + seconds(interval), poll_interval_seconds=interval)
    if p.state is not State.SUBMITTED:
        return _live(p, scheduled, now, detail, p.state is State.EXCEPTION, "status_changed")
    return Decision(scheduled, "poll_unchanged", detail, audited=False)


def _live(
    p: Procurement, changed: Procurement, now: datetime, detail: dict[str, Any], healing: bool, name: str
) -> Decision:
    """The upstream holds a live order: the procurement is (or becomes) submitted."""
    live = replace(changed, upstream_may_exist=True)
    if p.state is not State.SUBMITTED:
        live = released(
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
    delivered = released(
        known,
        state=State.DELIVERED,
        fulfillment=event.fulfillment,
        delivered_at=now,
        exception_reason=None,
        next_attempt_at=None,
        next_poll_at=None if amount_known else now + seconds(policy.poll_initial_seconds),
        poll_interval_seconds=None if amount_known else policy.poll_initial_seconds,
        upstream_may_exist=True,
    )
    return Decision(delivered, "healed_delivered" if healed else "delivered", detail)


def after_amount_fetch(p: Procurement, event: UpstreamReport, decision: Decision) -> Decision:
    """A poll of a delivered procurement is the fetch of its amount: keep the amount, poll no more."""
    if not (event.polled and p.state is State.DELIVERED and decision.procurement.state is State.DELIVERED):
        return decision
    fetched = replace(decision.procurement, next_poll_at=None)
    if p.amount is None and event.amount is not None:
        fetched = replace(fetched, amount=event.amount, currency=event.currency)
    return replace(decision, procurement=fetched)


def _refunded(known: Procurement, event: UpstreamReport, detail: dict[str, Any]) -> Decision:
    refunded = to_exception(known, Reason.UPSTREAM_REFUNDED, message=f"the upstream reports {event.status}")
    if event.refunded_amount is not None:
        detail["refunded_amount"] = event.refunded_amount
    return Decision(refunded, "upstream_refunded", detail)


def reconciled(p: Procurement, event: Reconciled, now: datetime, policy: Policy) -> Decision:
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
        return Decision(to_exception(p, Reason.AMOUNT_MISMATCH, message=message), "amount_mismatch", detail)
    after_delivery = report.status == CANCELED_STATUS or report.status in REFUNDED_STATUSES
    if p.state is State.DELIVERED and after_delivery:
        known = replace(p, upstream_status=report.status)
        return _refunded(known, report, detail)
    decision = upstream_report(p, replace(report, polled=True), now, policy)
    # Reconciliation records its own findings: goods after a resolution are one of them already.
    effects = tuple(effect for effect in decision.effects if not isinstance(effect, GoodsAfterResolution))
    return after_amount_fetch(p, report, replace(decision, effects=effects))


def amount_differs(p: Procurement, amount: str | None, currency: str | None) -> bool:
    """Whether the upstream's amount or currency contradicts the one recorded (unknown ones never do)."""
    if amount is not None and p.amount is not None and Decimal(amount) != Decimal(p.amount):
        return True
    return currency is not None and p.currency is not None and currency != p.currency


# --- polls ------------------------------------------------------------------------------------------------


def poll_claim(p: Procurement, event: PollClaim, now: datetime) -> Decision:
    due = p.next_poll_at is not None and p.next_poll_at <= now
    if p.state not in (State.SUBMITTED, State.DELIVERED) or not due or p.upstream_order_id is None:
        return ignored(p, "poll_not_due")
    until = now + seconds(event.hold_seconds)
    held = replace(p, next_poll_at=until, lease_owner=event.owner, lease_expires_at=until)
    return Decision(held, "poll_claimed", audited=False)


def poll_failed(p: Procurement, event: PollFailed, now: datetime, policy: Policy) -> Decision:
    interval = backoff.next_poll_interval(
        p.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
    )
    if p.state is State.DELIVERED:
        # The amount fetch failed: again later, backing off; never for an order the upstream does not know.
        retry_at = None if event.not_found else now + seconds(interval)
        later = replace(p, next_poll_at=retry_at, poll_interval_seconds=interval)
        return Decision(later, "amount_fetch_failed", {"code": event.code}, audited=False)
    if p.state is not State.SUBMITTED:
        return ignored(p, "poll_not_needed")
    detail = {"code": event.code, "message": event.message}
    if event.not_found:
        missing = to_exception(p, Reason.UPSTREAM_ORDER_MISSING, event.code, event.message)
        return Decision(missing, "upstream_order_missing", detail)
    later = replace(p, next_poll_at=now + seconds(interval), poll_interval_seconds=interval)
    return Decision(later, "poll_failed", detail, audited=False)


def give_up(p: Procurement, event: GiveUp) -> Decision:
    if p.state is State.DELIVERED:
        return Decision(replace(p, next_poll_at=None), "amount_fetch_given_up", audited=False)
    if p.state is not State.SUBMITTED:
        return ignored(p, "give_up_not_needed")
    message = f"not delivered after {int(event.waited_seconds)} s"
    return Decision(to_exception(p, Reason.STALE, message=message), "stale", {"message": message})
