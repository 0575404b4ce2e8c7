"""Storefront events: a durable outbox delivered at least once, in order per order, with backoff.

Each event is signed like the upstream API (seed 000 part 5) with the path of the webhook URL, so the
storefront verifies it with the same code it would use for an upstream. The storefront de-duplicates by
``event_id``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog

from procurd.background import Worker
from procurd.config import StorefrontSettings
from procurd.core.backoff import retry_delay
from procurd.core.clock import utcnow
from procurd.core.records import OutboxRow
from procurd.db.database import Database
from procurd.db.views import WithOutbox
from procurd.protocol.dujiao.signing import HeaderNames, signed_headers

log = structlog.get_logger("procurd.webhook")

RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 300.0
LEASE = timedelta(seconds=60)
BATCH = 20


def _claim_events(tx: WithOutbox, owner: str, now: datetime) -> list[OutboxRow]:
    return tx.outbox.claim_events(owner, now, now + LEASE, BATCH)


def _delivered(tx: WithOutbox, row_id: int, now: datetime) -> None:
    tx.outbox.event_delivered(row_id, now)


class WebhookDispatcher(Worker):
    """Delivers the storefront's events from the outbox; wakes when the state path queues one."""

    name = "storefront events"

    def __init__(
        self,
        database: Database,
        settings: StorefrontSettings,
        worker_id: str,
        wakeup: asyncio.Event | None = None,
        timeout_seconds: float = 15,
        idle_seconds: float = 5.0,
    ) -> None:
        super().__init__()
        self.database = database
        self.settings = settings
        self.worker_id = worker_id
        self.idle_seconds = idle_seconds
        if wakeup is not None:
            self.wakeup = wakeup
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.path = urlsplit(settings.webhook_url).path or "/"
        self.names = HeaderNames.for_prefix(settings.header_prefix)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def step(self) -> float | None:
        await self.deliver_due()
        due = await self.database.read(lambda tx: tx.outbox.next_event_due())
        if due is None:
            return None
        delay = (due - utcnow()).total_seconds()
        # Due but not claimed here: claimed by another instance (its answer, or its release when it is found
        # dead, wakes or reaches this loop) or behind an earlier event of its order: look again when idle.
        return delay if delay > 0 else None

    async def deliver_due(self) -> int:
        """Send every due event once; returns how many were delivered."""
        delivered = 0
        while True:
            rows = await self.database.write(_claim_events, self.worker_id, utcnow())
            if not rows:
                return delivered
            failed_orders: set[str] = set()
            for row in rows:
                if row.order_no in failed_orders:
                    await self._reschedule(
                        row, "an earlier event of this order is not delivered yet", delay=0
                    )
                    continue
                error = await self._send(row.payload)
                if error is None:
                    await self.database.write(_delivered, row.id, utcnow())
                    delivered += 1
                else:
                    failed_orders.add(row.order_no)
                    await self._reschedule(row, error, delay=None, attempts=row.attempts)
            if failed_orders and delivered == 0:
                return delivered

    async def _reschedule(self, row: OutboxRow, error: str, delay: float | None, attempts: int = 1) -> None:
        wait = retry_delay(attempts, RETRY_BASE_SECONDS, RETRY_MAX_SECONDS) if delay is None else delay
        retry_at = utcnow() + timedelta(seconds=wait)
        await self.database.write(lambda tx: tx.outbox.event_failed(row.id, error, retry_at))
        if delay is None:
            log.warning(
                "webhook.failed",
                event_id=row.event_id,
                order_no=row.order_no,
                error=error,
                retry_in_seconds=round(wait, 1),
            )

    async def _send(self, payload: Mapping[str, Any]) -> str | None:
        """POST one event; ``None`` on a 2xx answer, else the reason."""
        body = json.dumps(dict(payload), separators=(",", ":"), ensure_ascii=False).encode()
        headers = signed_headers(
            self.names,
            self.settings.webhook_api_key,
            self.settings.webhook_secret.get_secret_value(),
            "POST",
            self.path,
            int(time.time()),
            body,
        )
        headers["Content-Type"] = "application/json"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.post(self.settings.webhook_url, data=body, headers=headers) as response:
                await response.read()
                if 200 <= response.status < 300:
                    return None
                return f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return type(exc).__name__

    async def drain(self) -> None:
        await self.close()
