"""A quote before payment: intake refuses what the mirror knows cannot be filled (unless a backorder is
allowed), and ``POST /api/v1/orders/preview`` answers what intake would do with the same body, item by item,
creating nothing. Both decide with the same code, so each preview is checked against the intake that follows
it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import func, select

from procurd.db.schema import audit_log, orders, outbox, procurement_numbers, procurements
from procurd.http.testing import Stack, procurd_stack
from support import sql_rows

PRICING = {"rules": [{"markup_percent": "10"}]}  # 9.90 sells at 10.89, its loss guard (never above it)


@dataclass
class Shop:
    """procurd over the sandbox with a 9.90 SKU (stock 3), a 20.00 SKU out of stock, and an offer of the
    two (out of stock first), priced at cost plus 10 %."""

    stack: Stack
    sku: int
    empty: int


@pytest.fixture
async def shop(database_url: str) -> AsyncIterator[Shop]:
    async with procurd_stack(database_url, upstreams=("main",), pricing=PRICING) as stack:
        state = stack.sandbox.state
        sku = state.product(state.add_product(price="9.90", stock_quantity=3)).skus[0].id
        empty = state.product(state.add_product(price="20.00", stock_quantity=0)).skus[0].id
        await stack.sync("main")
        offer = {"sources": [{"upstream": "main", "sku_id": empty}, {"upstream": "main", "sku_id": sku}]}
        assert (await stack.admin("PUT", "/api/v1/offers/GIFT", offer)).status == 201
        yield Shop(stack, sku, empty)


def body(order_no: str, *items: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"order_no": order_no, "items": list(items), **fields}


async def stored(stack: Stack) -> tuple[int, ...]:
    """How many rows intake writes to: orders, procurements, numbers, audit entries, storefront events."""
    database = stack.runtime.database
    counts = []
    for table in (orders, procurements, procurement_numbers, audit_log, outbox):
        counts.append((await sql_rows(database, select(func.count()).select_from(table)))[0][0])
    return tuple(counts)


async def preview_then_intake(stack: Stack, request: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The preview of ``request`` (which writes nothing), then the intake of the same body."""
    before = await stored(stack)
    answer = await stack.admin("POST", "/api/v1/orders/preview", request)
    assert answer.status == 200, answer.body
    assert await stored(stack) == before
    preview: dict[str, Any] = answer.body["preview"]
    intake = await stack.admin("POST", "/api/v1/orders", request)
    assert intake.status == preview["answer"]["status"], (preview, intake.body)
    assert intake.body.get("error_code") == preview["answer"]["error_code"]
    return preview, intake


async def test_an_item_the_mirror_knows_is_short_is_refused_unless_a_backorder_is_allowed(shop: Shop) -> None:
    """A SKU out of stock, or with less stock than the quantity, is refused 409 insufficient_stock and
    nothing is stored; with "allow_backorder": true it is taken in and queued, the upstream deciding."""
    before = await stored(shop.stack)
    for item in ({"sku_id": shop.empty, "quantity": 1}, {"sku_id": shop.sku, "quantity": 4}):
        refused = await shop.stack.admin("POST", "/api/v1/orders", body("S1", item))
        assert (refused.status, refused.body["error_code"]) == (409, "insufficient_stock"), refused.body
        assert "allow_backorder" in refused.body["error_message"]
    assert await stored(shop.stack) == before
    enough = await shop.stack.admin("POST", "/api/v1/orders", body("S2", {"sku_id": shop.sku, "quantity": 3}))
    assert enough.status == 202, enough.body
    backorder = body("S3", {"sku_id": shop.empty, "quantity": 1}, allow_backorder=True)
    taken = await shop.stack.admin("POST", "/api/v1/orders", backorder)
    assert taken.status == 202, taken.body
    assert taken.body["order"]["procurements"][0]["state"] == "queued"
    again = await shop.stack.admin("POST", "/api/v1/orders", dict(backorder, allow_backorder=False))
    assert again.status == 200  # a repeat is the same order, whether it allows a backorder or not


async def test_an_offer_with_no_source_in_stock_is_refused_as_a_sku_is(shop: Shop) -> None:
    """An offer passes over a source out of stock; when no source can be bought for its stock it is refused
    409 insufficient_stock like a SKU; with a backorder allowed it is taken in as before, an exception
    no_source_available at once."""
    state = shop.stack.sandbox.state
    state.set_sku_stock(shop.sku, 0)
    await shop.stack.sync("main")
    item = {"offer": "GIFT", "quantity": 1}
    refused = await shop.stack.admin("POST", "/api/v1/orders", body("G1", item))
    assert (refused.status, refused.body["error_code"]) == (409, "insufficient_stock"), refused.body
    taken = await shop.stack.admin("POST", "/api/v1/orders", body("G2", item, allow_backorder=True))
    assert taken.status == 202
    [procurement] = taken.body["order"]["procurements"]
    assert (procurement["state"], procurement["exception_reason"]) == ("exception", "no_source_available")


async def test_the_preview_says_what_intake_does_item_by_item_and_creates_nothing(shop: Shop) -> None:
    """For each body the preview answers 200 with the answer intake then gives (202, 409 ...), writing
    nothing; per item the source, the mirrored price, the selling price, the stock, the hold, the limit and
    the loss guard, an offer's sources, and whether it is bought or why not."""
    stack = shop.stack
    preview, intake = await preview_then_intake(
        stack,
        body("Q1", {"sku_id": shop.sku, "quantity": 2}, {"offer": "GIFT", "quantity": 1},
             {"sku_id": shop.sku, "quantity": 1, "max_unit_price": "9.00"}),
    )  # fmt: skip
    assert (preview["accepted"], preview["repeat"], preview["answer"]["status"]) == (True, False, 202)
    first, offered, limited = preview["items"]
    assert {key: first[key] for key in ("upstream", "sku_id", "accepted", "outcome", "reason")} == {
        "upstream": "main", "sku_id": shop.sku, "accepted": True, "outcome": "queued", "reason": None,
    }  # fmt: skip
    assert (first["unit_price"], first["sell_price"], first["sell_currency"]) == ("9.90", "10.89", "CNY")
    assert (first["stock"], first["price_held"]) == ({"status": "low_stock", "quantity": 3}, False)
    assert (first["unit_limit"], first["loss_guard"], first["max_unit_price"]) == ("10.89", "10.89", None)
    assert (offered["sku_id"], offered["outcome"]) == (shop.sku, "queued")
    assert [(s["sku_id"], s["available"], s["reason"], s["in_use"]) for s in offered["sources"]] == [
        (shop.empty, False, "out_of_stock", False),
        (shop.sku, True, None, True),
    ]
    assert (limited["accepted"], limited["outcome"], limited["reason"]) == (
        False,
        "exception",
        "price_above_limit",
    )
    assert limited["unit_limit"] == "9.00"
    # Intake did what the preview said, item by item.
    states = [(p["state"], p["exception_reason"]) for p in intake.body["order"]["procurements"]]
    assert states == [("queued", None), ("queued", None), ("exception", "price_above_limit")]
    assert [p["sku_id"] for p in intake.body["order"]["procurements"]] == [shop.sku, shop.sku, shop.sku]

    short, refused = await preview_then_intake(
        stack, body("Q2", {"sku_id": shop.sku, "quantity": 1}, {"sku_id": shop.empty, "quantity": 1})
    )
    assert (short["accepted"], short["answer"]["status"], short["answer"]["error_code"]) == (
        False, 409, "insufficient_stock",
    )  # fmt: skip
    assert [(item["accepted"], item["outcome"], item["reason"]) for item in short["items"]] == [
        (True, "queued", None), (False, "refused", "insufficient_stock"),
    ]  # fmt: skip
    assert short["items"][1]["stock"] == {"status": "out_of_stock", "quantity": 0}
    assert refused.body["error_message"] == short["answer"]["error_message"]

    backorder, _ = await preview_then_intake(
        stack, body("Q3", {"sku_id": shop.empty, "quantity": 1}, allow_backorder=True)
    )
    assert (backorder["accepted"], backorder["items"][0]["outcome"]) == (True, "queued")

    unknown, _ = await preview_then_intake(stack, body("Q4", {"sku_id": 999_999, "quantity": 1}))
    assert (unknown["answer"]["status"], unknown["items"][0]["reason"]) == (422, "sku_not_found")


async def test_the_preview_of_an_order_taken_in_says_repeat_or_conflict(shop: Shop) -> None:
    """The preview of an order already taken in answers what intake answers: the same body is a repeat
    (200), another body under the number 409 order_conflict; a malformed body is refused 400 as intake
    refuses it."""
    request = body("R1", {"sku_id": shop.sku, "quantity": 1})
    assert (await shop.stack.admin("POST", "/api/v1/orders", request)).status == 202
    repeat = await shop.stack.admin("POST", "/api/v1/orders/preview", request)
    assert (repeat.status, repeat.body["preview"]["repeat"], repeat.body["preview"]["answer"]["status"]) == (
        200, True, 200,
    )  # fmt: skip
    assert repeat.body["preview"]["items"][0]["outcome"] == "queued"
    other = await shop.stack.admin(
        "POST", "/api/v1/orders/preview", body("R1", {"sku_id": shop.sku, "quantity": 2})
    )
    assert other.body["preview"]["answer"]["error_code"] == "order_conflict"
    malformed = await shop.stack.admin("POST", "/api/v1/orders/preview", {"order_no": "R2", "items": []})
    assert (malformed.status, malformed.body["error_code"]) == (400, "invalid_request")
