"""Scale-out: two real ``procurd run`` processes on one PostgreSQL database and one sandbox upstream."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy import Engine, event, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from fault_support import orderable_skus
from procurd.core.intake import parse_order_request
from procurd.db.health_store import HealthStore
from procurd.db.schema import audit_log, orders, procurements, sync_runs, upstream_health
from procurd.db.types import utcnow
from procurd.operations.runtime import Runtime
from procurd.operations.views import ProcurementViews
from procurd.sandbox import Sandbox, SandboxConfig
from scale_cluster import (
    DaemonProcess,
    cluster,
    instance_config,
    metric_value,
    requires_postgres,
    settings_of,
)
from support import AdminClient, mirror, settings_for, wait_until

pytestmark = requires_postgres

LOAD_ORDERS = 300
CALLBACK_ORDERS = 40
SUBMIT_CONCURRENCY = 16
BIG_BALANCE = Decimal("10000000.00")
UPSTREAM_REQUESTS = "procurd_upstream_requests_total"
CALLBACKS = "procurd_callbacks_total"


def sandbox_config(**overrides: Any) -> SandboxConfig:
    values: dict[str, Any] = {
        "products": 20,
        "manual_ratio": 0.0,
        "allow_private_callbacks": True,
        "balance": BIG_BALANCE,
        "callback_retry_delays": (0.2, 0.5, 1.0, 2.0),
    }
    values.update(overrides)
    return SandboxConfig(**values)


async def submit_all(admins: list[AdminClient], orders: dict[str, int]) -> None:
    """Submit every order (number to SKU), alternating between the instances, several at a time."""
    gate = asyncio.Semaphore(SUBMIT_CONCURRENCY)

    async def submit(index: int, order_no: str, sku_id: int) -> None:
        async with gate:
            order = await admins[index % len(admins)].submit(order_no, {"sku_id": sku_id, "quantity": 1})
            assert order["order_no"] == order_no

    await asyncio.gather(*(submit(i, no, sku) for i, (no, sku) in enumerate(orders.items())))


async def queue_counts(admin: AdminClient) -> dict[str, int]:
    status, body = await admin.call("GET", "/api/v1/status")
    assert status == 200, body
    (upstream,) = body["upstreams"]
    return upstream["queue"]  # type: ignore[no-any-return]


@pytest.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """A connection pool of this test's own on the shared database, beside the instances'."""
    engine = create_async_engine(database_url)
    try:
        yield engine
    finally:
        await engine.dispose()


async def test_two_instances_never_double_submit(
    database_url: str, engine: AsyncEngine, tmp_path: Path
) -> None:
    """300 orders taken in by two instances are each bought upstream exactly once, and all are delivered."""
    async with Sandbox(sandbox_config()) as sandbox:
        skus = orderable_skus(sandbox)
        configs = {name: instance_config(database_url, sandbox) for name in ("a", "b")}
        await mirror(settings_of(configs["a"]))
        orders = {f"LOAD{n:04d}": skus[n % len(skus)] for n in range(LOAD_ORDERS)}
        # Every third submission is answered late: claims stay in flight while the other instance works.
        for index in range(LOAD_ORDERS):
            sandbox.faults.delay_next("orders.create", seconds=0.2 if index % 3 == 0 else 0)
        async with cluster(tmp_path, configs) as daemons, aiohttp.ClientSession() as session:
            admins = [AdminClient(daemon.settings, session) for daemon in daemons]
            await submit_all(admins, orders)

            async def all_delivered() -> bool:
                return (await queue_counts(admins[0])).get("delivered", 0) == LOAD_ORDERS

            await wait_until(all_delivered, timeout=90, interval=0.2)
            submitted_by = [
                metric_value(await daemon.metrics(session), UPSTREAM_REQUESTS, endpoint="orders.create")
                for daemon in daemons
            ]
            for order_no in list(orders)[:: LOAD_ORDERS // 10]:
                for admin in admins:
                    view = await admin.order(order_no)
                    assert view["status"] == "delivered"
                    assert view["procurements"][0]["fulfillment"]["status"] == "delivered"

        assert all(count > 0 for count in submitted_by), submitted_by
        assert sum(submitted_by) == LOAD_ORDERS
        assert sandbox.request_counts["orders.create"] == LOAD_ORDERS
        assert len(sandbox.state.orders) == LOAD_ORDERS
        per_number = Counter(order.downstream_order_no for order in sandbox.state.orders.values())
        assert per_number == Counter(list(orders))
        await assert_each_submitted_once(engine)


async def assert_each_submitted_once(engine: AsyncEngine) -> None:
    """Every procurement was claimed once (a lost or doubled claim counts a second attempt), accepted once."""
    async with engine.connect() as conn:
        rows = (await conn.execute(select(procurements))).all()
        worker_submissions = select(audit_log.c.procurement_id).where(
            audit_log.c.source == "worker", audit_log.c.new_state == "submitted"
        )
        accepted = Counter((await conn.execute(worker_submissions)).scalars())
    assert len(rows) == LOAD_ORDERS
    assert {row.state for row in rows} == {"delivered"}
    assert {row.attempts for row in rows} == {1}
    assert all(count == 1 for count in accepted.values()), accepted.most_common(3)


async def test_any_instance_takes_any_callback(database_url: str, tmp_path: Path) -> None:
    """Orders taken in by instance A are delivered through callbacks that only instance B receives."""
    async with Sandbox(sandbox_config()) as sandbox:
        skus = orderable_skus(sandbox)
        no_polls = {"poll_initial_seconds": 3600, "poll_max_seconds": 3600}
        b_config = instance_config(database_url, sandbox, procurement=no_polls)
        b_callback = b_config["server"]["callback_url"]
        a_config = instance_config(
            database_url, sandbox, procurement=no_polls, server={"callback_url": b_callback}
        )
        await mirror(settings_of(a_config))
        orders = {f"CB{n:03d}": skus[n % len(skus)] for n in range(CALLBACK_ORDERS)}
        async with (
            cluster(tmp_path, {"a": a_config, "b": b_config}) as (a, b),
            aiohttp.ClientSession() as session,
        ):
            admin_a = AdminClient(a.settings, session)
            await submit_all([admin_a], orders)
            for order_no in orders:
                view = await admin_a.wait_status(order_no, "delivered", timeout=30)
                assert view["procurements"][0]["fulfillment"]["payload"]
            await sandbox.wait_callbacks_idle()
            a_metrics, b_metrics = await a.metrics(session), await b.metrics(session)

        assert {order.callback_url for order in sandbox.state.orders.values()} == {b_callback}
        delivered_callbacks = [attempt for attempt in sandbox.callback_log if attempt.ok]
        assert {attempt.downstream_order_no for attempt in delivered_callbacks} == set(orders)
        assert {attempt.url for attempt in sandbox.callback_log} == {b_callback}
        assert metric_value(a_metrics, CALLBACKS) == 0
        assert metric_value(b_metrics, CALLBACKS, result="accepted") == len(delivered_callbacks)
        assert metric_value(b_metrics, CALLBACKS, result="rejected") == 0
        assert metric_value(a_metrics, UPSTREAM_REQUESTS, endpoint="orders.create") > 0
        assert metric_value(a_metrics, UPSTREAM_REQUESTS, endpoint="orders.get") == 0
        assert metric_value(b_metrics, UPSTREAM_REQUESTS, endpoint="orders.get") == 0


async def test_one_catalogue_sync_at_a_time(database_url: str, engine: AsyncEngine, tmp_path: Path) -> None:
    """With both instances scheduled to sync twice a second or more, every pass runs on the one instance
    that holds the upstream's catalogue job, passes never overlap, and once that instance stops the other
    takes the job over; only a pass under way when its instance stops ends otherwise than ok."""
    async with Sandbox(sandbox_config(products=30)) as sandbox:
        durations = random.Random(7)
        for _ in range(400):
            sandbox.faults.delay_next("products", seconds=round(durations.uniform(0.05, 0.6), 2))
        configs = {
            name: instance_config(
                database_url,
                sandbox,
                catalog={"sync_interval_seconds": interval},
                server={"heartbeat_seconds": 0.5},
                logging={"level": "info", "format": "json"},
            )
            for name, interval in (("a", 0.5), ("b", 0.35))
        }
        async with cluster(tmp_path, configs) as daemons:
            await wait_until(lambda: sum(len(started_runs(daemon)) for daemon in daemons) >= 3, timeout=40)
            (holder,) = [daemon for daemon in daemons if started_runs(daemon)]
            (standby,) = [daemon for daemon in daemons if daemon is not holder]
            assert await holder.stop() == 0
            await wait_until(lambda: len(started_runs(standby)) >= 2, timeout=40, interval=0.1)

        rows = await sync_run_rows(engine)
        # A pass skipped because another instance held the sync lease is recorded as such, and is no pass.
        skipped_rows = [run for run in rows if run.status == "skipped"]
        assert len(skipped_rows) == len(skipped(daemons))
        assert all(run.error == "another instance is syncing" for run in skipped_rows)
        runs = [run for run in rows if run.status != "skipped"]
        # A pass under way when its instance stops is cut short (it resumes on the next schedule).
        cut_short = [run for run in runs if run.status != "ok"]
        assert len(cut_short) <= 2, cut_short
        assert all((run.status, run.error) == ("failed", "cancelled before it finished") for run in cut_short)
        for earlier, later in itertools.pairwise(runs):
            assert earlier.finished_at <= later.started_at, (earlier, later)
        by_holder, by_standby = started_runs(holder), started_runs(standby)
        assert by_holder.isdisjoint(by_standby)
        assert by_holder | by_standby == {run.id for run in runs}
        assert max(by_holder) < min(by_standby)
        assert all(record["reason"] == "another instance is syncing" for record in skipped(daemons))


def started_runs(daemon: DaemonProcess) -> set[int]:
    return {int(record["run_id"]) for record in daemon.log_events("catalog.sync_started")}


def skipped(daemons: list[DaemonProcess]) -> list[dict[str, Any]]:
    return [record for daemon in daemons for record in daemon.log_events("catalog.sync_skipped")]


async def sync_run_rows(engine: AsyncEngine) -> list[Any]:
    async with engine.connect() as conn:
        statement = select(sync_runs).where(sync_runs.c.upstream == "main").order_by(sync_runs.c.started_at)
        return list((await conn.execute(statement)).all())


async def test_instances_starting_together_both_create_health_rows(engine: AsyncEngine) -> None:
    """Two instances creating the health rows of a fresh database at the same moment both succeed."""
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        await first.run_sync(lambda conn: HealthStore(conn).ensure_rows(["main"], utcnow()))
        await second.begin()
        racing = asyncio.create_task(
            second.run_sync(lambda conn: HealthStore(conn).ensure_rows(["main"], utcnow()))
        )
        await wait_until(lambda: waiting_on_a_lock(engine))
        await first.commit()
        await racing
        await second.commit()
    async with engine.connect() as conn:
        assert list((await conn.execute(select(upstream_health.c.upstream))).scalars()) == ["main"]


async def waiting_on_a_lock(engine: AsyncEngine) -> bool:
    """Whether some session of this test's database waits for a lock another one holds."""
    async with engine.connect() as conn:
        statement = text(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return bool((await conn.execute(statement)).scalar_one())


async def test_order_view_is_one_snapshot_while_another_instance_commits(
    database_url: str, engine: AsyncEngine
) -> None:
    """An order read while another instance commits between the view's statements shows one state."""
    async with Sandbox(sandbox_config()) as sandbox:
        settings = settings_for(database_url, ("main", sandbox))
        await mirror(settings)
        runtime = Runtime.build(settings)
        try:
            sku_id = orderable_skus(sandbox)[0]
            request = parse_order_request({"order_no": "SNAP1", "items": [{"sku_id": sku_id, "quantity": 1}]})
            await runtime.service.submit(request)
            commit_before_procurements_read(runtime.database.sync_engine, other=engine, order_no="SNAP1")
            view = await ProcurementViews(runtime).order("SNAP1")
        finally:
            await runtime.close()
    assert view is not None
    (item,) = view["procurements"]
    assert view["exception"] is (item["state"] == "exception"), view


def commit_before_procurements_read(reader: Engine, other: AsyncEngine, order_no: str) -> None:
    """Just before ``reader`` first reads the procurements table (the order row is read by then), ``other``
    commits the order's change into an exception."""
    fired = False

    def commit_between(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        nonlocal fired
        if fired or "FROM procurements" not in statement:
            return
        fired = True
        with other.sync_engine.begin() as conn:
            conn.execute(
                update(procurements).where(procurements.c.order_no == order_no).values(state="exception")
            )
            conn.execute(update(orders).where(orders.c.order_no == order_no).values(exception=True))

    event.listen(reader, "before_cursor_execute", commit_between)
