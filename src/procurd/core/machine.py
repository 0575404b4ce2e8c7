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

:func:`decide` is the one entry; it hands each event to the part of the machine that decides it: getting a
procurement bought (:mod:`procurd.core.machine_submission`: admission, claims, an offer's failover, the
answers to a submission), what the upstream says (:mod:`procurd.core.machine_reports`: callbacks, polls,
reconciliation) and a person's actions (:mod:`procurd.core.machine_people`: retry, resolve, cancel), over
what every decision does to a record (:mod:`procurd.core.machine_records`).
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import datetime
from typing import assert_never

from procurd.core.machine_people import cancel, cancel_refusal, needs_upstream_cancel, resolve, retry
from procurd.core.machine_records import Policy, holds_poll, released
from procurd.core.machine_reports import (
    after_amount_fetch,
    check_claim,
    give_up,
    poll_claim,
    poll_failed,
    reconciled,
    upstream_report,
)
from procurd.core.machine_submission import (
    admit,
    claim,
    claim_abandoned,
    submit_accepted,
    submit_rejected,
    submit_unavailable,
)
from procurd.core.procurement import (
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
    NotAllowed,
    PollClaim,
    PollFailed,
    Procurement,
    Reconciled,
    Resolve,
    Retry,
    State,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
    UpstreamReport,
)

__all__ = ["Policy", "cancel_refusal", "decide", "is_noop", "needs_upstream_cancel"]


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
        return admit(event, now)
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
            return claim(p, event, now)
        case ClaimAbandoned():
            return claim_abandoned(p, event, now)
        case SubmitAccepted():
            return submit_accepted(p, event, now, policy)
        case SubmitRejected():
            return submit_rejected(p, event, now)
        case SubmitUnavailable():
            return submit_unavailable(p, event, now, policy, rng)
        case UpstreamReport():
            if event.number is not None and event.number != p.downstream_order_no:
                # About an order under a number the procurement no longer uses (the upstream canceled it).
                detail = {
                    "downstream_order_no": event.number,
                    "status": event.status,
                    "order_id": event.order_id,
                }
                return Decision(p, "status_for_previous_number", detail)
            check_claim(p, event)
            return after_amount_fetch(p, event, upstream_report(p, event, now, policy))
        case Reconciled():
            check_claim(p, event.report)
            return reconciled(p, event, now, policy)
        case ClaimRefused():
            detail = {"order_id": event.order_id, "status": event.status, "reason": event.reason}
            return Decision(p, "callback_unverified", detail)
        case PollClaim():
            return poll_claim(p, event, now)
        case PollFailed():
            return poll_failed(p, event, now, policy)
        case GiveUp():
            return give_up(p, event)
        case Retry():
            return retry(p, event, now)
        case Resolve():
            return resolve(p, event)
        case Cancel():
            return cancel(p, event)
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


def _poll_hold_ended(before: Procurement, event: Event, decision: Decision) -> Decision:
    """A poll's hold ends with the next change of the procurement that is not a poll claim: its answer, a
    callback that came first, a cancel ..."""
    after = decision.procurement
    if isinstance(event, PollClaim) or not holds_poll(before) or after == before:
        return decision
    if after.lease_owner != before.lease_owner:
        return decision
    return replace(decision, procurement=released(after))
