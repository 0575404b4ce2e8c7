"""Statements of ``alerts``: one row per alert key, and the sends that are due."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, RowMapping, bindparam, func, insert, or_, select, type_coerce, update

from procurd.core.alerts import Alert, Kind, Occurrence, occur, send_failed, sent
from procurd.db.schema import alerts

_FIELDS = (
    "key", "kind", "subject", "upstream", "message", "first_at", "last_at", "count", "unsent", "sent_at",
    "send_due_at", "attempts", "error",
)  # fmt: skip
_INSERT = insert(alerts)
_UPDATE = (
    update(alerts)
    .where(alerts.c.key == bindparam("b_key"))
    .values({name: bindparam(name) for name in _FIELDS if name != "key"})
)


def to_alert(row: RowMapping) -> Alert:
    values = {name: row[name] for name in _FIELDS}
    values["kind"] = Kind(values["kind"])
    return Alert(**values)


def _values(alert: Alert) -> dict[str, Any]:
    values = {name: getattr(alert, name) for name in _FIELDS}
    values["kind"] = alert.kind.value
    return values


class AlertStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def occur(
        self, occurrences: Sequence[Occurrence], now: datetime, repeat_after: float, deliver: bool
    ) -> list[Alert]:
        """Record occurrences (several of one key count one after the other); the alerts as they now are."""
        if not occurrences:
            return []
        keys = sorted({occurrence.key for occurrence in occurrences})
        found = self.connection.execute(
            select(alerts).where(alerts.c.key.in_(keys)).with_for_update()
        ).mappings()
        existing = {row["key"]: to_alert(row) for row in found}
        current: dict[str, Alert] = {}
        for occurrence in occurrences:
            before = current.get(occurrence.key) or existing.get(occurrence.key)
            current[occurrence.key] = occur(before, occurrence, now, repeat_after, deliver)
        new = [_values(alert) for key, alert in current.items() if key not in existing]
        changed = [dict(_values(alert), b_key=key) for key, alert in current.items() if key in existing]
        if new:
            self.connection.execute(_INSERT, new)
        if changed:
            self.connection.execute(_UPDATE, changed)
        return list(current.values())

    def claim_sends(self, owner: str, now: datetime, lease_until: datetime, limit: int) -> list[Alert]:
        """Take alerts whose message is due for ``owner`` until ``lease_until``."""
        due = (
            select(alerts.c.key)
            .where(
                alerts.c.send_due_at <= now,
                or_(alerts.c.lease_owner.is_(None), alerts.c.lease_expires_at < now),
            )
            .order_by(alerts.c.send_due_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        keys = list(self.connection.execute(due).scalars())
        if not keys:
            return []
        self.connection.execute(
            update(alerts)
            .where(alerts.c.key.in_(keys))
            .values(lease_owner=owner, lease_expires_at=lease_until)
        )
        rows = self.connection.execute(select(alerts).where(alerts.c.key.in_(keys))).mappings()
        return [to_alert(row) for row in rows]

    def settle_sent(self, key: str, owner: str, covered: int, now: datetime, repeat_after: float) -> None:
        """A message covering ``covered`` occurrences went out; let the claim go."""
        stored = self._claimed(key, owner)
        if stored is not None:
            self._store(sent(stored, covered, now, repeat_after))

    def settle_failed(self, key: str, owner: str, error: str, now: datetime) -> None:
        """The message did not go out; try again later and let the claim go."""
        stored = self._claimed(key, owner)
        if stored is not None:
            self._store(send_failed(stored, error, now))

    def _claimed(self, key: str, owner: str) -> Alert | None:
        row = (
            self.connection.execute(select(alerts).where(alerts.c.key == key).with_for_update())
            .mappings()
            .first()
        )
        return None if row is None or row["lease_owner"] != owner else to_alert(row)

    def _store(self, alert: Alert) -> None:
        values = {name: value for name, value in _values(alert).items() if name != "key"}
        self.connection.execute(
            update(alerts)
            .where(alerts.c.key == alert.key)
            .values(**values, lease_owner=None, lease_expires_at=None)
        )

    def recent(self, page: int, page_size: int, kind: str | None = None) -> tuple[int, list[Alert]]:
        conditions = [alerts.c.kind == kind] if kind else []
        total = self.connection.execute(
            select(func.count()).select_from(alerts).where(*conditions)
        ).scalar_one()
        rows = self.connection.execute(
            select(alerts)
            .where(*conditions)
            .order_by(alerts.c.last_at.desc(), alerts.c.key)
            .limit(page_size)
            .offset((page - 1) * page_size)
        ).mappings()
        return int(total), [to_alert(row) for row in rows]

    def count_since(self, since: datetime) -> int:
        statement = select(func.count()).select_from(alerts).where(alerts.c.last_at >= since)
        return int(self.connection.execute(statement).scalar_one())

    def next_send_due(self) -> datetime | None:
        statement = select(type_coerce(func.min(alerts.c.send_due_at), alerts.c.send_due_at.type))
        value = self.connection.execute(statement).scalar_one_or_none()
        return value if isinstance(value, datetime) else None
