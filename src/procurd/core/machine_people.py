"""The state machine (pure), a person's actions: retry an exception (under a new number once the upstream
canceled the old one), resolve it by hand, cancel (locally, or once the upstream confirmed).

Decided through :func:`procurd.core.machine.decide`, the one entry."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from procurd.core.machine_records import ignored, released
from procurd.core.machine_submission import moved_to
from procurd.core.numbers import retry_number
from procurd.core.procurement import (
    CANCELED_STATUS,
    Cancel,
    Decision,
    NotAllowed,
    NumberAdded,
    NumberRetired,
    Procurement,
    Reason,
    Resolve,
    Retry,
    State,
)

# --- people -----------------------------------------------------------------------------------------------


def retry(p: Procurement, event: Retry, now: datetime) -> Decision:
    if p.state is not State.EXCEPTION:
        raise NotAllowed("not_an_exception", f"procurement is {p.state.value}, not exception")
    if p.exception_reason == Reason.NOT_DELIVERED or (
        p.exception_reason == Reason.OUTCOME_UNKNOWN and not event.nothing_bought
    ):
        raise NotAllowed(p.exception_reason, settle_with_upstream(p))
    queued = released(
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
    if p.exception_reason == Reason.OUTCOME_UNKNOWN:
        detail["nothing_bought"] = True  # a person's word: sent again under the same number
    if p.offer_code is not None and p.source_position > 0 and not p.upstream_may_exist:
        # No upstream order can exist under the number: the offer starts again from its first source.
        if p.number_canceled:
            queued = replace(queued, upstream_order_id=None, upstream_order_no=None, upstream_status=None)
        restarted = moved_to(queued, 0, p.failovers, now, detail, "retry")
        return _renumbered(p, restarted) if p.number_canceled else restarted
    if not p.number_canceled:
        detail["downstream_order_no"] = p.downstream_order_no
        return Decision(queued, "retry", detail)
    return _renumbered(p, Decision(queued, "retry", detail))


def settle_with_upstream(p: Procurement) -> str:
    """Why ``p`` is not sent again, and what a person does instead."""
    if p.exception_reason == Reason.NOT_DELIVERED:
        what = f"the upstream made and charged order {p.upstream_order_no or p.upstream_order_id} "
        what += "but delivered nothing usable"
        after = "then resolve it with a note"
    else:
        what = "the upstream may have made the purchase (its outcome is unknown)"
        after = (
            "then resolve it with a note, or, if nothing was bought, retry it with nothing_bought and a note "
            "(sent again under the same number)"
        )
    return (
        f"not sent again: {what}, and sending it again could buy twice. Settle it with the upstream (its "
        f"purchase records, the balance before and after, named in the exception), {after}"
    )


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


def resolve(p: Procurement, event: Resolve) -> Decision:
    if p.state is not State.EXCEPTION:
        raise NotAllowed("not_an_exception", f"procurement is {p.state.value}, not exception")
    resolved = replace(
        p, state=State.RESOLVED, resolution_note=event.note, next_attempt_at=None, next_poll_at=None
    )
    return Decision(resolved, "resolved", {"note": event.note, "previous_reason": p.exception_reason})


def cancel(p: Procurement, event: Cancel) -> Decision:
    if p.state in (State.CANCELED, State.RESOLVED):
        return ignored(p, "duplicate")
    unscheduled = released(p, state=State.CANCELED, next_poll_at=None, next_attempt_at=None)
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
