"""The reads of the admin web console that the engine's own stores do not have: order search, the catalogue
browser and the sync run history.

Every list is one page (``LIMIT``/``OFFSET``) with the total count of its matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, Select, Table, Text, cast, func, or_, select

from procurd.core.numbers import MAX_ID
from procurd.core.records import CatalogSlice, OrderSummary
from procurd.db.schema import (
    mirror_products,
    mirror_skus,
    orders,
    procurement_numbers,
    procurements,
    sync_runs,
)

PRODUCT_COLUMNS = ("upstream", "id", "title", "slug", "fulfillment_type", "price_amount", "is_active",
                   "removed_at", "synced_at", "category_id", "sell_price", "sell_currency")  # fmt: skip
SKU_COLUMNS = ("upstream", "id", "product_id", "sku_code", "spec_values", "price_amount", "stock_status",
               "stock_quantity", "is_active", "removed_at", "synced_at", "sell_price", "sell_currency",
               "price_held_at", "held_cost")  # fmt: skip


def columns_of(table: Table, names: Sequence[str]) -> list[Column[Any]]:
    return [table.c[name] for name in names]


def _id_value(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) <= MAX_ID else None


class ConsoleStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # --- orders -------------------------------------------------------------------------------------------

    def find_orders(
        self, text: str | None, status: str | None, page: int, page_size: int
    ) -> tuple[int, list[OrderSummary]]:
        """Orders, newest first; with ``text``: those whose number starts with it, or that have an item
        bought under the downstream number ``text`` or known upstream by order id or number ``text``."""
        conditions: list[ColumnElement[bool]] = []
        if text:
            conditions.append(_order_matches(text))
        if status:
            conditions.append(orders.c.status == status)
        items = (
            select(func.count())
            .where(procurements.c.order_no == orders.c.order_no)
            .correlate(orders)
            .scalar_subquery()
        )
        statement = (
            select(
                orders.c.order_no,
                orders.c.status,
                orders.c.exception,
                orders.c.created_at,
                orders.c.updated_at,
                items.label("items"),
            )
            .where(*conditions)
            .order_by(orders.c.created_at.desc(), orders.c.order_no)
        )
        total = self._count(select(orders.c.order_no).where(*conditions))
        rows = self.connection.execute(_page(statement, page, page_size))
        return total, [
            OrderSummary(row.order_no, row.status, bool(row.exception), row.created_at, row.updated_at,
                         int(row.items))
            for row in rows
        ]  # fmt: skip

    # --- the catalogue ------------------------------------------------------------------------------------

    def catalog(self, text: str | None, upstream: str | None, page: int, page_size: int) -> CatalogSlice:
        """Mirrored products (removed ones too) by upstream and id, each with its SKUs; with ``text``: those
        whose title or slug contains it (any case), or whose id or one of whose SKU ids is ``text``."""
        conditions: list[ColumnElement[bool]] = []
        if upstream:
            conditions.append(mirror_products.c.upstream == upstream)
        if text:
            conditions.append(_product_matches(text))
        statement = (
            select(*columns_of(mirror_products, PRODUCT_COLUMNS))
            .where(*conditions)
            .order_by(mirror_products.c.upstream, mirror_products.c.id)
        )
        total = self._count(select(mirror_products.c.id).where(*conditions))
        rows = self.connection.execute(_page(statement, page, page_size)).mappings()
        products = [dict(row) for row in rows]
        skus: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for name in {product["upstream"] for product in products}:
            ids = [product["id"] for product in products if product["upstream"] == name]
            sku_statement = (
                select(*columns_of(mirror_skus, SKU_COLUMNS))
                .where(mirror_skus.c.upstream == name, mirror_skus.c.product_id.in_(ids))
                .order_by(mirror_skus.c.product_id, mirror_skus.c.id)
            )
            for row in self.connection.execute(sku_statement).mappings():
                skus.setdefault((name, row["product_id"]), []).append(dict(row))
        return CatalogSlice(total, products, skus)

    # --- sync runs ----------------------------------------------------------------------------------------

    def sync_runs(self, upstream: str | None, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]:
        """Catalogue passes, newest first, every column ``sync_runs`` has."""
        conditions = [sync_runs.c.upstream == upstream] if upstream else []
        statement = select(sync_runs).where(*conditions).order_by(sync_runs.c.id.desc())
        total = self._count(select(sync_runs.c.id).where(*conditions))
        rows = self.connection.execute(_page(statement, page, page_size)).mappings()
        return total, [dict(row) for row in rows]

    def _count(self, statement: Select[Any]) -> int:
        counted = select(func.count()).select_from(statement.subquery())
        return int(self.connection.execute(counted).scalar_one())


def _page(statement: Select[Any], page: int, page_size: int) -> Select[Any]:
    return statement.limit(page_size).offset((page - 1) * page_size)


def _order_matches(text: str) -> ColumnElement[bool]:
    by_number = select(procurements.c.order_no).join(
        procurement_numbers, procurement_numbers.c.procurement_id == procurements.c.id
    ).where(procurement_numbers.c.downstream_order_no == text)  # fmt: skip
    upstream_keys: list[ColumnElement[bool]] = [procurements.c.upstream_order_no == text]
    order_id = _id_value(text)
    if order_id is not None:
        upstream_keys.append(procurements.c.upstream_order_id == order_id)
    by_upstream = select(procurements.c.order_no).where(or_(*upstream_keys))
    return or_(
        orders.c.order_no.startswith(text, autoescape=True),
        orders.c.order_no.in_(by_number),
        orders.c.order_no.in_(by_upstream),
    )


def _product_matches(text: str) -> ColumnElement[bool]:
    needle = text.lower()
    matches: list[ColumnElement[bool]] = [
        func.lower(cast(mirror_products.c.title, Text)).contains(needle, autoescape=True),
        func.lower(mirror_products.c.slug).contains(needle, autoescape=True),
    ]
    identity = _id_value(text)
    if identity is not None:
        with_sku = select(mirror_skus.c.product_id).where(
            mirror_skus.c.upstream == mirror_products.c.upstream, mirror_skus.c.id == identity
        )
        matches += [mirror_products.c.id == identity, mirror_products.c.id.in_(with_sku)]
    return or_(*matches)
