"""The request budget of one upstream API key as one instance sees it, answered from the database that every
process of the installation shares (the statements and how they decide: :mod:`procurd.db.rate_budget`).

Each attempt is one autocommit statement on PostgreSQL (one round trip, on the database's clock) and one
short write transaction on SQLite; a database that cannot be reached refuses with a growing wait.
"""

from __future__ import annotations

import structlog

from procurd.db.database import Database
from procurd.db.errors import DatabaseError
from procurd.db.rate_budget import RESERVE_BELOW, Attempt

log = structlog.get_logger("procurd.upstream")

RETRY_MARGIN_SECONDS = 0.001  # ask again this long after the moment the budget named, not before it
DEMAND_TTL_SPACINGS = 2  # a waiting instance's demand outlives its next attempt by this many spacings
DEMAND_TTL_SECONDS = 1.0  # plus this
UNAVAILABLE_BACKOFF = (0.5, 1.0, 2.0, 5.0)


class SharedBudget:
    """One upstream key's budget as one instance sees it: what :class:`procurd.upstream.ratelimit.
    SharedRateLimiter` asks, answered from the database (:class:`procurd.db.rate_budget.RateBudgetStore`).

    Two requests of the key start at least ``1 / rate_per_second`` apart. Priorities below ``reserve_below``
    (order submissions) reserve the next slot wherever it lies; ``reserve_below=0`` makes every request wait
    for a free slot, the design this one was measured against (``benchmarks/cluster.py``). A database that
    cannot be reached refuses with a growing wait (nothing is sent while the budget cannot be checked).
    """

    def __init__(
        self,
        database: Database,
        key: str,
        upstream: str,
        instance: str,
        rate_per_second: float,
        *,
        reserve_below: int = RESERVE_BELOW,
    ) -> None:
        self.database = database
        self.reserve_below = reserve_below
        self.key = key
        self.upstream = upstream
        self.instance = instance
        self.spacing_seconds = 1 / rate_per_second
        self.demand_ttl_seconds = DEMAND_TTL_SPACINGS * self.spacing_seconds + DEMAND_TTL_SECONDS
        self._created = False
        self._failures = 0

    async def take(self, priority: int, then: int | None, count: int = 1) -> tuple[int, float]:
        """``(n, s)``: ``n`` slots for requests of ``priority``, the first starting in ``s`` seconds (0 or
        less: now); ``(0, s)``: refused, worth asking again in ``s`` seconds. Only priorities below
        ``reserve_below`` are given more than one slot at a time."""
        if priority >= self.reserve_below:
            count = 1
        try:
            attempt = await self._attempt(priority, then, count)
        except DatabaseError as exc:
            wait = UNAVAILABLE_BACKOFF[min(self._failures, len(UNAVAILABLE_BACKOFF) - 1)]
            self._failures += 1
            log.warning("rate_budget.unavailable", upstream=self.upstream, reason=exc.reason, retry_in=wait)
            return 0, wait
        self._failures = 0
        if attempt.granted:
            return attempt.granted, attempt.seconds_until(attempt.slot)
        if attempt.paused_until > attempt.now:
            return 0, attempt.seconds_until(attempt.paused_until) + RETRY_MARGIN_SECONDS
        if attempt.next_slot_at > attempt.now:
            return 0, attempt.seconds_until(attempt.next_slot_at) + RETRY_MARGIN_SECONDS
        # A slot is free, but another instance waits with a better priority and takes it.
        return 0, self.spacing_seconds / 2

    async def _attempt(self, priority: int, then: int | None, count: int) -> Attempt:
        args = (
            self.key,
            self.instance,
            priority,
            then,
            self.spacing_seconds,
            self.demand_ttl_seconds,
            self.reserve_below,
            count,
        )
        attempt = (
            await self.database.autocommit(lambda tx: tx.rate_budget.take(*args)) if self._created else None
        )
        if attempt is None:
            await self.database.autocommit(lambda tx: tx.rate_budget.ensure(self.key, self.upstream))
            self._created = True
            attempt = await self.database.autocommit(lambda tx: tx.rate_budget.take(*args))
            assert attempt is not None
        return attempt

    async def pause(self, seconds: float) -> None:
        """Nobody with this key sends for ``seconds`` from now."""
        try:
            await self.database.autocommit(lambda tx: tx.rate_budget.pause(self.key, seconds))
        except DatabaseError as exc:
            log.warning("rate_budget.pause_not_shared", upstream=self.upstream, reason=exc.reason)

    async def withdraw(self) -> None:
        """This instance waits for nothing any more."""
        try:
            await self.database.autocommit(lambda tx: tx.rate_budget.withdraw(self.key, self.instance))
        except DatabaseError as exc:
            # The demand expires on its own within a few spacings.
            log.warning("rate_budget.withdraw_failed", upstream=self.upstream, reason=exc.reason)
