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

from sqlalchemy import Connection, delete, func, select, text, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from procurd.db.dialect import insert_or_skip
from procurd.db.schema import rate_budgets, rate_demand
from procurd.db.types import utcnow

RESERVE_BELOW = 1  # requests of a priority below this (order submissions) may reserve a slot ahead
LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)

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
