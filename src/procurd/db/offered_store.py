"""Statements of the provider's offered catalogue: the ids it shows, the products' documents, and the mirror
rows they are built from."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, bindparam, case, func, insert, or_, select, update

from procurd.db.dialect import insert_or_skip
from procurd.db.provider_schema import provider_ids, provider_products, provider_state
from procurd.db.schema import mirror_categories, mirror_changes, mirror_products, mirror_skus

CHUNK = 500
VERSION = "version"  # provider_state's row for the offered catalogue's version

_PRODUCT_IDS = provider_ids.alias("product_ids")
_SKU_SOURCES = (
    select(
        provider_ids.c.id,
        provider_ids.c.upstream,
        provider_ids.c.upstream_id,
        _PRODUCT_IDS.c.id.label("product_id"),
        mirror_products.c.title,
    )
    .select_from(
        provider_ids.outerjoin(
            mirror_skus,
            and_(
                mirror_skus.c.upstream == provider_ids.c.upstream,
                mirror_skus.c.id == provider_ids.c.upstream_id,
            ),
        )
        .outerjoin(
            mirror_products,
            and_(
                mirror_products.c.upstream == mirror_skus.c.upstream,
                mirror_products.c.id == mirror_skus.c.product_id,
            ),
        )
        .outerjoin(
            _PRODUCT_IDS,
            and_(
                _PRODUCT_IDS.c.entity == "product",
                _PRODUCT_IDS.c.upstream == mirror_skus.c.upstream,
                _PRODUCT_IDS.c.upstream_id == mirror_skus.c.product_id,
            ),
        )
    )
    .where(provider_ids.c.entity == "sku", provider_ids.c.id.in_(bindparam("sku_ids", expanding=True)))
)


VERSION_QUERY = select(provider_state.c.value).where(provider_state.c.name == VERSION)
"""The offered catalogue's version (its one row; none before the first refresh)."""


@dataclass(frozen=True, slots=True)
class SkuSource:
    """An offered SKU id's source, and its product's offered id and title."""

    upstream: str
    upstream_id: int
    product_id: int | None
    title: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class OfferedRow:
    """A stored offered product: its document (JSON text), whether it is listed, and whether it ever was."""

    id: int
    upstream: str
    upstream_id: int
    category_id: int
    listed: bool
    document: str
    floors: Mapping[str, str] | None
    digest: str
    updated_at: datetime
    listed_once: bool = False


def _chunks(values: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(values), CHUNK):
        yield values[start : start + CHUNK]


class OfferedStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    # --- ids ------------------------------------------------------------------------------------------------

    def ids(self, keys: Iterable[tuple[str, str, int]]) -> dict[tuple[str, str, int], int]:
        """The offered ids given so far to these ``(entity, upstream, upstream_id)``."""
        found: dict[tuple[str, str, int], int] = {}
        by_source: dict[tuple[str, str], list[int]] = {}
        for entity, upstream, identity in set(keys):
            by_source.setdefault((entity, upstream), []).append(identity)
        for (entity, upstream), identities in by_source.items():
            for chunk in _chunks(sorted(identities)):
                statement = select(provider_ids.c.upstream_id, provider_ids.c.id).where(
                    provider_ids.c.entity == entity,
                    provider_ids.c.upstream == upstream,
                    provider_ids.c.upstream_id.in_(list(chunk)),
                )
                for row in self.connection.execute(statement):
                    found[(entity, upstream, int(row.upstream_id))] = int(row.id)
        return found

    def upstream_ids(self, entity: str, upstreams: Collection[str]) -> dict[tuple[str, int], int]:
        """Every offered id of the upstreams' rows of ``entity``, by ``(upstream, upstream_id)``."""
        if not upstreams:
            return {}
        statement = select(provider_ids).where(
            provider_ids.c.entity == entity, provider_ids.c.upstream.in_(sorted(upstreams))
        )
        return {
            (str(row.upstream), int(row.upstream_id)): int(row.id)
            for row in self.connection.execute(statement)
        }

    def taken_ids(self) -> dict[str, set[int]]:
        """Every id given out, by entity (of any upstream, offered or not any more)."""
        taken: dict[str, set[int]] = {}
        for entity, identity in self.connection.execute(select(provider_ids.c.entity, provider_ids.c.id)):
            taken.setdefault(entity, set()).add(int(identity))
        return taken

    def add_ids(self, new: Mapping[tuple[str, str, int], int]) -> None:
        rows = [
            {"entity": entity, "upstream": upstream, "upstream_id": upstream_id, "id": identity}
            for (entity, upstream, upstream_id), identity in new.items()
        ]
        for chunk in _chunks(rows):
            self.connection.execute(insert(provider_ids), list(chunk))

    # --- what changed in the mirror ---------------------------------------------------------------------

    def last_change(self) -> int:
        value = self.connection.execute(select(func.max(mirror_changes.c.seq))).scalar_one_or_none()
        return int(value or 0)

    def changed_products(self, upstream: str, after_seq: int, up_to_seq: int, since: datetime) -> set[int]:
        """Products of ``upstream`` whose mirror rows were written or removed at or after ``since``, or whose
        tracked values (prices, selling prices, stock, active) changed in the log after ``after_seq``."""
        found: set[int] = set()
        for table in (mirror_products, mirror_skus):
            key = table.c.id if table is mirror_products else table.c.product_id
            statement = select(key).where(
                table.c.upstream == upstream, or_(table.c.synced_at >= since, table.c.removed_at >= since)
            )
            found.update(int(value) for value in self.connection.execute(statement).scalars())
        logged = self.connection.execute(
            select(mirror_changes.c.entity, mirror_changes.c.entity_id).where(
                mirror_changes.c.upstream == upstream,
                mirror_changes.c.seq > after_seq,
                mirror_changes.c.seq <= up_to_seq,
                mirror_changes.c.entity.in_(("product", "sku")),
            )
        ).all()
        found.update(int(identity) for entity, identity in logged if entity == "product")
        skus = sorted({int(identity) for entity, identity in logged if entity == "sku"})
        for chunk in _chunks(skus):
            statement = select(mirror_skus.c.product_id).where(
                mirror_skus.c.upstream == upstream, mirror_skus.c.id.in_(list(chunk))
            )
            found.update(int(value) for value in self.connection.execute(statement).scalars())
        return found

    def category_ids(self, upstream: str) -> list[int]:
        """Every category id of the upstream's mirror, removed ones included (ids are kept forever)."""
        statement = select(mirror_categories.c.id).where(mirror_categories.c.upstream == upstream)
        return sorted(int(value) for value in self.connection.execute(statement).scalars())

    def product_ids(self, upstream: str) -> list[int]:
        statement = select(mirror_products.c.id).where(mirror_products.c.upstream == upstream)
        return sorted(int(value) for value in self.connection.execute(statement).scalars())

    # --- the mirror rows an offered product is built from ---------------------------------------------------

    def mirror_rows(
        self, upstream: str, product_ids: Sequence[int]
    ) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
        """The mirror's products and, per product, its SKUs (each a dict of its columns)."""
        products: list[dict[str, Any]] = []
        skus: dict[int, list[dict[str, Any]]] = {}
        for chunk in _chunks(sorted(set(product_ids))):
            ids = list(chunk)
            products += [
                dict(row)
                for row in self.connection.execute(
                    select(mirror_products).where(
                        mirror_products.c.upstream == upstream, mirror_products.c.id.in_(ids)
                    )
                ).mappings()
            ]
            for row in self.connection.execute(
                select(mirror_skus)
                .where(mirror_skus.c.upstream == upstream, mirror_skus.c.product_id.in_(ids))
                .order_by(mirror_skus.c.id)
            ).mappings():
                skus.setdefault(int(row["product_id"]), []).append(dict(row))
        return products, skus

    def sku_sources(self, offered_ids: Collection[int]) -> dict[int, SkuSource]:
        """What each offered SKU id stands for (one statement; an id never offered is left out): its
        upstream and upstream id, and, while the mirror has its product, that product's offered id and
        title."""
        found: dict[int, SkuSource] = {}
        for chunk in _chunks(sorted(set(offered_ids))):
            for row in self.connection.execute(_SKU_SOURCES, {"sku_ids": list(chunk)}):
                title = row.title if isinstance(row.title, dict) else None
                product_id = None if row.product_id is None else int(row.product_id)
                found[int(row.id)] = SkuSource(str(row.upstream), int(row.upstream_id), product_id, title)
        return found

    def categories(self, upstreams: Collection[str]) -> list[dict[str, Any]]:
        """The mirror's categories of the upstreams that are still listed."""
        if not upstreams:
            return []
        rows = self.connection.execute(
            select(mirror_categories)
            .where(
                mirror_categories.c.upstream.in_(sorted(upstreams)), mirror_categories.c.removed_at.is_(None)
            )
            .order_by(mirror_categories.c.upstream, mirror_categories.c.id)
        ).mappings()
        return [dict(row) for row in rows]

    # --- the offered products ------------------------------------------------------------------------------

    def digests(self, ids: Collection[int]) -> dict[int, str]:
        found: dict[int, str] = {}
        for chunk in _chunks(sorted(ids)):
            statement = select(provider_products.c.id, provider_products.c.digest).where(
                provider_products.c.id.in_(list(chunk))
            )
            found.update({int(row.id): str(row.digest) for row in self.connection.execute(statement)})
        return found

    def write_products(self, new: Sequence[Mapping[str, Any]], changed: Sequence[Mapping[str, Any]]) -> None:
        """Insert new offered products and replace changed ones (each with its document and digest); the
        catalogue's version moves with them. A product listed now is marked listed once, for good."""
        if new or changed:
            self.set_state(VERSION, self.version() + 1)
        for chunk in _chunks([{**row, "listed_once": row["listed"]} for row in new]):
            self.connection.execute(insert(provider_products), list(chunk))
        if changed:
            statement = (
                update(provider_products)
                .where(provider_products.c.id == bindparam("b_id"))
                .values(
                    {
                        **{
                            name: bindparam(name)
                            for name in (
                                "category_id",
                                "listed",
                                "document",
                                "floors",
                                "digest",
                                "updated_at",
                            )
                        },
                        "listed_once": or_(provider_products.c.listed_once, bindparam("listed")),
                    }
                )
            )
            for chunk in _chunks(list(changed)):
                self.connection.execute(statement, list(chunk))

    def listing(
        self,
        upstreams: Collection[str],
        page: int,
        page_size: int,
        category_id: int | None,
        updated_after: datetime | None,
        include_inactive: bool = False,
    ) -> tuple[int, list[OfferedRow]]:
        """A page of the upstreams' listed products in id order (``include_inactive``: of every product
        ever listed, those no longer on sale included), and how many there are under the filters."""
        shown = provider_products.c.listed_once if include_inactive else provider_products.c.listed
        conditions: list[ColumnElement[bool]] = [
            shown.is_(True),
            provider_products.c.upstream.in_(sorted(upstreams)),
        ]
        if category_id is not None:
            conditions.append(provider_products.c.category_id == category_id)
        if updated_after is not None:
            conditions.append(provider_products.c.updated_at >= updated_after)
        total = self.connection.execute(
            select(func.count()).select_from(provider_products).where(*conditions)
        ).scalar_one()
        rows = self.connection.execute(
            select(provider_products)
            .where(*conditions)
            .order_by(provider_products.c.id)
            .limit(page_size)
            .offset((page - 1) * page_size)
        ).mappings()
        return int(total), [OfferedRow(**dict(row)) for row in rows]

    def product(self, offered_id: int) -> OfferedRow | None:
        row = (
            self.connection.execute(select(provider_products).where(provider_products.c.id == offered_id))
            .mappings()
            .first()
        )
        return None if row is None else OfferedRow(**dict(row))

    def selling_currencies(self, upstreams: Sequence[str]) -> dict[str | None, int]:
        """The live SKUs of ``upstreams`` (active, under an active product, neither removed) by the currency
        of their selling price (``None``: no selling price): what the provider could offer, and why not."""
        sku, product = mirror_skus.c, mirror_products.c
        currency = case((sku.sell_price.is_(None), None), else_=sku.sell_currency).label("currency")
        statement = (
            select(currency, func.count())
            .select_from(
                mirror_skus.join(
                    mirror_products, and_(product.upstream == sku.upstream, product.id == sku.product_id)
                )
            )
            .where(
                sku.upstream.in_(list(upstreams)),
                sku.is_active.is_(True),
                sku.removed_at.is_(None),
                product.is_active.is_(True),
                product.removed_at.is_(None),
            )
            .group_by(currency)
        )
        return {currency: int(count) for currency, count in self.connection.execute(statement)}

    def counts(self) -> tuple[int, int]:
        """Offered products listed, and in all."""
        listed = self.connection.execute(
            select(func.count()).select_from(provider_products).where(provider_products.c.listed.is_(True))
        ).scalar_one()
        total = self.connection.execute(select(func.count()).select_from(provider_products)).scalar_one()
        return int(listed), int(total)

    # --- where the offered catalogue stands -----------------------------------------------------------------

    def state(self, name: str) -> int | None:
        value = self.connection.execute(
            select(provider_state.c.value).where(provider_state.c.name == name)
        ).scalar_one_or_none()
        return None if value is None else int(value)

    def version(self) -> int:
        """The offered catalogue's version: it moves with every write of an offered product."""
        return int(self.connection.execute(VERSION_QUERY).scalar_one_or_none() or 0)

    def set_state(self, name: str, value: int) -> None:
        self.connection.execute(
            insert_or_skip(self.connection, provider_state, provider_state.c.name).values(
                name=name, value=value
            )
        )
        self.connection.execute(
            update(provider_state).where(provider_state.c.name == name).values(value=value)
        )
