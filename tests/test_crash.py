"""Crash test: ``procurd run`` killed with SIGKILL at random moments under a stream of orders.

The sandbox upstream runs in the test process, so it outlives every kill; it answers ``orders.create``
late (a random delay per request), so kills land while submissions are in flight. Afterwards every order
is delivered, the upstream holds exactly one order per ``downstream_order_no``, and every procurement's
audit trail is one unbroken chain from intake to its final state.

The kill moments come from a seed printed at the start (``PROCURD_CRASH_SEED=N`` replays its choices);
``PROCURD_CRASH_ORDERS`` and ``PROCURD_CRASH_KILLS`` make a longer run than CI's 60 orders and 5 kills.

``lease_seconds`` is short here: a killed worker leaves its claim behind, and the procurement is only
taken again once that claim expires, so the lease bounds how long a crash delays an order. It stays above
the upstream timeout, so a live worker's claim never expires while its call is still running.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from fault_processes import Incarnations
from fault_support import (
    IntakeClient,
    all_delivered,
    audit_events,
    audit_problems,
    fault_sandbox_config,
    orderable_skus,
    procurement_rows,
    report,
    single_item,
    take_ledger,
)
from procurd.sandbox import Sandbox
from scale_cluster import instance_config, requires_postgres, settings_of
from support import mirror, wait_until

ORDERS = int(os.environ.get("PROCURD_CRASH_ORDERS", "60"))
KILLS = int(os.environ.get("PROCURD_CRASH_KILLS", "5"))
LEASE_SECONDS = 2.5
UPSTREAM_TIMEOUT_SECONDS = 2.0
CREATE_DELAY_SECONDS = (0.05, 0.6)  # how late the sandbox answers each order creation
UPTIME_SECONDS = (0.2, 1.0)  # how long a daemon runs before it is killed
DOWNTIME_SECONDS = (0.0, 0.5)  # how long it stays dead before the restart
ORDER_GAP_SECONDS = (0.02, 0.2)  # between two orders of the stream
SETTLE_TIMEOUT_SECONDS = 60.0
BURST_STREAMS = 8  # storefront streams at once in the kills-during-commits runs
WRITE_WAIT_SECONDS = 5.0  # how long a kill waits for the daemon to be inside a write transaction


def crash_seed() -> int:
    raw = os.environ.get("PROCURD_CRASH_SEED", "")
    seed = int(raw) if raw else random.SystemRandom().randrange(2**32)
    print(f"crash seed {seed} (replay with PROCURD_CRASH_SEED={seed})")
    return seed


def crash_config(database_url: str, sandbox: Sandbox) -> dict[str, Any]:
    return instance_config(
        database_url,
        sandbox,
        procurement={
            "lease_seconds": LEASE_SECONDS,
            "max_attempts": 20,
            "poll_initial_seconds": 0.5,
            "poll_max_seconds": 1.0,
        },
        upstream={"timeout_seconds": UPSTREAM_TIMEOUT_SECONDS},
    )


def slow_order_creation(sandbox: Sandbox, rng: random.Random, count: int) -> None:
    for _ in range(count):
        sandbox.faults.delay_next("orders.create", seconds=rng.uniform(*CREATE_DELAY_SECONDS))
    sandbox.faults.delay_callbacks(0.2)


async def order_stream(client: IntakeClient, skus: list[int], rng: random.Random, prefix: str) -> list[str]:
    """Hand ``ORDERS`` orders over one after another, alternating between the listeners."""
    numbers = []
    for index in range(ORDERS):
        order_no = f"{prefix}{index:03d}"
        await client.submit(order_no, single_item(rng.choice(skus)), first=index)
        numbers.append(order_no)
        # The gap between two orders is part of the random schedule, not a wait for anything.
        await asyncio.sleep(rng.uniform(*ORDER_GAP_SECONDS))
    return numbers


async def kill_repeatedly(victim: Incarnations, session: aiohttp.ClientSession, rng: random.Random) -> int:
    """SIGKILL the victim ``KILLS`` times at random moments, restarting it each time on the same ports."""
    for _ in range(KILLS):
        # Uptime and downtime are the random kill schedule, not waits for a condition.
        await asyncio.sleep(rng.uniform(*UPTIME_SECONDS))
        await victim.kill()
        await asyncio.sleep(rng.uniform(*DOWNTIME_SECONDS))
        await victim.start(session)
    return 0


class WriteProbe:
    """Tells when a daemon is inside a write transaction: on SQLite when the write lock is taken (a try with
    no wait fails), on PostgreSQL when one of its connections holds a transaction that has written."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self.postgres = None if database_url.startswith("sqlite") else create_async_engine(database_url)

    async def close(self) -> None:
        if self.postgres is not None:
            await self.postgres.dispose()

    async def writing(self, pid: int) -> bool:
        if self.postgres is None:
            return await asyncio.to_thread(self._sqlite_locked)
        statement = text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name LIKE :name AND backend_xid IS NOT NULL"
        )
        async with self.postgres.connect() as connection:
            found = await connection.execute(statement, {"name": f"procurd %:{pid}"})
            return bool(found.scalar_one())

    def _sqlite_locked(self) -> bool:
        path = self.database_url.split(":///", 1)[1]
        connection = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True  # "database is locked": the daemon is writing
        else:
            connection.execute("ROLLBACK")
            return False
        finally:
            connection.close()


async def kill_while_writing(
    victim: Incarnations, session: aiohttp.ClientSession, rng: random.Random, probe: WriteProbe
) -> int:
    """SIGKILL the victim ``KILLS`` times, each time while it is inside a write transaction (once some
    uptime has passed); returns how many kills landed in one."""
    landed = 0
    for _ in range(KILLS):
        await asyncio.sleep(rng.uniform(*UPTIME_SECONDS))  # the random kill schedule, not a wait
        deadline = time.monotonic() + WRITE_WAIT_SECONDS
        pid = victim.current.pid
        while time.monotonic() < deadline:
            if await probe.writing(pid):
                landed += 1
                break
        await victim.kill()
        await asyncio.sleep(rng.uniform(*DOWNTIME_SECONDS))
        await victim.start(session)
    return landed


async def order_burst(
    client: IntakeClient, skus: list[int], rng: random.Random, prefix: str, listener: int
) -> list[str]:
    """Hand ``ORDERS`` orders over from ``BURST_STREAMS`` storefront streams at once, to ``listener`` first
    (the next one while it is down): writes pile up, so the daemon commits many in each transaction."""
    numbers = [f"{prefix}{index:03d}" for index in range(ORDERS)]

    async def stream(part: int) -> None:
        for index in range(part, ORDERS, BURST_STREAMS):
            await client.submit(numbers[index], single_item(rng.choice(skus)), first=listener)
            await asyncio.sleep(rng.uniform(*ORDER_GAP_SECONDS))  # part of the random schedule

    await asyncio.gather(*(stream(part) for part in range(BURST_STREAMS)))
    return numbers


async def run_crash(
    database_url: str,
    tmp_path: Path,
    names: Sequence[str],
    victim_name: str,
    prefix: str,
    *,
    during_commits: bool = False,
) -> dict[str, Any]:
    """The whole crash run; returns its figures after asserting nothing was lost or doubled."""
    seed = crash_seed()
    kill_rng, order_rng, delay_rng = (random.Random(f"{seed}/{part}") for part in ("kill", "order", "delay"))
    async with Sandbox(fault_sandbox_config()) as sandbox:
        skus = orderable_skus(sandbox)
        configs = {name: crash_config(database_url, sandbox) for name in names}
        await mirror(settings_of(configs[names[0]]))
        slow_order_creation(sandbox, delay_rng, ORDERS * 3)
        instances = {name: Incarnations(name, config, tmp_path) for name, config in configs.items()}
        try:
            async with aiohttp.ClientSession() as session:
                await asyncio.gather(*(instance.start(session) for instance in instances.values()))
                client = IntakeClient(session, [instances[name].admin_url for name in names])
                started = time.monotonic()
                victim = instances[victim_name]
                if during_commits:
                    probe = WriteProbe(database_url)
                    try:
                        accepted, landed = await asyncio.gather(
                            order_burst(client, skus, order_rng, prefix, list(names).index(victim_name)),
                            kill_while_writing(victim, session, kill_rng, probe),
                        )
                    finally:
                        await probe.close()
                else:
                    accepted, landed = await asyncio.gather(
                        order_stream(client, skus, order_rng, prefix),
                        kill_repeatedly(victim, session, kill_rng),
                    )
                chaos_seconds = time.monotonic() - started
                settled = await _settle(database_url, seed)
                settle_seconds = time.monotonic() - started - chaos_seconds
            for instance in instances.values():
                code = await instance.stop()
                assert code == 0, f"{instance.name} exited with {code}:\n{instance.current.log_tail()}"
        finally:
            for instance in instances.values():
                await instance.kill_if_running()
        ledger = await take_ledger(database_url, sandbox, accepted)
    assert settled, f"seed {seed}: not every order was delivered"
    assert ledger.orders == ORDERS, (seed, ledger)
    assert ledger.lost == 0, (seed, ledger)
    assert ledger.duplicates == 0, (seed, ledger)
    assert ledger.upstream_orders == ORDERS, (seed, ledger)
    assert ledger.mismatched == 0, (seed, ledger)
    assert ledger.amount_unknown == 0, (seed, ledger)
    assert await audit_problems(database_url) == [], seed
    for instance in instances.values():
        assert not instance.log_events("http.internal_error"), instance.name
    rows = await procurement_rows(database_url)
    events = await audit_events(database_url)
    return {
        "seed": seed,
        "kills": instances[victim_name].kills,
        "kills_inside_a_write": landed,
        "seconds_under_kills": round(chaos_seconds, 1),
        "seconds_to_settle_after": round(settle_seconds, 1),
        "intake_retries": client.record.retry_count,
        "intake_retry_reasons": dict(client.record.retries),
        "resubmitted": sum(1 for row in rows if row.attempts > 1),
        "delivered_by_callback": events[("callback", "delivered")],
        "delivered_by_poll": events[("poll", "delivered")],
        **ledger.row(),
    }


async def _settle(database_url: str, seed: int) -> bool:
    async def settled() -> bool:
        return await all_delivered(database_url, ORDERS)

    try:
        return await wait_until(settled, timeout=SETTLE_TIMEOUT_SECONDS, interval=0.2)
    except AssertionError:
        states = sorted({(row.state, row.last_error_code) for row in await procurement_rows(database_url)})
        raise AssertionError(f"seed {seed}: orders not all delivered: {states}") from None


async def test_sigkill_under_load_loses_and_doubles_nothing(database_url: str, tmp_path: Path) -> None:
    """Five SIGKILLs of procurd amid 60 orders: all delivered, one upstream order each, audit unbroken."""
    if not database_url.startswith("sqlite"):
        pytest.skip("the single-daemon crash test runs on SQLite; the PostgreSQL pass kills one of two")
    figures = await run_crash(database_url, tmp_path, ["solo"], "solo", "CR")
    report("crash_sqlite", **figures)


@requires_postgres[0]
@requires_postgres[1]
async def test_sigkill_of_one_of_two_daemons(database_url: str, tmp_path: Path) -> None:
    """Two daemons on PostgreSQL, one killed 5 times amid 60 orders sent to both: nothing lost or doubled."""
    figures = await run_crash(database_url, tmp_path, ["steady", "victim"], "victim", "CP")
    report("crash_postgres", **figures)


async def test_sigkill_inside_batched_commits_loses_and_doubles_nothing(
    database_url: str, tmp_path: Path
) -> None:
    """Orders from 8 streams at once pile up into batched commits; five SIGKILLs land while the daemon is
    inside a write transaction: every accepted order is delivered once, every audit trail unbroken."""
    if not database_url.startswith("sqlite"):
        pytest.skip("the single-daemon crash test runs on SQLite; the PostgreSQL pass kills one of two")
    figures = await run_crash(database_url, tmp_path, ["solo"], "solo", "CB", during_commits=True)
    assert figures["kills_inside_a_write"] >= KILLS - 1, figures
    report("crash_batched_commits_sqlite", **figures)


@requires_postgres[0]
@requires_postgres[1]
async def test_sigkill_inside_batched_commits_of_one_of_two_daemons(
    database_url: str, tmp_path: Path
) -> None:
    """Two daemons on PostgreSQL; one killed five times while it holds a write transaction amid orders from 8
    streams at once: nothing lost or doubled."""
    figures = await run_crash(
        database_url, tmp_path, ["steady", "victim"], "victim", "CQ", during_commits=True
    )
    assert figures["kills_inside_a_write"] >= KILLS - 1, figures
    report("crash_batched_commits_postgres", **figures)
