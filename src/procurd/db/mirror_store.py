"""Every statement of the catalogue mirror: its snapshot, batched writes, the change log and sync runs.

Writes are Core ``executemany`` statements, one per kind of write and table, inside one transaction per
batch; nothing is read or written one row at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Connection, RowMapping, Table, bindparam, insert, null, select, update

from procurd.core.catalog import TRACKED_FIELDS, Entity, Plan, Record, Snapshot, existing_from_row
from procurd.db.schema import mirror_categories, mirror_changes, mirror_products, mirror_skus, sync_runs

MIRROR_TABLES: dict[Entity, Table] = {
    "category": mirror_categories,
    "product": mirror_products,
    "sku": mirror_skus,
}
# Nullable JSON columns get SQL NULL for a missing value (a bare None would be stored as JSON ``null``).
_NULLABLE_JSON: dict[Entity, frozenset[str]] = {
    entity: frozenset(column.name for column in table.c if isinstance(column.type, JSON) and column.nullable)
    for entity, table in MIRROR_TABLES.items()
}
SNAPSHOT_PARTITION_ROWS = 1000
INTERRUPTED_ERROR = "interrupted: the process running this sync stopped before it finished"


@dataclass(slots=True)
class RunTotals:
    """The counters of one sync run, as ``sync_runs`` stores them."""

    pages: int = 0
    categories: int = 0
    products: int = 0
    skus: int = 0
    added: int = 0
    changed: int = 0
    removed: int = 0
    rows_written: int = 0
    violations: list[str] = field(default_factory=list)

    def count(self, plans: Sequence[Plan]) -> None:
        """Add the effect of written ``plans``."""
        for plan in plans:
            self.added += plan.added
            self.changed += plan.changed
            self.removed += plan.removed
            self.rows_written += plan.rows


class MirrorStore:
    """The mirror's statements, on one transaction's connection."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def load_snapshot(self, upstream: str) -> dict[Entity, Snapshot]:
        """What the mirror holds for ``upstream``: per entity, id to digest, removal mark, tracked fields."""
        return {
            entity: self._table_snapshot(entity, table, upstream) for entity, table in MIRROR_TABLES.items()
        }

    def _table_snapshot(self, entity: Entity, table: Table, upstream: str) -> Snapshot:
        statement = select(
            table.c.id,
            table.c.content_hash,
            table.c.removed_at.is_not(None),
            *(table.c[name] for name in TRACKED_FIELDS[entity]),
        ).where(table.c.upstream == upstream)
        snapshot: Snapshot = {}
        result = self.connection.execution_options(yield_per=SNAPSHOT_PARTITION_ROWS).execute(statement)
        for identity, content_hash, removed, *tracked in result:
            snapshot[identity] = existing_from_row(entity, content_hash, bool(removed), tracked)
        return snapshot

    def write_plans(self, upstream: str, plans: Sequence[Plan], *, run_id: int, now: datetime) -> int:
        """Write ``plans``; returns the number of mirror rows written."""
        return _write_plans(self.connection, upstream, plans, run_id, now)

    def start_run(self, upstream: str, started_at: datetime) -> int:
        """Record a sync run of ``upstream`` as running; returns its id."""
        result = self.connection.execute(
            insert(sync_runs).values(upstream=upstream, started_at=started_at, status="running")
        )
        (run_id,) = result.inserted_primary_key or (None,)
        if run_id is None:
            raise RuntimeError("the database returned no id for the new sync run")
        return int(run_id)

    def close_interrupted_runs(self, upstream: str, now: datetime) -> int:
        """Mark runs of ``upstream`` still shown as running as failed; only while holding its sync lease."""
        result = self.connection.execute(
            update(sync_runs)
            .where(sync_runs.c.upstream == upstream, sync_runs.c.status == "running")
            .values(status="failed", finished_at=now, error=INTERRUPTED_ERROR)
        )
        return int(result.rowcount)

    def finish_run(
        self,
        run_id: int,
        *,
        upstream: str,
        status: str,
        finished_at: datetime,
        totals: RunTotals,
        error: str | None,
        plans: Sequence[Plan] = (),
    ) -> int:
        """Write ``plans`` (the removals of a complete listing) and close the run.

        ``totals`` must already count ``plans``. Returns the mirror rows ``plans`` wrote.
        """
        written = _write_plans(self.connection, upstream, plans, run_id, finished_at)
        self.connection.execute(
            update(sync_runs)
            .where(sync_runs.c.id == run_id)
            .values(
                status=status,
                finished_at=finished_at,
                pages=totals.pages,
                categories=totals.categories,
                products=totals.products,
                skus=totals.skus,
                added=totals.added,
                changed=totals.changed,
                removed=totals.removed,
                rows_written=totals.rows_written,
                violations=list(totals.violations),
                error=error,
            )
        )
        return written

    def last_run(self, upstream: str, *, finished: bool = False) -> RowMapping | None:
        """The most recent ``sync_runs`` row of ``upstream`` (only finished ones if asked), or ``None``."""
        statement = select(sync_runs).where(sync_runs.c.upstream == upstream)
        if finished:
            statement = statement.where(sync_runs.c.status != "running")
        result = self.connection.execute(statement.order_by(sync_runs.c.id.desc()).limit(1))
        return result.mappings().first()


def _write_plans(
    connection: Connection, upstream: str, plans: Sequence[Plan], run_id: int, now: datetime
) -> int:
    # Values shared by every row of a batch are bound once on the statement, not once per row.
    written = 0
    for plan in plans:
        table = MIRROR_TABLES[plan.entity]
        if plan.inserts:
            connection.execute(
                insert(table).values(upstream=upstream, synced_at=now),
                [{"id": record.id, **_column_values(record)} for record in plan.inserts],
            )
        if plan.updates:
            connection.execute(
                _by_id(update(table), table, upstream).values(synced_at=now),
                [{"b_id": record.id, **_column_values(record)} for record in plan.updates],
            )
        if plan.restores:
            connection.execute(
                _by_id(update(table), table, upstream).values(synced_at=now, removed_at=None),
                [{"b_id": record.id, **_column_values(record)} for record in plan.restores],
            )
        if plan.removals:
            connection.execute(
                _by_id(update(table), table, upstream).values(is_active=False, removed_at=now),
                [{"b_id": identity} for identity in plan.removals],
            )
        if plan.changes:
            connection.execute(
                insert(mirror_changes).values(upstream=upstream, changed_at=now, sync_run_id=run_id),
                [
                    {
                        "entity": change.entity,
                        "entity_id": change.entity_id,
                        "kind": change.kind,
                        "field": change.field,
                        "old_value": change.old_value,
                        "new_value": change.new_value,
                    }
                    for change in plan.changes
                ],
            )
        written += plan.rows
    return written


def _by_id(statement: Any, table: Table, upstream: str) -> Any:
    return statement.where(table.c.upstream == upstream, table.c.id == bindparam("b_id"))


def _column_values(record: Record) -> dict[str, Any]:
    values = dict(record.values)
    for name in _NULLABLE_JSON[record.entity]:
        if values[name] is None:
            values[name] = null()
    values["content_hash"] = record.content_hash
    return values
