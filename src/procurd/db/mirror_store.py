"""Every statement of the catalogue mirror: its snapshot, batched writes, selling prices and holds, the
change log and sync runs.

Mirror rows are written with the driver's ``executemany`` on plain tuples (:mod:`procurd.db.bulk`): each
statement is compiled once per dialect from its Core form, JSON columns are serialized once (orjson) from the
values the upstream sent, and no per-row SQLAlchemy processing runs. Nothing is read or written one row at a
time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import chain
from typing import Any

from sqlalchemy import (
    Connection,
    RowMapping,
    Table,
    and_,
    bindparam,
    false,
    func,
    insert,
    null,
    select,
    true,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import ClauseElement

from procurd.core.catalog import (
    ROW_FIELDS,
    TRACKED_FIELDS,
    Change,
    Entity,
    PassHistory,
    PassKind,
    Plan,
    Record,
    Snapshot,
)
from procurd.core.listing import COMPLETE_STATUSES, RunOutcome
from procurd.core.pricing import PriceChange, ProductFacts, Repricing, SkuFacts
from procurd.db.bulk import Bulk, DriverSql, binds, json_text
from procurd.db.schema import mirror_categories, mirror_changes, mirror_products, mirror_skus, sync_runs
from procurd.db.types import JsonDocument

MIRROR_TABLES: dict[Entity, Table] = {
    "category": mirror_categories,
    "product": mirror_products,
    "sku": mirror_skus,
}
IN_CHUNK = 500  # ids per IN (...) list
ROWS_PER_FETCH = 2000
INTERRUPTED_ERROR = "interrupted: the process running this sync stopped before it finished"


@dataclass(frozen=True, slots=True)
class KnownRows:
    """What the mirror held before a write: tracked values (TRACKED_FIELDS order) and, for SKUs, the
    product each belonged to."""

    tracked: dict[int, tuple[object, ...]]
    product_of: dict[int, int]


@dataclass(frozen=True)
class _TableWrites:
    """The bulk statements of one mirror table and how a record becomes their rows."""

    entity: Entity
    table: Table
    insert: Bulk
    update: Bulk
    restore: Bulk
    remove: Bulk
    json_columns: frozenset[str]

    @classmethod
    def of(cls, entity: Entity, table: Table) -> _TableWrites:
        columns = [*ROW_FIELDS[entity], "extra", "content_hash"]
        width = len(columns)

        def insert_statement() -> ClauseElement:
            names = ["upstream", "id", "synced_at", *columns]
            return insert(table).values(dict(zip(names, binds(len(names)), strict=True)))

        def update_statement(restore: bool) -> Callable[[], ClauseElement]:
            def build() -> ClauseElement:
                values: dict[str, Any] = dict(zip(["synced_at", *columns], binds(width + 1), strict=True))
                if restore:
                    values["removed_at"] = null()
                upstream, identity = binds(2, width + 1)
                return (
                    update(table).where(table.c.upstream == upstream, table.c.id == identity).values(values)
                )

            return build

        def remove_statement() -> ClauseElement:
            removed_at, upstream, identity = binds(3)
            return (
                update(table)
                .where(table.c.upstream == upstream, table.c.id == identity)
                .values(is_active=false(), removed_at=removed_at)
            )

        json_columns = frozenset(
            column.name
            for column in table.c
            if isinstance(column.type, JsonDocument) and column.name in columns
        )
        return cls(
            entity,
            table,
            Bulk(insert_statement),
            Bulk(update_statement(False)),
            Bulk(update_statement(True)),
            Bulk(remove_statement),
            json_columns,
        )

    def values(self, record: Record) -> tuple[Any, ...]:
        row = record.values
        json_columns = self.json_columns
        return (
            *(
                json_text(row[name]) if name in json_columns else row[name]
                for name in ROW_FIELDS[self.entity]
            ),
            json_text(row["extra"]),
            record.digest.hex(),
        )


_WRITES = {entity: _TableWrites.of(entity, table) for entity, table in MIRROR_TABLES.items()}
_SNAPSHOT_SQL = {
    table.name: DriverSql(
        select(table.c.id, table.c.content_hash, table.c.removed_at.is_not(None)).where(
            table.c.upstream == bindparam("upstream")
        )
    )
    for table in MIRROR_TABLES.values()
}
_CHANGE_COLUMNS = (
    "upstream",
    "changed_at",
    "sync_run_id",
    "entity",
    "entity_id",
    "kind",
    "field",
    "old_value",
    "new_value",
)
_INSERT_CHANGES = Bulk(
    lambda: insert(mirror_changes).values(
        dict(zip(_CHANGE_COLUMNS, binds(len(_CHANGE_COLUMNS)), strict=True))
    )
)


def _price_update(table: Table, hold: bool) -> Callable[[], ClauseElement]:
    def build() -> ClauseElement:
        names = ["sell_price", "sell_currency", *(["price_held_at", "held_cost"] if hold else [])]
        bound = binds(len(names) + 2)
        upstream, identity = bound[-2:]
        return (
            update(table)
            .where(table.c.upstream == upstream, table.c.id == identity)
            .values(dict(zip(names, bound, strict=False)))
        )

    return build


_SET_SKU_PRICE = Bulk(_price_update(mirror_skus, hold=False))
_HOLD_SKU_PRICE = Bulk(_price_update(mirror_skus, hold=True))
_SET_PRODUCT_PRICE = Bulk(_price_update(mirror_products, hold=False))


def _chunks(ids: Collection[int]) -> Iterator[list[int]]:
    ordered = sorted(ids)
    for start in range(0, len(ordered), IN_CHUNK):
        yield ordered[start : start + IN_CHUNK]


class MirrorStore:
    """The mirror's statements, on one transaction's connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def _bound(self, column: Any, value: Any) -> Any:
        """``value`` as the driver needs it for ``column`` (its type's own bind processing, done once)."""
        processor = column.type.bind_processor(self.connection.dialect)
        return value if processor is None else processor(value)

    # --- the snapshot and what the change log needs ----------------------------------------------------

    def load_snapshot(self, upstream: str) -> dict[Entity, Snapshot]:
        """What the mirror holds for ``upstream``: per entity, id to digest and removal mark."""
        return {entity: self._table_snapshot(table, upstream) for entity, table in MIRROR_TABLES.items()}

    def _table_snapshot(self, table: Table, upstream: str) -> Snapshot:
        # Plain driver rows: a snapshot reads every row of the upstream, tens of thousands of them.
        sql = _SNAPSHOT_SQL[table.name].sql(self.connection.dialect)
        return Snapshot.from_rows(chain.from_iterable(self._plain_batches(sql, (upstream,))))

    def _plain_batches(self, sql: str, parameters: tuple[Any, ...]) -> Iterator[Sequence[Any]]:
        """The rows of ``sql`` as the driver's own tuples, in batches, with no row object in between (a
        snapshot reads tens of thousands of rows). A driver error while fetching becomes SQLAlchemy's, as at
        execution."""
        cursor = self.connection.exec_driver_sql(sql, parameters).cursor
        dialect = self.connection.dialect
        try:
            while True:
                try:
                    batch = cursor.fetchmany(ROWS_PER_FETCH)
                except dialect.loaded_dbapi.Error as exc:
                    error = dialect.loaded_dbapi.Error
                    raise DBAPIError.instance(sql, parameters, exc, error, hide_parameters=True) from exc
                if not batch:
                    return
                yield batch
        finally:
            cursor.close()

    def known_rows(self, upstream: str, entity: Entity, ids: Collection[int]) -> KnownRows:
        """Tracked values (and a SKU's product) of the rows ``ids`` as stored now."""
        table = MIRROR_TABLES[entity]
        columns = [table.c[name] for name in TRACKED_FIELDS[entity]]
        with_product = entity == "sku"
        if with_product:
            columns.append(table.c.product_id)
        tracked: dict[int, tuple[object, ...]] = {}
        product_of: dict[int, int] = {}
        for chunk in _chunks(ids):
            statement = select(table.c.id, *columns).where(
                table.c.upstream == upstream, table.c.id.in_(chunk)
            )
            for identity, *values in self.connection.execute(statement):
                if with_product:
                    product_of[identity] = values.pop()
                tracked[identity] = tuple(values)
        return KnownRows(tracked, product_of)

    # --- writes --------------------------------------------------------------------------------------

    def write_plan(self, upstream: str, plan: Plan, *, run_id: int, now: datetime) -> int:
        """Write one entity's plan and its change-log entries; returns the mirror rows written."""
        writes = _WRITES[plan.entity]
        table = writes.table
        connection = self.connection
        synced_at = self._bound(table.c.synced_at, now)
        writes.insert.run(connection, [(upstream, r.id, synced_at, *writes.values(r)) for r in plan.inserts])
        for bulk, records in ((writes.update, plan.updates), (writes.restore, plan.restores)):
            bulk.run(connection, [(synced_at, *writes.values(r), upstream, r.id) for r in records])
        if plan.removals:
            removed_at = self._bound(table.c.removed_at, now)
            writes.remove.run(connection, [(removed_at, upstream, identity) for identity in plan.removals])
        self.log_changes(upstream, plan.changes, run_id=run_id, now=now)
        return plan.rows

    def log_changes(
        self, upstream: str, changes: Iterable[Change | PriceChange], *, run_id: int | None, now: datetime
    ) -> None:
        changed_at = self._bound(mirror_changes.c.changed_at, now)
        rows = []
        for change in changes:
            name: str | None
            if isinstance(change, PriceChange):
                kind, name = "changed", "sell_price"
            else:
                kind, name = change.kind, change.field
            entry = (change.entity, change.entity_id, kind, name, change.old_value, change.new_value)
            rows.append((upstream, changed_at, run_id, *entry))
        _INSERT_CHANGES.run(self.connection, rows)

    # --- selling prices and holds --------------------------------------------------------------------

    def pricing_facts(
        self, upstream: str, product_ids: Collection[int] | None = None
    ) -> tuple[list[SkuFacts], dict[int, ProductFacts]]:
        """Every SKU of the given products (all of ``upstream``'s when None) and the products, locked for
        this transaction (PostgreSQL; SQLite has one writer), in id order."""
        products: dict[int, ProductFacts] = {}
        categories: dict[int, int] = {}
        skus: list[SkuFacts] = []
        for condition in self._product_conditions(product_ids):
            product_rows = self._driver_rows(
                select(
                    mirror_products.c.id,
                    mirror_products.c.category_id,
                    mirror_products.c.sell_price,
                    mirror_products.c.sell_currency,
                )
                .where(mirror_products.c.upstream == upstream, condition(mirror_products.c.id))
                .order_by(mirror_products.c.id)
                .with_for_update()
            )
            for identity, category_id, price, currency in product_rows:
                products[identity] = ProductFacts(identity, price, currency)
                categories[identity] = category_id
            sku_rows = self._driver_rows(
                select(
                    mirror_skus.c.id,
                    mirror_skus.c.product_id,
                    mirror_skus.c.price_amount,
                    and_(mirror_skus.c.is_active, mirror_skus.c.removed_at.is_(None)),
                    mirror_skus.c.sell_price,
                    mirror_skus.c.sell_currency,
                    mirror_skus.c.price_held_at.is_not(None),
                )
                .where(mirror_skus.c.upstream == upstream, condition(mirror_skus.c.product_id))
                .order_by(mirror_skus.c.id)
                .with_for_update()
            )
            for identity, product_id, cost, live, price, currency, held in sku_rows:
                skus.append(
                    SkuFacts(
                        identity,
                        product_id,
                        categories.get(product_id),
                        cost,
                        bool(live),
                        price,
                        currency,
                        bool(held),
                    )
                )
        return skus, products

    def _driver_rows(self, statement: Any) -> Iterable[Any]:
        """Rows as the driver returns them (plain tuples: repricing reads every SKU of an upstream)."""
        compiled = statement.compile(
            dialect=self.connection.dialect, compile_kwargs={"render_postcompile": True}
        )
        values = compiled.params
        parameters = tuple(values[name] for name in compiled.positiontup or ())
        return chain.from_iterable(self._plain_batches(str(compiled), parameters))

    @staticmethod
    def _product_conditions(product_ids: Collection[int] | None) -> Iterator[Callable[[Any], Any]]:
        if product_ids is None:
            yield lambda column: true()
            return
        for chunk in _chunks(product_ids):
            yield lambda column, chunk=chunk: column.in_(chunk)  # type: ignore[misc]

    def has_prices(self, upstream: str) -> bool:
        """Whether any SKU or product of ``upstream`` has a selling price or a hold."""
        for table in (mirror_skus, mirror_products):
            statement = select(table.c.id).where(
                table.c.upstream == upstream, table.c.sell_price.is_not(None)
            )
            if self.connection.execute(statement.limit(1)).first() is not None:
                return True
        held = select(mirror_skus.c.id).where(
            mirror_skus.c.upstream == upstream, mirror_skus.c.price_held_at.is_not(None)
        )
        return self.connection.execute(held.limit(1)).first() is not None

    def write_prices(
        self, upstream: str, repricing: Repricing, *, run_id: int | None, now: datetime, log: bool = True
    ) -> None:
        """Store new selling prices and holds, and (``log``) their change-log entries."""
        held_at = self._bound(mirror_skus.c.price_held_at, now)
        _SET_SKU_PRICE.run(
            self.connection,
            [
                (sku.sell_price, sku.sell_currency, upstream, sku.id)
                for sku in repricing.skus
                if sku.hold_cost is None
            ],
        )
        _HOLD_SKU_PRICE.run(
            self.connection,
            [
                (sku.sell_price, sku.sell_currency, held_at, sku.hold_cost, upstream, sku.id)
                for sku in repricing.skus
                if sku.hold_cost is not None
            ],
        )
        _SET_PRODUCT_PRICE.run(
            self.connection,
            [
                (product.sell_price, product.sell_currency, upstream, product.id)
                for product in repricing.products
            ],
        )
        if log:
            self.log_changes(upstream, repricing.changes, run_id=run_id, now=now)

    def product_of_sku(self, upstream: str, sku_id: int) -> int | None:
        statement = select(mirror_skus.c.product_id).where(
            mirror_skus.c.upstream == upstream, mirror_skus.c.id == sku_id
        )
        value = self.connection.execute(statement).scalar()
        return None if value is None else int(value)

    def release_hold(self, upstream: str, sku_id: int) -> None:
        """Clear the hold of a SKU (lock it first with :meth:`pricing_facts`)."""
        self.connection.execute(
            update(mirror_skus)
            .where(mirror_skus.c.upstream == upstream, mirror_skus.c.id == sku_id)
            .values(price_held_at=None, held_cost=None)
        )

    def holds(self, upstream: str | None = None) -> list[RowMapping]:
        """Held SKUs (of one upstream, or of all), oldest hold first."""
        statement = (
            select(
                mirror_skus.c.upstream,
                mirror_skus.c.id.label("sku_id"),
                mirror_skus.c.product_id,
                mirror_skus.c.sku_code,
                mirror_products.c.title,
                mirror_skus.c.price_amount.label("cost"),
                mirror_skus.c.held_cost,
                mirror_skus.c.sell_price,
                mirror_skus.c.sell_currency,
                mirror_skus.c.price_held_at,
            )
            .select_from(
                mirror_skus.outerjoin(
                    mirror_products,
                    and_(
                        mirror_products.c.upstream == mirror_skus.c.upstream,
                        mirror_products.c.id == mirror_skus.c.product_id,
                    ),
                )
            )
            .where(mirror_skus.c.price_held_at.is_not(None))
            .order_by(mirror_skus.c.price_held_at, mirror_skus.c.upstream, mirror_skus.c.id)
        )
        if upstream is not None:
            statement = statement.where(mirror_skus.c.upstream == upstream)
        return list(self.connection.execute(statement).mappings())

    def totals(self) -> dict[str, dict[str, int]]:
        """Per upstream, the categories, products and SKUs the mirror holds that the upstream still lists
        (inactive ones included)."""
        totals: dict[str, dict[str, int]] = {}
        tables = (("categories", mirror_categories), ("products", mirror_products), ("skus", mirror_skus))
        for name, table in tables:
            statement = (
                select(table.c.upstream, func.count())
                .where(table.c.removed_at.is_(None))
                .group_by(table.c.upstream)
            )
            for upstream, number in self.connection.execute(statement):
                totals.setdefault(upstream, {"categories": 0, "products": 0, "skus": 0})[name] = int(number)
        return totals

    def product_ids(self, upstream: str) -> list[int]:
        statement = select(mirror_products.c.id).where(mirror_products.c.upstream == upstream)
        return list(self.connection.execute(statement).scalars())

    def category_ids(self, upstream: str) -> set[int]:
        """Ids of ``upstream``'s categories the upstream still lists."""
        statement = select(mirror_categories.c.id).where(
            mirror_categories.c.upstream == upstream, mirror_categories.c.removed_at.is_(None)
        )
        return set(self.connection.execute(statement).scalars())

    # --- sync runs -----------------------------------------------------------------------------------

    def start_run(self, upstream: str, started_at: datetime, kind: PassKind = "full") -> int:
        """Record a sync run of ``upstream`` as running; returns its id."""
        result = self.connection.execute(
            insert(sync_runs).values(upstream=upstream, started_at=started_at, status="running", kind=kind)
        )
        (run_id,) = result.inserted_primary_key or (None,)
        if run_id is None:
            raise RuntimeError("the database returned no id for the new sync run")
        return int(run_id)

    def record_skipped(self, upstream: str, now: datetime, kind: PassKind, reason: str) -> int:
        """Record a pass that did not run (another instance holds the upstream's sync lease)."""
        result = self.connection.execute(
            insert(sync_runs).values(
                upstream=upstream, started_at=now, finished_at=now, status="skipped", kind=kind, error=reason
            )
        )
        (run_id,) = result.inserted_primary_key or (None,)
        return int(run_id or 0)

    def close_interrupted_runs(self, upstream: str, now: datetime) -> int:
        """Mark runs of ``upstream`` still shown as running as failed; only while holding its sync lease."""
        result = self.connection.execute(
            update(sync_runs)
            .where(sync_runs.c.upstream == upstream, sync_runs.c.status == "running")
            .values(status="failed", finished_at=now, error=INTERRUPTED_ERROR)
        )
        return int(result.rowcount)

    def set_run_kind(self, run_id: int, kind: PassKind, updated_after: datetime | None) -> None:
        self.connection.execute(
            update(sync_runs).where(sync_runs.c.id == run_id).values(kind=kind, updated_after=updated_after)
        )

    def finish_run(self, run_id: int, outcome: RunOutcome) -> None:
        """Close the run with its counters, violations and error."""
        totals = outcome.totals
        self.connection.execute(
            update(sync_runs)
            .where(sync_runs.c.id == run_id)
            .values(
                status=outcome.status,
                kind=outcome.kind,
                finished_at=outcome.finished_at,
                ignored_updated_after=outcome.ignored_updated_after,
                pages=totals.pages,
                categories=totals.categories,
                products=totals.products,
                skus=totals.skus,
                added=totals.added,
                restored=totals.restored,
                changed=totals.changed,
                removed=totals.removed,
                rows_written=totals.rows_written,
                violations=list(totals.violations),
                error=outcome.error,
            )
        )

    def last_run(self, upstream: str, *, finished: bool = False) -> RowMapping | None:
        """The most recent pass of ``upstream`` that ran (only finished ones if asked), or ``None``."""
        statement = select(sync_runs).where(sync_runs.c.upstream == upstream, sync_runs.c.status != "skipped")
        if finished:
            statement = statement.where(sync_runs.c.status != "running")
        result = self.connection.execute(statement.order_by(sync_runs.c.id.desc()).limit(1))
        return result.mappings().first()

    def runs(self, upstream: str, limit: int = 20) -> list[RowMapping]:
        """The latest ``sync_runs`` rows of ``upstream``, skipped ones included, newest first."""
        statement = (
            select(sync_runs)
            .where(sync_runs.c.upstream == upstream)
            .order_by(sync_runs.c.id.desc())
            .limit(limit)
        )
        return list(self.connection.execute(statement).mappings())

    def pass_history(self, upstream: str) -> PassHistory:
        """Start times of the last complete pass, the last complete full pass, and the last pass that saw
        the upstream ignore ``updated_after``; the id of the newest run."""
        complete = and_(sync_runs.c.upstream == upstream, sync_runs.c.status.in_(COMPLETE_STATUSES))
        last_complete, last_full = self.connection.execute(
            select(
                func.max(sync_runs.c.started_at),
                func.max(sync_runs.c.started_at).filter(sync_runs.c.kind == "full"),
            ).where(complete)
        ).one()
        ignored, last_run_id = self.connection.execute(
            select(
                func.max(sync_runs.c.started_at).filter(sync_runs.c.ignored_updated_after.is_(True)),
                func.max(sync_runs.c.id),
            ).where(sync_runs.c.upstream == upstream)
        ).one()
        return PassHistory(
            last_complete_at=self._datetime(last_complete),
            last_full_at=self._datetime(last_full),
            ignored_updated_after_at=self._datetime(ignored),
            last_run_id=last_run_id,
        )

    @staticmethod
    def _datetime(value: Any) -> datetime | None:
        """An aggregate's datetime (SQLite returns text there, not the column's type)."""
        if value is None or isinstance(value, datetime):
            return _aware(value)
        return _aware(datetime.fromisoformat(str(value)))


def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
