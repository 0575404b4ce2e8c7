"""Mirror records of a listed product, built from the core's record functions (what the catalogue tests
write and compare; the sync itself digests pages on its own way to the same records)."""

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
