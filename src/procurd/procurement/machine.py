"""The procurement state machine (pure): one event and the current snapshot in, one decision out.

Every state change of a procurement — worker outcome, callback, poll, admin action, cancel — is decided
here and applied by :mod:`procurd.procurement.service` in one transaction. Rules (seed 000 part 1 and 3):

* nothing cancels or refunds by itself: failures become exceptions for a person;
* a state never moves backwards: a late ``paid`` after ``delivered`` is recorded, not applied;
* an upstream report may heal an exception that was only procurd not knowing the order existed;
* the same downstream order number is reused while an upstream order under it may be live; once the
  upstream canceled the order under it, a retry takes a new number.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from procurd.procurement import backoff
from procurd.procurement.model import (
    CANCELED_STATUS,
    COMPLETED_STATUS,
    DELIVERED_STATUSES,
    HEALABLE_REASONS,
    REFUNDED_STATUSES,
    Cancel,
    Decision,
    Event,
    GiveUp,
    PollFailed,
    Reason,
    Resolve,
    Retry,
    Snapshot,
    State,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
    UpstreamReport,
)
from procurd.procurement.numbers import retry_number


@dataclass(frozen=True, slots=True)
class Policy:
    """The schedule knobs of ``[procurement]``."""

    max_attempts: int = 6
    retry_base_seconds: float = 1
    retry_max_seconds: float = 300
    poll_initial_seconds: float = 30
    poll_max_seconds: float = 900


class NotAllowed(Exception):
    """An admin action that does not apply to the procurement's state."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def decide(
    snapshot: Snapshot, event: Event, now: datetime, policy: Policy, rng: random.Random | None = None
) -> Decision:
    """The decision for ``event``; raises :class:`NotAllowed` for an admin action that does not apply."""
    match event:
        case SubmitAccepted():
            return _submit_accepted(snapshot, event, now, policy)
        case SubmitRejected():
            return _submit_rejected(snapshot, event)
        case SubmitUnavailable():
            return _submit_unavailable(snapshot, event, now, policy, rng)
        case UpstreamReport():
            return _after_amount_fetch(snapshot, event, _upstream_report(snapshot, event, now, policy))
        case PollFailed():
            return _poll_failed(snapshot, event, now, policy)
        case GiveUp():
            return _give_up(snapshot, event)
        case Retry():
            return _retry(snapshot, event, now)
        case Resolve():
            return _resolve(snapshot, event)
        case Cancel():
            return _cancel(snapshot, event)
    raise TypeError(f"unknown event {event!r}")  # pragma: no cover


def _exception(reason: str, code: str | None = None, message: str | None = None) -> dict[str, Any]:
    return {
        "exception_reason": reason,
        "last_error_code": code or reason,
        "last_error_message": message,
        "lease_owner": None,
        "lease_expires_at": None,
        "next_attempt_at": None,
        "next_poll_at": None,
    }


def _ignored(snapshot: Snapshot, event: str, **detail: Any) -> Decision:
    return Decision(snapshot.state, event, detail=detail, record=False)


def _holds_claim(snapshot: Snapshot, worker: str) -> bool:
    return snapshot.state is State.QUEUED and snapshot.lease_owner == worker


# --- worker outcomes --------------------------------------------------------------------------------------


def _submit_accepted(snapshot: Snapshot, event: SubmitAccepted, now: datetime, policy: Policy) -> Decision:
    if not _holds_claim(snapshot, event.worker):
        # Another path already settled it (a callback, or a worker whose claim outlived ours). Callbacks
        # carry no amount: keep the one this answer brings, without touching the state.
        if snapshot.upstream_order_id == event.order_id and snapshot.amount is None and event.amount:
            changes = {
                "amount": event.amount,
                "currency": event.currency,
                "upstream_order_no": event.order_no,
            }
            if snapshot.state is State.DELIVERED:
                changes["next_poll_at"] = None  # the amount fetch a delivery without it asked for
            return Decision(snapshot.state, "late_submission_answer", changes, record=False)
        return _ignored(snapshot, "late_submission_answer", status=event.status, order_id=event.order_id)
    ids: dict[str, Any] = {
        "upstream_order_id": event.order_id,
        "upstream_order_no": event.order_no,
        "upstream_status": event.status,
        "amount": event.amount,
        "currency": event.currency,
        "lease_owner": None,
        "lease_expires_at": None,
        "next_attempt_at": None,
        "upstream_may_exist": True,
    }
    detail = {"order_id": event.order_id, "order_no": event.order_no, "status": event.status}
    if event.status == CANCELED_STATUS:
        # A repeated number answers with the order it already holds, canceled ones included.
        ids.update(_exception(Reason.UPSTREAM_CANCELED, message="the upstream holds this number as canceled"))
        ids["upstream_may_exist"] = False
        return Decision(State.EXCEPTION, "upstream_canceled", ids, detail, burn_number=True)
    if event.status in REFUNDED_STATUSES:
        ids.update(_exception(Reason.UPSTREAM_REFUNDED, message=f"the upstream reports {event.status}"))
        return Decision(State.EXCEPTION, "upstream_refunded", ids, detail)
    ids.update(
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
    return Decision(State.SUBMITTED, "submitted", ids, detail)


def _submit_rejected(snapshot: Snapshot, event: SubmitRejected) -> Decision:
    if not _holds_claim(snapshot, event.worker):
        return _ignored(snapshot, "late_submission_answer", code=event.code)
    detail: dict[str, Any] = {"code": event.code, "message": event.message}
    if event.kind == "payment_failed":
        changes = _exception(Reason.PAYMENT_FAILED, event.code, event.message)
        changes.update(
            upstream_order_id=event.order_id,
            upstream_order_no=event.order_no,
            upstream_status=event.status or CANCELED_STATUS,
            upstream_may_exist=False,
        )
        detail.update(order_id=event.order_id, order_no=event.order_no)
        return Decision(State.EXCEPTION, "payment_failed", changes, detail, burn_number=True)
    # A definite refusal proves this request created nothing; an earlier attempt whose answer was lost
    # may still have, so upstream_may_exist keeps its value.
    changes = _exception(event.code, event.code, event.message)
    detail["kind"] = event.kind
    return Decision(State.EXCEPTION, f"{event.kind}_error", changes, detail)


def _submit_unavailable(
    snapshot: Snapshot, event: SubmitUnavailable, now: datetime, policy: Policy, rng: random.Random | None
) -> Decision:
    if not _holds_claim(snapshot, event.worker):
        return _ignored(snapshot, "late_submission_answer", code=event.code)
    detail: dict[str, Any] = {"code": event.code, "message": event.message, "attempt": snapshot.attempts}
    release: dict[str, Any] = {
        "lease_owner": None,
        "lease_expires_at": None,
        "last_error_code": event.code,
        "last_error_message": event.message,
    }
    if event.rate_limited:
        # Throttled before the upstream looked at the request: not an attempt, and nothing was created.
        wait = event.retry_after if event.retry_after is not None else policy.retry_base_seconds
        release.update(next_attempt_at=now + _seconds(wait), attempts=max(0, snapshot.attempts - 1))
        return Decision(State.QUEUED, "rate_limited", release, detail)
    # A request that went out may have made the order even though no answer came back.
    may_exist = snapshot.upstream_may_exist or event.request_sent
    release["upstream_may_exist"] = may_exist
    if snapshot.attempts >= policy.max_attempts:
        changes = _exception(Reason.MAX_ATTEMPTS_EXCEEDED, event.code, event.message)
        changes["upstream_may_exist"] = may_exist
        return Decision(State.EXCEPTION, "max_attempts_exceeded", changes, detail)
    delay = backoff.retry_delay(snapshot.attempts, policy.retry_base_seconds, policy.retry_max_seconds, rng)
    release["next_attempt_at"] = now + _seconds(delay)
    detail["retry_in_seconds"] = round(delay, 3)
    return Decision(State.QUEUED, "retry_scheduled", release, detail)


# --- what the upstream says (callback or poll) ------------------------------------------------------------


def _upstream_report(snapshot: Snapshot, event: UpstreamReport, now: datetime, policy: Policy) -> Decision:
    status = event.status
    detail: dict[str, Any] = {"status": status, "order_id": event.order_id}
    known: dict[str, Any] = {
        "upstream_order_id": event.order_id,
        "upstream_order_no": event.order_no or snapshot.upstream_order_no,
        "upstream_status": status,
    }
    if event.amount is not None:
        known["amount"] = event.amount
    if event.currency is not None:
        known["currency"] = event.currency
    same_status = status == snapshot.upstream_status

    if snapshot.state is State.DELIVERED:
        if status in DELIVERED_STATUSES:
            if same_status:
                return _ignored(snapshot, "duplicate")
            if snapshot.upstream_status == COMPLETED_STATUS:
                # A delivered report that arrives after completed is older news: recorded, not applied.
                return Decision(State.DELIVERED, "late_status_ignored", {}, detail)
            return Decision(State.DELIVERED, "status_recorded", {"upstream_status": status}, detail)
        if status == CANCELED_STATUS:
            changes = _exception(Reason.CONFLICTING_CALLBACK, message="canceled after delivered")
            return Decision(State.EXCEPTION, "conflicting_status", changes, detail)
        if status in REFUNDED_STATUSES:
            return _refunded(event, detail)
        return Decision(State.DELIVERED, "late_status_ignored", {}, detail)

    if snapshot.state is State.CANCELED:
        if status == CANCELED_STATUS:
            return _ignored(snapshot, "duplicate")
        if status in DELIVERED_STATUSES:
            changes = _exception(Reason.CONFLICTING_CALLBACK, message=f"{status} after canceled")
            changes["fulfillment"] = event.fulfillment
            return Decision(State.EXCEPTION, "conflicting_status", changes, detail)
        return Decision(State.CANCELED, "late_status_ignored", {}, detail)

    if snapshot.state is State.RESOLVED:
        if status in DELIVERED_STATUSES and event.fulfillment and snapshot.fulfillment is None:
            changes = dict(known, fulfillment=event.fulfillment, delivered_at=now)
            return Decision(State.RESOLVED, "delivered_after_resolution", changes, detail)
        if same_status:
            return _ignored(snapshot, "duplicate")
        return Decision(State.RESOLVED, "status_after_resolution", {"upstream_status": status}, detail)

    if snapshot.state is State.EXCEPTION and snapshot.exception_reason not in HEALABLE_REASONS:
        if (
            status in DELIVERED_STATUSES
            and event.fulfillment
            and snapshot.exception_reason
            not in (
                Reason.CONFLICTING_CALLBACK,
                Reason.UPSTREAM_REFUNDED,
            )
        ):
            return _delivered(snapshot, known, event, now, policy, detail, healed=True)
        if same_status:
            return _ignored(snapshot, "duplicate")
        return Decision(State.EXCEPTION, "status_recorded", {"upstream_status": status}, detail)

    # queued (the answer to our submission was lost), submitted, or a healable exception
    healing = snapshot.state is State.EXCEPTION
    if status in DELIVERED_STATUSES:
        if event.fulfillment:
            return _delivered(snapshot, known, event, now, policy, detail, healed=healing)
        # Delivered without the content (a status-only report): fetch the order at once, unless this was
        # the fetch itself, which then backs off like any unchanged poll.
        if event.polled:
            return _poll_unchanged(snapshot, known, now, policy, detail)
        if same_status and snapshot.state is State.SUBMITTED:
            # A repeat: the fetch the first report asked for is already scheduled.
            return _ignored(snapshot, "duplicate")
        changes = dict(known, next_poll_at=now, poll_interval_seconds=snapshot.poll_interval_seconds)
        return _live(snapshot, changes, now, detail, healing, "delivery_pending_fetch")
    if status == CANCELED_STATUS:
        changes = _exception(Reason.UPSTREAM_CANCELED, message="the upstream canceled the order")
        changes.update(known, upstream_may_exist=False)
        return Decision(State.EXCEPTION, "upstream_canceled", changes, detail, burn_number=True)
    if status in REFUNDED_STATUSES:
        return _refunded(event, detail, known)
    if same_status and snapshot.state is State.SUBMITTED:
        if event.polled:
            return _poll_unchanged(snapshot, known, now, policy, detail)
        return _ignored(snapshot, "duplicate")
    interval = snapshot.poll_interval_seconds or policy.poll_initial_seconds
    changes = dict(known, next_poll_at=now + _seconds(interval), poll_interval_seconds=interval)
    return _live(snapshot, changes, now, detail, healing, "status_changed")


def _poll_unchanged(
    snapshot: Snapshot, known: dict[str, Any], now: datetime, policy: Policy, detail: dict[str, Any]
) -> Decision:
    interval = backoff.next_poll_interval(
        snapshot.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
    )
    changes = dict(known, next_poll_at=now + _seconds(interval), poll_interval_seconds=interval)
    if snapshot.state is not State.SUBMITTED:
        return _live(snapshot, changes, now, detail, snapshot.state is State.EXCEPTION, "status_changed")
    return Decision(State.SUBMITTED, "poll_unchanged", changes, detail, record=False)


def _live(
    snapshot: Snapshot,
    changes: dict[str, Any],
    now: datetime,
    detail: dict[str, Any],
    healing: bool,
    name: str,
) -> Decision:
    """The upstream holds a live order: the procurement is (or becomes) submitted."""
    changes.update(upstream_may_exist=True)
    if snapshot.state is not State.SUBMITTED:
        changes.update(
            submitted_at=snapshot.submitted_at or now,
            lease_owner=None,
            lease_expires_at=None,
            next_attempt_at=None,
            exception_reason=None,
        )
        name = "healed" if healing else "found_upstream"
    return Decision(State.SUBMITTED, name, changes, detail)


def _delivered(
    snapshot: Snapshot,
    known: dict[str, Any],
    event: UpstreamReport,
    now: datetime,
    policy: Policy,
    detail: dict[str, Any],
    healed: bool,
) -> Decision:
    # A callback carries no amount: when the submission's answer was lost too (a crash, a timeout), one
    # poll fetches it, unless a late answer brings it first.
    amount_known = known.get("amount") is not None or snapshot.amount is not None
    changes = dict(
        known,
        fulfillment=event.fulfillment,
        delivered_at=now,
        exception_reason=None,
        lease_owner=None,
        lease_expires_at=None,
        next_attempt_at=None,
        next_poll_at=None if amount_known else now + _seconds(policy.poll_initial_seconds),
        poll_interval_seconds=None if amount_known else policy.poll_initial_seconds,
        upstream_may_exist=True,
    )
    return Decision(State.DELIVERED, "healed_delivered" if healed else "delivered", changes, detail)


def _after_amount_fetch(snapshot: Snapshot, event: UpstreamReport, decision: Decision) -> Decision:
    """A poll of a delivered procurement is the fetch of its amount: keep the amount, poll no more."""
    if not (event.polled and snapshot.state is State.DELIVERED and decision.state is State.DELIVERED):
        return decision
    fetched: dict[str, Any] = {"next_poll_at": None}
    if snapshot.amount is None and event.amount is not None:
        fetched.update(amount=event.amount, currency=event.currency)
    return replace(decision, changes={**decision.changes, **fetched})


def _refunded(event: UpstreamReport, detail: dict[str, Any], known: dict[str, Any] | None = None) -> Decision:
    changes = _exception(Reason.UPSTREAM_REFUNDED, message=f"the upstream reports {event.status}")
    changes.update(known or {"upstream_status": event.status})
    if event.refunded_amount is not None:
        detail["refunded_amount"] = event.refunded_amount
    return Decision(State.EXCEPTION, "upstream_refunded", changes, detail)


def _poll_failed(snapshot: Snapshot, event: PollFailed, now: datetime, policy: Policy) -> Decision:
    if snapshot.state is State.DELIVERED:
        # The amount fetch failed: again later, backing off; never for an order the upstream does not know.
        interval = backoff.next_poll_interval(
            snapshot.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
        )
        retry_at = None if event.not_found else now + _seconds(interval)
        changes = {"next_poll_at": retry_at, "poll_interval_seconds": interval}
        return Decision(State.DELIVERED, "amount_fetch_failed", changes, {"code": event.code}, record=False)
    if snapshot.state is not State.SUBMITTED:
        return _ignored(snapshot, "poll_not_needed")
    detail = {"code": event.code, "message": event.message}
    if event.not_found:
        changes = _exception(Reason.UPSTREAM_ORDER_MISSING, event.code, event.message)
        return Decision(State.EXCEPTION, "upstream_order_missing", changes, detail)
    interval = backoff.next_poll_interval(
        snapshot.poll_interval_seconds, policy.poll_initial_seconds, policy.poll_max_seconds
    )
    changes = {"next_poll_at": now + _seconds(interval), "poll_interval_seconds": interval}
    return Decision(State.SUBMITTED, "poll_failed", changes, detail, record=False)


def _give_up(snapshot: Snapshot, event: GiveUp) -> Decision:
    if snapshot.state is State.DELIVERED:
        return Decision(State.DELIVERED, "amount_fetch_given_up", {"next_poll_at": None}, record=False)
    if snapshot.state is not State.SUBMITTED:
        return _ignored(snapshot, "give_up_not_needed")
    message = f"not delivered after {int(event.waited_seconds)} s"
    return Decision(State.EXCEPTION, "stale", _exception(Reason.STALE, message=message), {"message": message})


# --- people -----------------------------------------------------------------------------------------------


def _retry(snapshot: Snapshot, event: Retry, now: datetime) -> Decision:
    if snapshot.state is not State.EXCEPTION:
        raise NotAllowed("not_an_exception", f"procurement is {snapshot.state.value}, not exception")
    changes: dict[str, Any] = {
        "exception_reason": None,
        "last_error_code": None,
        "last_error_message": None,
        "attempts": 0,
        "next_attempt_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
        "next_poll_at": None,
        "poll_interval_seconds": None,
    }
    detail: dict[str, Any] = {"previous_reason": snapshot.exception_reason}
    if event.note:
        detail["note"] = event.note
    new_number = None
    if snapshot.number_canceled_upstream:
        # The upstream answers this number with its canceled order forever: buy under a new one.
        new_number = retry_number(_first_number(snapshot.downstream_order_no), snapshot.numbers_used)
        changes.update(
            downstream_order_no=new_number,
            upstream_order_id=None,
            upstream_order_no=None,
            upstream_status=None,
            amount=None,
            currency=None,
            upstream_may_exist=False,
        )
        detail["new_downstream_order_no"] = new_number
    else:
        detail["downstream_order_no"] = snapshot.downstream_order_no
    return Decision(State.QUEUED, "retry", changes, detail, new_number=new_number)


def _first_number(number: str) -> str:
    base, separator, suffix = number.rpartition("-r")
    return base if separator and suffix.isdigit() else number


def _resolve(snapshot: Snapshot, event: Resolve) -> Decision:
    if snapshot.state is not State.EXCEPTION:
        raise NotAllowed("not_an_exception", f"procurement is {snapshot.state.value}, not exception")
    changes = {"resolution_note": event.note, "next_attempt_at": None, "next_poll_at": None}
    detail = {"note": event.note, "previous_reason": snapshot.exception_reason}
    return Decision(State.RESOLVED, "resolved", changes, detail)


def _cancel(snapshot: Snapshot, event: Cancel) -> Decision:
    if snapshot.state in (State.CANCELED, State.RESOLVED):
        return _ignored(snapshot, "duplicate")
    if event.upstream_confirmed:
        changes = {
            "upstream_status": CANCELED_STATUS,
            "upstream_may_exist": False,
            "next_poll_at": None,
            "next_attempt_at": None,
            "lease_owner": None,
            "lease_expires_at": None,
        }
        return Decision(State.CANCELED, "canceled_upstream", changes, burn_number=True)
    reason = cancel_refusal(snapshot)
    if reason is not None:
        raise NotAllowed("cancel_not_allowed", reason)
    changes = {"next_attempt_at": None, "lease_owner": None, "lease_expires_at": None, "next_poll_at": None}
    return Decision(State.CANCELED, "canceled_locally", changes)


def cancel_refusal(snapshot: Snapshot) -> str | None:
    """Why the procurement cannot be canceled without the upstream, or ``None`` when it can be locally."""
    if snapshot.state is State.DELIVERED:
        return "delivered"
    if snapshot.state is State.QUEUED and snapshot.lease_owner is not None:
        return "a submission is in flight"
    if snapshot.upstream_may_exist:
        if snapshot.upstream_order_id is not None:
            return "the upstream order must be canceled first"
        return "an upstream order may exist (an earlier submission's answer was lost)"
    return None


def needs_upstream_cancel(snapshot: Snapshot) -> bool:
    """True when the cancel must go upstream first: a known upstream order that is not canceled."""
    return (
        snapshot.state in (State.SUBMITTED, State.EXCEPTION, State.QUEUED)
        and snapshot.upstream_order_id is not None
        and snapshot.upstream_may_exist
    )


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
