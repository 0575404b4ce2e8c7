"""What the tables that retention prunes weigh: bytes per row measured, and the steady size at 10,000
orders a day under the default ``[retention]``.

Orders are bought and delivered from the sandbox through procurd's own paths (intake over HTTP, a
submitter, the sandbox's delivery callback), with a storefront webhook configured so every order leaves its
events in the outbox; a few catalogue passes leave mirror changes and sync runs. The size of each table
(indexes included) is read from PostgreSQL (``pg_total_relation_size``) and divided by its rows; the steady
size is rows per order x 10,000 x the days kept. Prints figures; it does not pass or fail.

    python benchmarks/retention_sizes.py [--orders 300] [--postgres URL]

Without ``--postgres`` it uses ``PROCURD_TEST_POSTGRES_URL`` (a server ``scripts/test`` starts) and a new
database on it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid
from decimal import Decimal
from typing import Any

ORDERS_PER_DAY = 10_000
TABLES = ("audit_log", "outbox", "mirror_changes", "sync_runs", "alerts", "orders", "procurements")


async def measure(orders: int, server_url: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    from procurd.config import RetentionSettings
    from procurd.db.database import open_database
    from procurd.http.testing import procurd_stack
    from procurd.logs import configure_logging
    from procurd.operations.installation import migrate_schema
    from procurd.sandbox import SandboxConfig

    configure_logging("error")
    name = f"procurd_sizes_{uuid.uuid4().hex[:8]}"
    admin = create_async_engine(server_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as connection:
        await connection.execute(text(f'CREATE DATABASE "{name}"'))
    url = server_url.rsplit("/", 1)[0] + "/" + name
    try:
        database = open_database(url)
        await migrate_schema(database)
        await database.close()
        sandbox = SandboxConfig(
            products=50, balance=Decimal(1_000_000), allow_private_callbacks=True, rate_limit=False
        )
        hook = "http://127.0.0.1:9/hook"  # events stay in the outbox: no dispatcher runs here
        async with procurd_stack(url, upstreams=("main",), webhook_url=hook, sandbox_config=sandbox) as stack:
            await stack.sync("main")
            sku = stack.sandbox.state.first_sku("auto").id
            stack.sandbox.state.set_sku_stock(sku, -1)  # unlimited: every order is bought
            for number in range(orders):
                body = {"order_no": f"S{number}", "items": [{"sku_id": sku, "quantity": 1}]}
                answer = await stack.admin("POST", "/api/v1/orders", body)
                assert answer.status == 202, answer.body
                assert await stack.submit_due()
            await stack.sandbox.wait_callbacks_idle(timeout=120)
            for price in ("10.00", "11.00", "12.00"):  # every SKU's cost changes in each of three passes
                for product in stack.sandbox.state.active_products():
                    for item in product.skus:
                        stack.sandbox.state.set_sku_price(item.id, price)
                await stack.sync("main")
        engine = create_async_engine(url)
        async with engine.connect() as connection:
            sizes: dict[str, tuple[int, int]] = {}
            for table in TABLES:  # names of our own tables, not input
                rows = (await connection.execute(text(f"SELECT count(*) FROM {table}"))).scalar_one()  # noqa: S608
                size = (
                    await connection.execute(text("SELECT pg_total_relation_size(:t)"), {"t": table})
                ).scalar_one()
                sizes[table] = (int(rows), int(size))
            states = (
                await connection.execute(
                    text("SELECT state, exception_reason, count(*) FROM procurements GROUP BY 1, 2")
                )
            ).all()
            print("procurements:", ", ".join(f"{s}{f' ({r})' if r else ''} {n}" for s, r, n in states))
        await engine.dispose()
    finally:
        async with admin.connect() as connection:
            await connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()
    report(orders, sizes, RetentionSettings())


def report(orders: int, sizes: dict[str, tuple[int, int]], retention: Any) -> None:
    days = {"audit_log": retention.audit_days, "outbox": retention.outbox_delivered_days}
    print(f"{orders} orders bought and delivered (one item each), on PostgreSQL")
    print(f"{'table':<16}{'rows':>8}{'rows/order':>12}{'bytes/row':>11}{'kept days':>11}{'steady size':>14}")
    for table, (rows, size) in sizes.items():
        per_order = rows / orders
        per_row = size / rows if rows else 0
        kept = days.get(table)
        steady = "" if kept is None else human(per_order * ORDERS_PER_DAY * kept * per_row)
        print(f"{table:<16}{rows:>8}{per_order:>12.2f}{per_row:>11.0f}{kept or '':>11}{steady:>14}")
    print(f"steady sizes at {ORDERS_PER_DAY:,} orders/day under the default [retention]")


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} PiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=300)
    parser.add_argument("--postgres", default=os.environ.get("PROCURD_TEST_POSTGRES_URL"))
    args = parser.parse_args()
    if not args.postgres:
        sys.exit(
            "give --postgres URL (a server procurd may create a database on) or PROCURD_TEST_POSTGRES_URL"
        )
    asyncio.run(measure(args.orders, args.postgres))


if __name__ == "__main__":
    main()
