"""Fallback polls: ``GET /orders/:id`` for submitted, undelivered procurements whose callbacks are late.

Polls go through the same state-change path as callbacks. They run at poll priority, so order submissions
go first within the upstream's request budget.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from procurd.aio import wait_for_any
from procurd.procurement.model import Event, GiveUp, PollFailed, Source, UpstreamReport
from procurd.procurement.service import ProcurementService
from procurd.upstream.client import UpstreamClient
from procurd.upstream.errors import BusinessError, UpstreamError
from procurd.upstream.models import UpstreamOrder

log = structlog.get_logger("procurd.poller")

POLL_BATCH = 20


def report_of(order: UpstreamOrder) -> UpstreamReport:
    return UpstreamReport(
        order_id=order.order_id,
        status=order.status,
        order_no=order.order_no,
        fulfillment=order.fulfillment.to_json() if order.fulfillment is not None else None,
        amount=None if order.amount is None else str(order.amount),
        currency=order.currency,
        refunded_amount=None if order.refunded_amount is None else str(order.refunded_amount),
        polled=True,
    )


class Poller:
    """Polls one upstream's due orders."""

    def __init__(self, service: ProcurementService, client: UpstreamClient, give_up_seconds: float) -> None:
        self.service = service
        self.client = client
        self.give_up_seconds = give_up_seconds
        self.upstream = client.name
        self.wakeup = asyncio.Event()

    async def poll_due(self) -> int:
        """Poll every procurement that is due now; returns how many were handled."""
        handled = 0
        while True:
            rows = await self.service.claim_polls(self.upstream, POLL_BATCH)
            if not rows:
                return handled
            for row in rows:
                await self.service.apply(row.id, await self._event_for(row), Source.POLL)
                handled += 1

    async def _event_for(self, row: Any) -> Event:
        waited = (self.service.clock() - row.submitted_at).total_seconds() if row.submitted_at else 0.0
        if waited > self.give_up_seconds:
            return GiveUp(waited)
        try:
            order = await self.client.get_order(row.upstream_order_id)
        except BusinessError as exc:
            return PollFailed(exc.code, exc.message, not_found=exc.code == "order_not_found")
        except UpstreamError as exc:
            log.info("poll.failed", procurement_id=row.id, code=exc.code, upstream=self.upstream)
            return PollFailed(exc.code, exc.message)
        return report_of(order)

    async def run(self, stop: asyncio.Event, interval: float) -> None:
        """Poll whenever woken (the scheduler's tick) or every ``interval`` seconds, until ``stop``."""
        while not stop.is_set():
            try:
                await self.poll_due()
            except Exception:
                log.exception("poll.round_failed", upstream=self.upstream)
            self.wakeup.clear()
            await wait_for_any(stop, self.wakeup, timeout=interval)
