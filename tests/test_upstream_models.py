"""The upstream resource models: exact amounts, kept extra fields, lenient optional fields."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from procurd.core.exact import loads_exact
from procurd.upstream.models import (
    CancelResult,
    Category,
    CreateOrderRequest,
    Fulfillment,
    OrderCreated,
    PingResult,
    Product,
    ProductPage,
    UpstreamOrder,
)

PRODUCT: dict[str, Any] = {
    "id": 12,
    "slug": "game-card",
    "title": {"zh-CN": "游戏卡", "en-US": "Game card"},
    "description": {"en-US": "A card"},
    "content": {"en-US": "<p>details</p>"},
    "seo_meta": {"keywords": "card"},
    "images": ["https://img.example/1.png"],
    "tags": ["hot"],
    "price_amount": "9.90",
    "original_price": "10.00",
    "member_price": "9.90",
    "fulfillment_type": "auto",
    "manual_form_schema": None,
    "is_active": True,
    "category_id": 3,
    "skus": [
        {
            "id": 101,
            "sku_code": "GC-10",
            "spec_values": {"face": "10"},
            "price_amount": "9.90",
            "stock_status": "unlimited",
            "stock_quantity": -1,
            "is_active": True,
            "wholesale_prices": [{"min_quantity": 10, "price": "9.50"}],
        }
    ],
    "created_at": "2026-03-01T12:00:00Z",
    "updated_at": "2026-03-02T12:00:00Z",
    "includes_inactive": False,
}


def parse(text: str) -> Any:
    return loads_exact(text.encode())


def test_product_round_trip_is_exact() -> None:
    """A product goes back out exactly as it came in, extra fields and amount strings included."""
    product = Product.model_validate(PRODUCT)
    assert product.to_json() == PRODUCT
    assert product.model_dump(mode="json")["price_amount"] == "9.90"
    assert product.skus[0].price_amount == "9.90"
    assert Decimal(product.skus[0].price_amount) == Decimal("9.9")


def test_extra_fields_are_reachable() -> None:
    """Fields real sites add are kept in model_extra, on products and nested SKUs."""
    product = Product.model_validate(PRODUCT)
    assert product.model_extra == {"includes_inactive": False}
    sku = product.sku(101)
    assert sku is not None
    assert sku.model_extra == {"wholesale_prices": [{"min_quantity": 10, "price": "9.50"}]}


def test_json_float_amount_keeps_its_json_text() -> None:
    """A float amount in JSON (9.9) is taken from its text, never through binary rounding."""
    product = Product.model_validate(
        parse('{"id": 1, "price_amount": 9.9, "skus": [{"id": 2, "price_amount": 0.1}]}')
    )
    assert product.price_amount == "9.9"
    assert product.skus[0].price_amount == "0.1"
    assert Decimal(product.skus[0].price_amount) * 3 == Decimal("0.3")


@pytest.mark.parametrize("bad", ["abc", "NaN", "Infinity", "", True, [1]])
def test_amounts_must_be_finite_decimals(bad: Any) -> None:
    """An amount that is not a finite decimal number is refused."""
    with pytest.raises(ValidationError):
        Product.model_validate({"id": 1, "price_amount": bad})


def test_optional_fields_may_be_missing_or_null() -> None:
    """A bare product (id only, nulls elsewhere) validates and reports sensible defaults."""
    product = Product.model_validate({"id": 5, "title": None, "skus": None, "images": None})
    assert product.skus == []
    assert product.title is None
    assert product.is_active is True
    assert product.to_json() == {"id": 5, "title": None, "skus": [], "images": None}


def test_inactive_product_and_omitted_skus_are_fine() -> None:
    """An inactive product, or one whose inactive SKUs the upstream left out, is returned as is."""
    product = Product.model_validate({**PRODUCT, "is_active": False, "skus": []})
    assert product.is_active is False
    assert product.sku(101) is None


def test_category_round_trip() -> None:
    """A category keeps every field of seed 2.1."""
    data = {
        "id": 3,
        "parent_id": 0,
        "slug": "games",
        "name": {"en-US": "Games"},
        "icon": "",
        "sort_order": 10,
    }
    assert Category.model_validate(data).to_json() == data


def test_product_page_reports_what_the_upstream_answered() -> None:
    """A page carries total, page and page_size exactly as answered (a clamped page size included)."""
    page = ProductPage.model_validate({"items": [PRODUCT], "total": 230, "page": 2, "page_size": 50})
    assert (page.total, page.page, page.page_size) == (230, 2, 50)
    assert page.items[0].id == 12


def test_product_page_needs_its_counts() -> None:
    """A page without total is not a page."""
    with pytest.raises(ValidationError):
        ProductPage.model_validate({"items": []})


def test_ping_balance_is_an_exact_decimal() -> None:
    """The ping balance is a Decimal that keeps its trailing zeros on the way out."""
    ping = PingResult.model_validate(
        parse(
            '{"site_name": "Shop", "protocol_version": "1.0", "user_id": 7, "balance": "1000.00",'
            ' "currency": "CNY", "member_level": {"id": 1, "name": {"en-US": "Gold"}, "slug": "gold",'
            ' "icon": ""}}'
        )
    )
    assert ping.balance == Decimal("1000.00")
    assert ping.model_dump(mode="json")["balance"] == "1000.00"
    assert ping.member_level is not None
    assert ping.member_level.slug == "gold"


def test_ping_member_level_may_be_null() -> None:
    """A user without a member level has member_level None."""
    ping = PingResult.model_validate({"user_id": 1, "balance": "0", "currency": "CNY", "member_level": None})
    assert ping.member_level is None


def test_unknown_order_statuses_are_plain_strings() -> None:
    """refunded and partially_refunded, and refund fields, are accepted as they come."""
    order = UpstreamOrder.model_validate(
        parse(
            '{"order_id": 9, "order_no": "DJ9", "status": "partially_refunded", "amount": "20.00",'
            ' "currency": "CNY", "items": [], "refunded_amount": "10.00",'
            ' "refund_records": [{"amount": "10.00", "at": "2026-03-02T00:00:00Z"}]}'
        )
    )
    assert order.status == "partially_refunded"
    assert order.refunded_amount == Decimal("10.00")
    assert order.refund_records == [{"amount": "10.00", "at": "2026-03-02T00:00:00Z"}]
    assert order.to_json()["refunded_amount"] == "10.00"


def test_delivered_order_round_trip() -> None:
    """A delivered order with items and fulfillment goes back out unchanged."""
    data = {
        "order_id": 9,
        "order_no": "DJ9",
        "status": "delivered",
        "amount": "19.80",
        "currency": "CNY",
        "items": [
            {
                "product_id": 12,
                "sku_id": 101,
                "title": {"en-US": "Game card"},
                "quantity": 2,
                "unit_price": "9.90",
                "total_price": "19.80",
                "fulfillment_type": "auto",
            }
        ],
        "fulfillment": {
            "type": "auto",
            "status": "delivered",
            "payload": "CARD-1\nCARD-2",
            "delivery_data": None,
            "delivered_at": "2026-03-01T12:00:05Z",
        },
    }
    order = UpstreamOrder.model_validate(data)
    assert order.to_json() == data
    assert order.items[0].unit_price == "9.90"


def test_delivered_goods_never_show_in_repr() -> None:
    """The card payload and delivery data stay out of repr and str of the order and its fulfillment."""
    fulfillment = Fulfillment.model_validate(
        {
            "type": "auto",
            "status": "delivered",
            "payload": "SECRET-CARD",
            "delivery_data": {"pin": "SECRET-PIN"},
        }
    )
    order = UpstreamOrder(order_id=1, order_no="DJ1", status="delivered", fulfillment=fulfillment)
    for text in (repr(fulfillment), str(fulfillment), repr(order), str(order)):
        assert "SECRET" not in text
    assert fulfillment.payload == "SECRET-CARD"


def test_order_created_and_cancel_result() -> None:
    """Order creation and cancel answers keep their fields; missing identifiers are refused."""
    created = OrderCreated.model_validate(
        {"order_id": 5, "order_no": "DJ5", "status": "paid", "amount": "9.90", "currency": "CNY"}
    )
    assert (created.order_id, created.status, created.amount) == (5, "paid", "9.90")
    cancel = CancelResult.model_validate({"order_id": 5, "order_no": "DJ5", "status": "canceled"})
    assert cancel.status == "canceled"
    with pytest.raises(ValidationError):
        OrderCreated.model_validate({"order_no": "DJ5", "status": "paid"})


def test_create_order_body_is_compact_and_omits_none() -> None:
    """The order body is compact JSON in field order without None fields: it matches the seed's vector."""
    assert CreateOrderRequest(sku_id=1, quantity=1).body() == b'{"sku_id":1,"quantity":1}'
    body = CreateOrderRequest(
        sku_id=12,
        quantity=2,
        manual_form_data={"account": "玩家"},
        downstream_order_no="A1001-1",
        trace_id="t-1",
        callback_url="https://shop.example.com/api/v1/upstream/callback",
    ).body()
    assert json.loads(body) == {
        "sku_id": 12,
        "quantity": 2,
        "manual_form_data": {"account": "玩家"},
        "downstream_order_no": "A1001-1",
        "trace_id": "t-1",
        "callback_url": "https://shop.example.com/api/v1/upstream/callback",
    }
    assert b" " not in body


@pytest.mark.parametrize("fields", [{"sku_id": 0, "quantity": 1}, {"sku_id": 1, "quantity": 0}])
def test_create_order_request_validates(fields: dict[str, int]) -> None:
    """A SKU id must be positive and a quantity at least one."""
    with pytest.raises(ValidationError):
        CreateOrderRequest(**fields)


@given(st.decimals(allow_nan=False, allow_infinity=False, places=2, min_value=0, max_value=10**9))
def test_any_two_place_amount_string_round_trips(amount: Decimal) -> None:
    """Whatever two-place amount string the upstream sends comes back out unchanged."""
    text = f"{amount:.2f}"
    product = Product.model_validate(parse(json.dumps({"id": 1, "price_amount": text})))
    assert product.to_json()["price_amount"] == text
