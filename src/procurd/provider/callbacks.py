"""Callbacks to downstream sites: each provider order's latest status, pushed to its ``callback_url``.

The state path queues a status (``provider_callbacks``, one row per order, the newest status replacing one
not yet told); the :class:`CallbackDispatcher` sends what is due, signed with the account's key and secret
as seed 000 part 5 says, over the fixed path ``/api/v1/upstream/callback`` (what the real sites sign,
whatever the URL). A callback is delivered when the downstream answers HTTP 2xx with ``"ok": true``;
otherwise it is tried again with backoff (30 s, then doubling up to 30 minutes) until
``[provider] callback_give_up_seconds`` after its first try, when it is given up (an operator can replay it).
Every try is in the order's delivery log, from its claim on (in flight until its answer): when the instance
sending it stops first, the instance that takes its claims over marks it ``outcome unknown`` and the callback
is sent again at once. The body always tells the order's current status, so ``GET /orders/:id`` agrees with
the last callback, and a replay is idempotent for the receiver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import structlog
from aiohttp.abc import AbstractResolver

from procurd.background import Worker
from procurd.config import ProviderSettings
from procurd.core.clock import utcnow
from procurd.core.provider import Account, ProviderOrder
from procurd.core.records import CallbackDue, SettledTry
from procurd.db.database import Database
from procurd.db.views import WithProvider
from procurd.metrics import Metrics
from procurd.protocol.dujiao.callback import MESSAGE_CHARS, CallbackPoster, Delivery, callback_body
from procurd.upstream.errors import truncate

log = structlog.get_logger("procurd.provider")

FIRST_RETRY_SECONDS = 30.0
MAX_RETRY_SECONDS = 1800.0
LEASE = timedelta(seconds=60)
CONCURRENCY = 8  # tries in flight at a time


@dataclass(frozen=True, slots=True)
class Claimed:
    """A callback claimed for sending, with the order it tells and the account it is signed for."""

    due: CallbackDue
    order: ProviderOrder
    account: Account


def _claim(tx: WithProvider, owner: str, now: datetime, limit: int) -> list[Claimed]:
    """Take up to ``limit`` due callbacks, and read their orders and accounts, in one transaction."""
    dues = tx.provider.claim_callbacks(owner, now, now + LEASE, limit)
    if not dues:
        return []
    orders = tx.provider.orders_by_id([due.order_id for due in dues])
    accounts = tx.provider.accounts_by_id([due.account_id for due in dues])
    return [
        Claimed(due, orders[due.order_id], accounts[due.account_id])
        for due in dues
        if due.order_id in orders and due.account_id in accounts and orders[due.order_id].callback_url
    ]


def retry_in(attempts: int) -> float:
    """Seconds until the next try after ``attempts`` failed ones: 30 s, 60 s, 120 s ... up to 30 min."""
    return float(min(MAX_RETRY_SECONDS, FIRST_RETRY_SECONDS * 2.0 ** max(0, attempts - 1)))


class CallbackSender:
    """Tells a provider order's current status to its ``callback_url``: the body of seed 000 4.8, signed with
    the account's key and secret, posted by :class:`CallbackPoster` (one HTTP session), to public addresses
    only unless ``[provider] allow_private_callback_url``. A refused try sends nothing, is counted in
    ``procurd_provider_callbacks_refused_total`` and is logged in the order's delivery log like any failed
    try."""

    def __init__(
        self,
        settings: ProviderSettings,
        clock: Callable[[], datetime] = utcnow,
        *,
        resolver: AbstractResolver | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.poster = CallbackPoster(
            settings.header_prefix,
            settings.callback_timeout_seconds,
            public_only=not settings.allow_private_callback_url,
            resolver=resolver,
        )
        self.clock = clock
        self.metrics = metrics

    async def send(self, account: Account, order: ProviderOrder) -> Delivery:
        """Tell ``order``'s current status to its ``callback_url``."""
        assert order.callback_url
        now = self.clock()
        body = callback_body(order, now)
        delivery = await self.poster.send(order.callback_url, account.api_key, account.api_secret, body, now)
        if not delivery.refused:
            return delivery
        problem = delivery.message
        log.warning("provider.callback_refused", account=account.name, order_id=order.id, reason=problem)
        if self.metrics is not None:
            self.metrics.provider_callbacks_refused.labels(account.name).inc()
        message = (
            f"refused, nothing sent: {problem}; callbacks go to public addresses only "
            "([provider] allow_private_callback_url)"
        )
        return Delivery(False, None, truncate(message, MESSAGE_CHARS), refused=True)

    async def close(self) -> None:
        await self.poster.close()


class CallbackDispatcher(Worker):
    """Sends the due callbacks of every provider order; wakes when the state path queues one.

    Each try runs on its own (up to ``CONCURRENCY`` at a time) and wakes the dispatcher when it ends, so a
    downstream that keeps its connection open until the timeout holds up no other order's callback; the tries
    that ended are settled together.
    """

    name = "provider callbacks"

    def __init__(
        self,
        database: Database,
        settings: ProviderSettings,
        owner: str,
        *,
        sender: CallbackSender | None = None,
        wakeup: asyncio.Event | None = None,
        idle_seconds: float = 5.0,
    ) -> None:
        super().__init__()
        self.database = database
        self.settings = settings
        self.owner = owner
        self.sender = sender or CallbackSender(settings)
        self.idle_seconds = idle_seconds
        if wakeup is not None:
            self.wakeup = wakeup
        self._sending: set[asyncio.Task[Try]] = set()
        self._ended: list[Try] = []
        self._failure: BaseException | None = None

    async def step(self) -> float | None:
        await self._settle()  # first: a try of a replaced status lets the newer one be claimed
        while (room := CONCURRENCY - len(self._sending)) > 0:
            claimed = await self.database.write(_claim, self.owner, utcnow(), room)
            for one in claimed:
                self._start(one)
            if len(claimed) < room:
                break
        due_at = await self.database.read(lambda tx: tx.provider.next_callback_due())
        if due_at is None:
            return None
        delay = (due_at - utcnow()).total_seconds()
        # Due but not claimed: in flight here (its end wakes this loop) or on another instance.
        return delay if delay > 0 else None

    def _start(self, claimed: Claimed) -> None:
        async def send() -> Try:
            delivery = await self.sender.send(claimed.account, claimed.order)
            return Try(claimed.order, claimed.due.status, delivery, claimed.due)

        task = asyncio.create_task(send(), name=f"provider callback {claimed.order.id}")
        self._sending.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[Try]) -> None:
        self._sending.discard(task)
        if not task.cancelled():
            error = task.exception()
            if error is not None:
                self._failure = self._failure or error
            else:
                self._ended.append(task.result())
        self.wakeup.set()

    async def _settle(self) -> None:
        """Record the tries that ended (a bug in one is raised here, for the supervisor)."""
        if self._failure is not None:
            raise self._failure
        if self._ended:
            tries = list(self._ended)
            await record_tries(self.database, self.settings, tries, owner=self.owner)
            del self._ended[: len(tries)]

    async def drain(self) -> None:
        """Let the tries in flight end (each within the sender's timeout) and record them."""
        try:
            if self._sending:
                await asyncio.wait(set(self._sending))
            await self._settle()
        finally:
            for task in self._sending:
                task.cancel()
            await self.sender.close()


@dataclass(frozen=True, slots=True)
class Try:
    """One try of telling ``status`` to the downstream of ``order`` (``due``: the claim it was sent
    under; ``None`` for a replay)."""

    order: ProviderOrder
    status: str
    delivery: Delivery
    due: CallbackDue | None = None


async def record_try(
    database: Database,
    settings: ProviderSettings,
    order: ProviderOrder,
    status: str,
    delivery: Delivery,
    *,
    owner: str | None,
    due: CallbackDue | None = None,
) -> bool:
    """Log a try of telling ``status`` and settle the order's callback; whether it was given up now."""
    (gave_up,) = await record_tries(database, settings, [Try(order, status, delivery, due)], owner=owner)
    return gave_up


async def record_tries(
    database: Database, settings: ProviderSettings, tries: Sequence[Try], *, owner: str | None
) -> list[bool]:
    """Log tries in the orders' delivery logs and settle each callback (delivered, retried later or given
    up), in one transaction; for each, whether it was given up now."""
    now = utcnow()
    plans = []
    for attempt in tries:
        due, delivery = attempt.due, attempt.delivery
        attempts = (due.attempts if due is not None else 0) + 1
        first = due.first_attempt_at if due is not None and due.first_attempt_at is not None else now
        gave_up = (
            not delivery.ok
            and due is not None
            and (now - first).total_seconds() >= settings.callback_give_up_seconds
        )
        error = None if delivery.ok else _error_text(delivery)
        next_at = None if delivery.ok or gave_up else now + timedelta(seconds=retry_in(attempts))
        plans.append((attempt, attempts, gave_up, error, next_at))

    settled = [
        SettledTry(
            order_id=attempt.order.id, status=attempt.status, http_status=attempt.delivery.http_status,
            message=attempt.delivery.message, delivered=attempt.delivery.ok, gave_up=gave_up, error=error,
            next_attempt_at=next_at, attempt_id=None if attempt.due is None else attempt.due.attempt_id,
        )
        for attempt, _, gave_up, error, next_at in plans
    ]  # fmt: skip

    def settle(tx: WithProvider) -> None:
        tx.provider.settle_callbacks(settled, owner, now)

    await database.write(settle)
    for attempt, attempts, gave_up, error, next_at in plans:
        delivery = attempt.delivery
        fields = {
            "order_id": attempt.order.id,
            "status": attempt.status,
            "http_status": delivery.http_status,
            "attempt": attempts,
        }
        if delivery.ok:
            log.info("provider.callback_delivered", **fields, replay=owner is None)
        elif gave_up:
            log.warning("provider.callback_given_up", **fields, error=error)
        else:
            log.info(
                "provider.callback_failed",
                **fields,
                error=error,
                retry_at=next_at.isoformat() if next_at else None,
            )
    return [gave_up for _, _, gave_up, _, _ in plans]


def _error_text(delivery: Delivery) -> str:
    if delivery.refused and delivery.message:
        return delivery.message
    status = f"HTTP {delivery.http_status}" if delivery.http_status is not None else "no answer"
    return truncate(f"{status}: {delivery.message}" if delivery.message else status, MESSAGE_CHARS)
