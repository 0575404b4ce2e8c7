"""Retention: ``[retention]`` applied by the daemon once a day and by ``procurd prune``.

``audit_log``, ``mirror_changes``, the delivered ``outbox``, ``sync_runs`` and ``alerts`` would otherwise grow
forever. Rows older than their table's setting are deleted in batches, each its own short transaction, so
intake, callbacks and workers are never held up for long; 0 keeps a table forever. On several instances
only one prunes at a time (a lease).

Orders, procurements, their numbers and the trades of upstreams that record them (``upstream_trades``) are
never pruned: a trade belongs to its procurement, and one whose outcome is unknown is what keeps that
procurement from being sent again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import structlog

from procurd.config import RetentionSettings
from procurd.core.clock import utcnow
from procurd.core.records import Batch
from procurd.db.database import Database
from procurd.db.views import WithRetention

log = structlog.get_logger("procurd.retention")

BATCH_ROWS = 2000
LEASE = "retention"
LEASE_SECONDS = 3600


@dataclass
class PruneReport:
    cutoffs: dict[str, datetime] = field(default_factory=dict)  # table: rows written before this went
    deleted: dict[str, int] = field(default_factory=dict)
    skipped: bool = False  # another instance was pruning

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


# Each pruned table and the [retention] key that says how many days it is kept.
TABLES = {
    "audit_log": "audit_days",
    "mirror_changes": "mirror_changes_days",
    "outbox": "outbox_delivered_days",
    "sync_runs": "sync_runs_days",
    "alerts": "alerts_days",
}


def cutoffs(settings: RetentionSettings, now: datetime) -> dict[str, datetime]:
    """Each pruned table's cutoff: rows written before it go (tables kept forever are left out)."""
    days = {name: float(getattr(settings, key)) for name, key in TABLES.items()}
    return {name: now - timedelta(days=kept) for name, kept in days.items() if kept > 0}


async def prune(
    database: Database,
    settings: RetentionSettings,
    holder: str,
    *,
    now: datetime | None = None,
    batch_rows: int = BATCH_ROWS,
) -> PruneReport:
    """Delete what ``settings`` no longer keeps on ``now`` (the clock's time by default); how many rows of
    each table went."""
    report = PruneReport(cutoffs(settings, now or utcnow()))
    if not await database.write(lambda tx: tx.leases.acquire(LEASE, holder, utcnow(), LEASE_SECONDS)):
        log.info("retention.skipped", reason="another instance is pruning")
        report.skipped = True
        return report
    try:
        for name, before in report.cutoffs.items():
            report.deleted[name] = await _prune_table(database, name, before, batch_rows)
            await database.write(lambda tx: tx.leases.renew(LEASE, holder, utcnow(), LEASE_SECONDS))
    finally:
        await database.write(lambda tx: tx.leases.release(LEASE, holder))
    log.info("retention.pruned", deleted=report.deleted, total=report.total)
    return report


async def _prune_table(database: Database, name: str, before: datetime, batch_rows: int) -> int:
    deleted = 0
    if name == "alerts":
        while True:
            count = await database.write(lambda tx: tx.retention.delete_alerts(before, batch_rows))
            deleted += count
            if count < batch_rows:
                return deleted
            await asyncio.sleep(0)  # let waiting writes in between batches
    after_key: int | None = 0
    while after_key is not None:
        done = await database.write(_delete_batch, name, before, after_key, batch_rows)
        deleted += done.deleted
        after_key = done.last_key
        await asyncio.sleep(0)
    return deleted


def _delete_batch(tx: WithRetention, name: str, before: datetime, after_key: int, batch_rows: int) -> Batch:
    return tx.retention.delete_batch(name, before, after_key, batch_rows)
