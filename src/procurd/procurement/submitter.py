"""Submitters: claim due procurements of one upstream, send them, hand each answer to the state path.

The claim (and the attempt it counts) is committed before the HTTP call, so no second path can submit the
same procurement while the first call is in flight; a submitter that dies leaves a claim that expires and is
taken again (the upstream's idempotency by ``downstream_order_no`` then hands back the order instead of
paying twice).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping

import structlog

from procurd.background import Worker
from procurd.core.procurement import (
    Event,
    Procurement,
    Source,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
)
from procurd.db.errors import DatabaseUnavailable
from procurd.procurement.service import ProcurementService
from procurd.upstream.errors import (
    AuthError,
    BusinessError,
    ConnectFailed,
    NotDelivered,
    OutcomeUnknown,
    PaymentFailed,
    PriceChanged,
    RateLimited,
    UpstreamError,
)
from procurd.upstream.interface import Upstream
from procurd.upstream.models import CreateOrderRequest, OrderCreated

log = structlog.get_logger("procurd.submitter")

AnswerHook = Callable[[str, OrderCreated | UpstreamError], Awaitable[None]]
"""Told of every answer (or failure) of an order creation, with the upstream's name."""


def submission_request(p: Procurement, callback_url: str | None) -> CreateOrderRequest:
    return CreateOrderRequest(
        sku_id=p.sku_id,
        quantity=p.quantity,
        manual_form_data=dict(p.manual_form_data) if p.manual_form_data is not None else None,
        downstream_order_no=p.downstream_order_no,
        trace_id=p.trace_id or p.order_no,
        callback_url=callback_url,
        unit_limit=p.unit_limit,
        limit_given=p.max_unit_price is not None,
        fulfillment_type=p.fulfillment_type,
    )


def outcome_event(owner: str, outcome: OrderCreated | UpstreamError) -> Event:
    """The state machine's event for what the upstream answered (or failed to)."""
    match outcome:
        case OrderCreated():
            amount = None if outcome.amount is None else str(outcome.amount)
            goods = None if outcome.fulfillment is None else outcome.fulfillment.to_json()
            return SubmitAccepted(
                owner, outcome.order_id, outcome.order_no, outcome.status, amount, outcome.currency, goods
            )
        case OutcomeUnknown():
            return SubmitRejected(
                owner,
                "outcome_unknown",
                outcome.code,
                outcome_unknown_message(outcome),
                details=outcome.details,
            )
        case NotDelivered():
            return SubmitRejected(
                owner,
                "not_delivered",
                outcome.code,
                settling(outcome.message, outcome.details),
                outcome.order_id,
                outcome.order_no,
                "paid",
                outcome.amount,
                outcome.currency,
            )
        case PriceChanged():
            # Nothing was bought: sent again after the backoff, its price asked again first.
            return SubmitUnavailable(owner, outcome.code, outcome.message, request_sent=False)
        case PaymentFailed():
            return SubmitRejected(
                owner,
                "payment_failed",
                outcome.code,
                outcome.message,
                outcome.order_id,
                outcome.order_no,
                outcome.status,
            )
        case AuthError():
            return SubmitRejected(owner, "auth", outcome.code, outcome.message)
        case BusinessError():
            return SubmitRejected(owner, "business", outcome.code, outcome.described())
        case RateLimited():
            return SubmitUnavailable(owner, outcome.code, outcome.message, True, outcome.retry_after)
        case ConnectFailed():
            return SubmitUnavailable(owner, outcome.code, outcome.message, request_sent=False)
        case _:
            return SubmitUnavailable(owner, outcome.code, outcome.message)


def outcome_unknown_message(error: OutcomeUnknown) -> str:
    """What a person needs to settle a purchase whose outcome is unknown: why, the request number, what was
    bought, the balance before and after, and where the upstream's purchase records are."""
    return settling(f"{error.message} ({error.cause}); nothing is sent again by itself", error.details)


def settling(message: str, known: Mapping[str, str]) -> str:
    """``message`` with what ``known`` names for a person settling a purchase with the upstream."""
    parts = [message]
    labels = (
        ("request_no", "request number"),
        ("code", "commodity"),
        ("quantity", "quantity"),
        ("balance_before", "balance before"),
        ("balance_after", "balance after"),
        ("purchase_records", "the member's purchase records"),
    )
    parts += [f"{label} {known[key]}" for key, label in labels if known.get(key)]
    return "; ".join(parts)


class Submitter(Worker):
    """Up to ``size`` concurrent submissions for one upstream, fed by a single claimer.

    The claimer takes as many due procurements as there are free slots in one command, so an order costs one
    claim however many slots are idle. Each claim has an owner of its own: a late answer for a claim that
    expired and was taken again is recognised as stale.
    """

    def __init__(
        self,
        service: ProcurementService,
        client: Upstream,
        instance: str,
        size: int,
        callback_url: str | None,
        *,
        on_answer: AnswerHook | None = None,
        idle_seconds: float = 5.0,
    ) -> None:
        super().__init__()
        self.service = service
        self.client = client
        self.upstream = client.name
        self.name = f"submitter {self.upstream}"
        self.size = size
        self.callback_url = callback_url
        self.on_answer = on_answer
        self.idle_seconds = idle_seconds
        self.wakeup = service.wakeups.for_upstream(self.upstream)
        self.owner_prefix = f"{instance}/{self.upstream}"
        self.in_flight: set[asyncio.Task[None]] = set()
        self._claims = itertools.count(1)
        self._failure: BaseException | None = None

    async def step(self) -> float | None:
        if self._failure is not None:
            raise self._failure
        free = self.size - len(self.in_flight)
        if free <= 0:
            return None  # a finished submission wakes us
        owner = f"{self.owner_prefix}/{next(self._claims)}"
        claims = await self.service.claim_submissions(self.upstream, owner, free)
        claimed = claims.procurements
        for procurement in claimed:
            task = asyncio.create_task(self.submit(procurement, owner))
            self.in_flight.add(task)
            task.add_done_callback(self._finished)
        if len(claimed) == free:
            return None
        due = claims.next_due  # read by the claim, after it: no look of its own
        return None if due is None else (due - self.service.clock()).total_seconds()

    async def submit(self, procurement: Procurement, owner: str) -> None:
        """Send one procurement claimed by ``owner`` and record what the upstream answered."""
        bound = structlog.contextvars.bound_contextvars(
            order_no=procurement.order_no,
            downstream_order_no=procurement.downstream_order_no,
            upstream=self.upstream,
        )
        with bound:
            outcome: OrderCreated | UpstreamError
            try:
                outcome = await self.client.create_order(submission_request(procurement, self.callback_url))
            except UpstreamError as exc:
                outcome = exc
            event = outcome_event(owner, outcome)
            try:
                await self.service.apply(procurement.id, event, Source.WORKER, order_no=procurement.order_no)
            except DatabaseUnavailable as exc:
                # The claim stays until it expires; the procurement is then sent again under its number.
                log.warning("submission.not_recorded", procurement_id=procurement.id, reason=exc.reason)
            if self.on_answer is not None:
                await self.on_answer(self.upstream, outcome)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self.wakeup.set()
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    async def drain(self) -> None:
        if self.in_flight:
            await asyncio.gather(*self.in_flight, return_exceptions=True)
