"""Singletons: work that runs on one instance at a time under a lease ``job:<name>``, and moves when its
instance stops or vanishes; the heartbeat frees what a vanished instance held."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

from sqlalchemy import insert, select

from procurd.background import Singletons, Worker
from procurd.db.database import Database
from procurd.db.schema import instances, leases, rate_demand
from procurd.db.types import utcnow
from procurd.operations.instances import Heartbeat, SharedJobLeases
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from support import settings_for, sql_execute, sql_rows, wait_until

RENEW_SECONDS = 0.2


async def lease_holders(database: Database) -> dict[str, str]:
    return {row.name: row.holder for row in await sql_rows(database, select(leases.c.name, leases.c.holder))}


async def test_one_instance_holds_a_singleton_until_it_stops(database: Database) -> None:
    """The first instance to claim a singleton keeps it; the other is refused until the holder stops and
    gives its leases up."""
    leases = SharedJobLeases(database)
    first, second = Singletons(leases, "a:1", 60), Singletons(leases, "b:2", 60)
    assert await first.claim("ping:main")
    assert not await second.claim("ping:main")
    assert await first.claim("ping:main")
    assert await second.claim("checks")
    await first.drain()
    assert await lease_holders(database) == {"job:checks": "b:2"}
    assert await second.claim("ping:main")


async def test_a_lapsed_lease_moves_and_its_old_holder_notices(database: Database) -> None:
    """A holder that stopped renewing loses the singleton to the next instance that claims it; its next
    renewal finds the lease gone and it stops running the singleton."""
    leases = SharedJobLeases(database)
    stalled, standby = Singletons(leases, "a:1", RENEW_SECONDS), Singletons(leases, "b:2", RENEW_SECONDS)
    assert await stalled.claim("poll:main")
    await wait_until(lambda: standby.claim("poll:main"), timeout=5 * stalled.ttl_seconds)
    await stalled.step()
    assert not stalled.holds("poll:main")
    assert not await stalled.claim("poll:main")
    await standby.step()
    assert standby.holds("poll:main")


async def test_renewal_keeps_the_lease_past_its_first_expiry(database: Database) -> None:
    """A holder that renews every period keeps its singleton for longer than one lease lasts."""
    leases = SharedJobLeases(database)
    holder, other = Singletons(leases, "a:1", RENEW_SECONDS), Singletons(leases, "b:2", RENEW_SECONDS)
    assert await holder.claim("checks")
    past = time.monotonic() + 2 * holder.ttl_seconds

    async def renewed_past_two_leases() -> bool:
        await holder.step()
        assert not await other.claim("checks")
        return time.monotonic() > past

    await wait_until(renewed_past_two_leases, timeout=10, interval=RENEW_SECONDS)
    assert holder.holds("checks")


async def test_a_job_runs_only_on_the_holder(database: Database) -> None:
    """A scheduled job wrapped as a singleton runs on the instance holding it and is skipped elsewhere."""
    ran: list[str] = []
    leases = SharedJobLeases(database)
    first, second = Singletons(leases, "a:1", 60), Singletons(leases, "b:2", 60)

    def job(name: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            ran.append(name)

        return run

    for _ in range(3):
        await first.job("ping:main", job("a"))()
        await second.job("ping:main", job("b"))()
    assert ran == ["a", "a", "a"]


class CountingWorker(Worker):
    name = "counting"

    def __init__(self) -> None:
        super().__init__()
        self.steps = 0
        self.idle_seconds = 0.01

    async def step(self) -> float | None:
        self.steps += 1
        return None


async def test_a_worker_steps_only_on_the_holder(database: Database) -> None:
    """A worker wrapped as a singleton steps on the holder only; the one standing by looks at the lease once
    per renewal period instead of at its own pace."""
    holding, standing_by = CountingWorker(), CountingWorker()
    leases = SharedJobLeases(database)
    first, second = Singletons(leases, "a:1", 60), Singletons(leases, "b:2", 60)
    wrapped = first.worker(holding, "poll:main")
    standby = second.worker(standing_by, "poll:main")
    for _ in range(3):
        await wrapped.step()
        await standby.step()
    assert (holding.steps, standing_by.steps) == (3, 0)
    assert wrapped.idle_seconds == holding.idle_seconds
    assert standby.idle_seconds == second.idle_seconds == 60


async def test_releasing_an_instance_frees_its_leases_only(database: Database) -> None:
    """Freeing what an instance held takes its own leases (with or without a pass token) and nobody else's,
    even an instance whose id starts alike."""
    now = utcnow()

    async def take(name: str, holder: str) -> None:
        assert await database.write(lambda tx: tx.leases.acquire(name, holder, now, 60))

    await take("job:ping:main", "host:1")
    await take("catalog-sync:main", "host:1#0a1b2c3d")
    await take("job:checks", "host:12")
    await take("job:poll:main", "host:1x")
    released = await database.write(lambda tx: tx.leases.release_held_by(["host:1"]))
    assert released == ["catalog-sync:main", "job:ping:main"]
    assert await lease_holders(database) == {"job:checks": "host:12", "job:poll:main": "host:1x"}


async def test_heartbeat_frees_what_a_vanished_instance_held(database_url: str) -> None:
    """An instance whose heartbeat is older than three beats is marked down by the next heartbeat of a live
    one: its singletons and its waiting for the request budget are freed and ``instance_down`` is raised."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        settings = settings_for(database_url, ("main", sandbox), server={"heartbeat_seconds": 1})
        runtime = Runtime.build(settings)
        try:
            now = utcnow()
            gone = "far-host:4242"
            await sql_execute(
                runtime.database,
                insert(instances).values(
                    id=gone, host="far-host", pid=4242, version="0", started_at=now - timedelta(hours=1),
                    heartbeat_at=now - timedelta(seconds=3.5),
                ),
            )  # fmt: skip
            assert await runtime.database.write(lambda tx: tx.leases.acquire("job:ping:main", gone, now, 60))
            await sql_execute(
                runtime.database,
                insert(rate_demand).values(
                    key="k", instance=gone, priority=3, expires_at=now + timedelta(60)
                ),
            )
            heartbeat = Heartbeat(runtime)
            await heartbeat.start()
            await heartbeat.step()
            (row,) = await sql_rows(runtime.database, select(instances).where(instances.c.id == gone))
            assert row.down_at is not None
            assert await lease_holders(runtime.database) == {}
            assert await sql_rows(runtime.database, select(rate_demand)) == []
            _, raised = await runtime.database.read(lambda tx: tx.alerts.recent(1, 10, "instance_down"))
            assert [alert.subject for alert in raised] == [gone]
        finally:
            await runtime.close()


async def test_heartbeat_looks_again_when_the_next_instance_could_turn_stale(database_url: str) -> None:
    """The heartbeat wakes when the oldest heartbeat of the others turns three beats old, not a whole beat
    later."""
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        settings = settings_for(database_url, ("main", sandbox), server={"heartbeat_seconds": 1})
        runtime = Runtime.build(settings)
        try:
            now = utcnow()
            await sql_execute(
                runtime.database,
                insert(instances).values(
                    id="quiet:7", host="quiet", pid=7, version="0", started_at=now, heartbeat_at=now
                    - timedelta(seconds=2.6),
                ),
            )  # fmt: skip
            heartbeat = Heartbeat(runtime)
            await heartbeat.start()
            delay = await heartbeat.step()
            assert delay is not None
            assert 0.3 < delay < 0.6
        finally:
            await runtime.close()


async def test_a_restarted_daemon_takes_over_from_its_dead_predecessor_at_once(database_url: str) -> None:
    """At start-up, an instance recorded on this host whose process is gone is marked down and its leases
    freed at once, however fresh its last heartbeat."""
    finished = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    await finished.wait()
    predecessor = f"{socket.gethostname()}:{finished.pid}"
    async with Sandbox(SandboxConfig(products=2)) as sandbox:
        runtime = Runtime.build(settings_for(database_url, ("main", sandbox)))
        try:
            now = utcnow()
            await sql_execute(
                runtime.database,
                insert(instances).values(
                    id=predecessor, host=socket.gethostname(), pid=finished.pid, version="0", started_at=now,
                    heartbeat_at=now,
                ),
            )  # fmt: skip
            assert await runtime.database.write(
                lambda tx: tx.leases.acquire("job:poll:main", predecessor, now, 600)
            )
            await Heartbeat(runtime).start()
            (row,) = await sql_rows(runtime.database, select(instances).where(instances.c.id == predecessor))
            assert row.down_at is not None
            assert await lease_holders(runtime.database) == {}
        finally:
            await runtime.close()
