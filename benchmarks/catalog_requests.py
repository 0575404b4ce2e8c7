"""Upstream requests per catalogue pass: incremental against full, with 1 % of the products changed.

The sandbox (10,000 products x 3 SKUs by default, honouring ``updated_after``) runs in this process; the
figures are request counts, not timings. In order: a first full pass into an empty SQLite database, then
twice: change the price of one SKU of every hundredth product, and run a pass (incremental, then full).
Prints the requests of each pass (as the sandbox counted them), the rows each wrote, and the ratio; it does
not pass or fail.

    python benchmarks/catalog_requests.py [--products 10000] [--changed-percent 1] [--dialect seed|2026]

Every page is asked with ``include_inactive=true``; ``--dialect 2026`` makes the sandbox serve it, as
Dujiao-Next does since 2026.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

UPSTREAM = "bench"
AIM_PERCENT = 5.0


async def measure(
    products: int, skus_per_product: int, changed_percent: float, dialect: str = "seed"
) -> None:
    from procurd.catalog.sync import SyncOptions, SyncReport
    from procurd.config import UpstreamSettings
    from procurd.db.database import open_database
    from procurd.logs import configure_logging
    from procurd.operations.catalog_pass import run_sync
    from procurd.operations.installation import migrate_schema
    from procurd.protocol.dujiao.client import UpstreamClient
    from procurd.sandbox import Sandbox, SandboxConfig

    configure_logging("warning")
    config = SandboxConfig(
        products=products,
        skus_per_product=skus_per_product,
        seed=7,
        rate_limit=False,
        dialect="2026" if dialect == "2026" else "seed",
    )
    step = max(1, round(100 / changed_percent))
    with tempfile.TemporaryDirectory() as directory:
        database = open_database(f"sqlite+aiosqlite:///{Path(directory) / 'requests.db'}")
        await migrate_schema(database)
        async with Sandbox(config) as sandbox:
            settings = UpstreamSettings(
                name=UPSTREAM,
                base_url=sandbox.base_url,
                api_key=config.api_key,
                api_secret=config.api_secret,
                max_requests_per_second=1_000_000,
                timeout_seconds=60,
            )
            options = SyncOptions(incremental="auto")

            def change(round_number: int) -> int:
                changed = 0
                for product_id in range(1 + round_number, products + 1, step):
                    sku = sandbox.state.product(product_id).skus[0]
                    sandbox.state.set_sku_price(sku.id, str(Decimal(sku.price_amount) + Decimal("0.01")))
                    changed += 1
                return changed

            async def counted(full: bool) -> tuple[SyncReport, int]:
                before = sandbox.request_counts["*"]
                report = await run_sync(database, client, UPSTREAM, options=options, full=full)
                if report.status != "ok":
                    raise SystemExit(f"pass {report.run_id} {report.status}: {report.error}")
                return report, sandbox.request_counts["*"] - before

            async with UpstreamClient(settings) as client:
                first, first_requests = await counted(full=True)
                changed = change(1)
                incremental, incremental_requests = await counted(full=False)
                change(2)
                full, full_requests = await counted(full=True)
        await database.close()
    print(f"catalogue            {first.products} products, {first.skus} SKUs, page size 50")
    print(f"changed per round    {changed} products ({changed / first.products:.1%}), one SKU price each")
    print(f"first full pass      {first_requests} requests, {first.rows_written} rows written")
    print(
        f"incremental pass     {incremental_requests} requests ({incremental.pages} pages), "
        f"{incremental.rows_written} rows written, kind {incremental.kind}"
    )
    print(f"full pass            {full_requests} requests ({full.pages} pages), {full.rows_written} rows")
    ratio = incremental_requests / full_requests * 100
    print(f"incremental / full   {ratio:.1f} % of the requests (aim <= {AIM_PERCENT:g} %)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--products", type=int, default=10_000)
    parser.add_argument("--skus-per-product", type=int, default=3)
    parser.add_argument("--changed-percent", type=float, default=1.0)
    parser.add_argument("--dialect", choices=("seed", "2026"), default="seed")
    args = parser.parse_args(argv)
    asyncio.run(measure(args.products, args.skus_per_product, args.changed_percent, args.dialect))
    return 0


if __name__ == "__main__":
    sys.exit(main())
