"""The catalogue sync end to end: sandbox upstream on real sockets, procurd's client, a real database."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Container
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import create_async_engine

from procurd.catalog.pages import PageMemory
from procurd.catalog.sync import CANCELLED, SKIPPED_BUSY, SyncReport
from procurd.config import UpstreamSettings
from procurd.db.database import Database
from procurd.db.mirror_store import INTERRUPTED_ERROR
from procurd.db.schema import leases as leases_table
from procurd.db.schema import mirror_categories, mirror_changes, mirror_products, mirror_skus, sync_runs
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.operations.catalog_pass import last_sync, run_sync
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.upstream.models import CatalogPage, PingResult, SeenPage
from procurd.upstream.ratelimit import Priority
from support import lease_holder, wait_until

UPSTREAM = "main"
LEASE = f"catalog-sync:{UPSTREAM}"
PRODUCTS = 230  # five pages of 50
SEED_PRODUCT_FIELDS = (
    "slug",
    "title",
    "description",
    "content",
    "seo_meta",
    "images",
    "tags",
    "price_amount",
    "original_price",
    "member_price",
    "fulfillment_type",
    "manual_form_schema",
    "is_active",
    "category_id",
    "created_at",
    "updated_at",
)
SEED_SKU_FIELDS = (
    "sku_code",
    "spec_values",
    "price_amount",
    "original_price",
    "member_price",
    "stock_status",
    "stock_quantity",
    "is_active",
)


@pytest.fixture
async def sandbox() -> AsyncIterator[Sandbox]:
    """A sandbox upstream with five pages of products on 127.0.0.1."""
    async with Sandbox(
        SandboxConfig(products=PRODUCTS, skus_per_product=3, seed=5, rate_limit=False)
    ) as site:
        yield site


@pytest.fixture
async def client(sandbox: Sandbox) -> AsyncIterator[UpstreamClient]:
    """procurd's upstream client pointed at the sandbox, without a practical rate limit."""
    settings = UpstreamSettings(
        name=UPSTREAM,
        base_url=sandbox.base_url,
        api_key=sandbox.config.api_key,
        api_secret=sandbox.config.api_secret,
        max_requests_per_second=10_000,
    )
    async with UpstreamClient(settings) as upstream_client:
        yield upstream_client


class HookedClient:
    """The real client, with a hook run just before a chosen page is requested (to time sandbox faults)."""

    def __init__(self, client: UpstreamClient, before_page: dict[int, Callable[[], None]]) -> None:
        self._client = client
        self._before_page = before_page

    async def catalog_categories(self, *, priority: Priority = Priority.CATALOG) -> list[dict[str, Any]]:
        return await self._client.catalog_categories(priority=priority)

    async def catalog_page(
        self,
        page: int = 1,
        page_size: int = 20,
        *,
        updated_after: datetime | None = None,
        priority: Priority = Priority.CATALOG,
        seen: Container[bytes],
    ) -> CatalogPage | SeenPage:
        hook = self._before_page.pop(page, None)
        if hook is not None:
            hook()
        return await self._client.catalog_page(
            page, page_size, updated_after=updated_after, priority=priority, seen=seen
        )

    async def ping(self, *, priority: Priority = Priority.PING) -> PingResult:
        return await self._client.ping(priority=priority)


class GatedClient(HookedClient):
    """The real client whose category request waits until ``gate`` opens."""

    def __init__(self, client: UpstreamClient, gate: asyncio.Event) -> None:
        super().__init__(client, {})
        self._gate = gate

    async def catalog_categories(self, *, priority: Priority = Priority.CATALOG) -> list[dict[str, Any]]:
        await self._gate.wait()
        return await super().catalog_categories(priority=priority)


async def sync(database: Database, client: Any, **options: Any) -> SyncReport:
    options.setdefault("holder", "test-host:1")
    return await run_sync(database, client, UPSTREAM, **options)


def listed(sandbox: Sandbox) -> dict[int, dict[str, Any]]:
    """What GET /products lists right now, exactly as the sandbox serializes it."""
    return {product.id: json.loads(product.listing_json()) for product in sandbox.state.active_products()}


async def rows(database: Database, table: Any, **where: Any) -> list[dict[str, Any]]:
    statement = select(table).where(table.c.upstream == UPSTREAM)
    for column, value in where.items():
        statement = statement.where(table.c[column] == value)
    statement = statement.order_by(table.c.id)
    return await database.read(lambda tx: [dict(row) for row in tx.connection.execute(statement).mappings()])


async def one(database: Database, table: Any, identity: int) -> dict[str, Any]:
    (row,) = await rows(database, table, id=identity)
    return row


async def changes(database: Database, run_id: int | None) -> list[tuple[Any, ...]]:
    statement = (
        select(
            mirror_changes.c.entity,
            mirror_changes.c.entity_id,
            mirror_changes.c.kind,
            mirror_changes.c.field,
            mirror_changes.c.old_value,
            mirror_changes.c.new_value,
        )
        .where(mirror_changes.c.sync_run_id == run_id)
        .order_by(mirror_changes.c.seq)
    )
    return await database.read(lambda tx: [tuple(row) for row in tx.connection.execute(statement)])


async def count(database: Database, table: Any) -> int:
    statement = select(func.count()).select_from(table)
    return await database.read(lambda tx: int(tx.connection.execute(statement).scalar_one()))


async def take_lease(database: Database, holder: str, ttl: float = 60) -> bool:
    now = utcnow()
    return await database.write(lambda tx: tx.leases.acquire(LEASE, holder, now, ttl))


async def test_first_sync_mirrors_exactly_what_the_sandbox_lists(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Every listed category, product and SKU is mirrored; sample rows match the upstream field by field."""
    report = await sync(database, client)
    assert report.status == "ok", report.error
    expected = listed(sandbox)
    expected_skus = {sku["id"]: (pid, sku) for pid, product in expected.items() for sku in product["skus"]}
    assert (report.pages, report.products, report.skus) == (5, PRODUCTS, len(expected_skus))
    assert report.categories == len(sandbox.state.categories)
    assert report.rows_written == report.added == report.categories + report.products + report.skus
    assert report.removed == 0
    assert {row["id"] for row in await rows(database, mirror_products)} == set(expected)
    assert {row["id"] for row in await rows(database, mirror_skus)} == set(expected_skus)
    assert len(await rows(database, mirror_categories)) == len(sandbox.state.categories)

    for product_id in (1, 117, PRODUCTS):
        row = await one(database, mirror_products, product_id)
        sent = expected[product_id]
        for field in SEED_PRODUCT_FIELDS:
            assert row[field] == sent.get(field), field
        assert row["extra"] == {
            key: value for key, value in sent.items() if key not in (*SEED_PRODUCT_FIELDS, "id", "skus")
        }
        assert (row["removed_at"], row["synced_at"] is not None) == (None, True)
        for sku in sent["skus"]:
            sku_row = await one(database, mirror_skus, sku["id"])
            assert sku_row["product_id"] == product_id
            for field in SEED_SKU_FIELDS:
                assert sku_row[field] == sku.get(field), field
    discounted = next(sku for _, sku in expected_skus.values() if sku.get("member_price"))
    discounted_row = await one(database, mirror_skus, discounted["id"])
    assert (discounted_row["original_price"], discounted_row["member_price"]) == (
        discounted["original_price"],
        discounted["member_price"],
    )
    category = sandbox.state.categories[2].to_dict()
    category_row = await one(database, mirror_categories, 2)
    assert {field: category_row[field] for field in category if field != "id"} == {
        field: value for field, value in category.items() if field != "id"
    }
    assert category_row["is_active"] is True


async def test_first_pass_logs_no_additions_and_later_ones_do(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """The first pass of an upstream writes no change rows (a storefront loads the tables); a product added
    afterwards is logged as added, with its SKU."""
    first = await sync(database, client)
    assert first.added == first.rows_written > 0
    assert await count(database, mirror_changes) == 0
    added = sandbox.state.add_product(title="New")
    report = await sync(database, client)
    sku_id = sandbox.state.product(added).skus[0].id
    assert await changes(database, report.run_id) == [
        ("product", added, "added", None, None, None),
        ("sku", sku_id, "added", None, None, None),
    ]


async def test_unusable_sku_is_reported_on_every_pass_and_never_removed(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A SKU whose field does not fit its column is left out and reported by every pass, while its
    product and the other SKUs are mirrored; an unchanged second pass writes nothing."""
    product = sandbox.state.product(11)
    broken = product.skus[0]
    broken.sku_code = 12345  # type: ignore[assignment]
    problem = f"sku {broken.id} has a sku_code that is not text of up to 255: not mirrored"
    first = await sync(database, client)
    second = await sync(database, client)
    for report in (first, second):
        assert report.status == "ok"
        assert problem in report.violations
    assert second.rows_written == 0
    assert await rows(database, mirror_skus, id=broken.id) == []
    assert (await one(database, mirror_products, 11))["removed_at"] is None


async def test_unusable_category_is_reported_and_not_removed(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A category whose field does not fit its column is reported by the pass and stays as mirrored
    before: listed, it is not removed."""
    await sync(database, client)
    sandbox.state.categories[3].sort_order = "first"  # type: ignore[assignment]
    report = await sync(database, client, full=True)
    assert "category 3 has a sort_order that is not an integer: not mirrored" in report.violations
    assert (report.status, report.removed) == ("ok", 0)
    assert (await one(database, mirror_categories, 3))["removed_at"] is None


async def test_fields_beyond_the_seed_are_kept_in_extra(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """SKU fields the seed does not name (wholesale prices) land in extra unchanged."""
    await sync(database, client)
    with_extra = next(
        sku for product in listed(sandbox).values() for sku in product["skus"] if "wholesale_prices" in sku
    )
    row = await one(database, mirror_skus, with_extra["id"])
    assert row["extra"] == {"wholesale_prices": with_extra["wholesale_prices"]}


async def test_immediate_second_sync_writes_no_rows(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Syncing an unchanged upstream again writes 0 rows and logs no changes."""
    first = await sync(database, client)
    logged = await count(database, mirror_changes)
    second = await sync(database, client)
    assert second.status == "ok"
    assert (second.rows_written, second.added, second.changed, second.removed) == (0, 0, 0, 0)
    assert (second.products, second.skus) == (first.products, first.skus)
    assert await count(database, mirror_changes) == logged


async def test_price_stock_and_activity_changes_are_logged(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A new SKU price, new stock and a deactivated SKU each leave their change-log entries."""
    await sync(database, client)
    product = sandbox.state.product(7)
    priced, stocked, deactivated = product.skus[0], product.skus[1], product.skus[2]
    if not deactivated.is_active:
        sandbox.state.set_sku_active(deactivated.id, True)
        await sync(database, client)
    old_price, old_quantity = priced.price_amount, stocked.stock_quantity
    old_status = stocked.stock_status
    sandbox.state.set_sku_price(priced.id, "1234.50")
    sandbox.state.set_sku_stock(stocked.id, 5)
    sandbox.state.set_sku_active(deactivated.id, False)

    report = await sync(database, client)
    logged = await changes(database, report.run_id)
    assert ("sku", priced.id, "changed", "price_amount", old_price, "1234.50") in logged
    assert ("sku", stocked.id, "changed", "stock_quantity", str(old_quantity), "5") in logged
    if old_status != "low_stock":
        assert ("sku", stocked.id, "changed", "stock_status", old_status, "low_stock") in logged
    assert ("sku", deactivated.id, "removed", "is_active", "true", "false") in logged
    assert (await one(database, mirror_skus, priced.id))["price_amount"] == "1234.50"
    assert report.removed == 1


async def test_removed_product_and_inactive_sku_are_marked_and_come_back(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Unlisted rows get is_active false and removed_at; listed again they are restored (counted as
    restored, not added)."""
    await sync(database, client)
    gone = sandbox.state.product(12)
    gone_skus = [sku.id for sku in gone.skus if sku.is_active]
    hidden = next(sku for sku in sandbox.state.product(30).skus[1:] if sku.is_active)
    sandbox.state.remove_product(gone.id)
    sandbox.state.set_sku_active(hidden.id, False)

    removal = await sync(database, client)
    assert removal.status == "ok"
    assert removal.removed == 2 + len(gone_skus)
    for table, identity in (
        (mirror_products, gone.id),
        *((mirror_skus, sku) for sku in (*gone_skus, hidden.id)),
    ):
        row = await one(database, table, identity)
        assert (row["is_active"], row["removed_at"] is not None) == (False, True)
    assert ("product", gone.id, "removed", "is_active", "true", "false") in await changes(
        database, removal.run_id
    )

    sandbox.state.restore_product(gone.id)
    sandbox.state.set_sku_active(hidden.id, True)
    back = await sync(database, client)
    assert (back.restored, back.added) == (2 + len(gone_skus), 0)
    (run,) = await rows(database, sync_runs, id=back.run_id)
    assert (run["restored"], run["added"]) == (2 + len(gone_skus), 0)
    for table, identity in (
        (mirror_products, gone.id),
        *((mirror_skus, sku) for sku in (*gone_skus, hidden.id)),
    ):
        row = await one(database, table, identity)
        assert (row["is_active"], row["removed_at"]) == (True, None)
    logged = await changes(database, back.run_id)
    assert ("product", gone.id, "restored", "is_active", "false", "true") in logged
    assert ("sku", hidden.id, "restored", "is_active", "false", "true") in logged


async def test_removed_category_is_marked_removed(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A category the upstream stops listing is marked removed like products are."""
    await sync(database, client)
    empty_leaf = sandbox.state.add_category(0, "seasonal")
    await sync(database, client)
    del sandbox.state.categories[empty_leaf]
    report = await sync(database, client)
    row = await one(database, mirror_categories, empty_leaf)
    assert (row["is_active"], row["removed_at"] is not None) == (False, True)
    assert ("category", empty_leaf, "removed", "is_active", "true", "false") in await changes(
        database, report.run_id
    )


@pytest.mark.parametrize("fault", ["error", "malformed"])
async def test_failure_part_way_marks_nothing_removed(
    database: Database, sandbox: Sandbox, client: UpstreamClient, fault: str
) -> None:
    """When page 3 of 5 fails, the run is failed, nothing is removed and the error is recorded."""
    await sync(database, client)
    sandbox.state.remove_product(3)
    sandbox.state.set_sku_active(sandbox.state.product(4).skus[0].id, False)

    def break_page() -> None:
        if fault == "error":
            sandbox.faults.fail_next("products", count=10, status=500)
        else:
            sandbox.faults.malformed_next("products", count=10, body=b'{"ok": true, "items": [')

    report = await sync(database, HookedClient(client, {3: break_page}), concurrency=1)
    assert report.status == "failed"
    assert report.error is not None
    assert "products" in report.error
    assert report.removed == 0
    assert report.pages <= 2
    assert (await one(database, mirror_products, 3))["removed_at"] is None
    assert (await one(database, mirror_skus, sandbox.state.product(4).skus[0].id))["removed_at"] is None
    assert all(entry[2] != "removed" for entry in await changes(database, report.run_id))
    (run,) = await rows(database, sync_runs, id=report.run_id)
    assert (run["status"], run["error"], run["finished_at"] is not None) == ("failed", report.error, True)


async def test_repeated_early_failures_leave_the_database_usable(
    database: Database, sandbox: Sandbox
) -> None:
    """Syncs whose category request fails while the snapshot loads never leave the database locked."""
    # 1000 requests a second spaces the first requests so the failure lands while the snapshot loads.
    settings = UpstreamSettings(
        name=UPSTREAM,
        base_url=sandbox.base_url,
        api_key=sandbox.config.api_key,
        api_secret=sandbox.config.api_secret,
        max_requests_per_second=1000,
    )
    async with UpstreamClient(settings) as paced:
        await sync(database, paced)
        for _ in range(12):
            sandbox.faults.fail_next("categories", status=500)
            failed = await asyncio.wait_for(sync(database, paced), 20)
            assert failed.status == "failed"
            assert failed.error is not None
            assert "categories" in failed.error
        recovered = await asyncio.wait_for(sync(database, paced), 20)
    assert (recovered.status, recovered.rows_written) == ("ok", 0)


async def test_listing_that_shrinks_during_the_sync_removes_nothing(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A product total that changes between pages makes the listing untrustworthy: failed, nothing removed."""
    await sync(database, client)
    report = await sync(
        database, HookedClient(client, {3: lambda: sandbox.state.remove_product(2)}), concurrency=1
    )
    assert report.status == "failed"
    assert report.error is not None
    assert "total" in report.error
    assert report.removed == 0
    assert (await one(database, mirror_products, 2))["removed_at"] is None


async def test_clamped_page_size_is_followed(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Asking for 100 per page when the upstream answers 50 still mirrors every product, 50 a page."""
    report = await sync(database, client, page_size=100)
    assert report.status == "ok"
    assert (report.pages, report.products) == (5, PRODUCTS)
    assert sandbox.request_counts["products"] == 5
    assert len(await rows(database, mirror_products)) == PRODUCTS


async def test_category_rule_violations_are_recorded_not_fatal(
    database: Database, sandbox: Sandbox, client: UpstreamClient, caplog: pytest.LogCaptureFixture
) -> None:
    """A third category level, a product on a non-leaf and one on an unknown category are all reported."""
    top = next(category for category in sandbox.state.categories.values() if category.parent_id == 0)
    middle = sandbox.state.add_category(top.id, "middle")
    deep = sandbox.state.add_category(middle, "too-deep")
    sandbox.state.set_product_category(8, top.id)
    sandbox.state.set_product_category(9, 987654)

    report = await sync(database, client)
    assert report.status == "ok"
    expected = [
        f"category {deep} (too-deep) is more than two levels deep: "
        f"its parent {middle} is itself a sub-category",
        "product 9 is on unknown category 987654",
        f"product 8 is on category {top.id} ({top.slug}), which is not a leaf",
    ]
    assert sorted(report.violations) == sorted(expected)
    (run,) = await rows(database, sync_runs, id=report.run_id)
    assert run["violations"] == report.violations
    assert (await one(database, mirror_products, 9))["category_id"] == 987654
    warned = " ".join(record.getMessage() for record in caplog.records if record.levelname == "WARNING")
    assert all(violation in warned for violation in expected)


async def test_lease_held_elsewhere_skips_the_sync(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """While another instance holds the upstream's sync lease, a sync is skipped without touching the
    mirror or the upstream, and recorded in sync_runs as skipped."""
    assert await take_lease(database, "other-host:99")
    report = await sync(database, client)
    assert (report.status, report.error) == ("skipped", SKIPPED_BUSY)
    assert sum(sandbox.request_counts.values()) == 0
    (run,) = await rows(database, sync_runs)
    assert (run["id"], run["status"], run["error"]) == (report.run_id, "skipped", SKIPPED_BUSY)
    assert run["finished_at"] is not None
    assert await count(database, mirror_products) == 0
    assert await lease_holder(database, LEASE) == "other-host:99"
    assert await last_sync(database, UPSTREAM) is None


async def test_concurrent_syncs_of_one_upstream_run_one_at_a_time(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """Of two simultaneous syncs, one runs and the other is skipped (both recorded); the lease is free
    afterwards."""
    gate = asyncio.Event()
    runs = [asyncio.create_task(sync(database, GatedClient(client, gate), holder="same:1")) for _ in range(2)]
    done, pending = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
    gate.set()
    reports = [task.result() for task in done] + list(await asyncio.gather(*pending))
    assert sorted(report.status for report in reports) == ["ok", "skipped"]
    assert await lease_holder(database, LEASE) is None
    assert sorted(run["status"] for run in await rows(database, sync_runs)) == ["ok", "skipped"]


async def eventually(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Return once ``await predicate()`` is true; fail after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def lease_row(database: Database) -> dict[str, Any] | None:
    def read(tx: Tx) -> dict[str, Any] | None:
        row = (
            tx.connection.execute(select(leases_table).where(leases_table.c.name == LEASE)).mappings().first()
        )
        return None if row is None else dict(row)

    return await database.read(read)


async def test_lease_is_renewed_while_the_sync_runs(database: Database, client: UpstreamClient) -> None:
    """A sync that outlasts its lease's ttl keeps renewing it, and releases it when done."""
    gate = asyncio.Event()
    running = asyncio.create_task(sync(database, GatedClient(client, gate), lease_ttl_seconds=0.3))

    async def lease_taken() -> bool:
        return await lease_row(database) is not None

    await eventually(lease_taken)
    taken = await lease_row(database)
    assert taken is not None

    async def renewed() -> bool:
        row = await lease_row(database)
        return row is not None and row["expires_at"] > taken["expires_at"]

    await eventually(renewed)
    gate.set()
    report = await running
    assert report.status == "ok"
    assert await lease_row(database) is None


async def test_losing_the_lease_fails_the_sync_before_it_writes(
    database: Database, client: UpstreamClient, caplog: pytest.LogCaptureFixture
) -> None:
    """When another instance takes over the lease mid-run, the run fails and stops writing."""
    gate = asyncio.Event()
    running = asyncio.create_task(sync(database, GatedClient(client, gate), lease_ttl_seconds=0.3))

    async def lease_taken() -> bool:
        return await lease_row(database) is not None

    await eventually(lease_taken)
    await database.write(
        lambda tx: tx.connection.execute(
            update(leases_table)
            .where(leases_table.c.name == LEASE)
            .values(holder="thief:1", expires_at=utcnow() + timedelta(seconds=60))
        )
    )

    async def lease_lost_noticed() -> bool:
        return any("catalog.sync_lease_lost" in record.getMessage() for record in caplog.records)

    await eventually(lease_lost_noticed)
    gate.set()
    report = await running
    assert report.status == "failed"
    assert report.error == f"lease {LEASE} was taken by another instance"
    assert await count(database, mirror_categories) == 0
    assert await lease_holder(database, LEASE) == "thief:1"


async def test_cancelled_sync_is_recorded_as_failed_and_frees_the_lease(
    database: Database, client: UpstreamClient
) -> None:
    """A sync cancelled mid-run (daemon shutdown) closes its run as failed and releases its lease."""
    running = asyncio.create_task(sync(database, GatedClient(client, asyncio.Event())))

    async def run_started() -> bool:
        return await count(database, sync_runs) == 1

    await eventually(run_started)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    (run,) = await rows(database, sync_runs)
    assert (run["status"], run["error"]) == ("failed", "cancelled before it finished")
    assert await lease_row(database) is None


async def test_progress_reports_every_page(database: Database, client: UpstreamClient) -> None:
    """The progress callback counts stored pages up to the total the upstream announced."""
    seen: list[tuple[int, int]] = []
    await sync(database, client, progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (5, 5)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)
    assert {total for _, total in seen} == {5}


async def test_last_sync_reports_the_latest_run(database: Database, client: UpstreamClient) -> None:
    """last_sync reads back the most recent run exactly as run_sync reported it."""
    assert await last_sync(database, UPSTREAM) is None
    await sync(database, client)
    report = await sync(database, client)
    assert await last_sync(database, UPSTREAM) == report


async def test_last_sync_can_skip_the_running_pass(database: Database, client: UpstreamClient) -> None:
    """While a pass runs, last_sync shows it as running; finished=True shows the last one that ended."""
    done = await sync(database, client)
    gate = asyncio.Event()
    running = asyncio.create_task(sync(database, GatedClient(client, gate)))

    async def second_run_started() -> bool:
        return await count(database, sync_runs) == 2

    await eventually(second_run_started)
    current = await last_sync(database, UPSTREAM)
    assert current is not None
    assert current.status == "running"
    assert await last_sync(database, UPSTREAM, finished=True) == done
    gate.set()
    assert (await running).status == "ok"


async def test_refused_credentials_fail_the_run_without_leaking_the_secret(
    database: Database, sandbox: Sandbox
) -> None:
    """A wrong API secret fails the run; the recorded error names the problem, never the secret."""
    secret = "wrong-secret-a1b2c3d4e5"
    settings = UpstreamSettings(
        name=UPSTREAM,
        base_url=sandbox.base_url,
        api_key=sandbox.config.api_key,
        api_secret=secret,
        max_requests_per_second=10_000,
    )
    async with UpstreamClient(settings) as wrong:
        report = await sync(database, wrong)
    assert report.status == "failed"
    assert report.error is not None
    assert "invalid_signature" in report.error
    assert secret not in report.error
    assert await count(database, mirror_products) == 0


async def test_pages_answered_as_before_are_not_decoded_again(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """With the previous pass's pages remembered, a page answered byte for byte as before is not decoded;
    the page holding a change is, and the change is stored."""
    memory = PageMemory()
    first = await sync(database, client, pages=memory)
    assert (first.unchanged_pages, len(memory)) == (0, 5)
    sku = sandbox.state.product(7).skus[0]
    sandbox.state.set_sku_price(sku.id, "4321.00")

    second = await sync(database, client, pages=memory)
    assert (second.status, second.pages, second.unchanged_pages) == ("ok", 5, 4)
    assert (second.products, second.skus) == (first.products, first.skus)
    assert second.changed >= 1
    assert (await one(database, mirror_skus, sku.id))["price_amount"] == "4321.00"

    third = await sync(database, client, pages=memory)
    assert (third.unchanged_pages, third.rows_written, third.products) == (5, 0, first.products)


async def test_remembered_pages_still_let_a_full_pass_remove(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A product gone from the listing is marked removed by a pass that remembers the earlier pages."""
    memory = PageMemory()
    await sync(database, client, pages=memory)
    gone = sandbox.state.product(PRODUCTS)
    # One product out, one in, both on the last page: the total, and the pages before it, stay the same.
    sandbox.state.remove_product(gone.id)
    added = sandbox.state.add_product(title="Replacement")
    report = await sync(database, client, pages=memory)
    assert (report.status, report.unchanged_pages) == ("ok", 4)
    assert report.removed == 1 + len(gone.skus)
    assert (await one(database, mirror_products, gone.id))["removed_at"] is not None
    assert (await one(database, mirror_products, added))["removed_at"] is None


async def test_remembered_pages_are_not_trusted_after_another_pass(
    database: Database, client: UpstreamClient
) -> None:
    """After a pass that did not use the memory (another instance, an operator's ``catalog sync``), every
    page is decoded again."""
    memory = PageMemory()
    await sync(database, client, pages=memory)
    await sync(database, client)
    report = await sync(database, client, pages=memory)
    assert (report.status, report.unchanged_pages, report.rows_written) == ("ok", 0, 0)
    assert len(memory) == 5


async def test_a_failed_pass_forgets_the_remembered_pages(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """A pass that fails part way leaves nothing remembered: the next pass decodes every page."""
    memory = PageMemory()
    await sync(database, client, pages=memory)

    def break_page() -> None:
        sandbox.faults.fail_next("products", status=500)

    failed = await sync(database, HookedClient(client, {3: break_page}), concurrency=1, pages=memory)
    assert (failed.status, len(memory)) == ("failed", 0)
    report = await sync(database, client, pages=memory)
    assert (report.status, report.unchanged_pages) == ("ok", 0)


async def test_a_remembered_page_whose_rows_changed_is_fetched_again(
    database: Database, sandbox: Sandbox, client: UpstreamClient
) -> None:
    """When the mirror no longer holds a remembered page's products as listed (a row deleted by hand), the
    page is fetched again, decoded, and the row stored again."""
    memory = PageMemory()
    await sync(database, client, pages=memory)
    await database.write(
        lambda tx: tx.connection.execute(
            delete(mirror_products).where(mirror_products.c.upstream == UPSTREAM, mirror_products.c.id == 7)
        )
    )
    requests = sandbox.request_counts["products"]
    report = await sync(database, client, pages=memory)
    assert (report.status, report.unchanged_pages, report.added) == ("ok", 4, 1)
    assert sandbox.request_counts["products"] - requests == 6
    assert (await one(database, mirror_products, 7))["removed_at"] is None


LOCK_THE_LEASE = "SELECT 1 FROM leases WHERE name = :name FOR UPDATE"
LOCK_RUNNING_RUNS = "SELECT 1 FROM sync_runs WHERE upstream = :upstream AND status = 'running' FOR UPDATE"


@asynccontextmanager
async def writes_held(
    database: Database, database_url: str, locked_on_postgresql: str = LOCK_THE_LEASE
) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """Hold the pass's writes until the block is left; yields ``waiting()``: whether one is held. SQLite runs
    writes one at a time on its writer thread, so a write that blocks that thread holds every write after
    it; on PostgreSQL another connection locks rows with ``locked_on_postgresql`` (by default the upstream's
    expired sync lease, so that taking the lease waits)."""
    if database.dialect != "postgresql":
        entered, gate = threading.Event(), threading.Event()

        def block(tx: Tx) -> None:
            entered.set()
            gate.wait(timeout=30)

        blocker = asyncio.create_task(database.write(block))
        await wait_until(entered.is_set)
        before = database.counts.writes

        async def queued() -> bool:
            return database.counts.writes > before

        try:
            yield queued
        finally:
            gate.set()
            await blocker
        return
    engine = create_async_engine(database_url)
    connection = await engine.connect()
    await connection.begin()
    await connection.execute(text(locked_on_postgresql), {"name": LEASE, "upstream": UPSTREAM})

    async def blocked() -> bool:
        waits = await connection.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted"))
        return bool(waits.scalar_one())

    try:
        yield blocked
    finally:
        await connection.rollback()
        await connection.close()
        await engine.dispose()


async def test_a_pass_cancelled_while_taking_its_lease_gives_it_back(
    database: Database, database_url: str, client: UpstreamClient
) -> None:
    """A pass cancelled (a shutdown) while its lease is being taken does not leave the lease held until it
    expires: the taking runs to its end, the lease is given back, and the next pass runs."""
    assert await take_lease(database, "earlier-host:1", ttl=0.001)  # the lease row exists, expired
    async with writes_held(database, database_url) as waiting:
        cut_short = asyncio.create_task(sync(database, client))
        await wait_until(waiting)
        cut_short.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut_short
    assert await lease_holder(database, LEASE) is None
    report = await sync(database, client)
    assert report.status == "ok"


async def test_a_pass_cancelled_while_recording_its_run_records_it_cut_short(
    database: Database, database_url: str, client: UpstreamClient
) -> None:
    """A pass cancelled while its run is being recorded does not leave that run shown as running: the run is
    written all the same and then recorded as cut short (and the one a crashed pass left running as
    interrupted)."""
    if database.dialect != "postgresql":
        pytest.skip("SQLite runs writes one at a time: no gate holds the run's write without the lease's")
    crashed = await database.write(lambda tx: tx.mirror.start_run(UPSTREAM, utcnow()))
    async with writes_held(database, database_url, LOCK_RUNNING_RUNS) as waiting:
        cut_short = asyncio.create_task(sync(database, client))
        await wait_until(waiting)
        cut_short.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut_short
    runs = {run["id"]: (run["status"], run["error"]) for run in await rows(database, sync_runs)}
    assert runs.pop(crashed) == ("failed", INTERRUPTED_ERROR)
    assert list(runs.values()) == [("failed", CANCELLED)]
    assert await lease_holder(database, LEASE) is None
