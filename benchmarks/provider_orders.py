"""Benchmark of a provider order's path alone: ``--orders`` downstream orders taken in by the provider's
operation (the request's fields checked, then checked against the mirror, priced, charged and taken in by
the state path), ``--concurrency`` at a time, in-process, on SQLite.

The installation is the one a command opens (no background worker runs, so nothing is bought: what is
measured is the order path and the transactions it takes); the mirror is the in-memory sandbox's
catalogue, every SKU in stock without limit. Prints orders a second, the p50 and p99 of one order's
answer, the process's CPU per order, and the transactions and statements per order.

    python benchmarks/provider_orders.py [--orders 600] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from procurd.config import Settings
from procurd.core.provider import Account
from procurd.db.database import open_database
from procurd.logs import configure_logging
from procurd.loopback import unused_ports
from procurd.operations import Operations, open_operations
from procurd.operations.catalog_pass import run_sync
from procurd.operations.installation import migrate_schema
from procurd.operations.runtime import Runtime
from procurd.sandbox import Sandbox, SandboxConfig


def settings_for(database_url: str, sandbox: Sandbox) -> Settings:
    public_port, admin_port = unused_ports(2)
    return Settings(
        database={"url": database_url},
        server={"public_host": "127.0.0.1", "public_port": public_port, "admin_host": "127.0.0.1",
                "admin_port": admin_port, "callback_url": f"http://127.0.0.1:{public_port}/cb"},
        upstreams=[{"name": "top", "base_url": sandbox.base_url, "api_key": sandbox.config.api_key,
                    "api_secret": sandbox.config.api_secret, "max_requests_per_second": 1000}],
        provider={"enabled": True, "currency": "CNY"},
        pricing={"rules": [{"markup_percent": "10"}]},
        logging={"level": "warning", "format": "json"},
    )  # fmt: skip


async def offered_skus(operations: Operations, account: Account) -> list[int]:
    """The offered SKU ids on the first page of the catalogue."""
    page = await operations.provider.products(account, 1, 100, None, None)
    answer = page.answer
    body: dict[str, Any] = json.loads(gzip.decompress(answer) if answer[:2] == b"\x1f\x8b" else answer)
    return [sku["id"] for product in body["items"] for sku in product["skus"]]


async def run(orders: int, concurrency: int) -> None:
    path = Path(tempfile.mkdtemp(prefix="procurd-provider-orders-")) / "procurd.db"
    url = f"sqlite+aiosqlite:///{path}"
    database = open_database(url)
    try:
        await migrate_schema(database)
    finally:
        await database.close()
    async with Sandbox(SandboxConfig(products=20, skus_per_product=2, manual_ratio=0)) as sandbox:
        for product in sandbox.state.active_products():
            for sku in product.skus:
                sandbox.state.set_sku_stock(sku.id, -1)
        settings = settings_for(url, sandbox)
        runtime = Runtime.build(settings)
        try:
            report = await run_sync(runtime.database, runtime.client("top"), "top", holder="benchmark")
            assert report.status == "ok", report.error
        finally:
            await runtime.close()
        async with open_operations(settings) as operations:
            await operations.catalog.reprice()
            await operations.provider.refresh(full=True)
            await operations.provider.accounts.add("bench")
            await operations.provider.accounts.move("bench", "100000000.00", "benchmark", topup=True)
            account = await operations.provider.accounts.get("bench")
            skus = await offered_skus(operations, account)
            database = operations.runtime.database
            database.count_statements()
            counts = database.counts
            waiting = list(range(orders))
            latencies: list[float] = []

            async def site() -> None:
                while waiting:
                    index = waiting.pop()
                    started = time.perf_counter()
                    order, created = await operations.provider.create_order(
                        account, sku_id=skus[index % len(skus)], quantity=1, manual_form_data=None,
                        downstream_order_no=f"bench-{index}", trace_id=None, callback_url=None,
                    )  # fmt: skip
                    assert created, order
                    assert order.status == "paid", order
                    latencies.append(time.perf_counter() - started)

            transactions = sum(counts.transactions().values())
            statements = counts.statements
            cpu = time.process_time()
            started = time.perf_counter()
            await asyncio.gather(*(site() for _ in range(concurrency)))
            wall = time.perf_counter() - started
            cpu = time.process_time() - cpu
            transactions = sum(counts.transactions().values()) - transactions
            statements = counts.statements - statements
    latencies.sort()
    p50, p99 = latencies[len(latencies) // 2] * 1000, latencies[int(len(latencies) * 0.99)] * 1000
    print(
        f"{orders} provider orders, {concurrency} at a time: {orders / wall:.0f} orders/s, "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
        f"CPU {cpu / orders * 1000:.2f} ms per order, {transactions / orders:.2f} transactions and "
        f"{statements / orders:.1f} statements per order"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    configure_logging("warning", "json")
    asyncio.run(run(args.orders, args.concurrency))


if __name__ == "__main__":
    main()
