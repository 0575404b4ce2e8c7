"""Crash test of the provider role: a chain top → B → C in which B, a real ``procurd run`` process selling
its mirror of the top to C, is SIGKILLed while it takes C's orders in and buys them, then started again.

The top is the sandbox (in the test process, so it outlives every kill); it answers ``orders.create`` late, so
B's purchases are in flight when a kill lands. C is a daemon in the test process whose one upstream is B,
buying with an account created on B's database. C is handed its orders in waves, each paced over half a
second or so; B is killed once it has taken in half of a wave and is buying at least one order from the top,
and the next wave is released only once B is back, so every kill lands while B still has orders to take in,
with a purchase of its own in flight and C's submissions arriving (C keeps retrying while B is away).

Afterwards nothing is lost, doubled or stuck: every C order is delivered exactly once with the goods the top
delivered for it; the top holds exactly one order per C order; B holds exactly one provider order and one
procurement per C order, each delivered; C's wallet on B is its starting balance minus the sum charged, one
``order`` row in B's ledger per provider order, and the ledger's sum; every audit trail, on B and on C, is
one unbroken chain.

C's database is the test's (the ``database_url`` fixture: SQLite, or PostgreSQL when configured); B's is
another one of the same kind, of this test's own.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import func, select

from fault_processes import Incarnations
from fault_support import audit_problems, fault_sandbox_config, orderable_skus, report, single_item
from procurd.core.provider import cents_text
from procurd.db.database import Database, open_database
from procurd.db.provider_schema import provider_accounts, provider_ledger, provider_orders
from procurd.db.schema import procurements
from procurd.operations import open_operations
from procurd.sandbox import Sandbox
from procurd.sandbox.testing import SignedClient
from provider_support import ProviderSite, add_account, provider_config
from scale_cluster import own_database, settings_of
from support import AdminClient, config_data, mirror, running_daemon, sql_rows, wait_until

WAVES = 4  # C's orders come in this many waves; B is killed amid each but the last
WAVE_ORDERS = 8
ORDERS = WAVES * WAVE_ORDERS
WAVE_STREAMS = 4  # storefront streams at once within a wave
ORDER_GAP_SECONDS = (0.1, 0.3)  # between two orders of one stream: a wave takes about half a second
CREATE_DELAY_SECONDS = (0.2, 0.6)  # how late the top answers each of B's order creations
STARTING_BALANCE = "100000.00"
ACCOUNT = "siteC"
# B: a killed worker's claim is taken again once its lease expires, so the lease bounds how long a kill
# delays B's purchase; it stays above the top's timeout, so a live worker's claim never expires mid-call.
B_LEASE_SECONDS = 2.5
B_UPSTREAM_TIMEOUT_SECONDS = 2.0
SETTLE_TIMEOUT_SECONDS = 60.0
KILL_WAIT_SECONDS = 30.0


@pytest.fixture
async def provider_database_url(
    tmp_path: Path, postgres_template: str | None, sqlite_template: Path | None
) -> AsyncIterator[str]:
    """A second fresh, migrated database of the run's kind: B's own."""
    async with own_database(tmp_path, "provider", sqlite_template, postgres_template) as url:
        yield url


@dataclass
class KillRecord:
    """What B held at each kill."""

    taken_in: list[int] = field(default_factory=list)  # provider orders B had taken in
    buying: list[int] = field(default_factory=list)  # B's procurements claimed for submission to the top
    released: list[int] = field(default_factory=list)  # C orders handed over by then


def b_config(database_url: str, top: Sandbox) -> dict[str, Any]:
    return provider_config(
        database_url,
        ("top", top),
        procurement={
            "lease_seconds": B_LEASE_SECONDS,
            "max_attempts": 20,
            "poll_initial_seconds": 0.5,
            "poll_max_seconds": 1.0,
        },
        upstream={"timeout_seconds": B_UPSTREAM_TIMEOUT_SECONDS},
        provider={"site_name": "B", "rate_limit_per_minute": 100000},
    )


def c_config(database_url: str, b: ProviderSite) -> dict[str, Any]:
    # C retries its submissions to B quickly and long enough to outlast every restart of B.
    return config_data(
        database_url,
        ("b", b),
        procurement={
            "workers": 8,
            "max_attempts": 100,
            "retry_base_seconds": 0.05,
            "retry_max_seconds": 0.5,
            "poll_initial_seconds": 0.5,
            "poll_max_seconds": 1.0,
        },
    )


async def count(database: Database, statement: Any) -> int:
    return int(await database.read(lambda tx: tx.connection.execute(statement).scalar_one()))


TAKEN_IN = select(func.count()).select_from(provider_orders)


def buying(pid: int) -> Any:
    """How many of B's procurements the process ``pid`` has claimed to submit to the top (not the claims a
    killed incarnation left behind)."""
    return (
        select(func.count())
        .select_from(procurements)
        .where(procurements.c.state == "queued", procurements.c.lease_owner.contains(f":{pid}/"))
    )


async def offered_skus(b: ProviderSite) -> list[int]:
    """The SKU ids B offers C, once B's offered catalogue holds the top's products."""
    async with SignedClient(b.base_url, b.api_key, b.api_secret) as client:

        async def listed() -> list[dict[str, Any]] | None:
            products = await client.list_all_products()
            return products or None

        products = await wait_until(listed, timeout=20, interval=0.1)
    return [sku["id"] for product in products for sku in product["skus"]]


async def hand_over_waves(
    admin: AdminClient, skus: list[int], rng: random.Random, kills: list[asyncio.Event], released: list[int]
) -> list[str]:
    """Hand C its orders wave by wave, each from ``WAVE_STREAMS`` paced streams; wave k + 1 waits until B is
    back from its k-th kill."""
    numbers = [f"PC{index:03d}" for index in range(ORDERS)]
    for wave in range(WAVES):
        if wave > 0:
            await kills[wave - 1].wait()
        first = wave * WAVE_ORDERS

        async def stream(part: int, first: int = first) -> None:
            for index in range(first + part, first + WAVE_ORDERS, WAVE_STREAMS):
                order = await admin.submit(numbers[index], *single_item(rng.choice(skus)))
                assert order["order_no"] == numbers[index]
                released[0] += 1
                await asyncio.sleep(rng.uniform(*ORDER_GAP_SECONDS))  # the pacing, not a wait

        await asyncio.gather(*(stream(part) for part in range(WAVE_STREAMS)))
    return numbers


async def kill_amid_waves(
    b: Incarnations,
    b_database: Database,
    session: aiohttp.ClientSession,
    kills: list[asyncio.Event],
    released: list[int],
    record: KillRecord,
) -> None:
    """Kill B once it has taken in half of wave k and is buying from the top; start it again, then let the
    next wave go."""
    for wave, killed in enumerate(kills):
        threshold = wave * WAVE_ORDERS + WAVE_ORDERS // 2
        pid = b.current.pid

        async def taking_in_and_buying(threshold: int = threshold, pid: int = pid) -> tuple[int, int] | None:
            taken, claimed = await count(b_database, TAKEN_IN), await count(b_database, buying(pid))
            return (taken, claimed) if taken >= threshold and claimed > 0 else None

        taken, claimed = await wait_until(taking_in_and_buying, timeout=KILL_WAIT_SECONDS, interval=0.01)
        await b.kill()
        record.taken_in.append(taken)
        record.buying.append(claimed)
        record.released.append(released[0])
        await b.start(session)
        killed.set()


async def settled(c_admin: AdminClient, numbers: list[str]) -> bool:
    for order_no in numbers:
        if (await c_admin.order(order_no))["status"] != "delivered":
            return False
    return True


async def test_provider_killed_amid_a_burst_loses_and_doubles_nothing(
    database_url: str, provider_database_url: str, tmp_path: Path
) -> None:
    """B, a provider process between the top and C, is SIGKILLed three times while it takes C's orders in
    and buys them: every C order is delivered once with the top's goods, the top and B hold exactly one
    order each per C order, and C's wallet on B is charged exactly once per order, as its ledger says."""
    rng = random.Random(20240611)
    async with Sandbox(fault_sandbox_config(products=6)) as top:
        orderable_skus(top)  # unlimited stock, so no order runs short
        for _ in range(ORDERS * 3):
            top.faults.delay_next("orders.create", seconds=rng.uniform(*CREATE_DELAY_SECONDS))
        config = b_config(provider_database_url, top)
        await mirror(settings_of(config))
        async with open_operations(settings_of(config)) as operations:
            site = await add_account(operations, ACCOUNT, balance=STARTING_BALANCE)
        b = Incarnations("B", config, tmp_path)
        b_database = open_database(provider_database_url)
        record = KillRecord()
        try:
            async with aiohttp.ClientSession() as session:
                await b.start(session)
                skus = await offered_skus(site)
                c_settings = settings_of(c_config(database_url, site))
                await mirror(c_settings)
                async with running_daemon(c_settings):
                    c_admin = AdminClient(c_settings, session)
                    kills = [asyncio.Event() for _ in range(WAVES - 1)]
                    released = [0]
                    numbers, _ = await asyncio.gather(
                        hand_over_waves(c_admin, skus, rng, kills, released),
                        kill_amid_waves(b, b_database, session, kills, released, record),
                    )

                    async def all_delivered() -> bool:
                        return await settled(c_admin, numbers)

                    await wait_until(all_delivered, timeout=SETTLE_TIMEOUT_SECONDS, interval=0.2)
                code = await b.stop()
                assert code == 0, f"B exited with {code}:\n{b.current.log_tail()}"
        finally:
            await b.kill_if_running()
            await b_database.close()
        top_orders = list(top.state.orders.values())

    # Every kill landed while B had orders still to take in and a purchase from the top in flight.
    assert b.kills == WAVES - 1
    assert all(taken < ORDERS for taken in record.taken_in), record
    assert all(buying > 0 for buying in record.buying), record

    # The top: exactly one order per C order, each delivered.
    by_number = Counter(order.downstream_order_no for order in top_orders)
    assert len(top_orders) == ORDERS, by_number
    assert max(by_number.values()) == 1, by_number
    assert all(order.status in ("delivered", "completed") for order in top_orders)
    top_by_number = {order.downstream_order_no: order for order in top_orders}

    # B: one procurement and one provider order per C order, each delivered with the top's goods.
    b_procurements = await sql_rows(provider_database_url, select(procurements))
    b_orders = await sql_rows(provider_database_url, select(provider_orders))
    assert len(b_procurements) == ORDERS
    assert len(b_orders) == ORDERS
    assert len({row.downstream_order_no for row in b_orders}) == ORDERS
    b_bought = {row.order_no: row for row in b_procurements}
    assert set(b_bought) == {row.order_no for row in b_orders}
    for row in b_procurements:
        assert row.state == "delivered", (row.order_no, row.state, row.last_error_code)
        bought = top_by_number[row.downstream_order_no]
        assert row.upstream_order_id == bought.order_id
        assert bought.fulfillment is not None
        assert row.fulfillment["payload"] == bought.fulfillment.payload
    for row in b_orders:
        assert row.status == "delivered", (row.id, row.status)
        assert row.refunded_cents == 0
        assert row.fulfillment == b_bought[row.order_no].fulfillment

    # C: every order delivered once, with what B delivered (the top's goods), at the price B charged.
    c_procurements = await sql_rows(database_url, select(procurements))
    assert len(c_procurements) == ORDERS
    assert {row.order_no for row in c_procurements} == set(numbers)
    b_by_downstream = {row.downstream_order_no: row for row in b_orders}
    for row in c_procurements:
        assert row.state == "delivered", (row.order_no, row.state, row.last_error_code)
        sold = b_by_downstream[row.downstream_order_no]
        assert row.upstream_order_id == sold.id
        delivered = top_by_number[b_bought[sold.order_no].downstream_order_no].fulfillment
        assert delivered is not None
        assert row.fulfillment["payload"] == delivered.payload
        assert Decimal(row.amount) == Decimal(cents_text(sold.amount_cents))

    # C's wallet on B: the starting balance less the sum charged, once per order, as the ledger says.
    (account,) = await sql_rows(provider_database_url, select(provider_accounts))
    ledger = await sql_rows(
        provider_database_url,
        select(provider_ledger)
        .where(provider_ledger.c.account_id == account.id)
        .order_by(provider_ledger.c.id),
    )
    charged = sum(row.amount_cents for row in b_orders)
    starting = int(Decimal(STARTING_BALANCE) * 100)
    assert account.balance_cents == starting - charged
    assert sum(row.amount_cents for row in ledger) == account.balance_cents
    assert Counter(row.kind for row in ledger) == {"topup": 1, "order": ORDERS}
    charges = {row.order_id: row.amount_cents for row in ledger if row.kind == "order"}
    assert charges == {row.id: -row.amount_cents for row in b_orders}

    assert await audit_problems(provider_database_url) == []
    assert await audit_problems(database_url) == []
    assert not b.log_events("http.internal_error")
    report(
        "provider_crash",
        kills=b.kills,
        taken_in_at_kills=record.taken_in,
        buying_at_kills=record.buying,
        handed_over_at_kills=record.released,
        b_attempts=sum(row.attempts for row in b_procurements),
        c_attempts=sum(row.attempts for row in c_procurements),
        c_resubmitted=sum(1 for row in c_procurements if row.attempts > 1),
    )
