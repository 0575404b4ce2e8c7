"""Retention against a database filled the way procurd fills it: orders bought and delivered from the
sandbox (audit entries, storefront events), catalogue passes (mirror changes, sync runs) and alerts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from acgfaka_support import PLAIN, Choice, mirror_shop, running_shop
from console_support import delivered_order
from procurd.config import RetentionSettings
from procurd.core.alerts import Kind, Occurrence
from procurd.daemon import RETENTION_INTERVAL_SECONDS
from procurd.db.schema import alerts, audit_log, mirror_changes, outbox, sync_runs, upstream_trades
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.http.testing import Stack, procurd_stack
from procurd.operations.retention import LEASE, cutoffs, prune
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.acgfaka.testing import ControlClient
from procurd.upstream.errors import OutcomeUnknown
from procurd.upstream.models import CreateOrderRequest
from support import run_cli, running_daemon, settings_for, sql_rows
from test_acgfaka_orders import acg_daemon, acg_settings, exception_of, trades_sent
from test_cli_orders import write_config

TABLES = {"audit_log": audit_log, "mirror_changes": mirror_changes, "outbox": outbox, "sync_runs": sync_runs,
          "alerts": alerts}  # fmt: skip


@pytest.fixture
async def filled(database_url: str) -> AsyncIterator[Stack]:
    """Three delivered orders with their storefront events (two of them delivered to the storefront),
    three catalogue passes of one upstream with changes, and two alerts."""
    async with procurd_stack(
        database_url, upstreams=("main",), webhook_url="http://127.0.0.1:9/hook"
    ) as stack:
        await stack.sync("main")
        sku = stack.sandbox.state.first_sku("auto").id
        for number in range(3):
            await delivered_order(stack, f"R{number}", sku)
        stack.sandbox.state.set_sku_price(sku, "12.34")
        await stack.sync("main")
        await stack.sync("main")
        database = stack.runtime.database

        def deliver_two(tx: Tx) -> None:
            rows = tx.outbox.claim_events("test", utcnow(), utcnow() + timedelta(seconds=60), 2)
            for row in rows:
                tx.outbox.event_delivered(row.id, utcnow())

        await database.write(deliver_two)
        await stack.runtime.alerts.raise_(
            Occurrence(Kind.LOW_BALANCE, "main", "balance low", "main"),
            Occurrence(Kind.SYNC_FAILED, "main", "a pass failed", "main"),
        )
        yield stack


async def counts(stack: Stack) -> dict[str, int]:
    found = {}
    for name, table in TABLES.items():
        [(count,)] = await sql_rows(stack.runtime.database, select(func.count()).select_from(table))
        found[name] = int(count)
    return found


async def test_everything_past_its_days_goes_in_small_batches(filled: Stack) -> None:
    """A year and a half later every table is emptied in batches of three, except what must stay: the
    last sync run of the upstream and storefront events not delivered yet."""
    before = await counts(filled)
    assert all(before.values()), before
    later = utcnow() + timedelta(days=500)
    report = await prune(filled.runtime.database, RetentionSettings(), "test", now=later, batch_rows=3)
    after = await counts(filled)
    undelivered = before["outbox"] - 2
    assert after == {"audit_log": 0, "mirror_changes": 0, "outbox": undelivered, "sync_runs": 1, "alerts": 0}
    assert report.deleted == {name: before[name] - after[name] for name in TABLES}
    [(latest,)] = await sql_rows(filled.runtime.database, select(func.max(sync_runs.c.id)))
    [(kept,)] = await sql_rows(filled.runtime.database, select(sync_runs.c.id))
    assert kept == latest


async def test_each_table_keeps_its_own_days(filled: Stack) -> None:
    """Ten days on only the delivered storefront events (7 days) are past their time; a hundred days on
    mirror changes, sync runs and alerts (90) go too, the audit trail (365) stays; 0 keeps forever."""
    before = await counts(filled)
    database = filled.runtime.database
    ten_days = await prune(database, RetentionSettings(), "test", now=utcnow() + timedelta(days=10))
    assert {name: n for name, n in ten_days.deleted.items() if n} == {"outbox": 2}
    forever = RetentionSettings(mirror_changes_days=0, sync_runs_days=0, alerts_days=0, audit_days=0)
    nothing = await prune(database, forever, "test", now=utcnow() + timedelta(days=100))
    assert set(nothing.deleted) == {"outbox"}
    hundred_days = await prune(database, RetentionSettings(), "test", now=utcnow() + timedelta(days=100))
    assert hundred_days.deleted["audit_log"] == 0
    after = await counts(filled)
    assert after["audit_log"] == before["audit_log"]
    assert (after["mirror_changes"], after["sync_runs"], after["alerts"]) == (0, 1, 0)


def test_days_may_be_fractions_and_zero_keeps_forever() -> None:
    """Half a day keeps twelve hours; 0 leaves the table out of pruning."""
    now = utcnow()
    kept = cutoffs(RetentionSettings(outbox_delivered_days=0.5, alerts_days=0), now)
    assert kept["outbox"] == now - timedelta(hours=12)
    assert "alerts" not in kept
    assert kept["audit_log"] == now - timedelta(days=365)


async def test_one_instance_prunes_at_a_time(filled: Stack) -> None:
    """While another instance holds the retention lease a prune does nothing and says so."""
    database = filled.runtime.database
    await database.write(lambda tx: tx.leases.acquire(LEASE, "other:1", utcnow(), 3600))
    before = await counts(filled)
    report = await prune(database, RetentionSettings(), "test", now=utcnow() + timedelta(days=500))
    assert (report.skipped, report.deleted) == (True, {})
    assert await counts(filled) == before


async def test_prune_from_the_command_line(filled: Stack, tmp_path: Path) -> None:
    """``procurd prune`` applies [retention] now and prints what it deleted per table; --json answers the
    counts. Nothing is old enough yet: nothing goes."""
    config = write_config(tmp_path / "procurd.toml", filled)
    before = await counts(filled)
    human = await run_cli(config, "prune")
    assert human.exit_code == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0].split() == ["table", "deleted", "rows", "written"]
    assert any(line.split()[:2] == ["audit_log", "0"] for line in lines)
    assert lines[-1] == "0 rows deleted"
    as_json = await run_cli(config, "prune", "--json")
    assert json.loads(as_json.stdout)["total"] == 0
    assert await counts(filled) == before


async def test_the_daemon_prunes_daily(database_url: str) -> None:
    """procurd run schedules retention once a day (first a few minutes after start)."""
    async with Sandbox(SandboxConfig(products=1)) as sandbox:
        settings = settings_for(database_url, ("main", sandbox))
        async with running_daemon(settings) as daemon:
            job = daemon.scheduler.get_job("retention")
            assert job is not None
            assert job.trigger.interval == timedelta(seconds=RETENTION_INTERVAL_SECONDS)
            assert isinstance(job.next_run_time, datetime)


async def test_acg_faka_trades_are_kept_with_their_procurements(database_url: str) -> None:
    """A century on, a prune with every table at a thousandth of a day leaves every acg-faka trade: they
    are kept with their procurements, which are never pruned, and a trade whose outcome is unknown is what
    keeps it from being sent again (asked again, it still sends nothing)."""
    async with running_shop() as shop:
        settings = acg_settings(database_url, shop)
        [sku] = (await mirror_shop(settings, Choice(PLAIN))).skus
        async with acg_daemon(settings) as admin, ControlClient(shop.base_url) as control:
            await admin.submit("T1", {"upstream": "acg", "sku_id": sku, "quantity": 1})
            await admin.wait_status("T1", "delivered")
            await control.post("/faults", {"knob": "lost_answer_next"})
            await admin.submit("T2", {"upstream": "acg", "sku_id": sku, "quantity": 1})
            unknown = await exception_of(admin, "T2")
        shortest = RetentionSettings(
            audit_days=0.001, mirror_changes_days=0.001, outbox_delivered_days=0.001, sync_runs_days=0.001,
            alerts_days=0.001,
        )  # fmt: skip
        runtime = Runtime.build(settings)
        try:
            later = utcnow() + timedelta(days=36500)
            report = await prune(runtime.database, shortest, "test", now=later)
            assert report.deleted["audit_log"] > 0
            trades = await sql_rows(database_url, select(upstream_trades.c.downstream_order_no))
            assert sorted(row.downstream_order_no for row in trades) == ["T1", unknown["downstream_order_no"]]
            again = CreateOrderRequest(
                sku_id=sku, quantity=1, downstream_order_no=unknown["downstream_order_no"]
            )
            with pytest.raises(OutcomeUnknown) as raised:
                await runtime.client("acg").create_order(again)
            assert raised.value.cause == "sent_before"
        finally:
            await runtime.close()
        assert trades_sent(shop) == 2
