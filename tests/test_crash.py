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
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest

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


async def kill_repeatedly(victim: Incarnations, session: aiohttp.ClientSession, rng: random.Random) -> None:
    """SIGKILL the victim ``KILLS`` times at random moments, restarting it each time on the same ports."""
    for _ in range(KILLS):
        # Uptime and downtime are the random kill schedule, not waits for a condition.
        await asyncio.sleep(rng.uniform(*UPTIME_SECONDS))
        await victim.kill()
        await asyncio.sleep(rng.uniform(*DOWNTIME_SECONDS))
        await victim.start(session)


async def run_crash(
    database_url: str, tmp_path: Path, names: Sequence[str], victim_name: str, prefix: str
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
                accepted, _ = await asyncio.gather(
                    order_stream(client, skus, order_rng, prefix),
                    kill_repeatedly(instances[victim_name], session, kill_rng),
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
