"""Storefront events: a durable outbox delivered at least once, in order per order, with backoff.

Each event is signed like the upstream API (seed 000 part 5) with the path of the webhook URL, so the
storefront verifies it with the same code it would use for an upstream. The storefront de-duplicates by
``event_id``.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from procurd.aio import wait_for_any
from procurd.config import StorefrontSettings
from procurd.db import procurement_store as store
from procurd.db.types import utcnow
from procurd.procurement.backoff import retry_delay
from procurd.signing import HeaderNames, signed_headers

log = structlog.get_logger("procurd.webhook")

RETRY_BASE_SECONDS = 1.0
RETRY_MAX_SECONDS = 300.0
LEASE = timedelta(seconds=60)
BATCH = 20
IDLE_SECONDS = 1.0


class WebhookDispatcher:
    def __init__(
        self,
        engine: AsyncEngine,
        settings: StorefrontSettings,
        worker_id: str,
        wakeup: asyncio.Event | None = None,
        timeout_seconds: float = 15,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.worker_id = worker_id
        self.wakeup = wakeup or asyncio.Event()
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self.path = urlsplit(settings.webhook_url).path or "/"
        self.names = HeaderNames.for_prefix(settings.header_prefix)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def deliver_due(self) -> int:
        """Send every due event once; returns how many were delivered."""
        delivered = 0
        while True:
            async with self.engine.begin() as conn:
                rows = await store.claim_events(conn, self.worker_id, utcnow(), LEASE, BATCH)
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
                    async with self.engine.begin() as conn:
                        await store.mark_event_delivered(conn, row.id, utcnow())
                    delivered += 1
                else:
                    failed_orders.add(row.order_no)
                    await self._reschedule(row, error, delay=None, attempts=row.attempts)
            if failed_orders and delivered == 0:
                return delivered

    async def _reschedule(self, row: Any, error: str, delay: float | None, attempts: int = 1) -> None:
        wait = retry_delay(attempts, RETRY_BASE_SECONDS, RETRY_MAX_SECONDS) if delay is None else delay
        async with self.engine.begin() as conn:
            await store.mark_event_failed(conn, row.id, error, utcnow() + timedelta(seconds=wait))
        if delay is None:
            log.warning(
                "webhook.failed",
                event_id=row.event_id,
                order_no=row.order_no,
                error=error,
                retry_in_seconds=round(wait, 1),
            )

    async def _send(self, payload: dict[str, Any]) -> str | None:
        """POST one event; ``None`` on a 2xx answer, else the reason."""
        body = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
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

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.deliver_due()
            except Exception:
                log.exception("webhook.round_failed")
            self.wakeup.clear()
            await wait_for_any(stop, self.wakeup, timeout=IDLE_SECONDS)
        await self.close()
