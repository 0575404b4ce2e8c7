"""Incremental passes and removal safety, against the sandbox over real sockets: between full passes only
products updated since the last complete pass are asked for, an upstream that ignores updated_after is
recognised, only full passes remove, and a suspiciously large removal waits for a person."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from procurd.catalog.pages import PageMemory
from procurd.catalog.sync import SyncOptions, SyncReport
from procurd.config import UpstreamSettings
from procurd.db.database import Database
from procurd.db.schema import mirror_products, mirror_skus, sync_runs
from procurd.operations.catalog_pass import run_sync
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.sandbox import Sandbox, SandboxConfig

UPSTREAM = "main"
PRODUCTS = 120  # three pages of 50


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    """A sandbox upstream with three pages of products on 127.0.0.1."""
    async with Sandbox(SandboxConfig(products=PRODUCTS, skus_per_product=2, seed=3)) as site:
        yield site


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[UpstreamClient]:
    settings = UpstreamSettings(
        name=UPSTREAM,
        base_url=sandbox.base_url,
        api_key=sandbox.config.api_key,
        api_secret=sandbox.config.api_secret,
        max_requests_per_second=10_000,
    )
    async with UpstreamClient(settings) as upstream_client:
        yield upstream_client


async def sync(database: Database, client: UpstreamClient, **options: Any) -> SyncReport:
    mode = options.pop("incremental", "auto")
    fraction = options.pop("max_removed_fraction", 0.2)
    report = await run_sync(
        database,
        client,
        UPSTREAM,
        options=SyncOptions(incremental=mode, max_removed_fraction=fraction),
        holder="test:1",
        **options,
    )
    assert report.status in ("ok", "suspicious"), report.error
    return report


async def row(database: Database, table: Any, identity: int) -> dict[str, Any]:
    statement = select(table).where(table.c.upstream == UPSTREAM, table.c.id == identity)
    return await database.read(lambda tx: dict(tx.connection.execute(statement).mappings().one()))


def requests(sandbox: Sandbox) -> int:
    return sandbox.request_counts["products"]


async def test_incremental_pass_asks_only_for_updated_products(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """The first pass is full; the next asks for products updated since the last one began (one page
    here), applies their changes, and removes nothing; sync_runs records each pass's kind."""
    first = await sync(database, client)
    assert (first.kind, first.pages) == ("full", 3)
    changed = sandbox.state.product(7).skus[0]
    sandbox.state.set_sku_price(changed.id, "4321.00")
    sandbox.state.remove_product(9)
    before = requests(sandbox)

    second = await sync(database, client)
    assert (second.kind, second.pages, second.products) == ("incremental", 1, 1)
    assert requests(sandbox) - before == 1
    assert (await row(database, mirror_skus, changed.id))["price_amount"] == "4321.00"
    assert (second.removed, (await row(database, mirror_products, 9))["removed_at"]) == (0, None)
    runs = await database.read(
        lambda tx: tx.connection.execute(select(sync_runs.c.kind, sync_runs.c.updated_after)).all()
    )
    assert [kind for kind, _ in runs] == ["full", "incremental"]
    assert runs[1][1] is not None

    third = await sync(database, client, full=True)
    assert (third.kind, third.removed) == ("full", 1 + 2)  # the product and its SKUs
    assert (await row(database, mirror_products, 9))["removed_at"] is not None


async def test_upstream_ignoring_updated_after_gets_full_passes(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """In auto mode, a first page listing products older than asked shows the upstream ignores the
    parameter: the pass becomes full at the cost of one request, and the next passes are full."""
    sandbox.config.honour_updated_after = False
    await sync(database, client)
    before = requests(sandbox)
    fallback = await sync(database, client)
    assert (fallback.kind, fallback.ignored_updated_after) == ("full", True)
    assert requests(sandbox) - before == 3 + 1
    before = requests(sandbox)
    again = await sync(database, client)
    assert (again.kind, again.ignored_updated_after) == ("full", False)
    assert requests(sandbox) - before == 3


async def test_incremental_on_keeps_asking_and_off_never_asks(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """on: incremental between full passes even when the upstream ignores the parameter (nothing is
    removed); off: every pass is full."""
    await sync(database, client, incremental="on")
    sandbox.config.honour_updated_after = False
    sandbox.state.remove_product(3)
    trusted = await sync(database, client, incremental="on")
    assert (trusted.kind, trusted.ignored_updated_after, trusted.removed) == ("incremental", True, 0)
    assert (await sync(database, client, incremental="off")).kind == "full"


async def test_mass_removal_is_blocked_until_allowed(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A full pass that would remove more than max_removed_fraction of the live products removes nothing
    and is suspicious (alert mass_removal_blocked); allowed, the same removals apply."""
    await sync(database, client)
    for product_id in range(1, 31):  # a quarter of the catalogue
        sandbox.state.remove_product(product_id)
    blocked = await sync(database, client, full=True)
    assert (blocked.status, blocked.removed, blocked.removals_blocked) == ("suspicious", 0, 30)
    assert blocked.error is not None
    assert "30 of 120 live products" in blocked.error
    assert [alert.kind for alert in blocked.alerts()] == ["mass_removal_blocked"]
    assert (await row(database, mirror_products, 1))["removed_at"] is None
    stored = await database.read(lambda tx: tx.mirror.last_run(UPSTREAM))
    assert stored is not None
    assert (stored["status"], stored["removed"]) == ("suspicious", 0)

    allowed = await sync(database, client, full=True, allow_mass_removal=True)
    assert (allowed.status, allowed.removals_blocked) == ("ok", 0)
    mirrored_skus = sum(
        sku.is_active for product_id in range(1, 31) for sku in sandbox.state.product(product_id).skus
    )
    assert allowed.removed == 30 + mirrored_skus
    assert (await row(database, mirror_products, 1))["removed_at"] is not None


async def test_an_empty_listing_removes_nothing(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """An upstream that suddenly lists no products at all removes nothing, whatever the allowed share."""
    await sync(database, client)
    for product_id in range(1, PRODUCTS + 1):
        sandbox.state.remove_product(product_id)
    report = await sync(database, client, full=True, max_removed_fraction=1.0)
    assert (report.status, report.products, report.removed) == ("suspicious", 0, 0)
    assert report.error is not None
    assert "lists no products" in report.error


async def test_command_line_full_pass_and_mass_removal(
    tmp_path: Path, database_url: str, sandbox: Sandbox, database: Database
) -> None:
    """catalog sync exits 1 on a suspicious pass and says how to apply it; --full --allow-mass-removal
    applies it; --allow-mass-removal alone is a usage error."""
    config = tmp_path / "procurd.toml"
    config.write_text(
        f"""
[database]
url = "{database_url}"

[[upstreams]]
name = "main"
base_url = "{sandbox.base_url}"
api_key = "{sandbox.config.api_key}"
api_secret = "{sandbox.config.api_secret}"
max_requests_per_second = 500
""",
        encoding="utf-8",
    )

    async def procurd(*args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "procurd", "--config", str(config), "catalog", "sync", *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
        assert process.returncode is not None
        return process.returncode, stdout.decode(), stderr.decode()

    code, out, err = await procurd()
    assert (code, "main: ok (full)" in out) == (0, True), err
    for product_id in range(1, 61):
        sandbox.state.remove_product(product_id)
    code, out, _ = await procurd()
    assert (code, "main: ok (incremental)" in out) == (0, True)
    code, out, _ = await procurd("--full")
    assert code == 1
    assert "main: suspicious (full)" in out
    assert "--allow-mass-removal" in out
    code, _, err = await procurd("--allow-mass-removal")
    assert code == 2
    assert "needs --full" in err
    code, out, _ = await procurd("--full", "--allow-mass-removal")
    assert code == 0
    assert "main: ok (full)" in out
    assert (await row(database, mirror_products, 1))["removed_at"] is not None


async def test_incremental_passes_keep_the_full_pass_pages_remembered(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Incremental passes between two full passes of one process keep the first full pass's pages: the
    next full pass decodes only the page whose product changed (already stored by the incremental pass)."""
    memory = PageMemory()
    first = await sync(database, client, pages=memory)
    assert (first.kind, first.pages, len(memory)) == ("full", 3, 3)
    sandbox.state.set_sku_price(sandbox.state.product(7).skus[0].id, "4321.00")
    incremental = await sync(database, client, pages=memory)
    assert (incremental.kind, incremental.unchanged_pages, incremental.changed) == ("incremental", 0, 2)
    full = await sync(database, client, pages=memory, full=True)
    assert (full.kind, full.unchanged_pages, full.rows_written) == ("full", 2, 0)
