"""The admin listener over real sockets: intake, orders, cancels, the exception queue, auth and errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from procurd.db.schema import mirror_products, mirror_skus, orders, procurements
from procurd.http.errors import MAX_BODY_BYTES
from procurd.http.testing import Stack, procurd_stack
from support import sql_execute, sql_rows


@dataclass
class Shop:
    """procurd in front of the sandbox with a known auto SKU (9.90) and a manual SKU (5.00) mirrored."""

    stack: Stack
    auto_sku: int
    manual_sku: int
    auto_product: int


@pytest.fixture
async def shop(database_url: str) -> AsyncIterator[Shop]:
    """Both upstreams mirrored, with one auto and one manual product of known prices."""
    async with procurd_stack(database_url) as stack:
        state = stack.sandbox.state
        auto_product = state.add_product(price="9.90")
        manual_product = state.add_product(fulfillment_type="manual", price="5.00")
        await stack.sync("main")
        await stack.sync("second")
        yield Shop(stack, state.product(auto_product).skus[0].id, state.product(manual_product).skus[0].id,
                   auto_product)  # fmt: skip


def order_body(order_no: str, sku_id: int, upstream: str | None = "main", **item: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"sku_id": sku_id, "quantity": 1, **item}
    if upstream is not None:
        entry["upstream"] = upstream
    return {"order_no": order_no, "items": [entry]}


async def submit(shop: Shop, order_no: str, **item: Any) -> dict[str, Any]:
    answer = await shop.stack.admin("POST", "/api/v1/orders", order_body(order_no, shop.auto_sku, **item))
    assert answer.status == 202, answer.body
    order: dict[str, Any] = answer.body["order"]
    return order


# --- intake -------------------------------------------------------------------------------------------------


async def test_new_order_is_accepted_with_202_and_queued(shop: Shop) -> None:
    """A new order answers 202 with the order view; its item is queued under the order's own number."""
    answer = await shop.stack.admin(
        "POST", "/api/v1/orders", dict(order_body("A1", shop.auto_sku), trace_id="t-1")
    )
    assert answer.status == 202
    order = answer.body["order"]
    assert answer.body["ok"] is True
    assert (order["order_no"], order["status"], order["exception"], order["trace_id"]) == (
        "A1",
        "paid",
        False,
        "t-1",
    )
    [item] = order["procurements"]
    assert (item["state"], item["downstream_order_no"], item["upstream"]) == ("queued", "A1", "main")
    assert item["unit_price"] == "9.90"
    assert item["fulfillment"] is None


async def test_repeat_answers_200_and_a_different_body_409(shop: Shop) -> None:
    """The same body again answers 200 with the same order; another body under the number answers 409."""
    first = await shop.stack.admin(
        "POST", "/api/v1/orders", order_body("A2", shop.auto_sku, max_unit_price="10.0")
    )
    again = await shop.stack.admin(
        "POST", "/api/v1/orders", order_body("A2", shop.auto_sku, max_unit_price="10.00")
    )
    other = await shop.stack.admin("POST", "/api/v1/orders", order_body("A2", shop.auto_sku, quantity=2))
    assert (first.status, again.status) == (202, 200)
    assert again.body["order"]["procurements"][0]["id"] == first.body["order"]["procurements"][0]["id"]
    assert (other.status, other.body["error_code"]) == (409, "order_conflict")


async def test_concurrent_identical_posts_create_one_order(shop: Shop) -> None:
    """Two identical POSTs at once create one order: one answers 202, the other 200."""
    body = order_body("A3", shop.auto_sku)
    answers = await asyncio.gather(*(shop.stack.admin("POST", "/api/v1/orders", body) for _ in range(2)))
    assert sorted(answer.status for answer in answers) == [200, 202]
    database = shop.stack.runtime.database
    assert (await sql_rows(database, select(func.count()).select_from(orders)))[0][0] == 1
    assert (await sql_rows(database, select(func.count()).select_from(procurements)))[0][0] == 1


INVALID_BODIES: dict[str, tuple[Any, int, str]] = {
    "unknown upstream": (lambda s: order_body("V1", s.auto_sku, upstream="nope"), 422, "unknown_upstream"),
    "upstream left out with two configured": (lambda s: order_body("V1", s.auto_sku, upstream=None), 422,
                                              "upstream_required"),
    "unknown SKU": (lambda s: order_body("V1", 999_999), 422, "sku_not_found"),
    "quantity 0": (lambda s: order_body("V1", s.auto_sku, quantity=0), 400, "invalid_request"),
    "quantity as string": (lambda s: order_body("V1", s.auto_sku, quantity="1"), 400, "invalid_request"),
    "sku_id as fraction": (lambda s: b'{"order_no": "V1", "items": [{"sku_id": 1.0, "quantity": 1}]}', 400,
                           "invalid_request"),
    "manual without form data": (lambda s: order_body("V1", s.manual_sku), 422, "manual_form_data_required"),
    "manual with an empty form that must hold a field": (
        lambda s: order_body("V1", s.manual_sku, manual_form_data={}), 422, "manual_form_data_required"),
    "manual form lacks a required field": (
        lambda s: order_body("V1", s.manual_sku, manual_form_data={"note": "x"}), 400,
        "manual_form_data_invalid"),
    "manual form's required field blank": (
        lambda s: order_body("V1", s.manual_sku, manual_form_data={"account": " "}), 400,
        "manual_form_data_invalid"),
    "max_unit_price not a number": (lambda s: order_body("V1", s.auto_sku, max_unit_price="cheap"), 400,
                                    "invalid_request"),
    "max_unit_price negative": (lambda s: order_body("V1", s.auto_sku, max_unit_price="-1"), 400,
                                "invalid_request"),
    "max_unit_price boolean": (lambda s: order_body("V1", s.auto_sku, max_unit_price=True), 400,
                               "invalid_request"),
    "unknown item field": (lambda s: order_body("V1", s.auto_sku, colour="red"), 400, "invalid_request"),
    "no items": (lambda s: {"order_no": "V1", "items": []}, 400, "invalid_request"),
    "bad order_no": (lambda s: order_body("has space", s.auto_sku), 400, "invalid_request"),
    "not an object": (lambda s: [1, 2], 400, "invalid_request"),
    "invalid JSON": (lambda s: b'{"order_no": ', 400, "invalid_json"),
    "empty body": (lambda s: b"", 400, "invalid_json"),
    "NaN": (lambda s: b'{"order_no": "V1", "items": [{"sku_id": NaN, "quantity": 1}]}', 400, "invalid_json"),
    "oversize": (lambda s: b"[" + b" " * MAX_BODY_BYTES + b"]", 413, "payload_too_large"),
}  # fmt: skip


async def test_a_missing_required_form_field_is_named(shop: Shop) -> None:
    """A manual item whose form data lacks a field the mirrored manual_form_schema marks required is refused
    at intake naming the field, never sent to fail upstream."""
    body = order_body("V9", shop.manual_sku, manual_form_data={"note": "hello"})
    answer = await shop.stack.admin("POST", "/api/v1/orders", body)
    assert (answer.status, answer.body["error_code"]) == (400, "manual_form_data_invalid")
    assert "'account'" in answer.body["error_message"]
    assert shop.stack.sandbox.request_counts["orders.create"] == 0


@pytest.mark.parametrize("case", list(INVALID_BODIES), ids=list(INVALID_BODIES))
async def test_invalid_order_is_refused_and_nothing_stored(shop: Shop, case: str) -> None:
    """Each invalid intake body is refused with its status and error code, and no order is stored."""
    build, status, code = INVALID_BODIES[case]
    body = build(shop)
    raw = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
    answer = await shop.stack.admin("POST", "/api/v1/orders", raw=raw)
    assert (answer.status, answer.body["ok"], answer.body["error_code"]) == (status, False, code)
    assert answer.body["error_message"]
    assert (await sql_rows(shop.stack.runtime.database, select(func.count()).select_from(orders)))[0][0] == 0


async def test_inactive_sku_and_inactive_product_are_refused(shop: Shop) -> None:
    """A SKU or a product the mirror holds as inactive is refused with 422."""
    other_sku = shop.stack.sandbox.state.product(shop.auto_product).skus[0].id
    database = shop.stack.runtime.database
    await sql_execute(
        database, update(mirror_skus).where(mirror_skus.c.id == shop.manual_sku).values(is_active=False)
    )
    await sql_execute(
        database,
        update(mirror_products).where(mirror_products.c.id == shop.auto_product).values(is_active=False),
    )
    sku = await shop.stack.admin("POST", "/api/v1/orders", order_body("V2", shop.manual_sku))
    product = await shop.stack.admin("POST", "/api/v1/orders", order_body("V3", other_sku))
    assert (sku.status, sku.body["error_code"]) == (422, "sku_inactive")
    assert (product.status, product.body["error_code"]) == (422, "product_inactive")


async def test_price_above_limit_becomes_an_exception_and_is_never_sent(shop: Shop) -> None:
    """A mirrored price above max_unit_price is accepted as an exception price_above_limit and not bought."""
    order = await submit(shop, "P1", max_unit_price="9.89")
    [item] = order["procurements"]
    assert order["exception"] is True
    assert (item["state"], item["exception_reason"]) == ("exception", "price_above_limit")
    assert not await shop.stack.submit_due()
    assert shop.stack.sandbox.orders_for("P1") == []


async def test_amounts_are_exact_text_and_form_numbers_pass_through(shop: Shop) -> None:
    """A max_unit_price string keeps its exact text; numbers in manual_form_data are accepted."""
    raw = (
        b'{"order_no": "D1", "items": ['
        b'{"upstream": "main", "sku_id": %d, "quantity": 1, "max_unit_price": "10.10"},'
        b'{"upstream": "main", "sku_id": %d, "quantity": 1,'
        b' "manual_form_data": {"account": "a", "level": 1.5}}]}'
    ) % (shop.auto_sku, shop.manual_sku)
    answer = await shop.stack.admin("POST", "/api/v1/orders", raw=raw)
    assert answer.status == 202, answer.body
    first, second = answer.body["order"]["procurements"]
    assert (first["max_unit_price"], first["unit_price"], second["unit_price"]) == ("10.10", "9.90", "5.00")
    assert second["downstream_order_no"] == "D1-2"


@pytest.mark.parametrize("number", [b"10.10", b"10", b"1e1"])
async def test_an_amount_as_a_json_number_is_refused(shop: Shop, number: bytes) -> None:
    """max_unit_price written as a JSON number is refused 400, saying amounts are decimal strings."""
    raw = b'{"order_no": "N1", "items": [{"upstream": "main", "sku_id": %d, "quantity": 1, ' % shop.auto_sku
    answer = await shop.stack.admin(
        "POST", "/api/v1/orders", raw=raw + b'"max_unit_price": ' + number + b"}]}"
    )
    assert (answer.status, answer.body["error_code"]) == (400, "invalid_request")
    assert answer.body["error_message"] == (
        'items.0.max_unit_price: must be a decimal string such as "9.90" (a JSON string, not a number)'
    )


async def test_order_number_rule_is_said_in_words(shop: Shop) -> None:
    """An order_no that breaks the rule is refused with the rule in words, not a regular expression."""
    answer = await shop.stack.admin("POST", "/api/v1/orders", order_body("has space", shop.auto_sku))
    assert answer.status == 400
    assert answer.body["error_message"] == (
        "order_no: must be 1 to 64 characters: letters, digits, and _ . : - ; starting with a letter or digit"
    )


async def test_order_read_and_audit(shop: Shop) -> None:
    """An order and its audit trail are readable; unknown orders answer 404 order_not_found."""
    await submit(shop, "R1")
    order = await shop.stack.admin("GET", "/api/v1/orders/R1")
    audit = await shop.stack.admin("GET", "/api/v1/orders/R1/audit")
    missing = await shop.stack.admin("GET", "/api/v1/orders/NOPE")
    missing_audit = await shop.stack.admin("GET", "/api/v1/orders/NOPE/audit")
    assert (order.status, order.body["order"]["order_no"]) == (200, "R1")
    assert audit.status == 200
    assert [(entry["source"], entry["event"], entry["new_state"]) for entry in audit.body["audit"]] == [
        ("intake", "accepted", "queued")
    ]
    assert (missing.status, missing.body["error_code"]) == (404, "order_not_found")
    assert (missing_audit.status, missing_audit.body["error_code"]) == (404, "order_not_found")


# --- cancel -------------------------------------------------------------------------------------------------


async def test_cancel_of_a_never_sent_order_is_local(shop: Shop) -> None:
    """An order whose item was never sent is canceled at once, without the upstream; a repeat is harmless."""
    await submit(shop, "K1")
    answer = await shop.stack.admin("POST", "/api/v1/orders/K1/cancel")
    again = await shop.stack.admin("POST", "/api/v1/orders/K1/cancel")
    assert answer.status == 200, answer.body
    assert answer.body["order"]["status"] == "canceled"
    assert answer.body["order"]["procurements"][0]["state"] == "canceled"
    assert again.status == 200
    assert not await shop.stack.submit_due()


async def test_cancel_of_a_pending_payment_order_goes_upstream_first(shop: Shop) -> None:
    """A submitted item the upstream holds as pending_payment is canceled upstream, then locally."""
    shop.stack.sandbox.faults.pending_payment_next()
    await submit(shop, "K2")
    assert await shop.stack.submit_due()
    item = (await shop.stack.order("K2"))["procurements"][0]
    assert (item["state"], item["upstream_status"]) == ("submitted", "pending_payment")
    answer = await shop.stack.admin("POST", "/api/v1/orders/K2/cancel")
    assert answer.status == 200, answer.body
    assert answer.body["order"]["procurements"][0]["state"] == "canceled"
    assert shop.stack.sandbox.state.order(item["upstream_order_id"]).status == "canceled"


async def test_cancel_of_a_paid_order_is_denied_and_changes_nothing(shop: Shop) -> None:
    """The upstream refuses to cancel a paid order: 409 cancel_not_allowed, nothing changes on either side."""
    shop.stack.sandbox.faults.hold_delivery_next()
    await submit(shop, "K3")
    assert await shop.stack.submit_due()
    before = await shop.stack.order("K3")
    answer = await shop.stack.admin("POST", "/api/v1/orders/K3/cancel")
    assert (answer.status, answer.body["error_code"]) == (409, "cancel_not_allowed")
    [reason] = answer.body["items"]
    assert reason["downstream_order_no"] == "K3"
    assert "cancel_not_allowed" in reason["reason"]
    assert await shop.stack.order("K3") == before
    assert shop.stack.sandbox.state.order(before["procurements"][0]["upstream_order_id"]).status == "paid"


async def test_cancel_of_a_delivered_order_is_denied(shop: Shop) -> None:
    """A delivered item cannot be canceled: 409 with the reason ``delivered``."""
    await submit(shop, "K4")
    assert await shop.stack.submit_due()
    await shop.stack.sandbox.wait_callbacks_idle()
    assert (await shop.stack.order("K4"))["status"] == "delivered"
    answer = await shop.stack.admin("POST", "/api/v1/orders/K4/cancel")
    assert (answer.status, answer.body["error_code"]) == (409, "cancel_not_allowed")
    assert answer.body["items"][0]["reason"] == "delivered"
    missing = await shop.stack.admin("POST", "/api/v1/orders/NOPE/cancel")
    assert (missing.status, missing.body["error_code"]) == (404, "order_not_found")


# --- the exception queue ------------------------------------------------------------------------------------


async def test_exception_list_filters_and_pages(shop: Shop) -> None:
    """The queue filters by upstream and reason and pages; bad query values answer 400 invalid_query."""
    for number in ("E1", "E2", "E3"):
        await submit(shop, number, max_unit_price="1.00")
    await submit(shop, "E4", upstream="second", max_unit_price="1.00")
    shop.stack.sandbox.state.set_balance(Decimal("0"))
    await submit(shop, "E5")
    assert await shop.stack.submit_due()

    async def listing(query: str) -> dict[str, Any]:
        answer = await shop.stack.admin("GET", "/api/v1/exceptions" + query)
        assert answer.status == 200, answer.body
        body: dict[str, Any] = answer.body
        return body

    everything = await listing("")
    assert (everything["total"], everything["page"], everything["page_size"]) == (5, 1, 20)
    assert {item["order_no"] for item in everything["items"]} == {"E1", "E2", "E3", "E4", "E5"}
    second = await listing("?upstream=second")
    assert [(i["order_no"], i["upstream"], i["exception_reason"]) for i in second["items"]] == [
        ("E4", "second", "price_above_limit")
    ]
    payment = await listing("?reason=payment_failed&upstream=main")
    assert [item["order_no"] for item in payment["items"]] == ["E5"]
    pages = [await listing(f"?page_size=2&page={page}") for page in (1, 2, 3, 4)]
    assert [len(page["items"]) for page in pages] == [2, 2, 1, 0]
    assert {item["id"] for page in pages for item in page["items"]} == {
        item["id"] for item in everything["items"]
    }
    for query in (
        "?page=0",
        "?page=-1",
        "?page=x",
        "?page_size=0",
        "?page_size=101",
        "?upstream=" + "u" * 65,
    ):
        bad = await shop.stack.admin("GET", "/api/v1/exceptions" + query)
        assert (bad.status, bad.body["error_code"]) == (400, "invalid_query"), query


async def test_retry_after_payment_failed_uses_a_new_number_and_then_delivers(shop: Shop) -> None:
    """After payment_failed a retry buys under ``-r2``; with money on the wallet the worker delivers it."""
    shop.stack.sandbox.state.set_balance(Decimal("0"))
    await submit(shop, "F1")
    assert await shop.stack.submit_due()
    item = (await shop.stack.order("F1"))["procurements"][0]
    assert (item["state"], item["exception_reason"]) == ("exception", "payment_failed")
    shop.stack.sandbox.state.top_up(Decimal("100"))
    answer = await shop.stack.admin("POST", f"/api/v1/exceptions/{item['id']}/retry", {"note": "topped up"})
    assert answer.status == 200, answer.body
    retried = answer.body["procurement"]
    assert (retried["state"], retried["downstream_order_no"], retried["order_no"]) == (
        "queued",
        "F1-r2",
        "F1",
    )
    assert answer.body["order"]["exception"] is False
    assert await shop.stack.submit_due()
    await shop.stack.sandbox.wait_callbacks_idle()
    delivered = (await shop.stack.order("F1"))["procurements"][0]
    assert delivered["state"] == "delivered"
    assert delivered["downstream_order_nos"] == ["F1", "F1-r2"]
    assert [order.status for order in shop.stack.sandbox.orders_for("F1-r2")] == ["delivered"]


async def test_retry_after_a_refusal_reuses_the_number(shop: Shop) -> None:
    """A business refusal created nothing upstream, so the retry sends the same number again."""
    shop.stack.sandbox.faults.fail_next("orders.create", status=409, error_code="insufficient_stock")
    await submit(shop, "S1")
    assert await shop.stack.submit_due()
    item = (await shop.stack.order("S1"))["procurements"][0]
    assert item["exception_reason"] == "insufficient_stock"
    answer = await shop.stack.admin("POST", f"/api/v1/exceptions/{item['id']}/retry", raw=b"")
    assert answer.status == 200, answer.body
    assert answer.body["procurement"]["downstream_order_no"] == "S1"
    assert await shop.stack.submit_due()
    assert (await shop.stack.order("S1"))["procurements"][0]["state"] in ("submitted", "delivered")


async def exception_counts(shop: Shop) -> dict[str, int]:
    listing = await shop.stack.admin("GET", "/api/v1/exceptions?page_size=100")
    counts: dict[str, int] = {}
    for item in listing.body["items"]:
        counts[item["exception_reason"]] = counts.get(item["exception_reason"], 0) + 1
    return counts


async def test_bulk_retry_queues_the_matching_exceptions(shop: Shop) -> None:
    """POST /exceptions/retry retries by reason and upstream, oldest first up to limit; each goes through
    the same retry as a single one (a new number after payment_failed)."""
    for number in ("R1", "R2", "R3"):
        await submit(shop, number, max_unit_price="1.00")
    await submit(shop, "R4", upstream="second", max_unit_price="1.00")
    shop.stack.sandbox.state.set_balance(Decimal("0"))
    await submit(shop, "R5")
    assert await shop.stack.submit_due()
    ids = {
        item["order_no"]: item["id"]
        for item in (await shop.stack.admin("GET", "/api/v1/exceptions")).body["items"]
    }

    paid = await shop.stack.admin(
        "POST", "/api/v1/exceptions/retry", {"reason": "payment_failed", "note": "topped up"}
    )
    assert paid.status == 200, paid.body
    assert (paid.body["retried"], paid.body["skipped"], paid.body["remaining"]) == ([ids["R5"]], [], 0)
    assert (await shop.stack.order("R5"))["procurements"][0]["downstream_order_no"] == "R5-r2"
    oldest = await shop.stack.admin(
        "POST", "/api/v1/exceptions/retry", {"upstream": "main", "reason": "price_above_limit", "limit": 1}
    )
    assert (oldest.body["retried"], oldest.body["remaining"]) == ([ids["R1"]], 2)
    assert await exception_counts(shop) == {"price_above_limit": 3}
    everything = await shop.stack.admin("POST", "/api/v1/exceptions/retry", {"all": True})
    assert (sorted(everything.body["retried"]), everything.body["remaining"]) == (
        sorted([ids["R2"], ids["R3"], ids["R4"]]),
        0,
    )
    assert await exception_counts(shop) == {}
    for number in ("R1", "R2", "R3", "R4", "R5"):
        assert (await shop.stack.order(number))["procurements"][0]["state"] == "queued"


BULK_RETRY_REFUSALS: dict[str, tuple[Any, int, str]] = {
    "no body": (None, 422, "filter_required"),
    "no filter": ({"note": "x"}, 422, "filter_required"),
    "all false": ({"all": False}, 422, "filter_required"),
    "unknown upstream": ({"upstream": "nope"}, 400, "unknown_upstream"),
    "unknown reason": ({"reason": "max_attempt_exceeded"}, 400, "unknown_reason"),
    "all not a boolean": ({"all": "yes"}, 400, "invalid_request"),
    "reason not a string": ({"reason": 5}, 400, "invalid_request"),
    "blank reason": ({"reason": "  "}, 400, "invalid_request"),
    "long upstream": ({"upstream": "u" * 65}, 400, "invalid_request"),
    "limit 0": ({"all": True, "limit": 0}, 400, "invalid_request"),
    "limit too high": ({"all": True, "limit": 1001}, 400, "invalid_request"),
    "limit boolean": ({"all": True, "limit": True}, 400, "invalid_request"),
    "limit fraction": ({"all": True, "limit": 1.5}, 400, "invalid_request"),
    "note not a string": ({"all": True, "note": ["x"]}, 400, "note_required"),
    "unknown field": ({"all": True, "dry_run": True}, 400, "invalid_request"),
    "not an object": ([1], 400, "invalid_request"),
}


@pytest.mark.parametrize("case", BULK_RETRY_REFUSALS, ids=list(BULK_RETRY_REFUSALS))
async def test_bulk_retry_refusals_change_nothing(shop: Shop, case: str) -> None:
    """A bulk retry without a filter or with a malformed field answers 4xx and retries nothing."""
    body, status, code = BULK_RETRY_REFUSALS[case]
    await submit(shop, "RB1", max_unit_price="1.00")
    answer = await shop.stack.admin("POST", "/api/v1/exceptions/retry", body)
    assert (answer.status, answer.body["error_code"]) == (status, code)
    assert await exception_counts(shop) == {"price_above_limit": 1}


async def test_concurrent_bulk_retries_queue_each_exception_once(shop: Shop) -> None:
    """Two bulk retries at once: every exception is retried by exactly one; the other skips or misses it."""
    for number in ("RC1", "RC2", "RC3", "RC4"):
        await submit(shop, number, max_unit_price="1.00")
    answers = await asyncio.gather(
        *(
            shop.stack.admin("POST", "/api/v1/exceptions/retry", {"reason": "price_above_limit"})
            for _ in range(2)
        )
    )
    assert [answer.status for answer in answers] == [200, 200]
    retried = [pid for answer in answers for pid in answer.body["retried"]]
    skipped = [item for answer in answers for item in answer.body["skipped"]]
    assert len(retried) == len(set(retried)) == 4
    assert {item["error_code"] for item in skipped} <= {"not_an_exception"}
    retries = await sql_rows(
        shop.stack.runtime.database, text("SELECT count(*) FROM audit_log WHERE event = 'retry'")
    )
    assert retries[0][0] == 4


async def test_resolve_needs_a_note_and_closes_the_exception(shop: Shop) -> None:
    """Resolve without a non-empty note answers 400 note_required; with one the exception is resolved."""
    order = await submit(shop, "Z1", max_unit_price="1.00")
    pid = order["procurements"][0]["id"]
    for body in (None, {}, {"note": "   "}, {"note": 5}):
        refused = await shop.stack.admin("POST", f"/api/v1/exceptions/{pid}/resolve", body)
        assert (refused.status, refused.body["error_code"]) == (400, "note_required"), body
    answer = await shop.stack.admin("POST", f"/api/v1/exceptions/{pid}/resolve", {"note": "refunded by hand"})
    assert answer.status == 200, answer.body
    resolved = answer.body["procurement"]
    assert (resolved["state"], resolved["resolution_note"]) == ("resolved", "refunded by hand")
    assert answer.body["order"]["exception"] is False
    again = await shop.stack.admin("POST", f"/api/v1/exceptions/{pid}/resolve", {"note": "twice"})
    retry = await shop.stack.admin("POST", f"/api/v1/exceptions/{pid}/retry")
    assert (again.status, again.body["error_code"]) == (409, "not_an_exception")
    assert (retry.status, retry.body["error_code"]) == (409, "not_an_exception")


async def test_exception_actions_on_unknown_or_malformed_ids(shop: Shop) -> None:
    """An unknown id answers 404, a non-numeric id 400, a body that is not JSON 400."""
    order = await submit(shop, "Z2", max_unit_price="1.00")
    pid = order["procurements"][0]["id"]
    missing = await shop.stack.admin("POST", "/api/v1/exceptions/99999/retry")
    huge = await shop.stack.admin("POST", f"/api/v1/exceptions/{2**70}/resolve", {"note": "x"})
    malformed = await shop.stack.admin("POST", "/api/v1/exceptions/abc/retry")
    not_json = await shop.stack.admin("POST", f"/api/v1/exceptions/{pid}/retry", raw=b"{note")
    bad_note = await shop.stack.admin("POST", f"/api/v1/exceptions/{pid}/retry", {"note": ["x"]})
    assert (missing.status, missing.body["error_code"]) == (404, "procurement_not_found")
    assert (huge.status, huge.body["error_code"]) == (404, "procurement_not_found")
    assert (malformed.status, malformed.body["error_code"]) == (400, "invalid_id")
    assert (not_json.status, not_json.body["error_code"]) == (400, "invalid_json")
    assert (bad_note.status, bad_note.body["error_code"]) == (400, "note_required")
    assert (await shop.stack.order("Z2"))["procurements"][0]["state"] == "exception"


# --- the listener itself ------------------------------------------------------------------------------------


async def test_admin_token_is_required_everywhere_but_healthz(database_url: str) -> None:
    """With a token configured every path but /healthz needs ``Authorization: Bearer <token>``."""
    async with procurd_stack(database_url, admin_token="s3cret-admin-token", upstreams=("main",)) as stack:
        for token in ("", "wrong-token"):
            for method, path in (("GET", "/api/v1/status"), ("GET", "/metrics"), ("POST", "/api/v1/orders"),
                                 ("GET", "/no/such/path")):  # fmt: skip
                answer = await stack.admin(method, path, token=token)
                assert (answer.status, answer.body["error_code"]) == (401, "unauthorized"), (token, path)
                assert answer.headers["WWW-Authenticate"].startswith("Bearer")
        basic = await stack.admin("GET", "/api/v1/status", headers={"Authorization": "Basic czNjcmV0"})
        assert basic.status == 401
        assert (await stack.admin("GET", "/api/v1/status")).status == 200
        health = await stack.request("GET", stack.admin_url + "/healthz")
        assert (health.status, health.body) == (200, {"ok": True})


async def test_unknown_paths_and_methods_answer_json(shop: Shop) -> None:
    """Unknown paths answer JSON 404 and wrong methods JSON 405, each with a request id."""
    missing = await shop.stack.admin("GET", "/api/v2/orders")
    wrong = await shop.stack.admin("DELETE", "/api/v1/orders/A1")
    assert (missing.status, missing.body) == (
        404, {"ok": False, "error_code": "not_found", "error_message": "no such path"}
    )  # fmt: skip
    assert (wrong.status, wrong.body["error_code"]) == (405, "method_not_allowed")
    assert "POST" not in wrong.headers["Allow"]
    assert missing.headers["X-Request-Id"]


async def test_unexpected_failure_answers_json_without_a_traceback(shop: Shop) -> None:
    """A failure deep in the database answers a JSON error, never HTML or a traceback."""
    await sql_execute(shop.stack.runtime.database, text("DROP TABLE audit_log"))
    answer = await shop.stack.admin("POST", "/api/v1/orders", order_body("X1", shop.auto_sku))
    assert answer.status in (500, 503)
    assert answer.body["ok"] is False
    assert answer.body["error_code"] in ("internal_error", "database_unavailable")
    assert "Traceback" not in answer.text
    assert "audit_log" not in answer.text
