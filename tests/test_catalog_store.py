"""The mirror's storage layer on a migrated database: batched writes, snapshot, change log, sync runs."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select, text

from catalog_records import product_records
from procurd.core.catalog import (
    Entity,
    PassHistory,
    PassKind,
    Plan,
    Snapshot,
    apply_plan,
    category_record,
    diff_listed,
    diff_unlisted,
    log_changes,
)
from procurd.core.listing import RunOutcome, RunTotals
from procurd.db.database import Database
from procurd.db.mirror_store import INTERRUPTED_ERROR
from procurd.db.schema import mirror_changes, mirror_products, mirror_skus, sync_runs
from procurd.db.stores import Tx
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


def _entries(snapshot: Snapshot) -> dict[int, tuple[bytes | None, bool]]:
    return {identity: (snapshot.digest(identity), snapshot.removed(identity)) for identity in snapshot.ids()}


async def _run(database: Database, upstream: str = "main") -> int:
    now = utcnow()
    return await database.write(lambda tx: tx.mirror.start_run(upstream, now))


async def _snapshot(database: Database, upstream: str = "main") -> dict[Entity, Snapshot]:
    return await database.read(lambda tx: dict(tx.mirror.load_snapshot(upstream)))


def _finish_run(tx: Tx, run_id: int, outcome: RunOutcome) -> None:
    tx.mirror.finish_run(run_id, outcome)


async def _write(database: Database, run_id: int, *plans: Plan, upstream: str = "main") -> int:
    """Write plans as a pass does: change-log entries from the rows they rewrite."""
    now = utcnow()

    def write(tx: Tx) -> int:
        written = 0
        for plan in plans:
            known = tx.mirror.known_rows(upstream, plan.entity, plan.known_ids())
            log_changes(plan, known.tracked)
            written += tx.mirror.write_plan(upstream, plan, run_id=run_id, now=now)
        return written

    return await database.write(write)


async def _write_products(
    database: Database, run_id: int, *payloads: dict[str, Any], upstream: str = "main"
) -> int:
    snapshot = await _snapshot(database, upstream)
    listed = [product_records(payload) for payload in payloads]
    plans = [
        diff_listed("product", [item.record for item in listed if item.record], snapshot["product"]),
        diff_listed("sku", [sku for item in listed for sku in item.skus], snapshot["sku"]),
    ]
    return await _write(database, run_id, *plans, upstream=upstream)


async def _select(database: Database, statement: Any) -> list[dict[str, Any]]:
    return await database.read(lambda tx: [dict(row) for row in tx.connection.execute(statement).mappings()])


async def test_inserted_rows_hold_every_field_exactly(database: Database) -> None:
    """A written product and SKU read back field by field: amounts as text, JSON intact, extras kept."""
    run_id = await _run(database)
    assert await _write_products(database, run_id, product_payload(1, price="10.10")) == 2
    (product,) = await _select(database, select(mirror_products))
    (sku,) = await _select(database, select(mirror_skus))
    null_description = await database.read(
        lambda tx: tx.connection.execute(text("SELECT description IS NULL FROM mirror_products")).scalar_one()
    )
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


async def test_snapshot_reflects_what_was_written(database: Database) -> None:
    """The snapshot loaded back equals the in-memory snapshot the diff maintained."""
    run_id = await _run(database)
    listed = product_records(product_payload(1))
    assert listed.record is not None
    expected = Snapshot()
    plan = diff_listed("product", [listed.record], expected)
    await _write(database, run_id, plan)
    apply_plan(expected, plan)
    snapshot = await _snapshot(database)
    assert _entries(snapshot["product"]) == _entries(expected) == {1: (listed.record.digest, False)}
    assert len(snapshot["sku"]) == len(snapshot["category"]) == 0


async def test_snapshots_are_kept_apart_by_upstream(database: Database) -> None:
    """Two upstreams may use the same ids without seeing each other's rows."""
    await _write_products(database, await _run(database, "one"), product_payload(1), upstream="one")
    await _write_products(
        database, await _run(database, "two"), product_payload(1, price="1.00"), upstream="two"
    )
    one = await _snapshot(database, "one")
    two = await _snapshot(database, "two")
    assert one["product"].digest(1) != two["product"].digest(1)
    known = await database.read(lambda tx: tx.mirror.known_rows("two", "product", [1]))
    assert known.tracked == {1: ("1.00", "12.00", "9.90", True)}


async def test_update_removal_and_restore_round_trip(database: Database) -> None:
    """Updates rewrite the row, removal marks it inactive with removed_at, a restore clears it again."""
    run_id = await _run(database)
    await _write_products(database, run_id, product_payload(1))
    assert await _write_products(database, run_id, product_payload(1, price="5.00")) == 2

    snapshot = await _snapshot(database)
    removal = diff_unlisted("product", snapshot["product"])
    assert await _write(database, run_id, removal) == 1
    (row,) = await _select(database, select(mirror_products))
    assert row["price_amount"] == "5.00"
    assert row["is_active"] is False
    assert row["removed_at"] is not None
    assert (await _snapshot(database))["product"].removed(1)

    await _write_products(database, run_id, product_payload(1, price="5.00"))
    (row,) = await _select(database, select(mirror_products))
    assert row["is_active"] is True
    assert row["removed_at"] is None


async def test_changes_are_logged_in_order_with_the_run(database: Database) -> None:
    """Every planned change becomes a mirror_changes row with increasing seq and the run's id."""
    run_id = await _run(database)
    await _write_products(database, run_id, product_payload(1))
    await _write_products(database, run_id, product_payload(1, price="5.00"))
    rows = await _select(database, select(mirror_changes).order_by(mirror_changes.c.seq))
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


async def test_empty_plans_touch_nothing(database: Database) -> None:
    """Writing plans without rows or changes writes nothing at all."""
    run_id = await _run(database)
    plan = diff_listed("category", [], Snapshot())
    assert await _write(database, run_id, plan) == 0
    changes = await database.read(
        lambda tx: tx.connection.execute(select(func.count()).select_from(mirror_changes)).scalar_one()
    )
    assert changes == 0


async def test_run_is_recorded_from_start_to_finish(database: Database) -> None:
    """A run starts as running and is closed with its kind, counters, violations and error."""
    run_id = await _run(database)
    started = await database.read(lambda tx: tx.mirror.last_run("main"))
    assert started is not None
    assert (started["status"], started["kind"]) == ("running", "full")
    category = category_record({"id": 5, "parent_id": 0, "slug": "c", "name": {}})
    await _write(database, run_id, diff_listed("category", [category], Snapshot()))
    snapshot = await _snapshot(database)
    removals = [diff_unlisted("category", snapshot["category"])]
    assert await _write(database, run_id, *removals) == 1
    totals = RunTotals(pages=3, categories=0, products=7, skus=9, violations=["v"])
    totals.count(removals)
    outcome = RunOutcome("ok", "incremental", utcnow(), totals, None, ignored_updated_after=True)
    await database.write(lambda tx: tx.mirror.finish_run(run_id, outcome))
    finished = await database.read(lambda tx: tx.mirror.last_run("main"))
    assert finished is not None
    assert (finished["status"], finished["kind"], finished["ignored_updated_after"]) == (
        "ok",
        "incremental",
        True,
    )
    assert (finished["pages"], finished["products"], finished["skus"]) == (3, 7, 9)
    assert (finished["removed"], finished["rows_written"], finished["restored"]) == (1, 1, 0)
    assert finished["violations"] == ["v"]
    assert finished["finished_at"] >= finished["started_at"]


async def test_pass_history_tells_the_last_complete_and_full_passes(database: Database) -> None:
    """Only ok and suspicious passes count as complete; the last full one and the last that saw the
    upstream ignore updated_after are told apart."""
    assert await database.read(lambda tx: tx.mirror.pass_history("main")) == PassHistory()
    runs = []
    passes: tuple[tuple[str, PassKind, bool], ...] = (
        ("ok", "full", False),
        ("suspicious", "incremental", True),
        ("failed", "full", False),
    )
    for status, kind, ignored in passes:
        run_id = await _run(database)
        outcome = RunOutcome(status, kind, utcnow(), RunTotals(), None, ignored_updated_after=ignored)
        await database.write(_finish_run, run_id, outcome)
        runs.append(await database.read(lambda tx: tx.mirror.last_run("main")))
    history = await database.read(lambda tx: tx.mirror.pass_history("main"))
    full, incremental, _ = runs
    assert full is not None
    assert incremental is not None
    assert history.last_full_at == full["started_at"]
    assert history.last_complete_at == incremental["started_at"]
    assert history.ignored_updated_after_at == incremental["started_at"]


async def test_interrupted_runs_are_closed_as_failed(database: Database) -> None:
    """Runs left running by a stopped process become failed; other upstreams' runs are untouched."""
    await _run(database, "main")
    await _run(database, "other")
    now = utcnow()
    assert await database.write(lambda tx: tx.mirror.close_interrupted_runs("main", now)) == 1
    rows = await _select(database, select(sync_runs).order_by(sync_runs.c.id))
    assert [(row["upstream"], row["status"], row["error"]) for row in rows] == [
        ("main", "failed", INTERRUPTED_ERROR),
        ("other", "running", None),
    ]


async def test_last_run_of_an_unknown_upstream_is_none(database: Database) -> None:
    """No runs, no last run."""
    assert await database.read(lambda tx: tx.mirror.last_run("nobody")) is None
