"""The bookkeeping of a catalogue pass, without a database: what a listing is checked against the mirror's
snapshot, which records it writes, when it is complete, and what it removes or takes off sale at its end."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from catalog_records import product_payload, sku_payload
from procurd.core.catalog import (
    ENTITIES,
    Change,
    Entity,
    Plan,
    Snapshot,
    product_digest,
    product_record,
    sku_digest,
    sku_record,
)
from procurd.core.listing import (
    MAX_PAGE_SIZE,
    MAX_VIOLATIONS,
    Batch,
    IncompleteListing,
    ListedProduct,
    Listing,
    ListingSaid,
    RunTotals,
    Written,
)

CATEGORY = {"id": 11, "parent_id": 0, "slug": "cards", "name": {"en": "Cards"}}
# Tracked values of a product as stored (price_amount, original_price, member_price, is_active).
ON_SALE = ("9.90", None, None, True)
OFF_SALE = ("9.90", None, None, False)


@dataclass(frozen=True)
class Page:
    """What the bookkeeping reads of an answered page."""

    page: int
    total: int
    page_size: int
    includes_inactive: bool | None = None


def mirrored(*payloads: dict[str, Any]) -> dict[Entity, Snapshot]:
    """The mirror's snapshot when it holds ``payloads`` as they are listed now (live)."""
    snapshot = {entity: Snapshot() for entity in ENTITIES}
    for payload in payloads:
        snapshot["product"].load(payload["id"], product_digest(payload), False)
        for sku in payload["skus"]:
            snapshot["sku"].load(sku["id"], sku_digest(sku, payload["id"]), False)
    return snapshot


def listing_over(snapshot: dict[Entity, Snapshot]) -> tuple[Listing, list[str]]:
    """A listing against ``snapshot`` whose categories are listed; and the violations it reports."""
    violations: list[str] = []
    listing = Listing(violations.append)
    listing.load(snapshot)
    listing.categories([CATEGORY])
    return listing, violations


def take(listing: Listing, *payloads: dict[str, Any], includes_inactive: bool | None = None) -> bool:
    """One page of ``payloads`` stored as a pass stores it (decoded, noted, written); whether every product
    of it is held as listed."""
    batch = Batch()
    products = [ListedProduct.of(payload, listing.snapshot) for payload in payloads]
    as_listed = listing.take(batch, products, includes_inactive)
    listing.stored(listing.plans(batch))
    return as_listed


def ids(plan: Plan) -> dict[str, list[int]]:
    writes = {
        "inserts": [record.id for record in plan.inserts],
        "updates": [record.id for record in plan.updates],
        "restores": [record.id for record in plan.restores],
        "removals": plan.removals,
    }
    return {kind: listed for kind, listed in writes.items() if listed}


def test_products_held_as_listed_are_only_noted_and_the_others_become_records() -> None:
    """Product 1 as mirrored is only counted; product 2, one SKU of it repriced, is rewritten with that SKU
    alone; product 3, new, is inserted with its SKUs. Once written, the snapshot holds them as listed."""
    one, two = product_payload(1), product_payload(2)
    listing, violations = listing_over(mirrored(one, two))
    changed = product_payload(2, skus=[sku_payload(21, price_amount="12.00"), sku_payload(22)])
    batch = Batch()
    products = [ListedProduct.of(payload, listing.snapshot) for payload in (one, changed, product_payload(3))]
    assert products[0].changes is None
    assert listing.take(batch, products, None) is True
    plans = listing.plans(batch)
    assert [(plan.entity, ids(plan)) for plan in plans] == [
        ("product", {"inserts": [3], "updates": [2]}),
        ("sku", {"inserts": [31, 32], "updates": [21]}),
    ]
    assert listing.counts == {"category": 1, "product": 3, "sku": 6}
    listing.stored(plans)
    assert all(listing.snapshot["product"].listed(identity) for identity in (1, 2, 3))
    assert not listing.snapshot["product"].needs_write(3, product_digest(product_payload(3)))
    assert violations == []


def test_a_product_listed_twice_is_counted_once_and_its_page_not_taken_as_listed() -> None:
    """A listing that shifts under the pass repeats products: in one batch, on a later batch, mirrored or
    new. Each counts once, and a page that repeats one is not remembered as stored."""
    one = product_payload(1)
    listing, _ = listing_over(mirrored(one))
    new = product_payload(2)
    batch = Batch()
    repeated = [ListedProduct.of(payload, listing.snapshot) for payload in (one, new, new)]
    assert listing.take(batch, repeated, None) is False
    listing.stored(listing.plans(batch))
    assert take(listing, one) is False
    assert take(listing, new) is False
    assert listing.counts == {"category": 1, "product": 2, "sku": 4}


def test_a_product_that_cannot_be_mirrored_is_a_violation_counted_once() -> None:
    """A product without a price is reported once and not written, however often the pass sees it listed;
    one on an unknown category is written and reported."""
    listing, violations = listing_over(mirrored())
    unpriced = product_payload(4, price_amount=None)
    assert take(listing, unpriced) is False
    assert take(listing, unpriced) is False
    assert take(listing, product_payload(5, category_id=99)) is True
    assert violations == ["product 4 lacks price_amount: not mirrored", "product 5 is on unknown category 99"]
    assert 4 not in listing.snapshot["product"]
    assert 5 in listing.snapshot["product"]
    assert listing.counts["product"] == 2


def test_products_listed_inactive_are_held_back_and_guarded_with_the_removals() -> None:
    """A listing that includes inactive products and lists product 1 inactive while the mirror has it on sale
    writes it only at the end, counted by the guard as taken off sale; one the mirror has off sale already
    is written all the same and takes nothing off sale."""
    one, two = product_payload(1), product_payload(2)
    listing, _ = listing_over(mirrored(one, two))
    assert take(listing, product_payload(1, is_active=False), two, includes_inactive=True) is False
    assert listing.held_ids() == [1]
    assert listing.snapshot["product"].digest(1) == product_digest(one)  # nothing written yet
    on_sale = {1: ON_SALE}
    blocked = listing.closing(full=False, held_as_stored=on_sale, max_fraction=0.2, allowed=False)
    assert (blocked.plans, blocked.guard.blocked, blocked.products_deactivated) == ([], True, 1)
    assert "take 1 of 2 live products off sale" in str(blocked.guard.reason)
    for closing in (
        listing.closing(full=False, held_as_stored=on_sale, max_fraction=0.2, allowed=True),
        listing.closing(full=False, held_as_stored=on_sale, max_fraction=0.5, allowed=False),
        listing.closing(full=False, held_as_stored={1: OFF_SALE}, max_fraction=0.2, allowed=False),
    ):
        assert not closing.guard.blocked
        assert [(plan.entity, ids(plan)) for plan in closing.plans] == [
            ("product", {"updates": [1]}),
            ("sku", {}),  # its SKUs are listed as mirrored
        ]


def test_a_complete_full_listing_removes_what_it_did_not_list_unless_too_much() -> None:
    one, two, three = product_payload(1), product_payload(2), product_payload(3)
    listing, _ = listing_over(mirrored(one, two, three))
    listing.page(Page(1, 2, 50), 1)
    assert take(listing, one, two) is True
    listing.check_complete()
    closing = listing.closing(full=True, held_as_stored={}, max_fraction=0.5, allowed=False)
    assert [(plan.entity, ids(plan)) for plan in closing.plans] == [
        ("category", {}),
        ("product", {"removals": [3]}),
        ("sku", {"removals": [31, 32]}),
    ]
    assert closing.products_removed == 1
    blocked = listing.closing(full=True, held_as_stored={}, max_fraction=0.2, allowed=False)
    assert (blocked.plans, blocked.guard.blocked, blocked.products_removed) == ([], True, 1)
    incremental = listing.closing(full=False, held_as_stored={}, max_fraction=0.2, allowed=False)
    assert (incremental.plans, incremental.guard.blocked) == ([], False)


def test_a_listing_is_incomplete_when_its_total_moves_or_products_are_missing() -> None:
    listing, _ = listing_over(mirrored())
    listing.first_page(Page(1, 2, 50), 1, 50)
    take(listing, product_payload(1))
    with pytest.raises(
        IncompleteListing, match="saw 1 distinct products but the upstream reported a total of 2"
    ):
        listing.check_complete()
    listing.page(Page(2, 3, 50), 2)
    with pytest.raises(IncompleteListing, match=r"product total changed during the sync \(2, 3\)"):
        listing.check_complete()
    with pytest.raises(IncompleteListing, match="asked for page 3, the upstream answered page 2"):
        listing.page(Page(2, 3, 50), 3)


@pytest.mark.parametrize(
    ("answered", "listed", "page_size", "pages"),
    [(50, 50, 50, 5), (500, 100, MAX_PAGE_SIZE, 3), (0, 20, 20, 13), (0, 0, 40, 7)],
)
def test_the_first_page_sets_the_page_size_followed(
    answered: int, listed: int, page_size: int, pages: int
) -> None:
    """The page size answered, at most the largest asked for; the products listed when it says none, or
    what was asked when it lists none either; and the pages of the total (250) at that size."""
    listing = Listing(lambda violation: None)
    at = datetime(2026, 11, 23, tzinfo=UTC)
    assert listing.said(40, at) is None
    listing.first_page(Page(1, 250, answered, includes_inactive=True), listed, 40)
    assert (listing.page_size, listing.pages_total, listing.totals) == (page_size, pages, {250})
    assert listing.said(40, at) == ListingSaid(True, 40, page_size, at)


def test_violations_beyond_the_first_hundred_are_counted() -> None:
    totals = RunTotals()
    kept = [totals.violation(f"v{number}") for number in range(MAX_VIOLATIONS + 5)]
    assert kept == [True] * MAX_VIOLATIONS + [False] * 5
    totals.close({"category": 1, "product": 2, "sku": 3})
    assert (totals.categories, totals.products, totals.skus) == (1, 2, 3)
    assert totals.violations[-2:] == [f"v{MAX_VIOLATIONS - 1}", "... and 5 more violations"]


def test_written_notes_the_products_touched_and_the_costs_that_rose() -> None:
    """What repricing takes from a pass's writes: every product written or removed, the product of every
    SKU written (and the one a moved SKU left), and each SKU's cost change."""
    written = Written()
    products = Plan("product", inserts=[product_record(product_payload(1))], removals=[2])
    written.note(products, {})
    skus = Plan("sku", updates=[sku_record(sku_payload(31, price_amount="11.00"), 3)])
    skus.changes.append(Change("sku", 31, "changed", "price_amount", "9.90", "11.00"))
    skus.changes.append(Change("sku", 31, "changed", "stock_quantity", "50", "40"))
    written.note(skus, {31: 4})
    assert written.products == {1, 2, 3, 4}
    assert written.cost_rises == {31: ("9.90", "11.00")}
