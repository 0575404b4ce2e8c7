"""Statements of retention: old rows deleted a batch at a time, oldest first.

Each batch reads the next ``limit`` rows by primary key (the order they were written in) and deletes the
ones that are old enough, in one short transaction: no statement scans a whole table or holds the write
lock for long, and the tables need no index on their timestamps.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Column, ColumnElement, Connection, Table, and_, delete, func, select, true

from procurd.core.records import Batch
from procurd.db.schema import alerts, audit_log, mirror_changes, outbox, sync_runs


@dataclass(frozen=True, slots=True)
class Kept:
    """One table's retention: rows are written in ``key`` order at ``written``; those older than the cutoff
    that also match ``eligible`` are deleted."""

    table: Table
    key: Column[int]
    written: Column[datetime]
    eligible: ColumnElement[bool]


def _latest_runs() -> ColumnElement[bool]:
    # A pass decides the next one from the last of its upstream: that one is never deleted.
    latest = select(func.max(sync_runs.c.id)).group_by(sync_runs.c.upstream)
    return sync_runs.c.id.not_in(latest.scalar_subquery())


KEPT: dict[str, Kept] = {
    "audit_log": Kept(audit_log, audit_log.c.id, audit_log.c.at, true()),
    "mirror_changes": Kept(mirror_changes, mirror_changes.c.seq, mirror_changes.c.changed_at, true()),
    "outbox": Kept(outbox, outbox.c.id, outbox.c.created_at, outbox.c.delivered_at.is_not(None)),
    "sync_runs": Kept(sync_runs, sync_runs.c.id, sync_runs.c.started_at, _latest_runs()),
}


class RetentionStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def delete_batch(self, name: str, before: datetime, after_key: int, limit: int) -> Batch:
        """Delete the rows of table ``name`` among the next ``limit`` after ``after_key`` that were written
        before ``before`` (and are eligible)."""
        kept = KEPT[name]
        rows = self.connection.execute(
            select(kept.key, kept.written, kept.eligible)
            .where(kept.key > after_key)
            .order_by(kept.key)
            .limit(limit)
        ).all()
        if not rows:
            return Batch(0, None)
        doomed = [key for key, written, eligible in rows if written < before and eligible]
        deleted = 0
        if doomed:
            deleted = self.connection.execute(delete(kept.table).where(kept.key.in_(doomed))).rowcount
        reached_new_rows = any(written >= before for _, written, _ in rows)
        done = reached_new_rows or len(rows) < limit
        return Batch(deleted, None if done else rows[-1][0])

    def delete_alerts(self, before: datetime, limit: int) -> int:
        """Alerts last seen before ``before``, up to ``limit`` of them (the table holds one row per key)."""
        keys = select(alerts.c.key).where(alerts.c.last_at < before).limit(limit)
        return self.connection.execute(delete(alerts).where(and_(alerts.c.key.in_(keys)))).rowcount
