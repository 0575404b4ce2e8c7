"""Benchmark of the console's overview with its charts over a large history.

A database holds ``--procurements`` procurements (1,000,000 by default, each its own order) taken in evenly
over the last ``--days`` days (90): those of the last hour still open (submitted, a tenth queued), the older
ones delivered (93 %), canceled, resolved, and 0.2 % open exceptions nobody handled; every one with an
upstream amount, and the wallet's balance for every hour. The rows are written by the database
itself (a recursive CTE on SQLite, ``generate_series`` on PostgreSQL); the hourly rollup is then filled by
migration 0004's own code from the stored procurements, as an upgrade of such a database would fill it.

procurd's admin listener (the console, in this process, no daemon jobs) then answers ``GET /ui/`` with its
charts and ``GET /ui/?charts=off``, the same page without them (the baseline), alternately, ``--rounds`` times
each after a warm-up. Measured on the client: the time to the whole page, median and p90, and the ratio of the
two. Aim: the page with charts at or below 200 ms, and at or below 2 x the page without them.

    python benchmarks/overview.py [--procurements 1000000] [--database-url postgresql+asyncpg://...]

With ``--database-url`` give an empty database: the schema is created there first.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import Connection, text

import procurd
from procurd.config import Settings
from procurd.db.database import Database, open_database
from procurd.http.admin import make_admin_app
from procurd.http.testing import serve
from procurd.logs import configure_logging
from procurd.operations import Operations
from procurd.operations.installation import migrate_schema
from procurd.operations.runtime import Runtime

PAGE_AIM_MS = 200.0
ROLLUP_ROWS = "SELECT count(*) FROM procurement_hours"
RATIO_AIM = 2.0
# What becomes of a procurement, by its number: those of the last hour are still open (a tenth queued), the
# older ones settled (delivered, canceled, resolved), but for 0.2 % of exceptions nobody has handled yet.
STATES = " ".join(
    [
        "CASE WHEN n > :open_after THEN (CASE WHEN n % 10 = 0 THEN 'queued' ELSE 'submitted' END)",
        "WHEN n % 1000 < 930 THEN 'delivered' WHEN n % 1000 < 932 THEN 'exception'",
        "WHEN n % 1000 < 960 THEN 'resolved' ELSE 'canceled' END",
    ]
)


def seed_statements(dialect: str) -> list[str]:
    """The statements that write the orders and procurements (``n`` from 1 to ``:count``, taken in every
    ``:step`` seconds from ``:start``)."""
    if dialect == "sqlite":
        numbers = "WITH RECURSIVE seq(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM seq WHERE n < :count) "
        moment = "strftime('%Y-%m-%d %H:%M:%S', :start + n * :step + {0}, 'unixepoch') || '.000000'"
        source, json_array = "seq", "json_array('B' || n)"
    else:
        numbers = ""
        moment = "to_timestamp(:start + n * :step + {0})"
        source, json_array = "generate_series(1, :count) AS seq(n)", "jsonb_build_array('B' || n)"
    created = moment.format(0)
    submitted = moment.format(2)
    delivered = moment.format("3 + ((n % 900) * 7919) % 900")
    orders = " ".join(
        [
            f"{numbers}INSERT INTO orders (order_no, fingerprint, request, status, exception, created_at,",
            "updated_at, provider) SELECT 'B' || n, 'x', '{}', 'delivered', false,",
            f"{created}, {created}, false FROM {source}",
        ]
    )
    procurements = " ".join(
        [
            f"{numbers}INSERT INTO procurements (order_no, position, upstream, sku_id, quantity,",
            "downstream_order_no, downstream_order_nos, number_canceled, state, upstream_order_id,",
            "amount, currency, attempts, upstream_may_exist, source_position, submitted_at, delivered_at,",
            "created_at, updated_at) SELECT 'B' || n, 0, 'main', 1, 1, 'B' || n,",
            f"{json_array}, false, state, n, '9.90', 'CNY', 1, true, 0,",
            f"CASE WHEN state IN ('queued', 'canceled') THEN NULL ELSE {submitted} END,",
            f"CASE WHEN state = 'delivered' THEN {delivered} END, {created}, {created}",
            f"FROM (SELECT n, {STATES} AS state FROM {source}) AS numbered",  # noqa: S608 (constants)
        ]
    )
    return [orders, procurements]


def migration_0004() -> Any:
    path = Path(procurd.__file__).parent / "migrations" / "versions" / "0004_charts.py"
    spec = importlib.util.spec_from_file_location("migration_0004", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def seed(database: Database, count: int, days: int) -> dict[str, float]:
    """Write the history; how long each part took (seconds)."""
    now = datetime.now(UTC)
    start = int((now - timedelta(days=days)).timestamp())
    step = days * 86_400 / count
    parameters = {"count": count, "start": start, "step": step, "open_after": count - int(count / days / 24)}
    took: dict[str, float] = {}
    for name, statement in zip(("orders", "procurements"), seed_statements(database.dialect), strict=True):
        began = time.perf_counter()

        def write(tx: Any, statement: str = statement) -> None:
            tx.connection.execute(text(statement), parameters)

        await database.write(write)
        took[name] = time.perf_counter() - began
    began = time.perf_counter()
    module = migration_0004()
    await database.write(lambda tx: module.fill_rollup(tx.connection))
    took["rollup (migration 0004)"] = time.perf_counter() - began
    hours = [now - timedelta(hours=index) for index in range(days * 24)]

    def balances(tx: Any) -> None:
        for index, at in enumerate(hours):
            tx.charts.record_balance("main", f"{5000 + index * 3:.2f}", "CNY", at)

    await database.write(balances)
    await database.write(lambda tx: _analyze(tx.connection))
    return took


def _analyze(connection: Connection) -> None:
    connection.execute(text("ANALYZE"))


async def timed(session: aiohttp.ClientSession, url: str) -> float:
    began = time.perf_counter()
    async with session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        await answer.read()
    return (time.perf_counter() - began) * 1000


async def measure(base: str, rounds: int) -> dict[str, list[float]]:
    pages = {"with charts": base + "/ui/", "without charts": base + "/ui/?charts=off"}
    times: dict[str, list[float]] = {name: [] for name in pages}
    async with aiohttp.ClientSession() as session:
        for url in pages.values():  # warm-up: templates, statements, caches
            for _ in range(3):
                await timed(session, url)
        for _ in range(rounds):
            for name, url in pages.items():
                times[name].append(await timed(session, url))
    return times


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def settings_for(database_url: str) -> Settings:
    return Settings(
        database={"url": database_url},
        server={"callback_url": "https://shop.example.com/api/v1/upstream/callback"},
        upstreams=[{"name": "main", "base_url": "http://127.0.0.1:9", "api_key": "k", "api_secret": "s"}],
        logging={"level": "warning", "format": "json"},
    )


async def run(args: argparse.Namespace, database_url: str) -> bool:
    configure_logging("warning", "json")
    database = open_database(database_url)
    try:
        await migrate_schema(database)
        print(f"seeding {args.procurements:,} procurements over {args.days} days ({database.dialect})")
        for name, seconds in (await seed(database, args.procurements, args.days)).items():
            print(f"  {name:<24} {seconds:7.1f} s")
        rows = await database.read(lambda tx: tx.connection.execute(text(ROLLUP_ROWS)).scalar_one())
        print(f"  rollup rows              {rows:7,}")
    finally:
        await database.close()
    operations = Operations(Runtime.build(settings_for(database_url), instance="bench"))
    try:
        async with serve(make_admin_app(operations)) as base:
            times = await measure(base, args.rounds)
    finally:
        await operations.close()
    figures: dict[str, tuple[float, float]] = {
        name: (statistics.median(values), p90(values)) for name, values in times.items()
    }
    print(f"\nGET the overview, {args.rounds} times each, alternately (client side, the whole page)")
    for name, (median, ninety) in figures.items():
        print(f"  {name:<16} median {median:7.1f} ms   p90 {ninety:7.1f} ms")
    with_charts, without = figures["with charts"][0], figures["without charts"][0]
    ratio = with_charts / without
    print(f"  with / without   {ratio:.2f}")
    checks: dict[str, Callable[[], bool]] = {
        f"the page with charts at or below {PAGE_AIM_MS:g} ms (median)": lambda: with_charts <= PAGE_AIM_MS,
        f"at or below {RATIO_AIM:g} x the page without charts": lambda: ratio <= RATIO_AIM,
    }
    passed = True
    for name, check in checks.items():
        ok = check()
        passed &= ok
        print(f"{'PASS' if ok else 'MISS'}  {name}")
    return passed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--procurements", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--rounds", type=int, default=20, help="requests of each page (default 20)")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        url = args.database_url or f"sqlite+aiosqlite:///{Path(directory) / 'overview.db'}"
        passed = asyncio.run(run(args, url))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
