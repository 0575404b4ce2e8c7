"""The request budget of one upstream API key, shared by every process of an installation: every daemon
instance on one PostgreSQL database, and on SQLite the daemon and every command run beside it.

The budget is one row of ``rate_budgets``: ``next_slot_at``, the earliest moment the next request may start,
and ``paused_until``, set when the upstream answered "too many requests". A request takes a slot with one
statement that moves ``next_slot_at`` one spacing past the slot it hands out (a cell-rate schedule with a
burst of one), so whatever the number of instances, two requests of the key start at least one spacing
apart, and the pause holds for all of them.

Priorities cross instances through ``rate_demand``: each instance that waits for the budget records the best
priority it has waiting. An order submission may reserve the next slot even when it lies in the future
(orders queue among themselves, first come first served, and everything else waits behind them). Anything
else takes a slot only when one is free right now and no other instance waits with a better priority, so an
order never waits behind more than the one lower-priority request already under way.

On PostgreSQL one statement per attempt, run in autocommit on a connection kept for it: one round trip,
on the database's clock. On SQLite (one host) the same decision is taken in Python inside a write
transaction, under the database's write lock, on the host's clock.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import structlog
from sqlalchemy import Connection, delete, func, select, text, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from procurd.db.dialect import insert_or_skip
from procurd.db.errors import DatabaseError
from procurd.db.schema import rate_budgets, rate_demand
from procurd.db.types import utcnow

if TYPE_CHECKING:
    from procurd.db.database import Database

log = structlog.get_logger("procurd.upstream")

RESERVE_BELOW = 1  # requests of a priority below this (order submissions) may reserve a slot ahead
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)
RETRY_MARGIN_SECONDS = 0.001  # ask again this long after the moment the budget named, not before it
DEMAND_TTL_SPACINGS = 2  # a waiting instance's demand outlives its next attempt by this many spacings
DEMAND_TTL_SECONDS = 1.0  # plus this
UNAVAILABLE_BACKOFF = (0.5, 1.0, 2.0, 5.0)

_TAKE = text(
    """
WITH params AS (
    SELECT CAST(:key AS varchar) AS key, CAST(:instance AS varchar) AS instance,
           CAST(:priority AS integer) AS priority, CAST(:then AS integer) AS then,
           CAST(:count AS integer) AS count,
           make_interval(secs => CAST(:spacing AS double precision)) AS spacing,
           make_interval(secs => CAST(:demand_ttl AS double precision)) AS demand_ttl
),
clock AS MATERIALIZED (SELECT clock_timestamp() AS now),
budget AS (
    SELECT b.next_slot_at, b.paused_until, clock.now,
           (SELECT min(d.priority) FROM rate_demand AS d
             WHERE d.key = b.key AND d.instance <> params.instance AND d.expires_at > clock.now) AS ahead
      FROM rate_budgets AS b, clock, params
     WHERE b.key = params.key
       FOR UPDATE OF b
),
decision AS (
    SELECT greatest(budget.next_slot_at, budget.paused_until, budget.now) AS slot,
           budget.next_slot_at, budget.paused_until, budget.ahead, budget.now,
           (params.priority < CAST(:reserve_below AS integer)
            OR (budget.next_slot_at <= budget.now AND budget.paused_until <= budget.now
                AND coalesce(budget.ahead >= params.priority, true))) AS granted
      FROM budget, params
),
taken AS (
    UPDATE rate_budgets AS b
       SET next_slot_at = decision.slot + params.spacing * params.count, granted = b.granted + params.count
      FROM decision, params
     WHERE b.key = params.key AND decision.granted
 RETURNING b.next_slot_at
),
demand AS (
    SELECT params.key, params.instance, decision.slot + params.demand_ttl AS expires_at,
           CASE WHEN decision.granted THEN params.then ELSE params.priority END AS priority
      FROM decision, params
),
published AS (
    INSERT INTO rate_demand (key, instance, priority, expires_at)
    SELECT key, instance, priority, expires_at FROM demand WHERE priority IS NOT NULL
        ON CONFLICT (key, instance) DO UPDATE
       SET priority = excluded.priority, expires_at = excluded.expires_at
),
withdrawn AS (
    DELETE FROM rate_demand AS d
     USING demand
     WHERE d.key = demand.key AND d.instance = demand.instance AND demand.priority IS NULL
)
SELECT decision.granted, params.count, decision.slot,
       coalesce(taken.next_slot_at, decision.next_slot_at) AS next_slot_at,
       decision.paused_until, decision.ahead, clock_timestamp() AS now
  FROM decision CROSS JOIN params LEFT JOIN taken ON true
"""
)

_PAUSE = text(
    """
UPDATE rate_budgets
   SET paused_until = greatest(
           paused_until, clock_timestamp() + make_interval(secs => CAST(:seconds AS double precision)))
 WHERE key = CAST(:key AS varchar)
"""
)


def budget_key(api_root: str, api_key: str) -> str:
    """The budget's name: a digest of the site and the key (the key itself stays out of the database)."""
    return hashlib.sha256(f"{api_root}\n{api_key}".encode()).hexdigest()[:32]


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt at the budget found, in the database's clock."""

    granted: int  # slots handed out, one spacing apart (0: refused)
    slot: datetime  # the start of the first slot handed out (when granted)
    next_slot_at: datetime
    paused_until: datetime
    ahead: int | None  # the best priority another instance waits with
    now: datetime

    def seconds_until(self, moment: datetime) -> float:
        return (moment - self.now).total_seconds()


class RateBudgetStore:
    """The statements of the shared budgets; :meth:`take` and :meth:`pause` differ by backend."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def ensure(self, key: str, upstream: str) -> None:
        """Create the budget's row unless it exists."""
        self.connection.execute(
            insert_or_skip(self.connection, rate_budgets, rate_budgets.c.key).values(
                key=key, upstream=upstream, next_slot_at=LONG_AGO, paused_until=LONG_AGO, granted=0
            )
        )

    def take(
        self,
        key: str,
        instance: str,
        priority: int,
        then: int | None,
        spacing_seconds: float,
        demand_ttl_seconds: float,
        reserve_below: int = RESERVE_BELOW,
        count: int = 1,
    ) -> Attempt | None:
        """Try to take ``count`` consecutive slots for requests of ``priority``; ``None`` when the budget's
        row is missing.

        ``then`` is the best priority this instance still has waiting once these requests are served: the
        demand recorded when slots are granted (none when ``None``); when refused, ``priority`` is recorded.
        A priority below ``reserve_below`` gets the next slots even when they lie ahead.
        """
        raise NotImplementedError

    def pause(self, key: str, seconds: float) -> None:
        """Nobody sends with this key for ``seconds`` from now (a pause only ever grows)."""
        raise NotImplementedError

    def withdraw(self, key: str, instance: str) -> None:
        """``instance`` no longer waits for budget ``key``."""
        self.connection.execute(
            delete(rate_demand).where(rate_demand.c.key == key, rate_demand.c.instance == instance)
        )

    def forget(self, instances: list[str]) -> None:
        """The instances are gone: they wait for nothing."""
        if instances:
            self.connection.execute(delete(rate_demand).where(rate_demand.c.instance.in_(instances)))


class PostgresRateBudgetStore(RateBudgetStore):
    """One statement per attempt, on the database's clock."""

    def take(
        self,
        key: str,
        instance: str,
        priority: int,
        then: int | None,
        spacing_seconds: float,
        demand_ttl_seconds: float,
        reserve_below: int = RESERVE_BELOW,
        count: int = 1,
    ) -> Attempt | None:
        row = self.connection.execute(
            _TAKE,
            {
                "key": key,
                "instance": instance,
                "priority": priority,
                "then": then,
                "reserve_below": reserve_below,
                "spacing": spacing_seconds,
                "demand_ttl": demand_ttl_seconds,
                "count": count,
            },
        ).first()
        if row is None:
            return None
        return Attempt(
            granted=int(row[1]) if row.granted else 0,
            slot=row.slot,
            next_slot_at=row.next_slot_at,
            paused_until=row.paused_until,
            ahead=row.ahead,
            now=row.now,
        )

    def pause(self, key: str, seconds: float) -> None:
        self.connection.execute(_PAUSE, {"key": key, "seconds": seconds})


class SqliteRateBudgetStore(RateBudgetStore):
    """The PostgreSQL statement's decision taken in Python, inside a write transaction: SQLite's write lock
    serialises every process of the installation, and they all share one host's clock."""

    def take(
        self,
        key: str,
        instance: str,
        priority: int,
        then: int | None,
        spacing_seconds: float,
        demand_ttl_seconds: float,
        reserve_below: int = RESERVE_BELOW,
        count: int = 1,
    ) -> Attempt | None:
        now = utcnow()
        budget = self.connection.execute(
            select(rate_budgets.c.next_slot_at, rate_budgets.c.paused_until).where(rate_budgets.c.key == key)
        ).first()
        if budget is None:
            return None
        next_slot_at, paused_until = budget.next_slot_at, budget.paused_until
        ahead = self.connection.execute(
            select(func.min(rate_demand.c.priority)).where(
                rate_demand.c.key == key, rate_demand.c.instance != instance, rate_demand.c.expires_at > now
            )
        ).scalar()
        slot = max(next_slot_at, paused_until, now)
        granted = priority < reserve_below or (
            next_slot_at <= now and paused_until <= now and (ahead is None or ahead >= priority)
        )
        if granted:
            next_slot_at = slot + timedelta(seconds=spacing_seconds * count)
            self.connection.execute(
                update(rate_budgets)
                .where(rate_budgets.c.key == key)
                .values(next_slot_at=next_slot_at, granted=rate_budgets.c.granted + count)
            )
        waiting = then if granted else priority
        if waiting is None:
            self.withdraw(key, instance)
        else:
            expires_at = slot + timedelta(seconds=demand_ttl_seconds)
            upsert = sqlite_insert(rate_demand).values(
                key=key, instance=instance, priority=waiting, expires_at=expires_at
            )
            self.connection.execute(
                upsert.on_conflict_do_update(
                    index_elements=[rate_demand.c.key, rate_demand.c.instance],
                    set_={"priority": waiting, "expires_at": expires_at},
                )
            )
        return Attempt(
            granted=count if granted else 0,
            slot=slot,
            next_slot_at=next_slot_at,
            paused_until=paused_until,
            ahead=ahead,
            now=utcnow(),
        )

    def pause(self, key: str, seconds: float) -> None:
        until = utcnow() + timedelta(seconds=max(0.0, seconds))
        self.connection.execute(
            update(rate_budgets)
            .where(rate_budgets.c.key == key, rate_budgets.c.paused_until < until)
            .values(paused_until=until)
        )


def rate_budget_store(connection: Connection) -> RateBudgetStore:
    """The budget statements of the connection's backend."""
    if connection.dialect.name == "postgresql":
        return PostgresRateBudgetStore(connection)
    return SqliteRateBudgetStore(connection)


class SharedBudget:
    """One upstream key's budget as one instance sees it: what :class:`procurd.upstream.ratelimit.
    SharedRateLimiter` asks, answered from the database.

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
