"""Cluster benchmark on PostgreSQL: the shared request budget, several instances against the real limit, and
how fast a killed instance's claims are taken over.

1. Budget designs, in this process: 1, 2 and 3 instances (a shared rate limiter each, with a connection pool
   of its own) on one budget of ``--fast-rate`` requests a second for ``--seconds`` each; every instance runs
   4 order submitters, the first also 4 catalogue fetchers (each "request" takes 20 ms once granted). Two
   designs: procurd's (order submissions reserve the next slot, everything else takes a free slot when no
   instance waits with a better priority) and every request waiting for a free slot (``reserve_below=0``: a
   shared token bucket that waiters poll when the next token is due). Figures: requests granted per second
   against the budget, database round trips per request, refused attempts per request, an order's wait p50
   and p99, catalogue requests granted while an order waited; and one attempt's time in autocommit (what
   procurd does) against the same statement in a transaction of its own.
2. The real limit: the sandbox in a child process enforces 60 requests per 60 s per key and blocks the key
   for 30 s on the 61st (answered HTTP 200 with ``status_code`` 429); 1, 2 and 3 ``procurd run`` instances at
   ``max_requests_per_second = 1`` take a burst of ``--orders`` orders while the start-up catalogue pass
   runs. Figures: delivered orders per minute against the budget (60), rate-limited answers, most requests
   in any 60 s window, catalogue requests while orders were queued, and database round trips per upstream
   request (the instances' ``procurd_database_transactions_total{kind="autocommit"}``: one round trip each).
3. SIGKILL of one of three instances holding claimed submissions, with the default heartbeat (5 s) and claim
   lease (60 s): seconds from the kill until another instance took the claims.

    python benchmarks/cluster.py --database-url postgresql+asyncpg://user@127.0.0.1:5432/postgres

``--database-url`` names a database on a server where the user may create databases: each run creates one of
its own and drops it afterwards. Prints measured figures; nothing passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import aiohttp
from sqlalchemy import func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from procurement_processes import API_KEY, API_SECRET, HEADER_PREFIX, SandboxProcess, percentile

from fault_support import IntakeClient, most_in_any_window, single_item
from procurd.db.database import open_database
from procurd.db.rate_budget import RESERVE_BELOW, budget_key
from procurd.db.schema import audit_log, procurements
from procurd.logs import configure_logging
from procurd.operations.budgets import SharedBudget
from procurd.operations.installation import migrate_schema
from procurd.sandbox.config import SandboxConfig
from procurd.sandbox.testing import ControlClient
from procurd.upstream.ratelimit import Priority, SharedRateLimiter
from scale_cluster import DaemonProcess, cluster, instance_config, metric_value, settings_of
from support import mirror, sql_rows

REAL_WINDOW_REQUESTS = 60
REAL_WINDOW_SECONDS = 60.0
REAL_BLOCK_SECONDS = 30.0
REAL_BUDGET = 1.0  # max_requests_per_second: the site's 60 a minute
SIMULATED_REQUEST_SECONDS = 0.02
ORDER_SUBMITTERS = 4
CATALOGUE_FETCHERS = 4
SAMPLE_ATTEMPTS = 300
CATALOGUE_PRODUCTS = 1000  # 20 pages: the start-up pass is still under way when the orders come
PRODUCTION_PROCUREMENT = {  # the defaults, but for retries a little quicker than a person would wait
    "workers": 8,
    "lease_seconds": 60,
    "max_attempts": 20,
    "retry_base_seconds": 1,
    "retry_max_seconds": 30,
    "poll_initial_seconds": 30,
    "poll_max_seconds": 900,
}


# --- databases ----------------------------------------------------------------------------------------------


@asynccontextmanager
async def fresh_database(server_url: str) -> AsyncIterator[str]:
    """A new, migrated database on the server of ``server_url``; dropped afterwards."""
    name = f"procurd_cluster_bench_{uuid.uuid4().hex[:10]}"
    admin = create_async_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as connection:
            await connection.execute(text(f"CREATE DATABASE {name}"))
        url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
        database = open_database(url)
        try:
            await migrate_schema(database)
        finally:
            await database.close()
        yield url
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        await admin.dispose()


# --- part 1: budget designs ---------------------------------------------------------------------------------


class CountingBudget(SharedBudget):
    """The shared budget, counting refused attempts."""

    refused = 0

    async def take(self, priority: int, then: int | None, count: int = 1) -> tuple[int, float]:
        granted, seconds = await super().take(priority, then, count)
        if not granted:
            CountingBudget.refused += 1
        return granted, seconds


@dataclass
class DesignRun:
    order_waits: list[float] = field(default_factory=list)
    granted: dict[str, int] = field(default_factory=lambda: {"order": 0, "catalogue": 0})
    pages_while_orders_waited: int = 0
    orders_waiting: int = 0


async def run_design(
    url: str, instances: int, rate: float, seconds: float, reserve_below: int
) -> dict[str, Any]:
    key = budget_key(f"http://bench/{uuid.uuid4().hex}", API_KEY)
    databases = [open_database(url) for _ in range(instances)]
    limiters = [
        SharedRateLimiter(
            CountingBudget(database, key, "bench", f"bench:{n}", rate, reserve_below=reserve_below), rate
        )
        for n, database in enumerate(databases)
    ]
    run = DesignRun()
    CountingBudget.refused = 0
    deadline = time.monotonic() + seconds

    async def submitter(limiter: SharedRateLimiter) -> None:
        while time.monotonic() < deadline:
            asked = time.monotonic()
            run.orders_waiting += 1
            try:
                await limiter.acquire(Priority.ORDER)
            finally:
                run.orders_waiting -= 1
            run.order_waits.append(time.monotonic() - asked)
            run.granted["order"] += 1
            await asyncio.sleep(SIMULATED_REQUEST_SECONDS)  # the request itself, then its answer recorded

    async def fetcher(limiter: SharedRateLimiter) -> None:
        while time.monotonic() < deadline:
            await limiter.acquire(Priority.CATALOG)
            run.granted["catalogue"] += 1
            run.pages_while_orders_waited += run.orders_waiting > 0
            await asyncio.sleep(SIMULATED_REQUEST_SECONDS)

    started = time.monotonic()
    try:
        tasks = [submitter(limiter) for limiter in limiters for _ in range(ORDER_SUBMITTERS)]
        tasks += [fetcher(limiters[0]) for _ in range(CATALOGUE_FETCHERS)]
        await asyncio.gather(*tasks)
    finally:
        elapsed = time.monotonic() - started
        for limiter in limiters:
            await limiter.close()
        round_trips = sum(database.counts.autocommits for database in databases)
        for database in databases:
            await database.close()
    granted = sum(run.granted.values())
    return {
        "granted_per_second": round(granted / elapsed, 2),
        "of_budget": round(granted / elapsed / rate, 3),
        "round_trips_per_request": round(round_trips / granted, 2),
        "refused_per_request": round(CountingBudget.refused / granted, 2),
        "order_wait_p50_ms": round(percentile(run.order_waits, 0.5) * 1000, 1),
        "order_wait_p99_ms": round(percentile(run.order_waits, 0.99) * 1000, 1),
        "orders": run.granted["order"],
        "pages": run.granted["catalogue"],
        "pages_while_orders_waited": run.pages_while_orders_waited,
    }


async def attempt_times(url: str) -> dict[str, float]:
    """One attempt's statement on a kept autocommit connection against the same in a transaction."""
    database = open_database(url)
    key = budget_key("http://bench/attempts", API_KEY)
    args = (key, "bench:0", int(Priority.ORDER), None, 1e-6, 1.0)
    try:
        await database.write(lambda tx: tx.rate_budget.ensure(key, "bench"))
        figures = {}
        for name, run in (("autocommit", database.autocommit), ("transaction", database.write)):
            samples = []
            for _ in range(SAMPLE_ATTEMPTS):
                started = time.perf_counter()
                await run(lambda tx: tx.rate_budget.take(*args))
                samples.append(time.perf_counter() - started)
            figures[f"{name}_p50_ms"] = round(percentile(samples, 0.5) * 1000, 2)
            figures[f"{name}_p99_ms"] = round(percentile(samples, 0.99) * 1000, 2)
        return figures
    finally:
        await database.close()


async def budget_designs(server_url: str, rate: float, seconds: float) -> None:
    print(f"\n1. budget designs: {rate:g} requests/s for {seconds:g} s each, 4 order submitters per instance")
    async with fresh_database(server_url) as url:
        print("   one attempt:", json.dumps(await attempt_times(url)))
        for design, reserve_below in (
            ("procurd (orders reserve)", RESERVE_BELOW),
            ("every request polls", 0),
        ):
            for instances in (1, 2, 3):
                figures = await run_design(url, instances, rate, seconds, reserve_below)
                print(f"   {design}, {instances} instance(s):", json.dumps(figures))


# --- part 2: the real limit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteSandbox:
    """What an instance's configuration needs of a sandbox running in another process."""

    base_url: str
    config: SandboxConfig


def sandbox_process(**options: Any) -> tuple[SandboxProcess, RemoteSandbox]:
    process = SandboxProcess(multiprocessing.get_context("spawn"), **options)
    base_url = process.start()
    config = SandboxConfig(api_key=API_KEY, api_secret=API_SECRET, header_prefix=HEADER_PREFIX)
    return process, RemoteSandbox(base_url, config)


async def request_log(base_url: str) -> list[dict[str, Any]]:
    async with ControlClient(base_url, timeout=60) as control:
        return list((await control.get("/requests"))["requests"])


def unthrottled(config: dict[str, Any]) -> Any:
    """The settings of ``config`` with every upstream's budget lifted."""
    upstreams = [{**upstream, "max_requests_per_second": 100} for upstream in config["upstreams"]]
    return settings_of({**config, "upstreams": upstreams})


async def delivered(url: str, prefix: str) -> int:
    rows = await sql_rows(
        url,
        select(func.count())
        .select_from(procurements)
        .where(procurements.c.state == "delivered", procurements.c.order_no.startswith(prefix)),
    )
    return int(rows[0][0])


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], seconds: float, what: str, interval: float = 0.5
) -> None:
    deadline = time.monotonic() + seconds
    while not await predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {seconds:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


async def autocommits(daemons: list[DaemonProcess], session: aiohttp.ClientSession) -> float:
    texts = [await daemon.metrics(session) for daemon in daemons]
    return sum(metric_value(body, "procurd_database_transactions_total", kind="autocommit") for body in texts)


async def submit(daemons: list[DaemonProcess], skus: list[int], numbers: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        client = IntakeClient(session, [daemon.admin_url for daemon in daemons])
        gate = asyncio.Semaphore(16)

        async def one(index: int) -> None:
            async with gate:
                await client.submit(numbers[index], single_item(skus[index % len(skus)]), first=index)

        await asyncio.gather(*(one(index) for index in range(len(numbers))))


async def real_limit_run(server_url: str, instances: int, orders: int, directory: Path) -> dict[str, Any]:
    process, sandbox = sandbox_process(
        products=CATALOGUE_PRODUCTS,
        manual_ratio=0.0,
        rate_limit_requests=REAL_WINDOW_REQUESTS,
        rate_limit_window_seconds=REAL_WINDOW_SECONDS,
        rate_limit_block_seconds=REAL_BLOCK_SECONDS,
        callback_retry_delays=(1.0, 2.0, 4.0, 8.0),
    )
    try:
        async with fresh_database(server_url) as url:
            configs = {
                f"i{n}": instance_config(
                    url,
                    sandbox,
                    upstream={"max_requests_per_second": REAL_BUDGET, "ping_interval_seconds": 300},
                    procurement=PRODUCTION_PROCUREMENT,
                    catalog={"sync_interval_seconds": 600},
                    server={"heartbeat_seconds": 5},
                )
                for n in range(instances)
            }
            await mirror(unthrottled(configs["i0"]))  # the sandbox's limit is still off
            skus = (await process.ask("skus"))[:40]
            await process.ask("rate_limit", True)
            async with ControlClient(sandbox.base_url) as control:
                await control.post("/requests/reset")
            run_directory = directory / f"real-{instances}"
            run_directory.mkdir()
            async with cluster(run_directory, configs) as daemons:

                async def catalogue_under_way() -> bool:
                    requests = (await process.ask("counts"))["requests"]
                    return bool(requests.get("categories", 0) + requests.get("products", 0) >= 2)

                await wait_for(catalogue_under_way, 60, "the start-up catalogue pass")
                async with aiohttp.ClientSession() as session:
                    before = await autocommits(daemons, session)
                    started = time.monotonic()
                    prefix = f"R{instances}-"
                    await submit(daemons, skus, [f"{prefix}{n:04d}" for n in range(orders)])

                    async def all_delivered() -> bool:
                        return await delivered(url, prefix) == orders

                    await wait_for(all_delivered, orders / REAL_BUDGET * 3 + 120, "every order delivered")
                    seconds = time.monotonic() - started
                    after = await autocommits(daemons, session)
                requests = await request_log(sandbox.base_url)
    finally:
        process.stop()
    creates = [r["at"] for r in requests if r["endpoint"] == "orders.create"]
    pages = [r["at"] for r in requests if r["endpoint"] in ("products", "categories")]
    in_burst = [r for r in requests if creates[0] <= r["at"] <= creates[-1]]
    per_minute = (len(creates) - 1) / (creates[-1] - creates[0]) * 60
    return {
        "instances": instances,
        "orders": orders,
        "upstream_orders_per_minute": round(per_minute, 2),
        "budget_per_minute": REAL_BUDGET * 60,
        "of_budget": round(per_minute / (REAL_BUDGET * 60), 4),
        "delivered_per_minute_end_to_end": round(orders / seconds * 60, 2),
        "requests": len(requests),
        "rate_limited": sum(r["rate_limited"] for r in requests),
        "most_in_any_60s": most_in_any_window(sorted(r["at"] for r in requests), REAL_WINDOW_SECONDS),
        "pages_while_orders_queued": sum(1 for at in pages if creates[0] < at < creates[-1]),
        "requests_per_minute_in_burst": round((len(in_burst) - 1) / (creates[-1] - creates[0]) * 60, 2),
        "db_round_trips_per_request": round((after - before) / max(1, len(in_burst)), 2),
    }


async def real_limit(server_url: str, orders: int, directory: Path) -> None:
    print(f"\n2. the real limit (60 per 60 s, 30 s block), max_requests_per_second = 1, {orders} orders")
    for instances in (1, 2, 3):
        print("  ", json.dumps(await real_limit_run(server_url, instances, orders, directory)))


# --- part 3: SIGKILL with the default heartbeat -----------------------------------------------------------


async def takeover(server_url: str, orders: int, directory: Path) -> None:
    print(f"\n3. SIGKILL of one of three instances mid-batch, default heartbeat (5 s), {orders} orders")
    process, sandbox = sandbox_process(products=40, manual_ratio=0.0, callback_retry_delays=(1.0, 2.0, 4.0))
    try:
        async with fresh_database(server_url) as url:
            configs = {
                name: instance_config(
                    url,
                    sandbox,
                    upstream={"max_requests_per_second": 100},
                    procurement=PRODUCTION_PROCUREMENT,
                )
                for name in ("a", "b", "victim")
            }
            await mirror(settings_of(configs["a"]))
            skus = (await process.ask("skus"))[:40]
            async with ControlClient(sandbox.base_url) as control:
                fault = {
                    "knob": "delay_next",
                    "endpoint": "orders.create",
                    "count": 10 * orders,
                    "seconds": 1,
                }
                await control.post("/faults", fault)
            (directory / "takeover").mkdir()
            async with cluster(directory / "takeover", configs) as daemons:
                victim = daemons[2]
                victim_id = f"{socket.gethostname()}:{victim.pid}"
                numbers = [f"K-{n:04d}" for n in range(orders)]
                burst = asyncio.create_task(submit(daemons, skus, numbers))
                claimed: list[int] = []

                async def victim_claims() -> bool:
                    rows = await sql_rows(
                        url,
                        select(procurements.c.id).where(
                            procurements.c.state == "queued",
                            procurements.c.lease_owner.startswith(victim_id + "/"),
                        ),
                    )
                    claimed[:] = [row.id for row in rows]
                    return bool(claimed)

                await wait_for(victim_claims, 60, "the victim to claim submissions")
                await victim.kill()
                killed_at = time.monotonic()

                async def taken_over() -> bool:
                    rows = await sql_rows(
                        url, select(audit_log.c.procurement_id).where(audit_log.c.event == "claim_abandoned")
                    )
                    return {row.procurement_id for row in rows} >= set(claimed)

                await wait_for(taken_over, 60, "the victim's claims taken over", interval=0.02)
                taken_seconds = time.monotonic() - killed_at
                await burst

                async def all_delivered() -> bool:
                    return await delivered(url, "K-") == orders

                await wait_for(all_delivered, 180, "every order delivered")
            counts = await process.ask("counts")
    finally:
        process.stop()
    print(
        "  ",
        json.dumps(
            {
                "claims_held_at_kill": len(claimed),
                "takeover_seconds": round(taken_seconds, 2),
                "three_heartbeats_seconds": 15,
                "upstream_orders": counts["orders"],
                "orders": orders,
            }
        ),
    )


# --- main -------------------------------------------------------------------------------------------------


async def main(options: argparse.Namespace) -> None:
    configure_logging("warning", "json")
    print(
        f"cluster benchmark on {make_url(options.database_url).render_as_string(hide_password=True)}, "
        f"{multiprocessing.cpu_count()} cores"
    )
    with TemporaryDirectory(prefix="procurd-cluster-bench.") as directory:
        if "designs" in options.parts:
            await budget_designs(options.database_url, options.fast_rate, options.seconds)
        if "real" in options.parts:
            await real_limit(options.database_url, options.orders, Path(directory))
        if "takeover" in options.parts:
            await takeover(options.database_url, 200, Path(directory))


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database-url", required=True, help="postgresql+asyncpg://user@host:port/database")
    parser.add_argument("--orders", type=int, default=150, help="orders per run against the real limit")
    parser.add_argument("--fast-rate", type=float, default=20.0, help="the budget of part 1 (requests/s)")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long each run of part 1 lasts")
    parser.add_argument(
        "--parts", nargs="+", choices=("designs", "real", "takeover"), default=["designs", "real", "takeover"]
    )
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse_arguments()))
