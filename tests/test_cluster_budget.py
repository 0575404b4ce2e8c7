"""The request budget every process of an installation shares (daemons on PostgreSQL, or a daemon and the
commands beside it on SQLite): spacing, priorities across processes, pauses.

Each "instance" here is a :class:`SharedRateLimiter` with an instance id of its own and a database
connection pool of its own, on the test's migrated database; they share one budget row as separate
processes do.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from procurd.db.database import Database, open_database
from procurd.db.rate_budget import Attempt, budget_key
from procurd.db.schema import rate_budgets, rate_demand
from procurd.operations.budgets import SharedBudget
from procurd.upstream.ratelimit import Priority, SharedRateLimiter
from support import sql_rows, wait_until

KEY = budget_key("http://upstream.example/api/v1/upstream", "key")
RATE = 10.0  # requests a second: 100 ms apart
SPACING = 1 / RATE
BUDGETS: weakref.WeakKeyDictionary[SharedRateLimiter, RecordingBudget] = weakref.WeakKeyDictionary()


@pytest.fixture
async def instances(database_url: str) -> AsyncIterator[Callable[[str], SharedRateLimiter]]:
    """Builds a limiter for an instance id, each with its own database connections; closes them all."""
    async with AsyncExitStack() as stack:

        def instance(name: str) -> SharedRateLimiter:
            database = open_database(database_url)
            stack.push_async_callback(database.close)
            budget = RecordingBudget(database, KEY, "main", name, RATE)
            limiter = SharedRateLimiter(budget, RATE)
            BUDGETS[limiter] = budget
            stack.push_async_callback(limiter.close)
            return limiter

        yield instance


class RecordingBudget(SharedBudget):
    """The shared budget as it is, noting the slots it grants on the database's clock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.granted: list[datetime] = []

    async def _attempt(self, priority: int, then: int | None, count: int) -> Attempt:
        attempt = await super()._attempt(priority, then, count)
        spacing = timedelta(seconds=self.spacing_seconds)
        self.granted.extend(attempt.slot + spacing * index for index in range(attempt.granted))
        return attempt


async def grant_times(limiter: SharedRateLimiter, priority: Priority, count: int) -> list[float]:
    """Acquire ``count`` times one after another; the starts of the slots granted (when the requests may
    go, whenever the caller's task then runs)."""
    for _ in range(count):
        await limiter.acquire(priority)
    return list(limiter.used_slots)[-count:]


async def test_instances_share_one_budget(instances: Callable[[str], SharedRateLimiter]) -> None:
    """Three instances asking at once get their requests spaced one budget interval apart between them, on
    the database's clock (the schedule they share): together they never go faster than the budget."""
    limiters = [instances(name) for name in ("a", "b", "c")]
    times = await asyncio.gather(*(grant_times(limiter, Priority.ORDER, 10) for limiter in limiters))
    assert all(len(per_instance) == 10 for per_instance in times)
    granted = sorted(slot for limiter in limiters for slot in granted_by(limiter))
    assert len(granted) >= 30  # a slot handed out too late to be used is let go, never shared
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(granted)]
    assert min(gaps) >= SPACING * 0.999, gaps


def granted_by(limiter: SharedRateLimiter) -> list[datetime]:
    """The slots the budget granted ``limiter``'s instance, on the database's clock."""
    return BUDGETS[limiter].granted


async def test_batches_of_orders_from_several_processes_keep_the_spacing(database_url: str) -> None:
    """At 50 requests a second, orders are granted in batches (up to 5 slots per round trip); three
    processes sending orders at once are granted slots one budget interval apart between them, on the
    database's clock (the schedule they share), whatever each process's own clock made of them."""
    rate = 50.0
    async with AsyncExitStack() as stack:
        limiters, budgets = [], []
        for name in ("a", "b", "c"):
            database = open_database(database_url)
            stack.push_async_callback(database.close)
            budget = RecordingBudget(database, KEY, "main", name, rate)
            limiter = SharedRateLimiter(budget, rate)
            stack.push_async_callback(limiter.close)
            limiters.append(limiter)
            budgets.append(budget)

        async def orders(limiter: SharedRateLimiter) -> None:
            await asyncio.gather(*(limiter.acquire(Priority.ORDER) for _ in range(20)))

        await asyncio.gather(*(orders(limiter) for limiter in limiters))
        budget_calls = sum(limiter.budget_calls for limiter in limiters)
        used = sum(len(limiter.used_slots) for limiter in limiters)
        granted = sorted(slot for budget in budgets for slot in budget.granted)
    assert used == 60
    assert len(granted) >= used  # a slot handed out too late to be used is let go, never shared
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(granted)]
    assert min(gaps) >= (1 / rate) * 0.999, gaps
    assert budget_calls < used / 2


async def test_an_order_on_one_instance_goes_ahead_of_catalogue_pages_on_another(
    instances: Callable[[str], SharedRateLimiter],
) -> None:
    """While one instance has catalogue pages queued, an order on another instance is served within about
    one interval, ahead of the pages still waiting."""
    syncing, ordering = instances("syncing"), instances("ordering")
    served: list[str] = []

    async def page(number: int) -> None:
        await syncing.acquire(Priority.CATALOG)
        served.append(f"page-{number}")

    pages = [asyncio.create_task(page(number)) for number in range(8)]
    await wait_until(lambda: len(served) >= 2)
    asked = time.monotonic()
    await ordering.acquire(Priority.ORDER)
    waited = time.monotonic() - asked
    served.append("order")
    await asyncio.gather(*pages)
    # The page under way holds the current interval; the order takes the next slot (plus timer lateness).
    assert waited < 1.5 * SPACING, waited
    assert served.index("order") < len(served) - 4, served


async def test_a_better_priority_on_another_instance_goes_first(
    instances: Callable[[str], SharedRateLimiter],
) -> None:
    """An instance waiting with a ping takes the next free slot before an instance waiting with catalogue
    pages, whichever asked first."""
    pinging, syncing = instances("pinging"), instances("syncing")
    order: list[str] = []

    async def sync_pages() -> None:
        for number in range(6):
            await syncing.acquire(Priority.CATALOG)
            order.append(f"page-{number}")

    syncer = asyncio.create_task(sync_pages())
    await wait_until(lambda: len(order) >= 1)

    async def ping() -> None:
        await pinging.acquire(Priority.PING)
        order.append("ping")

    pinged_at = len(order)
    await ping()
    await syncer
    assert order.index("ping") <= pinged_at + 1, order


async def test_a_pause_on_one_instance_holds_every_instance(
    instances: Callable[[str], SharedRateLimiter], database: Database
) -> None:
    """After one instance is told "too many requests", another instance sends nothing until the pause ends."""
    told, other = instances("told"), instances("other")
    await told.acquire(Priority.ORDER)
    await other.acquire(Priority.ORDER)
    pause = 0.5
    paused_at = time.monotonic()
    told.pause_for(pause)

    async def pause_shared() -> bool:
        (row,) = await sql_rows(database, select(rate_budgets.c.paused_until, rate_budgets.c.key))
        return bool(row.paused_until.timestamp() > time.time())

    await wait_until(pause_shared)
    await other.acquire(Priority.ORDER)
    assert time.monotonic() - paused_at >= pause * 0.9
    assert told.paused_for <= pause


async def test_waiting_is_recorded_only_while_waiting(
    instances: Callable[[str], SharedRateLimiter], database: Database
) -> None:
    """An instance's demand is in the database while it has requests waiting and gone once it has none."""
    limiter = instances("a")
    await limiter.acquire(Priority.ORDER)
    waiting = [asyncio.create_task(limiter.acquire(Priority.CATALOG)) for _ in range(3)]

    async def demand_is(*expected: int) -> bool:
        rows = await sql_rows(database, select(rate_demand.c.priority))
        return [row.priority for row in rows] == list(expected)

    await wait_until(lambda: demand_is(Priority.CATALOG))
    await asyncio.gather(*waiting)
    await wait_until(demand_is)


async def test_cancelled_waiters_leave_nothing_behind(instances: Callable[[str], SharedRateLimiter]) -> None:
    """Waiters cancelled while queued take no slot, and the ones behind them are still served."""
    limiter = instances("a")
    await limiter.acquire(Priority.ORDER)
    doomed = [asyncio.create_task(limiter.acquire(Priority.CATALOG)) for _ in range(3)]
    survivor = asyncio.create_task(limiter.acquire(Priority.CATALOG))
    # Each is queued, or already served when a slot came free before the rest had queued (a busy machine).
    await wait_until(
        lambda: limiter.waiting[Priority.CATALOG] + sum(task.done() for task in [*doomed, survivor]) == 4
    )
    for task in doomed:
        task.cancel()
    await asyncio.wait_for(survivor, 5)
    assert sum(limiter.waiting.values()) == 0
