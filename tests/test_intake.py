"""The intake request: strict parsing, exact amounts, and the fingerprint that tells repeats apart."""

from __future__ import annotations

from decimal import Decimal

import pytest

from procurd.core.intake import MALFORMED, IntakeError, parse_order_request


def body(**item: object) -> dict[str, object]:
    return {"order_no": "A1", "items": [{"sku_id": 1, "quantity": 1, **item}]}


def test_form_data_numbers_become_plain_json() -> None:
    """Exact decimals in buyer form data become plain numbers, so any caller can store them."""
    request = parse_order_request(
        body(manual_form_data={"n": Decimal("2"), "x": Decimal("1.5"), "l": [Decimal("3")]})
    )
    assert request.items[0].manual_form_data == {"n": 2, "x": 1.5, "l": [3]}


@pytest.mark.parametrize("price", ["9.90", "10", "0.01"])
def test_max_unit_price_accepts_decimal_strings(price: str) -> None:
    """max_unit_price is a decimal string, kept as written."""
    assert parse_order_request(body(max_unit_price=price)).items[0].max_unit_price == price


@pytest.mark.parametrize("price", [9.9, Decimal("9.90"), 10, "nine", "-1", "NaN", True])
def test_max_unit_price_refuses_numbers_and_nonsense(price: object) -> None:
    """A JSON number (exact or not), a negative or a non-number is refused with a message naming the
    field."""
    with pytest.raises(IntakeError) as caught:
        parse_order_request(body(max_unit_price=price))
    assert "max_unit_price" in caught.value.message


@pytest.mark.parametrize(
    "bad",
    [
        {"order_no": "", "items": [{"sku_id": 1, "quantity": 1}]},
        {"order_no": "A 1", "items": [{"sku_id": 1, "quantity": 1}]},
        {"order_no": "A1", "items": []},
        {"order_no": "A1", "items": [{"sku_id": "1", "quantity": 1}]},
        {"order_no": "A1", "items": [{"sku_id": 1, "quantity": 0}]},
        {"order_no": "A1", "items": [{"sku_id": 1, "quantity": 1, "colour": "red"}]},
        {"order_no": "A1", "items": [{"sku_id": 1, "quantity": True}]},
        ["not", "an", "object"],
    ],
)
def test_bad_bodies_are_refused(bad: object) -> None:
    """Malformed bodies are refused with invalid_request; nothing is coerced."""
    with pytest.raises(IntakeError) as caught:
        parse_order_request(bad)
    assert caught.value.code == "invalid_request"
    assert caught.value.code in MALFORMED


def test_fingerprint_is_stable_and_sensitive() -> None:
    """Equal amounts written differently fingerprint alike; any real difference changes the fingerprint."""
    first = parse_order_request(body(max_unit_price="9.9")).fingerprint()
    assert parse_order_request(body(max_unit_price="9.90")).fingerprint() == first
    assert parse_order_request(body(max_unit_price="9.91")).fingerprint() != first
    assert parse_order_request(body(max_unit_price="9.9", quantity=2)).fingerprint() != first
