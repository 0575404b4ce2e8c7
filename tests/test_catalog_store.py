"""The mirror's storage layer on a migrated database: batched writes, snapshot, change log, sync runs."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from procurd.core.catalog import (
    Existing,
    apply_plan,
    category_record,
    diff_listed,
    diff_unlisted,
    product_records,
    value_text,
)
from procurd.db import mirror_store
from procurd.db.mirror_store import INTERRUPTED_ERROR, RunTotals
from procurd.db.schema import mirror_changes, mirror_products, mirror_skus, sync_runs
from procurd.db.types import utcnow


def product_payload(product_id: int, price: str = "9.90", **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": product_id,
        "slug": f"p{product_id}",
        "title": {"en": f"Product {product_id}"},
        "description": None,
        "images": [],
        "tags": ["t"],
        "price_amount": price,
        "original_price": "12.00",
        "member_price": "9.90",
        "fulfillment_type": "manual",
        "manual_form_schema": {"fields": [{"key": "email"}]},
        "is_active": True,
        "category_id": 2,
        "skus": [
            {
                "id": product_id * 10,
                "sku_code": "A",
                "spec_values": {"size": "L"},
                "price_amount": price,
                "stock_status": "unlimited",
                "stock_quantity": -1,
                "is_active": True,
                "warehouse": "north",
            }
        ],
        "sales": 3,
    }
    payload.update(changes)
    return payload


def _as_text(snapshot: dict[int, Existing]) -> dict[int, tuple[str, bool, tuple[str | None, ...]]]:
    return {
        identity: (entry.content_hash, entry.removed, tuple(value_text(value) for value in entry.tracked))
        for identity, entry in snapshot.items()
    }


async def _run(engine: AsyncEngine, upstream: str = "main") -> int:
    return await mirror_store.start_run(engine, upstream, utcnow())


async def _write_products(
    engine: AsyncEngine, run_id: int, *payloads: dict[str, Any], upstream: str = "main"
) -> int:
    snapshot = await mirror_store.load_snapshot(engine, upstream)
    listed = [product_records(payload) for payload in payloads]
    plans = [
        diff_listed("product", [item.record for item in listed if item.record], snapshot["product"]),
        diff_listed("sku", [sku for item in listed for sku in item.skus], snapshot["sku"]),
    ]
    return await mirror_store.write_plans(engine, upstream, plans, run_id=run_id, now=utcnow())


async def test_inserted_rows_hold_every_field_exactly(engine: AsyncEngine) -> None:
    """A written product and SKU read back field by field: amounts as text, JSON intact, extras kept."""
    run_id = await _run(engine)
    assert await _write_products(engine, run_id, product_payload(1, price="10.10")) == 2
    async with engine.connect() as connection:
        product = (await connection.execute(select(mirror_products))).mappings().one()
        sku = (await connection.execute(select(mirror_skus))).mappings().one()
        null_description = (
            await connection.execute(text("SELECT description IS NULL FROM mirror_products"))
        ).scalar_one()
    assert product["upstream"] == "main"
    assert product["id"] == 1
    assert product["price_amount"] == "10.10"
    assert product["original_price"] == "12.00"
    assert product["member_price"] == "9.90"
    assert product["title"] == {"en": "Product 1"}
    assert product["manual_form_schema"] == {"fields": [{"key": "email"}]}
    assert product["extra"] == {"sales": 3}
    assert product["removed_at"] is None
    assert product["synced_at"] is not None
    assert bool(null_description)
    assert sku["product_id"] == 1
    assert sku["stock_quantity"] == -1
    assert sku["spec_values"] == {"size": "L"}
    assert sku["extra"] == {"warehouse": "north"}


async def test_snapshot_reflects_what_was_written(engine: AsyncEngine) -> None:
    """The snapshot loaded back equals the in-memory snapshot the diff maintained."""
    run_id = await _run(engine)
    listed = product_records(product_payload(1))
    assert listed.record is not None
    expected: dict[int, Existing] = {}
    plan = diff_listed("product", [listed.record], expected)
    await mirror_store.write_plans(engine, "main", [plan], run_id=run_id, now=utcnow())
    apply_plan(expected, plan)
    snapshot = await mirror_store.load_snapshot(engine, "main")
    assert _as_text(snapshot["product"]) == _as_text(expected)
    assert snapshot["sku"] == {}
    assert snapshot["category"] == {}


async def test_snapshots_are_kept_apart_by_upstream(engine: AsyncEngine) -> None:
    """Two upstreams may use the same ids without seeing each other's rows."""
    await _write_products(engine, await _run(engine, "one"), product_payload(1), upstream="one")
    await _write_products(engine, await _run(engine, "two"), product_payload(1, price="1.00"), upstream="two")
    one = await mirror_store.load_snapshot(engine, "one")
    two = await mirror_store.load_snapshot(engine, "two")
    assert one["product"][1].tracked[0] == "9.90"
    assert two["product"][1].tracked[0] == "1.00"


async def test_update_removal_and_restore_round_trip(engine: AsyncEngine) -> None:
    """Updates rewrite the row, removal marks it inactive with removed_at, a restore clears it again."""
    run_id = await _run(engine)
    await _write_products(engine, run_id, product_payload(1))
    assert await _write_products(engine, run_id, product_payload(1, price="5.00")) == 2

    snapshot = await mirror_store.load_snapshot(engine, "main")
    removal = diff_unlisted("product", snapshot["product"])
    assert await mirror_store.write_plans(engine, "main", [removal], run_id=run_id, now=utcnow()) == 1
    async with engine.connect() as connection:
        row = (await connection.execute(select(mirror_products))).mappings().one()
    assert row["price_amount"] == "5.00"
    assert row["is_active"] is False
    assert row["removed_at"] is not None
    assert (await mirror_store.load_snapshot(engine, "main"))["product"][1].removed

    await _write_products(engine, run_id, product_payload(1, price="5.00"))
    async with engine.connect() as connection:
        row = (await connection.execute(select(mirror_products))).mappings().one()
    assert row["is_active"] is True
    assert row["removed_at"] is None


async def test_changes_are_logged_in_order_with_the_run(engine: AsyncEngine) -> None:
    """Every planned change becomes a mirror_changes row with increasing seq and the run's id."""
    run_id = await _run(engine)
    await _write_products(engine, run_id, product_payload(1))
    await _write_products(engine, run_id, product_payload(1, price="5.00"))
    async with engine.connect() as connection:
        rows = (
            (await connection.execute(select(mirror_changes).order_by(mirror_changes.c.seq))).mappings().all()
        )
    assert [
        (row["entity"], row["kind"], row["field"], row["old_value"], row["new_value"]) for row in rows
    ] == [
        ("product", "added", None, None, None),
        ("sku", "added", None, None, None),
        ("product", "changed", "price_amount", "9.90", "5.00"),
        ("sku", "changed", "price_amount", "9.90", "5.00"),
    ]
    assert {row["sync_run_id"] for row in rows} == {run_id}
    assert all(row["upstream"] == "main" for row in rows)


async def test_empty_plans_touch_nothing(engine: AsyncEngine) -> None:
    """Writing plans without rows or changes writes nothing at all."""
    run_id = await _run(engine)
    plan = diff_listed("category", [], {})
    assert await mirror_store.write_plans(engine, "main", [plan], run_id=run_id, now=utcnow()) == 0
    async with engine.connect() as connection:
        assert (await connection.execute(select(func.count()).select_from(mirror_changes))).scalar_one() == 0


async def test_run_is_recorded_from_start_to_finish(engine: AsyncEngine) -> None:
    """A run starts as running and is closed with its counters, violations and removals in one go."""
    run_id = await _run(engine)
    started = await mirror_store.last_run(engine, "main")
    assert started is not None
    assert started["status"] == "running"
    category = category_record({"id": 5, "parent_id": 0, "slug": "c", "name": {}})
    await mirror_store.write_plans(
        engine, "main", [diff_listed("category", [category], {})], run_id=run_id, now=utcnow()
    )
    snapshot = await mirror_store.load_snapshot(engine, "main")
    removals = [diff_unlisted("category", snapshot["category"])]
    totals = RunTotals(pages=3, categories=0, products=7, skus=9, violations=["v"])
    totals.count(removals)
    written = await mirror_store.finish_run(
        engine,
        run_id,
        upstream="main",
        status="ok",
        finished_at=utcnow(),
        totals=totals,
        error=None,
        plans=removals,
    )
    assert written == 1
    finished = await mirror_store.last_run(engine, "main")
    assert finished is not None
    assert finished["status"] == "ok"
    assert (finished["pages"], finished["products"], finished["skus"]) == (3, 7, 9)
    assert (finished["removed"], finished["rows_written"]) == (1, 1)
    assert finished["violations"] == ["v"]
    assert finished["finished_at"] >= finished["started_at"]


async def test_interrupted_runs_are_closed_as_failed(engine: AsyncEngine) -> None:
    """Runs left running by a stopped process become failed; other upstreams' runs are untouched."""
    await _run(engine, "main")
    await _run(engine, "other")
    assert await mirror_store.close_interrupted_runs(engine, "main", utcnow()) == 1
    async with engine.connect() as connection:
        rows = (await connection.execute(select(sync_runs).order_by(sync_runs.c.id))).mappings().all()
    assert [(row["upstream"], row["status"], row["error"]) for row in rows] == [
        ("main", "failed", INTERRUPTED_ERROR),
        ("other", "running", None),
    ]


async def test_last_run_of_an_unknown_upstream_is_none(engine: AsyncEngine) -> None:
    """No runs, no last run."""
    assert await mirror_store.last_run(engine, "nobody") is None
