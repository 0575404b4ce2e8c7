"""Statements of ``instances``: every daemon on the database, its heartbeat, and how it ended."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, delete, insert, select, update

from procurd.core.records import Instance, Survey
from procurd.db.schema import instances


class InstanceStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def register(self, instance: Instance) -> None:
        """Record a starting daemon (a restart under an id seen before starts its row afresh)."""
        self.connection.execute(delete(instances).where(instances.c.id == instance.id))
        self.connection.execute(
            insert(instances).values(
                id=instance.id,
                host=instance.host,
                pid=instance.pid,
                version=instance.version,
                started_at=instance.started_at,
                heartbeat_at=instance.heartbeat_at,
            )
        )

    def heartbeat(self, instance_id: str, now: datetime) -> bool:
        """Beat; False when the row is gone or marked down (another instance took over its work)."""
        result = self.connection.execute(
            update(instances)
            .where(
                instances.c.id == instance_id, instances.c.down_at.is_(None), instances.c.stopped_at.is_(None)
            )
            .values(heartbeat_at=now)
        )
        return result.rowcount == 1

    def stopped(self, instance_id: str, now: datetime) -> None:
        """A clean shutdown."""
        self.connection.execute(update(instances).where(instances.c.id == instance_id).values(stopped_at=now))

    def mark_down(self, stale_before: datetime, now: datetime, also: list[str] | None = None) -> Survey:
        """Instances that stopped beating before ``stale_before`` without a clean shutdown (and those named in
        ``also``: found dead another way), marked down now; only the caller that marks one gets it back."""
        candidates = select(instances).where(instances.c.stopped_at.is_(None), instances.c.down_at.is_(None))
        live = [Instance(**row) for row in self.connection.execute(candidates.with_for_update()).mappings()]
        stale = [i for i in live if i.heartbeat_at < stale_before or i.id in (also or [])]
        for instance in stale:
            self.connection.execute(
                update(instances).where(instances.c.id == instance.id).values(down_at=now)
            )
        beats = [instance.heartbeat_at for instance in live if instance not in stale]
        return Survey(stale, min(beats, default=None))

    def all(self) -> list[Instance]:
        statement = select(instances).order_by(instances.c.started_at.desc(), instances.c.id)
        return [Instance(**row) for row in self.connection.execute(statement).mappings()]

    def forget_before(self, before: datetime) -> int:
        """Delete rows of instances that ended (cleanly or not) before ``before``."""
        ended = (instances.c.stopped_at < before) | (instances.c.down_at < before)
        return int(self.connection.execute(delete(instances).where(ended)).rowcount)
