"""Listed products as the upstream sends them (:func:`product_payload`) and as mirror records, built from the
core's record functions (what the catalogue tests write and compare; the sync itself digests pages on its own
way to the same records)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from procurd.core.catalog import IncompleteRecord, Record, product_record, sku_record


@dataclass(frozen=True, slots=True)
class ListedProduct:
    """A listed Product: its record and its SKUs' records, plus every id listed, usable or not.

    ``record`` is ``None`` (and ``skus`` empty) when the product itself cannot be mirrored; ``problems``
    says what could not be mirrored. Listed ids count as listed either way, so nothing is marked removed
    because the upstream sent it incomplete.
    """

    id: int
    category_id: int | None
    record: Record | None
    skus: list[Record]
    sku_ids: tuple[int, ...]
    problems: tuple[str, ...]


def product_records(payload: Mapping[str, Any]) -> ListedProduct:
    """A Product as the upstream sent it (decoded JSON, SKUs under ``skus``) as mirror records."""
    identity = int(payload["id"])
    sku_payloads: Sequence[Mapping[str, Any]] = payload.get("skus") or ()
    sku_ids = tuple(int(sku["id"]) for sku in sku_payloads)
    category_id = payload.get("category_id")
    category = category_id if type(category_id) is int else None
    try:
        product = product_record(payload)
    except IncompleteRecord as exc:
        return ListedProduct(identity, category, None, [], sku_ids, (str(exc),))
    skus: list[Record] = []
    problems: list[str] = []
    for sku in sku_payloads:
        try:
            skus.append(sku_record(sku, identity))
        except IncompleteRecord as exc:
            problems.append(str(exc))
    return ListedProduct(identity, category, product, skus, sku_ids, tuple(problems))


def product_payload(product_id: int = 1, **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": product_id,
        "slug": f"product-{product_id}",
        "title": {"en": "Gift card", "zh-CN": "礼品卡"},
        "description": {"en": "A card"},
        "content": {"en": "<p>card</p>"},
        "seo_meta": {},
        "images": ["https://img.example/1.png"],
        "tags": ["gift"],
        "price_amount": "9.90",
        "fulfillment_type": "auto",
        "manual_form_schema": None,
        "is_active": True,
        "category_id": 11,
        "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-02T00:00:00Z",
        "skus": [sku_payload(product_id * 10 + 1), sku_payload(product_id * 10 + 2)],
    }
    payload.update(changes)
    return payload


def sku_payload(sku_id: int, **changes: Any) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "id": sku_id,
        "sku_code": f"SKU-{sku_id}",
        "spec_values": {"region": "EU"},
        "price_amount": "9.90",
        "stock_status": "in_stock",
        "stock_quantity": 50,
        "is_active": True,
    }
    payload.update(changes)
    return payload
