"""The storefront's outbox: events waiting to be told to the storefront's webhook, claimed by one dispatcher
at a time, in order per order, and released at once when the instance holding them is found dead."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Connection, func, or_, select, type_coerce, update

from procurd.core.records import AuditRow, OutboxRow
from procurd.db.procurement_store import ProcurementStore
from procurd.db.schema import outbox

# A claimed event whose instance stopped before recording the storefront's answer: it may have been told.
UNKNOWN_TRY = "outcome unknown: the instance that claimed it stopped before recording an answer; sent again"


class OutboxStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def claim_events(self, owner: str, now: datetime, lease_until: datetime, limit: int) -> list[OutboxRow]:
        """Claim due events that are the oldest undelivered one of their order (in order per order)."""
        earlier = outbox.alias("earlier")
        blocked = (
            select(earlier.c.id)
            .where(
                earlier.c.order_no == outbox.c.order_no,
                earlier.c.id < outbox.c.id,
                earlier.c.delivered_at.is_(None),
            )
            .exists()
        )
        due = (
            select(outbox.c.id)
            .where(
                outbox.c.delivered_at.is_(None),
                outbox.c.next_attempt_at <= now,
                or_(outbox.c.lease_owner.is_(None), outbox.c.lease_expires_at < now),
                ~blocked,
            )
            .order_by(outbox.c.id)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        statement = (
            update(outbox)
            .where(outbox.c.id.in_(due.scalar_subquery()))
            .values(lease_owner=owner, lease_expires_at=lease_until, attempts=outbox.c.attempts + 1)
            .returning(
                outbox.c.id,
                outbox.c.event_id,
                outbox.c.order_no,
                outbox.c.event,
                outbox.c.payload,
                outbox.c.attempts,
            )
        )
        rows = sorted(self.connection.execute(statement), key=lambda row: row.id)
        return [
            OutboxRow(row.id, row.event_id, row.order_no, row.event, row.payload, row.attempts)
            for row in rows
        ]

    def event_delivered(self, event_row_id: int, now: datetime) -> None:
        self.connection.execute(
            update(outbox)
            .where(outbox.c.id == event_row_id)
            .values(delivered_at=now, lease_owner=None, lease_expires_at=None, last_error=None)
        )

    def event_failed(self, event_row_id: int, error: str, retry_at: datetime) -> None:
        self.connection.execute(
            update(outbox)
            .where(outbox.c.id == event_row_id)
            .values(next_attempt_at=retry_at, lease_owner=None, lease_expires_at=None, last_error=error[:500])
        )

    def pending_events(self) -> int:
        statement = select(func.count()).select_from(outbox).where(outbox.c.delivered_at.is_(None))
        return int(self.connection.execute(statement).scalar_one())

    def next_event_due(self) -> datetime | None:
        statement = select(
            type_coerce(func.min(outbox.c.next_attempt_at), outbox.c.next_attempt_at.type)
        ).where(outbox.c.delivered_at.is_(None))
        value = self.connection.execute(statement).scalar_one_or_none()
        return value if isinstance(value, datetime) else None

    def release(self, instances: Sequence[str], now: datetime) -> list[OutboxRow]:
        """The events ``instances`` (found dead) had claimed, due again at once. The try each was in (counted
        in ``attempts`` when it was claimed) is recorded as of unknown outcome: the storefront may have it
        (it de-duplicates by ``event_id``). Its ``last_error`` says so, and so does an entry
        ``storefront_event_unknown`` in its order's audit trail, which outlives the event's delivery."""
        if not instances:
            return []
        claimed = list(
            self.connection.execute(
                select(outbox.c.id, outbox.c.event_id, outbox.c.order_no, outbox.c.event, outbox.c.attempts,
                       outbox.c.lease_owner)
                .where(outbox.c.lease_owner.in_(list(instances)), outbox.c.delivered_at.is_(None))
                .order_by(outbox.c.id)
                .with_for_update()
            )
        )  # fmt: skip
        if not claimed:
            return []
        self.connection.execute(
            update(outbox)
            .where(outbox.c.id.in_([row.id for row in claimed]))
            .values(
                lease_owner=None,
                lease_expires_at=None,
                next_attempt_at=now,
                last_error=UNKNOWN_TRY,
            )
        )
        ProcurementStore(self.connection).insert_audit(
            [
                AuditRow(
                    row.order_no, None, now, "worker", "storefront_event_unknown", None, None,
                    {"event": row.event, "event_id": row.event_id, "attempt": row.attempts,
                     "instance": row.lease_owner, "outcome": UNKNOWN_TRY},
                )
                for row in claimed
            ]
        )  # fmt: skip
        return [OutboxRow(row.id, row.event_id, row.order_no, row.event, {}, row.attempts) for row in claimed]
