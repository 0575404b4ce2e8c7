"""Fallback polls: ``GET /orders/:id`` for submitted, undelivered procurements whose callbacks are late.

Polls go through the same state path as callbacks, at poll priority, so order submissions go first within
the upstream's request budget. A poll is claimed before it is sent: its next poll moves out until the
answer comes, so no two pollers ask about one order at once.
"""

from __future__ import annotations

import asyncio

import structlog

from procurd.background import Worker
from procurd.core.procurement import Event, GiveUp, PollFailed, Procurement, Source
from procurd.procurement.answers import answer_problem, report_of
from procurd.procurement.service import ProcurementService
from procurd.upstream.errors import BusinessError, UpstreamError
from procurd.upstream.interface import Upstream

log = structlog.get_logger("procurd.poller")

POLL_BATCH = 20


class Poller(Worker):
    """Polls one upstream's due orders, and wakes when the next one falls due."""

    def __init__(
        self,
        service: ProcurementService,
        client: Upstream,
        give_up_seconds: float,
        *,
        instance: str,
        idle_seconds: float = 5.0,
    ) -> None:
        super().__init__()
        self.service = service
        self.client = client
        self.give_up_seconds = give_up_seconds
        self.upstream = client.name
        self.name = f"poller {self.upstream}"
        self.idle_seconds = idle_seconds
        self.wakeup = service.wakeups.for_polls(self.upstream)
        # The instance that holds a poll is named in its claim, so that the poll is free again at once when
        # the instance is found gone.
        self.owner = f"{instance}/{self.upstream}/poll"

    async def step(self) -> float | None:
        while (claims := await self.service.claim_polls(self.upstream, self.owner, POLL_BATCH)).procurements:
            await asyncio.gather(*(self._poll(procurement) for procurement in claims.procurements))
        due = claims.next_due  # read by the claim that found none due, after it
        return None if due is None else (due - self.service.clock()).total_seconds()

    async def _poll(self, procurement: Procurement) -> None:
        event = await self._event_for(procurement)
        await self.service.apply(procurement.id, event, Source.POLL, order_no=procurement.order_no)

    async def _event_for(self, procurement: Procurement) -> Event:
        submitted_at = procurement.submitted_at
        waited = (self.service.clock() - submitted_at).total_seconds() if submitted_at else 0.0
        if waited > self.give_up_seconds:
            return GiveUp(waited)
        assert procurement.upstream_order_id is not None
        try:
            order = await self.client.get_order(procurement.upstream_order_id)
        except BusinessError as exc:
            return PollFailed(exc.code, exc.message, not_found=exc.code == "order_not_found")
        except UpstreamError as exc:
            log.info("poll.failed", procurement_id=procurement.id, code=exc.code, upstream=self.upstream)
            return PollFailed(exc.code, exc.message)
        problem = answer_problem(procurement, order)
        if problem is not None:
            # Never adopted: an order procurd did not ask for is no news of its own.
            log.warning("poll.answer_mismatch", procurement_id=procurement.id, upstream=self.upstream,
                        problem=problem)  # fmt: skip
            return PollFailed("order_mismatch", problem)
        return report_of(order)
