"""Submission workers: claim a due procurement, send it upstream, hand the outcome to the service.

The claim is committed before the HTTP call, so no second path can submit the same procurement while the
first call is in flight; a worker that dies leaves a claim that expires and is taken again (the upstream's
idempotency by ``downstream_order_no`` then hands back the order instead of paying twice).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from procurd.aio import wait_for_any
from procurd.procurement.model import (
    Event,
    Source,
    SubmitAccepted,
    SubmitRejected,
    SubmitUnavailable,
)
from procurd.procurement.service import ProcurementService
from procurd.upstream.client import UpstreamClient
from procurd.upstream.errors import (
    AuthError,
    BusinessError,
    PaymentFailed,
    RateLimited,
    UpstreamError,
    UpstreamUnavailable,
)
from procurd.upstream.models import CreateOrderRequest, OrderCreated

log = structlog.get_logger("procurd.worker")

# How often an idle worker looks for work queued by another process (in-process intake wakes it at once).
IDLE_POLL_SECONDS = 1.0

AuthFailureHook = Callable[[str, AuthError], Awaitable[None]]


def submission_request(row: Any, callback_url: str | None) -> CreateOrderRequest:
    return CreateOrderRequest(
        sku_id=row.sku_id,
        quantity=row.quantity,
        manual_form_data=row.manual_form_data,
        downstream_order_no=row.downstream_order_no,
        trace_id=row.trace_id or row.order_no,
        callback_url=callback_url,
    )


def outcome_event(worker: str, outcome: OrderCreated | UpstreamError) -> Event:
    """The state-machine event for what the upstream answered (or failed to)."""
    if isinstance(outcome, OrderCreated):
        return SubmitAccepted(
            worker,
            outcome.order_id,
            outcome.order_no,
            outcome.status,
            _text(outcome.amount),
            outcome.currency,
        )
    if isinstance(outcome, PaymentFailed):
        return SubmitRejected(
            worker,
            "payment_failed",
            outcome.code,
            outcome.message,
            outcome.order_id,
            outcome.order_no,
            outcome.status,
        )
    if isinstance(outcome, AuthError):
        return SubmitRejected(worker, "auth", outcome.code, outcome.message)
    if isinstance(outcome, BusinessError):
        return SubmitRejected(worker, "business", outcome.code, outcome.message)
    if isinstance(outcome, RateLimited):
        return SubmitUnavailable(worker, outcome.code, outcome.message, True, outcome.retry_after)
    assert isinstance(outcome, UpstreamUnavailable)
    return SubmitUnavailable(worker, outcome.code, outcome.message)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


class SubmissionWorker:
    """One worker task of one upstream."""

    def __init__(
        self,
        service: ProcurementService,
        client: UpstreamClient,
        worker_id: str,
        callback_url: str | None,
        on_auth_failure: AuthFailureHook | None = None,
    ) -> None:
        self.service = service
        self.client = client
        self.worker_id = worker_id
        self.callback_url = callback_url
        self.on_auth_failure = on_auth_failure
        self.upstream = client.name

    async def run_once(self) -> bool:
        """Claim and submit one due procurement; ``False`` when nothing was due."""
        claimed = await self.service.claim_due(self.upstream, self.worker_id, limit=1)
        if not claimed:
            return False
        row = claimed[0]
        bound = structlog.contextvars.bound_contextvars(
            order_no=row.order_no, downstream_order_no=row.downstream_order_no, upstream=self.upstream
        )
        with bound:
            outcome: OrderCreated | UpstreamError
            try:
                outcome = await self.client.create_order(submission_request(row, self.callback_url))
            except UpstreamError as exc:
                outcome = exc
            if isinstance(outcome, AuthError) and self.on_auth_failure is not None:
                await self.on_auth_failure(self.upstream, outcome)
            await self.service.apply(row.id, outcome_event(self.worker_id, outcome), Source.WORKER)
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set; an in-flight submission always finishes and is recorded."""
        wakeup = self.service.wakeups.for_upstream(self.upstream)
        while not stop.is_set():
            try:
                worked = await self.run_once()
            except Exception:
                log.exception("worker.error", worker=self.worker_id, upstream=self.upstream)
                worked = False
                await wait_for_any(stop, timeout=IDLE_POLL_SECONDS)
                continue
            if worked:
                continue
            wakeup.clear()
            delay = await self._idle_delay()
            await wait_for_any(stop, wakeup, timeout=delay)

    async def _idle_delay(self) -> float:
        try:
            due = await self.service.next_due_at(self.upstream)
        except Exception:  # noqa: BLE001
            return IDLE_POLL_SECONDS
        if due is None:
            return IDLE_POLL_SECONDS
        seconds = (due - self.service.clock()).total_seconds()
        return max(0.0, min(IDLE_POLL_SECONDS, seconds))
