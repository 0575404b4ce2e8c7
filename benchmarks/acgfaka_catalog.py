"""Benchmark of a catalogue pass of an acg-faka supplier beside one of a Dujiao-Next site, in the same run.

Both sandboxes run in one child process (so they do not share this process's event loop): an acg-faka shop
generating ``--commodities`` commodities (1,000 by default; its eight kinds in turn, so three in four are
listed for docking, with variants and add-ons) and a Dujiao-Next site of as many products (3 SKUs each),
rate limits off. In this process, for each upstream in turn, into its own empty database: the first pass,
an unchanged second pass by the same upstream object (what the daemon does between its passes: the acg-faka
source hands on what it built, the Dujiao-Next pass its remembered pages), and an unchanged pass by a new
upstream object (a new process: ``procurd catalog sync``, or the daemon after a restart). Each pass is
timed (wall clock and CPU of this process) with the requests it sent, by endpoint, and the rows it wrote.
The acg-faka passes run with a request bound large enough to read every commodity at once
(``--requests-per-pass``); the one a daemon uses by default (500) is what the printed request counts are
measured against. Prints measured figures; it does not pass or fail.

    python benchmarks/acgfaka_catalog.py [--commodities 1000] [--database-url postgresql+asyncpg://...]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

API_KEY = "bench-key"
API_SECRET = "bench-secret-0123456789"
DEFAULT_BOUND = 500


def _serve(commodities: int, ready: multiprocessing.connection.Connection, stop: Any) -> None:
    """Child process: both sandboxes until ``stop`` is set; their base URLs through ``ready``."""
    from procurd.logs import configure_logging
    from procurd.sandbox import Sandbox, SandboxConfig
    from procurd.sandbox.acgfaka import AcgFakaSandbox, ShopConfig

    configure_logging("warning")

    async def serve() -> None:
        site = SandboxConfig(
            api_key=API_KEY, api_secret=API_SECRET, products=commodities, skus_per_product=3, seed=7,
            rate_limit=False,
        )  # fmt: skip
        async with (
            Sandbox(site) as dujiao,
            AcgFakaSandbox(ShopConfig(commodities=commodities, seed=7)) as shop,
        ):
            ready.send((dujiao.base_url, shop.base_url))
            await asyncio.get_running_loop().run_in_executor(None, stop.wait)

    asyncio.run(serve())


def _migrate(database_url: str) -> None:
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
class Pass:
    label: str
    seconds: float
    cpu_seconds: float
    status: str
    products: int
    skus: int
    rows_written: int
    requests: Counter[str] = field(default_factory=Counter)
    priced: int = 0  # acg-faka: the price and stock requests (what catalog_requests_per_pass bounds)


async def passes(protocol: str, base_url: str, database_url: str, bound: int) -> list[Pass]:
    """The three passes of one upstream (see the module)."""
    from procurd.catalog.pages import PageMemory
    from procurd.catalog.sync import SyncOptions
    from procurd.config import UpstreamSettings
    from procurd.db.database import open_database
    from procurd.logs import configure_logging
    from procurd.operations.catalog_pass import run_sync
    from procurd.operations.choices import DatabaseChoices
    from procurd.operations.trades import DatabaseTrades
    from procurd.protocol.acgfaka.upstream import AcgFakaUpstream
    from procurd.protocol.dujiao.client import UpstreamClient
    from procurd.sandbox.acgfaka import DEFAULT_APP_ID, DEFAULT_APP_KEY
    from procurd.upstream.interface import Upstream

    configure_logging("warning")
    requests: Counter[str] = Counter()

    def observe(upstream: str, endpoint: str, outcome: str, seconds: float, error: object) -> None:
        requests[endpoint] += 1

    database = open_database(database_url)
    common: dict[str, Any] = {"name": protocol, "base_url": base_url, "max_requests_per_second": 1_000_000}

    def upstream() -> Upstream:
        if protocol == "acg-faka":
            settings = UpstreamSettings(
                **common, protocol="acg-faka", app_id=str(DEFAULT_APP_ID), app_key=DEFAULT_APP_KEY,
                catalog_requests_per_pass=bound,
            )  # fmt: skip
            choices, trades = DatabaseChoices(database), DatabaseTrades(database, "benchmark")
            return AcgFakaUpstream(settings, choices=choices, trades=trades, observer=observe)
        settings = UpstreamSettings(**common, api_key=API_KEY, api_secret=API_SECRET)
        return UpstreamClient(settings, observer=observe)

    options = SyncOptions(page_size=50, concurrency=4)
    measured: list[Pass] = []

    async def one(label: str, client: Upstream, pages: PageMemory) -> None:
        requests.clear()
        started, cpu = time.perf_counter(), time.process_time()
        report = await run_sync(database, client, protocol, options=options, pages=pages)
        measured.append(
            Pass(
                label,
                time.perf_counter() - started,
                time.process_time() - cpu,
                report.status,
                report.products,
                report.skus,
                report.rows_written,
                Counter(requests),
            )
        )
        if isinstance(client, AcgFakaUpstream) and client.catalogue.last_listing is not None:
            measured[-1].priced = client.catalogue.last_listing.requests

    try:
        first = upstream()
        pages = PageMemory()
        await one("first pass", first, pages)
        await one("unchanged, same process", first, pages)
        await first.close()
        fresh = upstream()
        await one("unchanged, new process", fresh, PageMemory())
        await fresh.close()
    finally:
        await database.close()
    return measured


def show(protocol: str, measured: list[Pass]) -> None:
    print(f"{protocol}:")
    for found in measured:
        asked = ", ".join(f"{endpoint} {count}" for endpoint, count in sorted(found.requests.items()))
        print(
            f"  {found.label:<24} {found.seconds:6.3f} s  CPU {found.cpu_seconds:6.3f} s  {found.status}  "
            f"{found.products} products, {found.skus} SKUs, {found.rows_written} rows written; "
            f"{sum(found.requests.values())} requests ({asked})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commodities", type=int, default=1000)
    parser.add_argument("--requests-per-pass", type=int, default=1_000_000)
    parser.add_argument("--database-url", default=None, help="PostgreSQL server URL (default: SQLite files)")
    args = parser.parse_args(argv)

    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    stop = context.Event()
    child = context.Process(target=_serve, args=(args.commodities, sender, stop), daemon=True)
    child.start()
    results: dict[str, list[Pass]] = {}
    try:
        if not receiver.poll(120):
            raise SystemExit("the sandboxes did not start within 120 s")
        dujiao_url, shop_url = receiver.recv()
        with tempfile.TemporaryDirectory() as directory:
            for protocol, base_url in (("dujiao", dujiao_url), ("acg-faka", shop_url)):
                if args.database_url:
                    database_url = _fresh_postgres(args.database_url, protocol)
                else:
                    database_url = f"sqlite+aiosqlite:///{Path(directory) / f'{protocol}.db'}"
                migration = context.Process(target=_migrate, args=(database_url,))
                migration.start()
                migration.join()
                if migration.exitcode != 0:
                    raise SystemExit("the schema migration failed")
                results[protocol] = asyncio.run(
                    passes(protocol, base_url, database_url, args.requests_per_pass)
                )
    finally:
        stop.set()
        child.join(30)
        if child.is_alive():
            child.terminate()
            child.join()
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"database {'PostgreSQL' if args.database_url else 'SQLite'}; load average {load} (at the end)")
    for protocol, measured in results.items():
        show(protocol, measured)
    priced = results["acg-faka"][0].priced
    print(
        f"acg-faka's first pass asked {priced} prices and stocks: at the default bound of {DEFAULT_BOUND} a "
        f"pass, {-(-priced // DEFAULT_BOUND)} passes fill the mirror; at 1 request a second, {priced} s"
    )
    return 0


def _fresh_postgres(server_url: str, protocol: str) -> str:
    """A new database on the server for one upstream's passes (left behind for a look afterwards)."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url
    from sqlalchemy.ext.asyncio import create_async_engine

    name = f"procurd_bench_{protocol.replace('-', '_')}_{os.getpid()}"

    async def create() -> None:
        engine = create_async_engine(server_url, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as connection:
                await connection.execute(text(f"DROP DATABASE IF EXISTS {name}"))
                await connection.execute(text(f"CREATE DATABASE {name}"))
        finally:
            await engine.dispose()

    asyncio.run(create())
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


if __name__ == "__main__":
    sys.exit(main())
