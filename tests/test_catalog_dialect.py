"""Removals at once: every listing asks ``include_inactive=true``; where the upstream answers
``includes_inactive: true`` (Dujiao-Next since 2026) a product or SKU it lists inactive is made inactive by
that pass, incremental or full, with its change row, under the mass-removal guard; where it does not (seed
000), nothing changes: a product taken off sale waits for the next full pass."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import select

from procurd.catalog.pages import PageMemory
from procurd.catalog.sync import SyncOptions, SyncReport
from procurd.config import UpstreamSettings
from procurd.db.database import Database
from procurd.db.schema import mirror_changes, mirror_products, mirror_skus
from procurd.operations.catalog_pass import run_sync
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.sandbox import Sandbox, SandboxConfig

UPSTREAM = "main"
PRODUCTS = 120  # three pages of 50


@pytest.fixture(params=["seed", "2026"])
async def sandbox(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    """Three pages of products, speaking seed 000 or Dujiao-Next of 2026."""
    config = SandboxConfig(products=PRODUCTS, skus_per_product=2, seed=3, dialect=request.param)
    async with Sandbox(config) as site:
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
    fraction = options.pop("max_removed_fraction", 0.2)
    report = await run_sync(
        database,
        client,
        UPSTREAM,
        options=SyncOptions(incremental="auto", max_removed_fraction=fraction),
        holder="test:1",
        **options,
    )
    assert report.status in ("ok", "suspicious"), report.error
    return report


async def product_row(database: Database, identity: int) -> dict[str, Any]:
    statement = select(mirror_products).where(
        mirror_products.c.upstream == UPSTREAM, mirror_products.c.id == identity
    )
    return await database.read(lambda tx: dict(tx.connection.execute(statement).mappings().one()))


async def sku_row(database: Database, identity: int) -> dict[str, Any]:
    statement = select(mirror_skus).where(mirror_skus.c.upstream == UPSTREAM, mirror_skus.c.id == identity)
    return await database.read(lambda tx: dict(tx.connection.execute(statement).mappings().one()))


Change = tuple[str, str | None, str | None]


async def changes_of(database: Database, entity: str, identity: int) -> list[Change]:
    statement = (
        select(mirror_changes.c.kind, mirror_changes.c.field, mirror_changes.c.new_value)
        .where(mirror_changes.c.entity == entity, mirror_changes.c.entity_id == identity)
        .order_by(mirror_changes.c.seq)
    )
    rows = await database.read(lambda tx: tx.connection.execute(statement).all())
    return [(kind, field, value) for kind, field, value in rows]


def speaks_2026(sandbox: Sandbox) -> bool:
    return sandbox.config.dialect == "2026"


async def test_an_incremental_pass_mirrors_a_deactivation_against_the_2026_dialect_only(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A product taken off sale upstream between passes: the next pass, incremental, makes it inactive in
    the mirror at once with an is_active change row against Dujiao-Next of 2026 (which lists it inactive when
    asked include_inactive and says so); against seed 000 it stays on sale until a full pass removes it."""
    first = await sync(database, client)
    assert (first.kind, first.status, first.products) == ("full", "ok", PRODUCTS)
    assert first.includes_inactive is (True if speaks_2026(sandbox) else None)
    sandbox.state.set_product_active(9, False)

    second = await sync(database, client)
    assert (second.kind, second.status) == ("incremental", "ok")
    mirrored = await product_row(database, 9)
    if speaks_2026(sandbox):
        assert (mirrored["is_active"], mirrored["removed_at"]) == (False, None)
        assert ("changed", "is_active", "false") in await changes_of(database, "product", 9)
        assert (second.products, second.changed) == (1, 1)
    else:
        assert (mirrored["is_active"], mirrored["removed_at"]) == (True, None)
        assert await changes_of(database, "product", 9) == []
        full = await sync(database, client, full=True)
        assert full.removed == 1 + len(sandbox.state.product(9).skus)
        assert (await product_row(database, 9))["removed_at"] is not None


async def test_a_sku_listed_inactive_is_made_inactive_by_that_pass(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A product on sale whose SKU the upstream lists inactive: that pass, incremental, writes the SKU
    inactive with its change row (the sandbox, like Dujiao-Next, lists only active SKUs in a listing; this
    product lists its inactive SKU as a site that does list them would)."""
    await sync(database, client)
    product = sandbox.state.product(11)
    product.skus[0].is_active = True
    sku = product.skus[1]
    sku.is_active = False
    product.extra = {}  # the listing is serialized afresh below, every SKU with its flag
    object.__setattr__(product, "_listing_json", product.detail_json())

    report = await sync(database, client)
    assert report.kind == "incremental"
    assert (await sku_row(database, sku.id))["is_active"] is False
    assert ("changed", "is_active", "false") in await changes_of(database, "sku", sku.id)
    assert (await product_row(database, 11))["is_active"] is True


async def test_a_product_gone_even_from_an_inactive_listing_waits_for_a_full_pass(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A product the upstream deletes (listed nowhere, inactive listings included): incremental passes
    leave it; the next full pass removes it."""
    await sync(database, client)
    sandbox.state.remove_product(13)
    incremental = await sync(database, client)
    assert (incremental.kind, incremental.removed) == ("incremental", 0)
    assert (await product_row(database, 13))["removed_at"] is None
    full = await sync(database, client, full=True)
    assert full.removed >= 1
    assert (await product_row(database, 13))["removed_at"] is not None


async def test_mass_deactivation_is_blocked_until_allowed(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A pass that would take more than max_removed_fraction of the live products off sale deactivates
    nothing: the run is suspicious with alert mass_removal_blocked, the mirror keeps them on sale; allowed
    (--full --allow-mass-removal) they are made inactive, and no product is removed for it. Against seed
    000 the same upstream lists them nowhere: the full pass's removals are what the guard holds."""
    memory = PageMemory()
    await sync(database, client, pages=memory)
    for product_id in range(1, 31):  # a quarter of the catalogue
        sandbox.state.set_product_active(product_id, False)
    blocked = await sync(database, client, pages=memory)
    if speaks_2026(sandbox):
        outcome = (blocked.kind, blocked.status, blocked.deactivations_blocked)
        assert outcome == ("incremental", "suspicious", 30)
        assert blocked.error is not None
        assert "take 30 of 120 live products off sale" in blocked.error
        assert [alert.kind for alert in blocked.alerts()] == ["mass_removal_blocked"]
    else:
        assert (blocked.kind, blocked.status) == ("incremental", "ok")
    assert (await product_row(database, 1))["is_active"] is True

    again = await sync(database, client, full=True, pages=memory)
    assert (again.status, again.removed) == ("suspicious", 0)
    assert (await product_row(database, 1))["is_active"] is True

    allowed = await sync(database, client, full=True, allow_mass_removal=True, pages=memory)
    assert allowed.status == "ok"
    mirrored = await product_row(database, 1)
    if speaks_2026(sandbox):
        assert (mirrored["is_active"], mirrored["removed_at"], allowed.removed) == (False, None, 0)
        assert ("changed", "is_active", "false") in await changes_of(database, "product", 30)
    else:
        assert mirrored["removed_at"] is not None
    after = await sync(database, client, full=True, pages=memory)
    assert (after.status, after.rows_written, after.removed) == ("ok", 0, 0)


async def test_a_few_deactivations_in_a_full_pass_apply_with_the_removals(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Below the guard's share a full pass against 2026 deactivates what it lists inactive and removes what
    it lists nowhere, in one pass; later passes write nothing and decode no page again."""
    memory = PageMemory()
    await sync(database, client, pages=memory)
    sandbox.state.set_product_active(40, False)
    sandbox.state.remove_product(41)
    full = await sync(database, client, full=True, pages=memory)
    assert full.status == "ok"
    gone = await product_row(database, 41)
    assert gone["removed_at"] is not None
    off_sale = await product_row(database, 40)
    if speaks_2026(sandbox):
        assert (off_sale["is_active"], off_sale["removed_at"]) == (False, None)
    else:
        assert off_sale["removed_at"] is not None
    again = await sync(database, client, full=True, pages=memory)
    assert again.rows_written == 0
    # A page holding a product taken off sale is stored at the pass's end, so remembered from the next.
    third = await sync(database, client, full=True, pages=memory)
    assert (third.rows_written, third.unchanged_pages) == (0, 3)


async def test_a_pass_reports_what_the_listing_said(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """The pass reports whether the upstream answered includes_inactive, the page size asked and the one it
    answered: a 2026 site clamps 100 to 50, the seed sandbox too (its maximum is 50)."""
    report = await run_sync(database, client, UPSTREAM, holder="test:1", page_size=100)
    assert report.status == "ok", report.error
    assert report.includes_inactive is (True if speaks_2026(sandbox) else None)
    assert (report.page_size_asked, report.page_size_answered) == (100, 50)
