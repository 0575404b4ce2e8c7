"""Benchmark of ``procurd catalog sync`` against the sandbox upstream.

The sandbox (10,000 products x 3 SKUs by default, rate limit off) runs in a child process so it does not
share this process's event loop or CPU. In this process, in order: one untimed warm-up fetch, a timed
fetch-only pass (every page fetched and parsed by the same client with the same concurrency, nothing
stored), the first sync into an empty database, an immediate second sync, and a second fetch-only pass.
Prints the figures and checks them against the targets; exits 1 when a target is missed.

    python benchmarks/catalog_sync.py [--products 10000] [--database-url postgresql+asyncpg://...]
                                      [--upstream-latency-ms 0]

Peak RSS is ``ru_maxrss`` of this process only: the sandbox and the schema migration (what
``procurd db upgrade`` does before the daemon starts) run in child processes and are not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import multiprocessing.connection
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
TARGET_RATIO = 1.2
TARGET_SECOND_FRACTION = 1 / 3
TARGET_RSS_MB = 100.0

T = TypeVar("T")


def _serve_sandbox(
    products: int,
    skus_per_product: int,
    latency_seconds: float,
    ready: multiprocessing.connection.Connection,
    stop: Any,
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
    from procurd.db.engine import create_engine

    from procurd.db import migrate

    async def upgrade() -> None:
        engine = create_engine(database_url)
        try:
            await migrate.upgrade(engine)
        finally:
            await engine.dispose()

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
    first_rows: int
    second_rows: int
    products: int
    skus: int
    pages: int
    peak_rss_mb: float


async def fetch_only(client: Any, page_size: int, concurrency: int) -> int:
    """Fetch and parse every page exactly as a sync does, storing nothing; returns the products seen."""
    from procurd.upstream.ratelimit import Priority

    await client.categories(priority=Priority.CATALOG)
    first = await client.products(1, page_size, priority=Priority.CATALOG)
    answered = first.page_size
    numbers = iter(range(2, max(1, math.ceil(first.total / answered)) + 1))
    seen = [len(first.items)]

    async def worker() -> None:
        for number in numbers:
            page = await client.products(number, answered, priority=Priority.CATALOG)
            seen.append(len(page.items))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sum(seen)


async def measure(base_url: str, database_url: str, page_size: int, concurrency: int) -> Figures:
    from procurd.db.engine import create_engine

    from procurd.catalog.sync import run_sync
    from procurd.config import UpstreamSettings
    from procurd.logs import configure_logging
    from procurd.upstream import UpstreamClient

    configure_logging("warning")
    settings = UpstreamSettings(
        name=UPSTREAM,
        base_url=base_url,
        api_key=API_KEY,
        api_secret=API_SECRET,
        max_requests_per_second=1_000_000,
        timeout_seconds=60,
    )
    engine = create_engine(database_url)
    try:
        async with UpstreamClient(settings) as client:
            await fetch_only(client, page_size, concurrency)  # warm-up: connections, sandbox caches

            _, fetch = await timed(fetch_only(client, page_size, concurrency))
            first, sync = await timed(
                run_sync(engine, client, UPSTREAM, page_size=page_size, concurrency=concurrency)
            )
            second, second_sync = await timed(
                run_sync(engine, client, UPSTREAM, page_size=page_size, concurrency=concurrency)
            )
            _, fetch_again = await timed(fetch_only(client, page_size, concurrency))
    finally:
        await engine.dispose()
    for report in (first, second):
        if report.status != "ok":
            raise SystemExit(f"sync {report.run_id} {report.status}: {report.error}")
    return Figures(
        fetch=[fetch, fetch_again],
        sync=sync,
        second_sync=second_sync,
        first_rows=first.rows_written,
        second_rows=second.rows_written,
        products=first.products,
        skus=first.skus,
        pages=first.pages,
        peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )


def report(figures: Figures) -> bool:
    fetch = min(figures.fetch, key=lambda phase: phase.seconds)
    ratio = figures.sync.seconds / fetch.seconds
    fraction = figures.second_sync.seconds / figures.sync.seconds
    runs = ", ".join(f"{phase.seconds:.3f}" for phase in figures.fetch)
    print(f"catalogue           {figures.products} products, {figures.skus} SKUs, {figures.pages} pages")
    print(f"fetch-only seconds  {fetch.seconds:.3f}  (CPU {fetch.cpu_seconds:.3f}; runs: {runs})")
    print(
        f"sync seconds        {figures.sync.seconds:.3f}  (CPU {figures.sync.cpu_seconds:.3f}; "
        f"rows written {figures.first_rows})"
    )
    print(f"sync / fetch-only   {ratio:.2f}  (target <= {TARGET_RATIO})")
    print(
        f"second sync seconds {figures.second_sync.seconds:.3f}  (CPU {figures.second_sync.cpu_seconds:.3f}; "
        f"{fraction:.2f} of the first)"
    )
    print(f"second sync rows    {figures.second_rows}  (target 0)")
    print(f"peak RSS MB         {figures.peak_rss_mb:.1f}  (target < {TARGET_RSS_MB:.0f})")
    checks = {
        "sync <= 1.2 x fetch-only": ratio <= TARGET_RATIO,
        "second sync writes 0 rows": figures.second_rows == 0,
        "second sync < 1/3 of the first": fraction < TARGET_SECOND_FRACTION,
        "peak RSS < 100 MB": figures.peak_rss_mb < TARGET_RSS_MB,
    }
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'MISS'}  {name}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--skus-per-product", type=int, default=3)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument(
        "--upstream-latency-ms",
        type=float,
        default=0.0,
        help="delay the sandbox adds to every product page, like a remote site (default 0: loopback speed)",
    )
    args = parser.parse_args(argv)

    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    stop = context.Event()
    child = context.Process(
        target=_serve_sandbox,
        args=(args.products, args.skus_per_product, args.upstream_latency_ms / 1000, sender, stop),
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
            figures = asyncio.run(measure(base_url, database_url, args.page_size, args.concurrency))
    finally:
        stop.set()
        child.join(30)
        if child.is_alive():
            child.terminate()
            child.join()
    return 0 if report(figures) else 1


if __name__ == "__main__":
    sys.exit(main())
