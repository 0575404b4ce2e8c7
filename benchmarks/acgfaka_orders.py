"""Benchmark: orders a second from one acg-faka upstream, beside the same from one Dujiao-Next upstream.

One procurd daemon (``Daemon``, both listeners, workers, pollers) in this process buys from two upstreams,
each a sandbox in a child process: a Dujiao-Next site (the baseline, measured in the same run) and an
acg-faka shop. The storefront (a child process) POSTs ``--orders`` one-item orders of card goods at the
admin API, ``--intake-concurrency`` in flight, first to the Dujiao-Next upstream, then the same number to
the acg-faka one. Measured for each, from the first intake request to the last delivery: orders a second,
the upstream requests per delivered order, and the time from intake to delivery.

The two protocols buy differently, and the figures show what that costs: Dujiao-Next takes orders
concurrently and delivers by callback; an acg-faka purchase is three requests (``valuation`` right before
the trade, ``connect`` for the balance before, the ``trade`` itself) made one trade at a time per member
account, under the account's lease in the database, with the goods in the trade's answer.

Both upstreams are mirrored by the daemon's own catalogue passes at its start; the acg-faka shop's one card
commodity is ordered by the SKU id procurd gave its one choice, found in the mirror.

    python benchmarks/acgfaka_orders.py [--orders 300] [--database-url postgresql+asyncpg://...]

Prints the parameters and the figures; nothing passes or fails. With ``--database-url`` give an empty
database (or one this benchmark used before): the schema is upgraded first and every run uses order
numbers of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import multiprocessing.connection
import secrets
import statistics
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from procurement import (
    load_average,
    ms,
    procurements_of_run,
    settled_count,
    shown_url,
    sync_finished,
    wait_for,
)
from procurement_processes import (
    API_KEY,
    API_SECRET,
    HEADER_PREFIX,
    STARTUP_DEADLINE_SECONDS,
    SandboxProcess,
    storefront_load,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from acgfaka_support import Choice, sku_of
from procurd.config import Settings
from procurd.core.clock import utcnow
from procurd.daemon import Daemon
from procurd.db.database import Database, open_database
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.operations.catalog_pass import last_sync
from procurd.operations.installation import migrate_schema
from procurd.protocol.dujiao.callback import CALLBACK_PATH
from procurd.sandbox.acgfaka import DEFAULT_APP_ID, AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.shop import DEFAULT_APP_KEY
from procurd.sandbox.testing import ControlClient
from procurd.systemd import Notifier

DUJIAO = "dujiao"
ACG = "acg"
CODE = "BENCHCARD0000001"
PRICE = "1.00"
SHOP_BALANCE = Decimal("10000000.00")


# --- the acg-faka shop in a child process -----------------------------------------------------------------


def _serve_shop(conn: multiprocessing.connection.Connection) -> None:
    """Child process: the sandbox acg-faka shop (no goods of its own) until the parent says ``stop``."""
    configure_logging("warning", "json")

    async def serve() -> None:
        async with AcgFakaSandbox(ShopConfig(commodities=0, balance=SHOP_BALANCE)) as shop:
            conn.send(shop.base_url)
            await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        conn.send(None)

    asyncio.run(serve())


class ShopProcess:
    def __init__(self, context: multiprocessing.context.SpawnContext) -> None:
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve_shop, args=(child,), daemon=True)

    def start(self) -> str:
        self._process.start()
        if not self._conn.poll(STARTUP_DEADLINE_SECONDS):
            raise SystemExit("the acg-faka shop did not start in time")
        return str(self._conn.recv())

    def stop(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send("stop")
                if self._conn.poll(30):
                    self._conn.recv()
            except (BrokenPipeError, EOFError):
                pass
            self._process.join(30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()


async def stock_shop(base_url: str, cards: int) -> None:
    """One card commodity with ``cards`` cards at the shop."""
    async with ControlClient(base_url) as control:
        category = (await control.post("/categories", {"name": "benchmark"}))["category"]["id"]
        await control.post(
            "/commodities", {"code": CODE, "name": CODE, "category_id": category, "price": PRICE}
        )
        for start in range(0, cards, 1000):
            batch = [{"secret": f"CARD-{n:07d}"} for n in range(start, min(cards, start + 1000))]
            await control.post(f"/commodities/{CODE}/cards", {"cards": batch})


async def shop_requests(base_url: str) -> dict[str, int]:
    async with ControlClient(base_url) as control:
        return dict((await control.get("/requests"))["counts"])


async def mirrored_since(database: Database, upstream: str, since: datetime) -> bool:
    """Whether a catalogue pass of ``upstream`` begun at ``since`` or later ended ``ok`` (a database this
    benchmark used before holds the passes of earlier runs)."""
    report = await last_sync(database, upstream)
    return report is not None and report.started_at >= since and await sync_finished(database, upstream)


# --- procurd ------------------------------------------------------------------------------------------------


def daemon_settings(database_url: str, dujiao_url: str, shop_url: str, workers: int) -> Settings:
    public_port, admin_port = unused_ports(2)
    common = {"max_requests_per_second": 10_000, "ping_interval_seconds": 3600}
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
                "name": DUJIAO,
                "base_url": dujiao_url,
                "api_key": API_KEY,
                "api_secret": API_SECRET,
                "header_prefix": HEADER_PREFIX,
                **common,
            },
            {
                "name": ACG,
                "protocol": "acg-faka",
                "base_url": shop_url,
                "app_id": str(DEFAULT_APP_ID),
                "app_key": DEFAULT_APP_KEY,
                **common,
            },
        ],
        catalog={"sync_interval_seconds": 3600, "page_size": 50, "concurrency": 4},
        procurement={"workers": workers, "poll_initial_seconds": 30, "poll_max_seconds": 900},
        logging={"level": "error", "format": "json"},
    )


@dataclass(frozen=True)
class Run:
    protocol: str
    orders: int
    delivered: int
    seconds: float  # first intake request to last delivery
    to_delivery: list[float]
    requests: dict[str, int]
    undelivered: dict[str, int]  # state: count

    @property
    def per_second(self) -> float:
        return self.delivered / self.seconds if self.seconds > 0 else float("nan")


async def run_orders(
    args: argparse.Namespace,
    pool: concurrent.futures.ProcessPoolExecutor,
    database: Database,
    daemon: Daemon,
    upstream: str,
    sku_ids: list[int],
    requests: Any,
) -> Run:
    """``args.orders`` one-item orders of ``upstream``, until every one settled."""
    loop = asyncio.get_running_loop()
    prefix = f"{upstream[:1].upper()}{secrets.token_hex(3)}-"
    orders = [(f"{prefix}{index:06d}", sku_ids[index % len(sku_ids)]) for index in range(args.orders)]
    admin_url = f"http://127.0.0.1:{daemon.admin_port}/api/v1/orders"
    before: dict[str, int] = await requests()
    load = loop.run_in_executor(pool, storefront_load, admin_url, upstream, orders, args.intake_concurrency)

    async def all_settled() -> bool:
        if load.done():
            load.result()
        return load.done() and await settled_count(database, prefix) >= args.orders

    await wait_for(all_settled, 120 + args.orders * 0.5, f"{args.orders} orders of {upstream}", 0.05)
    intake = load.result()
    after: dict[str, int] = await requests()
    rows = await procurements_of_run(database, prefix)
    delivered = [row for row in rows if row.state == "delivered" and row.delivered is not None]
    last = max((row.delivered or 0.0) for row in rows)
    return Run(
        protocol=upstream,
        orders=args.orders,
        delivered=len(delivered),
        seconds=last - intake["started"],
        to_delivery=[row.delivered - row.accepted for row in delivered if row.delivered is not None],
        requests={
            name: count - before.get(name, 0)
            for name, count in after.items()
            if name != "*" and count != before.get(name)  # "*": the Dujiao-Next sandbox's total
        },
        undelivered=dict(Counter(row.state for row in rows if row.state != "delivered")),
    )


async def measure(args: argparse.Namespace, database_url: str) -> list[Run]:
    configure_logging("error", "json")
    context = multiprocessing.get_context("spawn")
    database = open_database(database_url)
    dujiao = SandboxProcess(context, products=args.products, rate_limit=False)
    shop = ShopProcess(context)
    try:
        await migrate_schema(database)
        dujiao_url, shop_url = dujiao.start(), shop.start()
        await stock_shop(shop_url, args.orders + 10)
        daemon = Daemon(
            daemon_settings(database_url, dujiao_url, shop_url, args.workers), notifier=Notifier({})
        )
        started = utcnow()
        await daemon.start()
        try:
            deadline = STARTUP_DEADLINE_SECONDS
            await wait_for(lambda: mirrored_since(database, DUJIAO, started), deadline, "the mirror")
            await wait_for(lambda: mirrored_since(database, ACG, started), deadline, "the acg-faka mirror")
            acg_sku = await sku_of(database, Choice(CODE), ACG)
            dujiao_skus: list[int] = await dujiao.ask("skus")

            async def dujiao_requests() -> dict[str, int]:
                return dict((await dujiao.ask("counts"))["requests"])

            with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
                baseline = await run_orders(
                    args, pool, database, daemon, DUJIAO, dujiao_skus, dujiao_requests
                )
                acg = await run_orders(
                    args, pool, database, daemon, ACG, [acg_sku], lambda: shop_requests(shop_url)
                )
        finally:
            await daemon.shutdown()
    finally:
        shop.stop()
        dujiao.stop()
        await database.close()
    return [baseline, acg]


def report(args: argparse.Namespace, database_url: str, runs: list[Run]) -> None:
    print("procurd acg-faka orders benchmark")
    print(f"  {'database':<22}{shown_url(database_url)}")
    print(f"  {'load average':<22}{load_average()}")
    print(f"  {'orders':<22}{args.orders} one-item orders per upstream, {args.intake_concurrency} intake")
    print(f"  {'':<22}requests in flight, {args.workers} workers, no rate limit at either upstream")
    print()
    baseline = runs[0]
    for run in runs:
        waits = sorted(run.to_delivery)
        p50 = statistics.median(waits) if waits else float("nan")
        p99 = waits[int(len(waits) * 0.99) - 1] if waits else float("nan")
        per_order = {name: count / max(run.delivered, 1) for name, count in sorted(run.requests.items())}
        shown = ", ".join(f"{name} {value:.2f}" for name, value in per_order.items())
        print(f"{run.protocol}")
        print(f"  {'delivered':<22}{run.delivered}/{run.orders}, not delivered: {run.undelivered or 'none'}")
        print(f"  {'orders a second':<22}{run.per_second:.1f} (first intake request to last delivery "
              f"{run.seconds:.2f} s)")  # fmt: skip
        print(f"  {'intake to delivery':<22}p50 {ms(p50)}, p99 {ms(p99)}")
        print(f"  {'requests per order':<22}{shown}")
        if run is not baseline:
            print(f"  {'beside the baseline':<22}{run.per_second / baseline.per_second:.2f} × Dujiao-Next's "
                  "orders a second")  # fmt: skip
    print(f"load average at the end: {load_average()}")


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--orders", type=int, default=300, help="orders per upstream (default 300)")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument("--intake-concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=8, help="procurement.workers")
    parser.add_argument("--products", type=int, default=100, help="catalogue of the Dujiao-Next sandbox")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    with tempfile.TemporaryDirectory() as directory:
        database_url = args.database_url or f"sqlite+aiosqlite:///{Path(directory) / 'bench.db'}"
        runs = asyncio.run(measure(args, database_url))
        report(args, database_url, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
