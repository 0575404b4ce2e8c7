"""Benchmark of procurd's procurement engine: intake to delivery, the callback receiver, the priority limiter.

Two runs, each with its own sandbox upstream in a child process, and a procurd daemon (``Daemon``, both
listeners, workers, pollers) in this process:

1. Throughput. The storefront (a child process) POSTs ``--orders`` one-item orders to the admin API with
   ``--intake-concurrency`` requests in flight; the sandbox creates each order, delivers it at once and
   pushes the signed callback. Measured: orders per second from the first intake request to the last
   delivery, intake latency (the storefront's side), intake to upstream order creation (the sandbox notes
   each creation on its own clock), upstream requests per delivered order. Then a load generator (a child
   process) POSTs signed duplicate callbacks of the delivered orders at procurd's public listener, and the
   same requests at a bare aiohttp handler in another child process: verified callbacks per second next
   to the bare handler's requests per second.
2. Priority under the real sites' rate limit (60 requests a minute, then a 30 s block; procurd at
   ``max_requests_per_second = 1``). The catalogue is mirrored first with the limit off; with it on, the
   daemon's start-up catalogue sync re-reads every page while ``--limited-orders`` orders arrive, spaced
   out. Each order's wait from intake to upstream creation is compared with one request interval.

    python benchmarks/procurement.py [--orders 2000] [--database-url postgresql+asyncpg://...] [--quick]

Prints the parameters, the figures and PASS/MISS per target; exits 1 when a target is missed. With
``--database-url`` give an empty database (or one this benchmark used before): the schema is upgraded
first and every run uses order numbers of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import os
import secrets
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from procurement_processes import (
    API_KEY,
    API_SECRET,
    HEADER_PREFIX,
    STARTUP_DEADLINE_SECONDS,
    BareServer,
    SandboxProcess,
    callback_load,
    percentile,
    storefront_load,
)
from sqlalchemy import Executable, Row, func, select
from sqlalchemy.engine import make_url

from procurd.config import Settings, UpstreamSettings
from procurd.daemon import Daemon
from procurd.db.database import Database, open_database
from procurd.db.schema import procurements
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.operations.catalog_pass import last_sync, run_sync
from procurd.operations.installation import migrate_schema
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.systemd import Notifier
from procurd.upstream.ratelimit import Priority

UPSTREAM = "bench"
LIMITED_UPSTREAM = "bench-limited"
SETTLED_STATES = ("delivered", "exception", "canceled", "resolved")
TARGET_REQUESTS_PER_ORDER = 1.05
# Intake commit, worker claim and the HTTP round trip happen around the limiter's wait: allowed on top of
# the one request interval an order may wait for its token.
LOCAL_WORK_ALLOWANCE_SECONDS = 0.1


# --- small helpers ------------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


async def wait_for(
    predicate: Callable[[], Awaitable[bool]], deadline_seconds: float, what: str, interval: float = 0.2
) -> None:
    """Poll ``predicate`` until true; stop the benchmark when ``deadline_seconds`` pass first."""
    deadline = time.monotonic() + deadline_seconds
    while not await predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {deadline_seconds:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


def shown_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


# --- procurd ------------------------------------------------------------------------------------------------


def daemon_settings(
    database_url: str, upstream: str, base_url: str, requests_per_second: float, workers: int
) -> Settings:
    """procurd on loopback with the production defaults for polls and retries."""
    public_port, admin_port = unused_ports(2)
    return Settings(
        database={"url": database_url},
        server={
            "public_host": "127.0.0.1",
            "public_port": public_port,
            "admin_host": "127.0.0.1",
            "admin_port": admin_port,
            "callback_url": f"http://127.0.0.1:{public_port}{CALLBACK_PATH}",
            "allow_private_callback_url": True,
        },
        upstreams=[
            {
                "name": upstream,
                "base_url": base_url,
                "api_key": API_KEY,
                "api_secret": API_SECRET,
                "header_prefix": HEADER_PREFIX,
                "max_requests_per_second": requests_per_second,
                "ping_interval_seconds": 3600,
                # Every pass reads every page: run 2 needs the start-up pass's pages queued behind orders.
                "incremental_sync": "off",
            }
        ],
        catalog={"sync_interval_seconds": 3600, "page_size": 50, "concurrency": 4},
        procurement={"workers": workers, "poll_initial_seconds": 30, "poll_max_seconds": 900},
        logging={"level": "warning", "format": "json"},
    )


async def rows_of(database: Database, statement: Executable) -> list[Row[*tuple[Any, ...]]]:
    return await database.read(lambda tx: list(tx.connection.execute(statement).all()))


async def sync_finished(database: Database, upstream: str) -> bool:
    report = await last_sync(database, upstream)
    if report is not None and report.status not in ("ok", "running"):
        raise SystemExit(f"the catalogue sync of {upstream} ended {report.status}: {report.error}")
    return report is not None and report.status == "ok"


async def settled_count(database: Database, prefix: str) -> int:
    statement = select(func.count()).where(
        procurements.c.order_no.like(f"{prefix}%"), procurements.c.state.in_(SETTLED_STATES)
    )
    return int((await rows_of(database, statement))[0][0])


@dataclass(frozen=True)
class Procurement:
    order_no: str
    state: str
    upstream_order_id: int | None
    accepted: float  # Unix seconds of intake
    delivered: float | None


async def procurements_of_run(database: Database, prefix: str) -> list[Procurement]:
    statement = select(
        procurements.c.order_no,
        procurements.c.state,
        procurements.c.upstream_order_id,
        procurements.c.created_at,
        procurements.c.delivered_at,
    ).where(procurements.c.order_no.like(f"{prefix}%"))
    rows = await rows_of(database, statement)
    return [
        Procurement(
            row.order_no,
            row.state,
            row.upstream_order_id,
            row.created_at.timestamp(),
            row.delivered_at.timestamp() if row.delivered_at else None,
        )
        for row in rows
    ]


def creation_waits(rows: list[Procurement], created: dict[int, float]) -> dict[str, float]:
    """Seconds from intake to the upstream's creation of the order, per order number."""
    return {
        row.order_no: created[row.upstream_order_id] - row.accepted
        for row in rows
        if row.upstream_order_id in created
    }


# --- run 1: throughput --------------------------------------------------------------------------------------


@dataclass
class Throughput:
    orders: int
    delivered: int
    not_delivered: dict[str, int]
    upstream_orders: int
    intake_statuses: dict[int, int]
    intake_refusals: list[str]
    intake_seconds: float
    intake_latencies: list[float]
    end_to_end_seconds: float
    to_creation: list[float]
    submission_seconds: float
    to_delivery: list[float]
    requests: dict[str, int]
    sandbox_callbacks: dict[str, int]
    cpu_seconds: float
    statements: int
    write_transactions: int
    read_transactions: int
    bare: dict[str, Any]
    verified: dict[str, Any]
    still_delivered_after_duplicates: int


async def run_throughput(
    args: argparse.Namespace,
    context: multiprocessing.context.SpawnContext,
    pool: concurrent.futures.ProcessPoolExecutor,
    database: Database,
    database_url: str,
) -> Throughput:
    sandbox = SandboxProcess(context, products=args.products, rate_limit=False)
    base_url = sandbox.start()
    try:
        settings = daemon_settings(database_url, UPSTREAM, base_url, args.upstream_rps, args.workers)
        daemon = Daemon(settings, notifier=Notifier({}))
        await daemon.start()
        try:
            await wait_for(lambda: sync_finished(database, UPSTREAM), STARTUP_DEADLINE_SECONDS, "the mirror")
            return await _measure_throughput(args, context, pool, database, sandbox, daemon)
        finally:
            await daemon.shutdown()
    finally:
        sandbox.stop()


async def _measure_throughput(
    args: argparse.Namespace,
    context: multiprocessing.context.SpawnContext,
    pool: concurrent.futures.ProcessPoolExecutor,
    database: Database,
    sandbox: SandboxProcess,
    daemon: Daemon,
) -> Throughput:
    loop = asyncio.get_running_loop()
    prefix = f"T{secrets.token_hex(3)}-"
    skus: list[int] = await sandbox.ask("skus")
    orders = [(f"{prefix}{index:06d}", skus[index % len(skus)]) for index in range(args.orders)]
    admin_url = f"http://127.0.0.1:{daemon.admin_port}/api/v1/orders"
    counts = daemon.runtime.database.counts
    daemon.runtime.database.count_statements()
    counted_before = (counts.statements, counts.writes, counts.reads)
    cpu_before = time.process_time()
    load = loop.run_in_executor(pool, storefront_load, admin_url, UPSTREAM, orders, args.intake_concurrency)

    async def all_settled() -> bool:
        if load.done():
            load.result()  # a failed load generator stops the wait at once
        return load.done() and await settled_count(database, prefix) >= args.orders

    await wait_for(all_settled, 60 + args.orders * 0.1, f"{args.orders} orders to settle", 0.05)
    cpu_seconds = time.process_time() - cpu_before
    statements, writes, reads = (
        counts.statements - counted_before[0],
        counts.writes - counted_before[1],
        counts.reads - counted_before[2],
    )
    intake = load.result()
    rows = await procurements_of_run(database, prefix)
    created: dict[int, float] = await sandbox.ask("created")
    upstream_counts = await sandbox.ask("counts")

    bodies: list[bytes] = await sandbox.ask("callback_bodies")
    callback_args = (bodies, args.callback_connections, args.callback_warmup, args.callback_seconds)
    with BareServer(context) as bare_port:
        bare = await loop.run_in_executor(pool, callback_load, bare_port, *callback_args)
    assert daemon.public_port is not None
    verified = await loop.run_in_executor(pool, callback_load, daemon.public_port, *callback_args)
    after = await procurements_of_run(database, prefix)

    delivered = [row for row in rows if row.state == "delivered" and row.delivered is not None]
    waits = creation_waits(rows, created)
    return Throughput(
        orders=args.orders,
        delivered=len(delivered),
        not_delivered=dict(Counter(row.state for row in rows if row.state != "delivered")),
        upstream_orders=upstream_counts["orders"],
        intake_statuses=intake["statuses"],
        intake_refusals=intake["refusals"],
        intake_seconds=intake["finished"] - intake["started"],
        intake_latencies=intake["latencies"],
        end_to_end_seconds=max((row.delivered or 0.0) for row in rows) - intake["started"],
        to_creation=list(waits.values()),
        submission_seconds=max(created.values()) - min(created.values()) if created else float("nan"),
        to_delivery=[row.delivered - row.accepted for row in delivered if row.delivered is not None],
        requests=upstream_counts["requests"],
        sandbox_callbacks=upstream_counts["callbacks"],
        cpu_seconds=cpu_seconds,
        statements=statements,
        write_transactions=writes,
        read_transactions=reads,
        bare=bare,
        verified=verified,
        still_delivered_after_duplicates=sum(1 for row in after if row.state == "delivered"),
    )


# --- run 2: priority under the real rate limit --------------------------------------------------------------


@dataclass
class LimitedOrder:
    order_no: str
    catalogue_waiting: int  # catalogue requests queued in procurd's limiter when the order was accepted
    intake_status: int
    wait: float | None = None  # intake to upstream creation
    during_sync: bool = False


@dataclass
class Limited:
    interval: float
    catalogue_pages: int
    catalogue_products: int
    sync_seconds: float
    sync_status: str
    orders: list[LimitedOrder]
    delivered: int
    requests: dict[str, int]
    rate_limited: int


async def run_limited(
    args: argparse.Namespace,
    context: multiprocessing.context.SpawnContext,
    database: Database,
    database_url: str,
) -> Limited:
    sandbox = SandboxProcess(context, products=args.limited_products, rate_limit=False)
    base_url = sandbox.start()
    try:
        await mirror_unlimited(database, base_url)
        await sandbox.ask("rate_limit", True)  # the real sites' 60 a minute from here on
        settings = daemon_settings(database_url, LIMITED_UPSTREAM, base_url, 1, args.workers)
        daemon = Daemon(settings, notifier=Notifier({}))
        await daemon.start()
        try:
            return await _measure_limited(args, database, sandbox, daemon)
        finally:
            await daemon.shutdown()
    finally:
        sandbox.stop()


async def mirror_unlimited(database: Database, base_url: str) -> None:
    """Mirror the catalogue at full speed (intake checks orders against the mirror)."""
    fast = UpstreamSettings(
        name=LIMITED_UPSTREAM,
        base_url=base_url,
        api_key=API_KEY,
        api_secret=API_SECRET,
        header_prefix=HEADER_PREFIX,
        max_requests_per_second=1_000_000,
    )
    async with UpstreamClient(fast) as client:
        report = await run_sync(database, client, LIMITED_UPSTREAM, holder="benchmark")
    if not report.ok:
        raise SystemExit(f"mirroring the rate-limited sandbox failed: {report.error}")


async def _measure_limited(
    args: argparse.Namespace, database: Database, sandbox: SandboxProcess, daemon: Daemon
) -> Limited:
    limiter = daemon.runtime.client(LIMITED_UPSTREAM).limiter

    async def catalogue_queued() -> bool:
        return limiter.waiting[Priority.CATALOG] > 0

    await wait_for(catalogue_queued, STARTUP_DEADLINE_SECONDS, "the catalogue sync to queue pages", 0.01)
    skus: list[int] = await sandbox.ask("skus")
    prefix = f"L{secrets.token_hex(3)}-"
    admin_url = f"http://127.0.0.1:{daemon.admin_port}/api/v1/orders"
    placed: list[LimitedOrder] = []
    async with aiohttp.ClientSession() as session:
        first = time.monotonic()
        for index in range(args.limited_orders):
            await asyncio.sleep(max(0.0, first + index * args.limited_spacing - time.monotonic()))
            order_no = f"{prefix}{index:03d}"
            waiting = limiter.waiting[Priority.CATALOG]
            item = {"upstream": LIMITED_UPSTREAM, "sku_id": skus[index % len(skus)], "quantity": 1}
            async with session.post(admin_url, json={"order_no": order_no, "items": [item]}) as response:
                await response.read()
            placed.append(LimitedOrder(order_no, waiting, response.status))

    async def orders_settled() -> bool:
        return await settled_count(database, prefix) >= len(placed)

    await wait_for(orders_settled, 120, "the rate-limited orders to settle")
    await wait_for(lambda: sync_finished(database, LIMITED_UPSTREAM), 600, "the rate-limited catalogue sync")
    report = await last_sync(database, LIMITED_UPSTREAM)
    if report is None or report.finished_at is None:
        raise SystemExit("the rate-limited catalogue sync left no finished run")
    rows = {row.order_no: row for row in await procurements_of_run(database, prefix)}
    created: dict[int, float] = await sandbox.ask("created")
    waits = creation_waits(list(rows.values()), created)
    sync_end = report.finished_at.timestamp()
    for order in placed:
        order.wait = waits.get(order.order_no)
        row = rows.get(order.order_no)
        created_at = created.get(row.upstream_order_id) if row and row.upstream_order_id else None
        order.during_sync = created_at is not None and created_at < sync_end
    counts = await sandbox.ask("counts")
    return Limited(
        interval=1.0 / daemon.settings.upstreams[0].max_requests_per_second,
        catalogue_pages=report.pages,
        catalogue_products=report.products,
        sync_seconds=(report.finished_at - report.started_at).total_seconds(),
        sync_status=report.status,
        orders=placed,
        delivered=sum(1 for row in rows.values() if row.state == "delivered"),
        requests=counts["requests"],
        rate_limited=counts["rate_limited"],
    )


# --- report -------------------------------------------------------------------------------------------------


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def print_parameters(args: argparse.Namespace, database_url: str) -> None:
    lines = [
        ("database", shown_url(database_url)),
        ("load average", load_average()),
        ("run 1", f"{args.orders} one-item orders, {args.intake_concurrency} intake requests in flight, "
                  f"{args.workers} workers, poll_initial_seconds 30"),
        ("", f"sandbox of {args.products} products, no rate limit, procurd max_requests_per_second "
             f"{args.upstream_rps:g}"),
        ("callback load", f"{args.callback_connections} keep-alive connections, {args.callback_warmup:g} s "
                          f"warm-up + {args.callback_seconds:g} s measured, per target"),
        ("run 2", f"sandbox rate limit on (60 a minute, then a 30 s block), {args.limited_products} "
                  "products, procurd max_requests_per_second 1"),
        ("", f"{args.limited_orders} orders {args.limited_spacing:g} s apart during the start-up sync"),
    ]  # fmt: skip
    print("procurd procurement benchmark")
    for name, value in lines:
        print(f"  {name:<22}{value}")
    print()


def report_throughput(figures: Throughput) -> dict[str, bool]:
    creates = figures.requests.get("orders.create", 0)
    gets = figures.requests.get("orders.get", 0)
    per_order = (creates + gets) / figures.delivered if figures.delivered else float("inf")
    verified_rate = figures.verified["ok"] / figures.verified["seconds"]
    bare_rate = figures.bare["ok"] / figures.bare["seconds"]
    rows = [
        ("orders delivered", f"{figures.delivered} / {figures.orders}",
         f"upstream orders {figures.upstream_orders}; not delivered {figures.not_delivered or 'none'}"),
        ("end to end", f"{figures.delivered / figures.end_to_end_seconds:.1f} orders/s",
         f"first intake request to last delivery: {figures.end_to_end_seconds:.2f} s"),
        ("intake", f"{len(figures.intake_latencies) / figures.intake_seconds:.1f} orders/s",
         f"all {len(figures.intake_latencies)} answered in {figures.intake_seconds:.2f} s; "
         f"HTTP {dict(sorted(figures.intake_statuses.items()))}"),
        ("upstream submissions", f"{len(figures.to_creation) / figures.submission_seconds:.1f} orders/s",
         f"first to last upstream creation: {figures.submission_seconds:.2f} s"),
        ("intake latency p50", ms(percentile(figures.intake_latencies, 0.5)), "POST /api/v1/orders answered"),
        ("intake latency p99", ms(percentile(figures.intake_latencies, 0.99)), ""),
        ("intake->upstream p50", ms(percentile(figures.to_creation, 0.5)), "to the sandbox's creation"),
        ("intake->upstream p99", ms(percentile(figures.to_creation, 0.99)), ""),
        ("intake->delivered p50", ms(percentile(figures.to_delivery, 0.5)), "callback stored"),
        ("intake->delivered p99", ms(percentile(figures.to_delivery, 0.99)), ""),
        ("CPU per order", ms(figures.cpu_seconds / figures.orders),
         f"this process (procurd and the benchmark's own polling) over run 1: {figures.cpu_seconds:.1f} s"),
        ("SQL statements", f"{figures.statements / figures.orders:.2f} per order",
         f"{figures.statements} in all"),
        ("write transactions", f"{figures.write_transactions / figures.orders:.3f} per order",
         f"{figures.write_transactions} in all; read transactions {figures.read_transactions}"),
        ("upstream requests", f"{per_order:.3f} per order",
         f"orders.create {creates} + orders.get {gets}; target <= {TARGET_REQUESTS_PER_ORDER}"),
        ("sandbox callbacks", f"{figures.sandbox_callbacks.get('delivered', 0)} ok",
         f"failed tries {figures.sandbox_callbacks.get('failed', 0)}"),
        ("verified callbacks", f"{verified_rate:.0f} /s",
         f"p50 {ms(figures.verified['p50'])}, p99 {ms(figures.verified['p99'])}; "
         f"failed {figures.verified['failures'] or 'none'}"),
        ("bare aiohttp handler", f"{bare_rate:.0f} /s",
         f"p50 {ms(figures.bare['p50'])}, p99 {ms(figures.bare['p99'])}"),
        ("verified / bare", f"{verified_rate / bare_rate:.3f}", "share of a bare handler's throughput"),
    ]  # fmt: skip
    print("run 1: throughput, callbacks healthy")
    for name, value, note in rows:
        print(f"  {name:<22}{value:>18}   {note}")
    for refusal in figures.intake_refusals:
        print(f"  intake refusal: {refusal}")
    print()
    return {
        "every order delivered, one upstream order each": figures.delivered == figures.orders
        and figures.upstream_orders == figures.orders,
        "every intake answered 202": figures.intake_statuses == {202: figures.orders},
        f"upstream requests per delivered order <= {TARGET_REQUESTS_PER_ORDER}": per_order
        <= TARGET_REQUESTS_PER_ORDER,
        "every duplicate callback verified and answered ok": not figures.verified["failures"]
        and figures.verified["ok"] > 0,
        "duplicates changed nothing": figures.still_delivered_after_duplicates == figures.delivered,
    }


def report_limited(figures: Limited) -> dict[str, bool]:
    allowed = figures.interval + LOCAL_WORK_ALLOWANCE_SECONDS
    print("run 2: orders during a catalogue sync under the real rate limit")
    print(f"  catalogue sync        {figures.sync_status}: {figures.catalogue_products} products, "
          f"{figures.catalogue_pages} pages in {figures.sync_seconds:.1f} s at 1 request/s")  # fmt: skip
    print(f"  one request interval  {figures.interval:.3f} s")
    print(f"  {'order':<14}{'catalogue queued':>18}{'intake->upstream':>18}  during sync")
    for order in figures.orders:
        wait = "not created" if order.wait is None else f"{order.wait:.3f} s"
        print(f"  {order.order_no:<14}{order.catalogue_waiting:>18}{wait:>18}  "
              f"{'yes' if order.during_sync else 'NO'}")  # fmt: skip
    waits = [order.wait for order in figures.orders if order.wait is not None]
    if waits:
        print(f"  wait p50 / max        {percentile(waits, 0.5):.3f} s / {max(waits):.3f} s "
              f"({max(waits) / figures.interval:.2f} intervals)")  # fmt: skip
    print(f"  upstream requests     {dict(sorted(figures.requests.items()))}")
    print(f"  rate-limited answers  {figures.rate_limited}")
    print()
    return {
        "rate-limited orders all delivered": figures.delivered == len(figures.orders),
        "orders created while the sync ran": all(order.during_sync for order in figures.orders),
        f"each order waited <= one interval (+{LOCAL_WORK_ALLOWANCE_SECONDS:g} s local work)": len(waits)
        == len(figures.orders)
        and max(waits) <= allowed,
        "no request was rate-limited": figures.rate_limited == 0,
        "catalogue sync ok": figures.sync_status == "ok",
    }


# --- main ---------------------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace, database_url: str) -> bool:
    configure_logging("warning", "json")
    context = multiprocessing.get_context("spawn")
    database = open_database(database_url)
    try:
        await migrate_schema(database)
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            throughput = await run_throughput(args, context, pool, database, database_url)
        checks = report_throughput(throughput)
        limited = await run_limited(args, context, database, database_url)
        checks |= report_limited(limited)
    finally:
        await database.close()
    print(f"load average at the end: {load_average()}")
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'MISS'}  {name}")
    return all(checks.values())


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--orders", type=int, default=2000, help="orders of run 1 (default 2000)")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 200 orders, short phases")
    parser.add_argument("--intake-concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=8, help="procurement.workers")
    parser.add_argument("--products", type=int, default=100, help="catalogue of run 1's sandbox")
    parser.add_argument("--upstream-rps", type=float, default=10_000, help="run 1's max_requests_per_second")
    parser.add_argument("--callback-connections", type=int, default=16)
    parser.add_argument("--callback-warmup", type=float, default=1.0)
    parser.add_argument("--callback-seconds", type=float, default=5.0)
    parser.add_argument("--limited-products", type=int, default=2000, help="catalogue of run 2's sandbox")
    parser.add_argument("--limited-orders", type=int, default=10)
    # Not a whole number of request intervals, so the orders arrive at different points of the interval.
    parser.add_argument("--limited-spacing", type=float, default=3.3, help="seconds between run 2's orders")
    args = parser.parse_args(argv)
    if args.quick:
        args.orders = min(args.orders, 200)
        args.callback_warmup, args.callback_seconds = 0.5, 2.0
        args.limited_products, args.limited_orders, args.limited_spacing = 400, 4, 1.3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    with tempfile.TemporaryDirectory() as directory:
        database_url = args.database_url or f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"
        print_parameters(args, database_url)
        passed = asyncio.run(measure(args, database_url))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
