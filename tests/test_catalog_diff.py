"""The pure catalogue diff: records from upstream payloads, what to write, the change log, and the choice
of pass."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from catalog_records import product_payload, product_records, sku_payload
from procurd.core.catalog import (
    CATEGORY_FIELDS,
    ENTITIES,
    INCREMENTAL_OVERLAP,
    PRODUCT_FIELDS,
    ROW_FIELDS,
    SKU_FIELDS,
    TRACKED_FIELDS,
    CategoryRules,
    Change,
    IncompleteRecord,
    PassHistory,
    Record,
    Snapshot,
    apply_plan,
    category_record,
    choose_pass,
    deactivated,
    diff_listed,
    diff_unlisted,
    digest_of,
    log_changes,
    older_than_asked,
    removal_guard,
    rfc3339,
    sku_record,
    total_suggests_full_listing,
    value_text,
)
from procurd.db.schema import mirror_categories, mirror_products, mirror_skus

BOOKKEEPING = {"upstream", "id", "synced_at", "removed_at", "extra", "content_hash"}
SELLING = {"sell_price", "sell_currency", "price_held_at", "held_cost"}


def snapshot_of(*records: Record, removed: bool = False) -> Snapshot:
    snapshot = Snapshot()
    for record in records:
        snapshot.load(record.id, record.digest, removed)
    return snapshot


# Tracked values of a SKU as the mirror stores them (price_amount ... is_active).
STORED_SKU = ("9.90", None, None, "in_stock", 50, True)


def test_row_fields_match_the_schema_columns() -> None:
    """Every seed field has a mirror column of the same name and every data column is filled by a record."""
    for entity, table in zip(ENTITIES, (mirror_categories, mirror_products, mirror_skus), strict=True):
        assert set(ROW_FIELDS[entity]) == {column.name for column in table.c} - BOOKKEEPING - SELLING
    assert set(CATEGORY_FIELDS) <= set(ROW_FIELDS["category"])
    assert set(PRODUCT_FIELDS) <= set(ROW_FIELDS["product"])
    assert set(SKU_FIELDS) <= set(ROW_FIELDS["sku"])


def test_product_payload_becomes_product_and_sku_records() -> None:
    """A product's seed fields land in its columns, its SKUs become records carrying product_id."""
    listed = product_records(product_payload(7))
    assert listed.record is not None
    assert listed.record.values["title"] == {"en": "Gift card", "zh-CN": "礼品卡"}
    assert listed.record.values["price_amount"] == "9.90"
    assert listed.record.values["original_price"] is None
    assert "skus" not in listed.record.values
    assert [sku.id for sku in listed.skus] == [71, 72]
    assert listed.sku_ids == (71, 72)
    assert all(sku.values["product_id"] == 7 for sku in listed.skus)
    assert listed.problems == ()


def test_fields_beyond_the_seed_go_to_extra() -> None:
    """Unknown fields are kept under extra; a record without any has no extra."""
    listed = product_records(product_payload(1, sales_count=12, badge={"en": "hot"}))
    assert listed.record is not None
    assert listed.record.values["extra"] == {"sales_count": 12, "badge": {"en": "hot"}}
    assert listed.skus[0].values["extra"] is None


def test_amounts_keep_their_exact_text() -> None:
    """Amount strings pass through unchanged, and Decimals become their exact text."""
    listed = product_records(
        product_payload(1, price_amount="10.00", skus=[sku_payload(5, price_amount=Decimal("0.10"))])
    )
    assert listed.record is not None
    assert listed.record.values["price_amount"] == "10.00"
    assert listed.skus[0].values["price_amount"] == "0.10"


def test_category_defaults_fill_missing_optional_fields() -> None:
    """A category that leaves out icon and sort_order still makes a complete, active row."""
    record = category_record({"id": 3, "parent_id": 0, "slug": "games", "name": {"en": "Games"}})
    assert record.values["icon"] == ""
    assert record.values["sort_order"] == 0
    assert record.values["is_active"] is True


def test_digest_ignores_key_order_but_not_values() -> None:
    """The content digest depends on what was sent (and where), not on the order of the keys."""
    assert digest_of({"a": 1, "b": {"y": 1, "x": 2}}) == digest_of({"b": {"x": 2, "y": 1}, "a": 1})
    assert digest_of({"a": 1}) != digest_of({"a": 2})
    assert digest_of({"a": 1}, 7) != digest_of({"a": 1}, 8)
    assert digest_of({"a": Decimal("1.10")}) == digest_of({"a": "1.10"})
    assert len(digest_of({})) == 16


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("stock_quantity", "5", "has a stock_quantity that is not an integer"),
        ("stock_quantity", True, "has a stock_quantity that is not an integer"),
        ("stock_quantity", 2**63, "has a stock_quantity that is not an integer"),
        ("is_active", 1, "has an is_active that is not true or false"),
        ("price_amount", "9,90", "has a price_amount that is not a decimal amount"),
        ("price_amount", 9.9, "has a price_amount that is not a decimal amount"),
        ("price_amount", "1" * 41, "has a price_amount that is not a decimal amount"),
        ("stock_status", "s" * 17, "has a stock_status that is not text of up to 16"),
        ("sku_code", 12, "has a sku_code that is not text of up to 255"),
    ],
)
def test_values_a_column_cannot_hold_make_the_record_unusable(field: str, value: Any, reason: str) -> None:
    """A SKU whose field does not fit its column is not mirrored, with the field named."""
    with pytest.raises(IncompleteRecord) as raised:
        sku_record(sku_payload(5, **{field: value}), 1)
    assert str(raised.value) == f"sku 5 {reason}: not mirrored"


def test_integer_and_exact_decimal_amounts_become_text() -> None:
    """An amount sent as an integer or read as an exact Decimal is stored as its plain decimal text."""
    assert sku_record(sku_payload(5, price_amount=10), 1).values["price_amount"] == "10"
    assert sku_record(sku_payload(5, price_amount=Decimal("1E+2")), 1).values["price_amount"] == "100"


def test_product_without_a_price_is_reported_not_mirrored() -> None:
    """A product lacking price_amount has no record, but its id and SKU ids still count as listed."""
    payload = product_payload(4)
    del payload["price_amount"]
    listed = product_records(payload)
    assert listed.record is None
    assert listed.skus == []
    assert listed.sku_ids == (41, 42)
    assert listed.problems == ("product 4 lacks price_amount: not mirrored",)


def test_sku_without_stock_is_reported_and_skipped() -> None:
    """One unusable SKU is left out while the product and its other SKUs are mirrored."""
    bad = sku_payload(2)
    del bad["stock_quantity"]
    listed = product_records(product_payload(1, skus=[sku_payload(1), bad]))
    assert listed.record is not None
    assert [sku.id for sku in listed.skus] == [1]
    assert listed.sku_ids == (1, 2)
    assert listed.problems == ("sku 2 lacks stock_quantity: not mirrored",)


def test_new_records_are_inserted_with_added_entries() -> None:
    """Against an empty snapshot every record is an insert logged as added."""
    listed = product_records(product_payload(1))
    plan = diff_listed("sku", listed.skus, Snapshot())
    assert [record.id for record in plan.inserts] == [11, 12]
    assert log_changes(plan, {}) == [Change("sku", 11, "added"), Change("sku", 12, "added")]
    assert plan.rows == 2
    assert plan.added == 2


def test_first_pass_additions_are_not_logged() -> None:
    """Without additions logged (an upstream's first pass) new rows leave no change entries."""
    plan = diff_listed("sku", product_records(product_payload(1)).skus, Snapshot())
    assert log_changes(plan, {}, log_additions=False) == []
    assert plan.added == 2


def test_unchanged_records_write_nothing() -> None:
    """Records whose digest matches the snapshot produce no writes and no changes."""
    listed = product_records(product_payload(1))
    assert listed.record is not None
    plan = diff_listed("product", [listed.record], snapshot_of(listed.record))
    assert plan.rows == 0
    assert plan.changes == []


def test_price_and_stock_changes_are_logged_field_by_field() -> None:
    """A changed SKU is updated and each tracked field that moved gets one changed entry."""
    before = product_records(product_payload(1)).skus[0]
    after = product_records(
        product_payload(
            1,
            skus=[
                sku_payload(
                    11, price_amount="8.50", stock_quantity=3, stock_status="low_stock", original_price="9.90"
                )
            ],
        )
    ).skus[0]
    plan = diff_listed("sku", [after], snapshot_of(before))
    assert plan.updates == [after]
    assert log_changes(plan, {11: STORED_SKU}) == [
        Change("sku", 11, "changed", "price_amount", "9.90", "8.50"),
        Change("sku", 11, "changed", "original_price", None, "9.90"),
        Change("sku", 11, "changed", "stock_status", "in_stock", "low_stock"),
        Change("sku", 11, "changed", "stock_quantity", "50", "3"),
    ]


def test_untracked_change_updates_without_log_entries() -> None:
    """A new title rewrites the row but is not a price, stock or activity change."""
    before = product_records(product_payload(1)).record
    after = product_records(product_payload(1, title={"en": "New"})).record
    assert before is not None
    assert after is not None
    plan = diff_listed("product", [after], snapshot_of(before))
    assert plan.updates == [after]
    assert log_changes(plan, {1: ("9.90", None, None, True)}) == []


def test_activity_change_is_logged() -> None:
    """A SKU listed as inactive logs is_active true to false."""
    before = product_records(product_payload(1)).skus[0]
    after = product_records(product_payload(1, skus=[sku_payload(11, is_active=False)])).skus[0]
    plan = diff_listed("sku", [after], snapshot_of(before))
    assert log_changes(plan, {11: STORED_SKU}) == [Change("sku", 11, "changed", "is_active", "true", "false")]


def test_unlisted_rows_are_removed() -> None:
    """Rows a complete listing did not mark are removed with an is_active entry; removed rows stay so."""
    skus = product_records(product_payload(1)).skus
    snapshot = snapshot_of(*skus)
    snapshot.load(99, b"\xab" * 16, True)
    assert snapshot.mark_listed(11)
    plan = diff_unlisted("sku", snapshot)
    assert plan.removals == [12]
    assert log_changes(plan, {12: STORED_SKU}) == [Change("sku", 12, "removed", "is_active", "true", "false")]
    assert plan.removed == 1


def test_marking_an_id_twice_reports_the_repeat() -> None:
    """The first mark of a held id succeeds, a second one says it was already listed; unknown ids pass."""
    record = product_records(product_payload(1)).skus[0]
    snapshot = snapshot_of(record)
    assert snapshot.mark_listed(11)
    assert not snapshot.mark_listed(11)
    assert snapshot.listed(11)
    assert snapshot.digest(11) == record.digest
    assert not snapshot.needs_write(11, record.digest)
    assert snapshot.mark_listed(404)
    assert 404 not in snapshot


def test_written_records_count_as_listed() -> None:
    """After a plan is applied, its records are listed and so never removed by the same pass."""
    listed = product_records(product_payload(1))
    snapshot = Snapshot()
    apply_plan(snapshot, diff_listed("sku", listed.skus, snapshot))
    assert all(snapshot.listed(identity) for identity in snapshot.ids())
    assert diff_unlisted("sku", snapshot).removals == []


def test_reappearing_rows_are_restored() -> None:
    """A removed row listed again is rewritten, logged as restored, plus any tracked field that moved."""
    before = product_records(product_payload(1)).skus[0]
    snapshot = snapshot_of(before)
    apply_plan(snapshot, diff_unlisted("sku", snapshot))
    assert snapshot.removed(11)
    again = product_records(product_payload(1, skus=[sku_payload(11, price_amount="7.00")])).skus[0]
    plan = diff_listed("sku", [again], snapshot)
    assert plan.restores == [again]
    removed_row = (*STORED_SKU[:-1], False)
    assert log_changes(plan, {11: removed_row}) == [
        Change("sku", 11, "restored", "is_active", "false", "true"),
        Change("sku", 11, "changed", "price_amount", "9.90", "7.00"),
    ]
    assert (plan.restored, plan.added) == (1, 0)


def test_restore_with_identical_content_still_writes() -> None:
    """A row restored with the same digest is rewritten so removed_at is cleared."""
    record = product_records(product_payload(1)).record
    assert record is not None
    plan = diff_listed("product", [record], snapshot_of(record, removed=True))
    assert plan.restores == [record]


def test_apply_plan_makes_a_second_diff_empty() -> None:
    """After applying a plan to the snapshot, the same records diff to nothing."""
    listed = product_records(product_payload(1))
    snapshot = Snapshot()
    apply_plan(snapshot, diff_listed("sku", listed.skus, snapshot))
    assert diff_listed("sku", listed.skus, snapshot).rows == 0


def test_stored_tracked_values_compare_as_text() -> None:
    """Stored tracked values (numbers, booleans) log the same text as the upstream's values."""
    sku = product_records(product_payload(1)).skus[0]
    assert tuple(value_text(value) for value in STORED_SKU) == sku.tracked


@pytest.mark.parametrize(
    ("value", "text"), [(True, "true"), (False, "false"), (None, None), (-1, "-1"), ("9.90", "9.90")]
)
def test_value_text(value: object, text: str | None) -> None:
    """Change-log values are text: booleans lower-case, numbers and strings as written."""
    assert value_text(value) == text


def _rules(*categories: tuple[int, int]) -> CategoryRules:
    return CategoryRules.from_records(
        category_record({"id": identity, "parent_id": parent, "slug": f"c{identity}", "name": {}})
        for identity, parent in categories
    )


def test_two_level_categories_break_no_rule() -> None:
    """Top-level and sub-categories with products on leaves are fine."""
    rules = _rules((1, 0), (2, 1), (3, 0))
    assert rules.category_violations() == []
    assert rules.product_violation(10, 2) is None
    assert rules.product_violation(11, 3) is None


def test_third_level_and_orphan_categories_are_violations() -> None:
    """A sub-category of a sub-category and a category under an unlisted parent are reported."""
    rules = _rules((1, 0), (2, 1), (3, 2), (4, 99))
    assert rules.category_violations() == [
        "category 3 (c3) is more than two levels deep: its parent 2 is itself a sub-category",
        "category 4 (c4) has parent 99, which is not listed",
    ]


def test_products_on_unknown_or_non_leaf_categories_are_violations() -> None:
    """Products must sit on a listed leaf category."""
    rules = _rules((1, 0), (2, 1))
    assert rules.product_violation(10, 1) == "product 10 is on category 1 (c1), which is not a leaf"
    assert rules.product_violation(11, 42) == "product 11 is on unknown category 42"


NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)


def _history(
    *,
    last_complete_at: timedelta | None = None,
    last_full_at: timedelta | None = None,
    ignored_updated_after_at: timedelta | None = None,
) -> PassHistory:
    def moment(age: timedelta | None) -> datetime | None:
        return None if age is None else NOW - age

    return PassHistory(
        last_complete_at=moment(last_complete_at),
        last_full_at=moment(last_full_at),
        ignored_updated_after_at=moment(ignored_updated_after_at),
    )


RECENT = _history(last_complete_at=timedelta(minutes=10), last_full_at=timedelta(hours=2))
STALE_FULL = _history(last_complete_at=timedelta(minutes=10), last_full_at=DAY)
IGNORED = _history(
    last_complete_at=timedelta(minutes=10),
    last_full_at=timedelta(hours=2),
    ignored_updated_after_at=timedelta(hours=1),
)
IGNORED_LONG_AGO = _history(
    last_complete_at=timedelta(minutes=10),
    last_full_at=timedelta(hours=2),
    ignored_updated_after_at=timedelta(days=2),
)


@pytest.mark.parametrize(
    ("mode", "history", "force", "kind"),
    [
        ("auto", _history(), False, "full"),
        ("auto", RECENT, False, "incremental"),
        ("on", RECENT, False, "incremental"),
        ("off", RECENT, False, "full"),
        ("auto", RECENT, True, "full"),
        ("auto", STALE_FULL, False, "full"),
        ("auto", IGNORED, False, "full"),
        ("on", IGNORED, False, "incremental"),
        ("auto", IGNORED_LONG_AGO, False, "incremental"),
    ],
)
def test_choice_of_pass(mode: Any, history: PassHistory, force: bool, kind: str) -> None:
    """Full when asked, when off, without a complete full pass within the interval, or (auto) after the
    upstream ignored updated_after within it; incremental otherwise."""
    plan = choose_pass(history, NOW, mode=mode, full_interval=DAY, force_full=force)
    assert plan.kind == kind
    if kind == "incremental":
        assert history.last_complete_at is not None
        assert plan.updated_after == history.last_complete_at - INCREMENTAL_OVERLAP
    else:
        assert plan.updated_after is None


def test_rfc3339_is_utc_whole_seconds() -> None:
    """updated_after is sent in UTC, rounded down to the second."""
    moment = datetime(2026, 11, 24, 4, 5, 9, 999_000, tzinfo=timezone(timedelta(hours=8)))
    assert rfc3339(moment) == "2026-11-23T20:05:09Z"


def test_products_older_than_asked_prove_the_filter_was_ignored() -> None:
    """A product updated before updated_after (offsets respected) is proof; unreadable times prove nothing."""
    since = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    fresh = {"id": 1, "updated_at": "2026-11-23T20:00:00+08:00"}
    unreadable = {"id": 2, "updated_at": "yesterday"}
    naive = {"id": 3, "updated_at": "2020-01-01T00:00:00"}
    old = {"id": 4, "updated_at": "2026-11-23T19:59:59+08:00"}
    assert older_than_asked([fresh, unreadable, naive], since) is None
    assert older_than_asked([fresh, old], since) == 4


def test_total_as_long_as_the_catalogue_suggests_an_unfiltered_answer() -> None:
    """A total covering every mirrored product of a catalogue longer than one page looks unfiltered."""
    assert total_suggests_full_listing(total=1000, live_products=1000, page_size=50)
    assert not total_suggests_full_listing(total=12, live_products=1000, page_size=50)
    assert not total_suggests_full_listing(total=30, live_products=30, page_size=50)


@pytest.mark.parametrize(
    ("removed", "live", "total", "allowed", "blocked"),
    [
        (0, 100, 100, False, False),
        (20, 100, 80, False, False),
        (21, 100, 79, False, True),
        (21, 100, 79, True, False),
        (1, 100, 0, False, True),
        (0, 0, 0, False, False),
    ],
)
def test_removal_guard(removed: int, live: int, total: int, allowed: bool, blocked: bool) -> None:
    """More than the allowed share of live products, or any when nothing is listed, is blocked unless
    mass removal is allowed."""
    guard = removal_guard(
        products_removed=removed, live_products=live, total_listed=total, max_fraction=0.2, allowed=allowed
    )
    assert guard.blocked == blocked
    if blocked:
        assert guard.reason is not None
        assert "--allow-mass-removal" in guard.reason


@pytest.mark.parametrize(
    ("removed", "deactivated", "total", "blocked", "said"),
    [
        (0, 20, None, False, None),
        (0, 21, None, True, "take 21 of 100 live products off sale"),
        (10, 11, 90, True, "remove 10 and take 11 more of 100 live products off sale"),
        (10, 10, 90, False, None),
        (0, 1, None, False, None),  # an incremental listing of one product is no empty listing
    ],
)
def test_removal_guard_counts_what_a_pass_takes_off_sale(
    removed: int, deactivated: int, total: int | None, blocked: bool, said: str | None
) -> None:
    """Products listed inactive that the mirror holds on sale count with the removals against the allowed
    share; an incremental pass (no total of the whole catalogue) is never taken for an empty listing."""
    guard = removal_guard(
        products_removed=removed,
        products_deactivated=deactivated,
        live_products=100,
        total_listed=total,
        max_fraction=0.2,
        allowed=False,
    )
    assert guard.blocked == blocked
    if said is not None:
        assert guard.reason is not None
        assert said in guard.reason
        assert "nothing was removed or taken off sale" in guard.reason


def test_deactivated_are_the_products_the_mirror_holds_active() -> None:
    """Of the products a pass lists inactive, those whose stored is_active is true are taken off sale."""
    active = TRACKED_FIELDS["product"].index("is_active")

    def stored(is_active: object) -> tuple[object, ...]:
        values: list[object] = [None] * len(TRACKED_FIELDS["product"])
        values[active] = is_active
        return tuple(values)

    assert deactivated({3: stored(True), 1: stored(1), 2: stored(False), 4: stored(0)}) == [1, 3]
