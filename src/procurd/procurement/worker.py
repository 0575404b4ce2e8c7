"""Submission workers: claim a due procurement, send it upstream, hand the outcome to the service.

The claim is committed before the HTTP call, so no second path can submit the same procurement while the
first call is in flight; a worker that dies leaves a claim that expires and is taken again (the upstream's
idempotency by ``downstream_order_no`` then hands back the order instead of paying twice).
"""

from __future__ import annotations

import asyncio
import itertools
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
    ConnectFailed,
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
    sent = not isinstance(outcome, ConnectFailed)
    return SubmitUnavailable(worker, outcome.code, outcome.message, request_sent=sent)


def _text(value: object) -> str | None:
    return None if value is None else str(value)


class SubmissionWorker:
    """Sends claimed procurements of one upstream and hands each outcome to the service."""

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
        await self.submit(claimed[0], self.worker_id)
        return True

    async def submit(self, row: Any, claim_owner: str) -> None:
        """Send one procurement claimed under ``claim_owner`` and record what the upstream answered."""
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
            await self.service.apply(row.id, outcome_event(claim_owner, outcome), Source.WORKER)

    async def idle_delay(self) -> float:
        """How long to wait before looking again: until the next retry falls due, at most a second."""
        try:
            due = await self.service.next_due_at(self.upstream)
        except Exception:  # noqa: BLE001
            return IDLE_POLL_SECONDS
        if due is None:
            return IDLE_POLL_SECONDS
        seconds = (due - self.service.clock()).total_seconds()
        return max(0.0, min(IDLE_POLL_SECONDS, seconds))


class SubmissionPool:
    """Up to ``size`` concurrent submissions for one upstream, fed by a single claimer.

    The claimer takes as many due procurements as there are free slots in one statement, so an order costs
    one claim however many workers are idle, and an idle pool asks the database once per
    ``IDLE_POLL_SECONDS`` instead of once per worker. Each claim gets an owner of its own: a late answer
    for a claim that expired and was taken again is recognised as stale.
    """

    def __init__(self, worker: SubmissionWorker, size: int) -> None:
        self.worker = worker
        self.size = size
        self.in_flight: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()
        self._claims = itertools.count(1)

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set; submissions in flight then finish and are recorded."""
        wakeup = self.worker.service.wakeups.for_upstream(self.worker.upstream)
        try:
            while not stop.is_set():
                free = self.size - len(self.in_flight)
                if free <= 0:
                    self._slot_freed.clear()
                    await wait_for_any(stop, self._slot_freed, timeout=IDLE_POLL_SECONDS)
                    continue
                wakeup.clear()
                claimed = await self._claim(free)
                if claimed is None:
                    await wait_for_any(stop, timeout=IDLE_POLL_SECONDS)
                elif claimed < free:
                    await wait_for_any(stop, wakeup, timeout=await self.worker.idle_delay())
        finally:
            if self.in_flight:
                await asyncio.gather(*self.in_flight, return_exceptions=True)

    async def _claim(self, limit: int) -> int | None:
        """Claim up to ``limit`` due procurements and start sending them; ``None`` when the claim failed."""
        owner = f"{self.worker.worker_id}/{next(self._claims)}"
        try:
            rows = await self.worker.service.claim_due(self.worker.upstream, owner, limit=limit)
        except Exception:
            log.exception("worker.error", worker=self.worker.worker_id, upstream=self.worker.upstream)
            return None
        for row in rows:
            task = asyncio.create_task(self._send(row, owner))
            self.in_flight.add(task)
            task.add_done_callback(self._finished)
        return len(rows)

    async def _send(self, row: Any, owner: str) -> None:
        try:
            await self.worker.submit(row, owner)
        except Exception:
            # The claim stays until it expires; the procurement is then taken again.
            log.exception("worker.error", worker=owner, upstream=self.worker.upstream, procurement_id=row.id)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.in_flight.discard(task)
        self._slot_freed.set()
