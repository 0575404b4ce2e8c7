"""Benchmark of ``procurd catalog sync`` against the sandbox upstream.

The sandbox (10,000 products x 3 SKUs by default, rate limit off) runs in a child process so it does not
share this process's event loop. In this process, in order: one untimed warm-up fetch, a timed fetch-only
pass, the first sync into an empty database, an immediate (unchanged) second sync that remembers the first
one's pages (as the daemon does between its passes), the same again with nothing remembered (a first pass of
a new process, such as ``procurd catalog sync``), and a second fetch-only pass. The fetch-only baseline is
the same pages fetched and JSON-decoded by the same client with the same concurrency (what a sync does before
it compares anything), nothing stored; the ratios use the faster of its two runs. Prints measured figures,
ratios and the aims beside them; it does not pass or fail.

    python benchmarks/catalog_sync.py [--products 10000] [--database-url postgresql+asyncpg://...]
                                      [--upstream-latency-ms 0] [--with-pricing] [--dialect seed|2026]

Every page is asked with ``include_inactive=true``; ``--dialect 2026`` makes the sandbox serve it (and say
so in each answer), as Dujiao-Next does since 2026.

Peak RSS is ``ru_maxrss`` of this process only: the sandbox and the schema migration (what
``procurd db upgrade`` does before the daemon starts) run in child processes and are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

API_KEY = "bench-key"
API_SECRET = "bench-secret-0123456789"
UPSTREAM = "bench"
AIM_FIRST_RATIO = 1.5
AIM_SECOND_RATIO = 1.2
AIM_RSS_MB = 90.0

T = TypeVar("T")


def _serve_sandbox(
    products: int,
    skus_per_product: int,
    latency_seconds: float,
    ready: multiprocessing.connection.Connection,
    stop: Any,
    dialect: str = "seed",
) -> None:
    """Child process: run the sandbox until ``stop`` is set; send its base URL through ``ready``."""
    from procurd.logs import configure_logging
    from procurd.sandbox import Sandbox, SandboxConfig

    configure_logging("warning")

    async def serve() -> None:
        config = SandboxConfig(
            api_key=API_KEY,
            api_secret=API_SECRET,
            products=products,
            skus_per_product=skus_per_product,
            seed=7,
            rate_limit=False,
            dialect="2026" if dialect == "2026" else "seed",
        )
        async with Sandbox(config) as sandbox:
            if latency_seconds > 0:
                sandbox.faults.delay_next("products", count=1_000_000, seconds=latency_seconds)
            ready.send(sandbox.base_url)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, stop.wait)

    asyncio.run(serve())


def _migrate(database_url: str) -> None:
    """Child process: create the schema, as ``procurd db upgrade`` would before the daemon starts."""
    from procurd.db.database import open_database
    from procurd.operations.installation import migrate_schema

    async def upgrade() -> None:
        database = open_database(database_url)
        try:
            await migrate_schema(database)
        finally:
            await database.close()

    asyncio.run(upgrade())


@dataclass
class Phase:
    """Wall-clock and CPU seconds (all threads of this process) of one timed step."""

    seconds: float
    cpu_seconds: float


async def timed(step: Awaitable[T]) -> tuple[T, Phase]:
    started, cpu_started = time.perf_counter(), time.process_time()
    result = await step
    return result, Phase(time.perf_counter() - started, time.process_time() - cpu_started)


@dataclass
class Figures:
    fetch: list[Phase]
    sync: Phase
    second_sync: Phase
    cold_sync: Phase
    first_rows: int
    first_changes: int
    second_rows: int
    cold_rows: int
    products: int
    skus: int
    pages: int
    rss_before_mb: float
    peak_rss_mb: float
    priced: bool


async def fetch_only(client: Any, page_size: int, concurrency: int) -> int:
    """Fetch and decode every page as a sync does, storing nothing; returns the products seen."""
    from procurd.upstream.ratelimit import Priority

    await client.catalog_categories(priority=Priority.CATALOG)
    first = await client.catalog_page(1, page_size, priority=Priority.CATALOG)
    answered = first.page_size
    numbers = iter(range(2, max(1, math.ceil(first.total / answered)) + 1))
    seen = [len(first.items)]

    async def worker() -> None:
        for number in numbers:
            page = await client.catalog_page(number, answered, priority=Priority.CATALOG)
            seen.append(len(page.items))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sum(seen)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def measure(
    base_url: str, database_url: str, page_size: int, concurrency: int, with_pricing: bool
) -> Figures:
    from procurd.catalog.pages import PageMemory
    from procurd.catalog.sync import SyncOptions
    from procurd.config import PricingSettings, UpstreamSettings
    from procurd.db.database import open_database
    from procurd.db.schema import mirror_changes
    from procurd.logs import configure_logging
    from procurd.operations.catalog_pass import run_sync
    from procurd.protocol.dujiao.client import UpstreamClient

    configure_logging("warning")
    settings = UpstreamSettings(
        name=UPSTREAM,
        base_url=base_url,
        api_key=API_KEY,
        api_secret=API_SECRET,
        max_requests_per_second=1_000_000,
        timeout_seconds=60,
    )
    rules = [{"markup_percent": "20", "rounding": "x.99"}] if with_pricing else []
    options = SyncOptions(
        page_size=page_size,
        concurrency=concurrency,
        pricing=PricingSettings(hold_on_cost_increase_percent="10", rules=rules),
    )
    database = open_database(database_url)
    try:
        async with UpstreamClient(settings) as client:
            await fetch_only(client, page_size, concurrency)  # warm-up: connections, sandbox caches
            rss_before = _rss_mb()
            _, fetch = await timed(fetch_only(client, page_size, concurrency))
            pages = PageMemory()
            first, sync = await timed(run_sync(database, client, UPSTREAM, options=options, pages=pages))
            second, second_sync = await timed(
                run_sync(database, client, UPSTREAM, options=options, pages=pages)
            )
            cold, cold_sync = await timed(run_sync(database, client, UPSTREAM, options=options))
            _, fetch_again = await timed(fetch_only(client, page_size, concurrency))
        changes = await database.read(lambda tx: tx.connection.execute(mirror_changes.select()).all())
    finally:
        await database.close()
    for report in (first, second, cold):
        if report.status != "ok":
            raise SystemExit(f"sync {report.run_id} {report.status}: {report.error}")
    return Figures(
        fetch=[fetch, fetch_again],
        sync=sync,
        second_sync=second_sync,
        cold_sync=cold_sync,
        first_rows=first.rows_written,
        first_changes=len(changes),
        second_rows=second.rows_written,
        cold_rows=cold.rows_written,
        products=first.products,
        skus=first.skus,
        pages=first.pages,
        rss_before_mb=rss_before,
        peak_rss_mb=_rss_mb(),
        priced=with_pricing,
    )


def store_rows_alone(database_path: Path) -> Phase:
    """The floor of storing the mirror on SQLite: the rows the first sync wrote, read back as tuples and
    inserted with the driver alone (executemany, one transaction per table) into an empty copy of the
    schema, in this process. No digest, no record, no Python per row beyond the driver's."""
    import sqlite3

    tables = ("mirror_categories", "mirror_products", "mirror_skus")
    with contextlib.closing(sqlite3.connect(database_path)) as source:
        rows = {table: source.execute(f"SELECT * FROM {table}").fetchall() for table in tables}  # noqa: S608
        schema = [
            sql
            for (sql,) in source.execute(
                "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL AND tbl_name IN (?, ?, ?)", tables
            )
        ]
    target_path = database_path.with_name("floor.db")
    with contextlib.closing(sqlite3.connect(target_path, isolation_level=None)) as target:
        target.execute("PRAGMA journal_mode=WAL")
        target.execute("PRAGMA synchronous=NORMAL")
        for sql in schema:
            target.execute(sql)
        started, cpu_started = time.perf_counter(), time.process_time()
        for table, table_rows in rows.items():
            if not table_rows:
                continue
            marks = ", ".join("?" * len(table_rows[0]))
            target.execute("BEGIN IMMEDIATE")
            target.executemany(f"INSERT INTO {table} VALUES ({marks})", table_rows)  # noqa: S608
            target.execute("COMMIT")
        return Phase(time.perf_counter() - started, time.process_time() - cpu_started)


def report(figures: Figures, database: str, floor: Phase | None) -> None:
    fetch = min(figures.fetch, key=lambda phase: phase.seconds)
    rows = figures.products + figures.skus
    runs = ", ".join(f"{phase.seconds:.3f}" for phase in figures.fetch)

    def per_row(phase: Phase) -> str:
        return f"{phase.cpu_seconds / rows * 1e6:.0f} us CPU/row"

    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"database            {database}{' (with a pricing rule)' if figures.priced else ''}")
    print(f"load average        {load} (at the end)")
    print(f"catalogue           {figures.products} products, {figures.skus} SKUs, {figures.pages} pages")
    print(
        f"fetch-only          {fetch.seconds:.3f} s  (CPU {fetch.cpu_seconds:.3f} s, {per_row(fetch)}; "
        f"runs {runs})  baseline"
    )
    print(
        f"first sync          {figures.sync.seconds:.3f} s  (CPU {figures.sync.cpu_seconds:.3f} s, "
        f"{per_row(figures.sync)}; {figures.first_rows} rows, {figures.first_changes} change rows)"
    )
    print(
        f"  / fetch-only      {figures.sync.seconds / fetch.seconds:.2f}  (aim <= {AIM_FIRST_RATIO}; "
        f"extra CPU {(figures.sync.cpu_seconds - fetch.cpu_seconds) / rows * 1e6:.0f} us/row)"
    )
    if floor is not None:
        print(
            f"  storing alone     {floor.seconds:.3f} s  (CPU {floor.cpu_seconds:.3f} s; the same rows "
            "inserted "
            f"by the driver alone: {floor.seconds / fetch.seconds:.2f} x fetch-only)"
        )
    for label, second, written in (
        ("unchanged re-sync ", figures.second_sync, figures.second_rows),
        ("  nothing remembered", figures.cold_sync, figures.cold_rows),
    ):
        print(
            f"{label:<20}{second.seconds:.3f} s  (CPU {second.cpu_seconds:.3f} s, "
            f"{per_row(second)}; {written} rows written, aim 0)"
        )
        print(f"  / fetch-only      {second.seconds / fetch.seconds:.2f}  (aim <= {AIM_SECOND_RATIO})")
    print(
        f"peak RSS            {figures.peak_rss_mb:.1f} MB  (aim <= {AIM_RSS_MB:.0f}; "
        f"{figures.rss_before_mb:.1f} MB after imports and the warm-up fetch)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--skus-per-product", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument("--with-pricing", action="store_true", help="price every SKU with one rule")
    parser.add_argument(
        "--upstream-latency-ms",
        type=float,
        default=0.0,
        help="delay the sandbox adds to every product page, like a remote site (default 0: loopback speed)",
    )
    parser.add_argument(
        "--dialect", choices=("seed", "2026"), default="seed", help="what the sandbox speaks (default seed)"
    )
    args = parser.parse_args(argv)

    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    stop = context.Event()
    child = context.Process(
        target=_serve_sandbox,
        args=(
            args.products,
            args.skus_per_product,
            args.upstream_latency_ms / 1000,
            sender,
            stop,
            args.dialect,
        ),
        daemon=True,
    )
    child.start()
    try:
        if not receiver.poll(120):
            raise SystemExit("the sandbox did not start within 120 s")
        base_url = receiver.recv()
        with tempfile.TemporaryDirectory() as directory:
            database_url = args.database_url or f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"
            migration = context.Process(target=_migrate, args=(database_url,))
            migration.start()
            migration.join()
            if migration.exitcode != 0:
                raise SystemExit("the schema migration failed")
            figures = asyncio.run(
                measure(base_url, database_url, args.page_size, args.concurrency, args.with_pricing)
            )
            floor = None if args.database_url else store_rows_alone(Path(directory) / "bench.db")
    finally:
        stop.set()
        child.join(30)
        if child.is_alive():
            child.terminate()
            child.join()
    report(figures, "PostgreSQL" if args.database_url else "SQLite", floor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
