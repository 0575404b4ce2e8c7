"""Statements of ``upstream_health``: the last ping of each upstream, pending auth errors, callback counts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, select, update

from procurd.core.records import UpstreamHealth
from procurd.db.dialect import insert_or_skip
from procurd.db.schema import upstream_health

_COUNT_CALLBACKS = (
    update(upstream_health)
    .where(upstream_health.c.upstream == bindparam("b_upstream"))
    .values(
        callbacks_accepted=upstream_health.c.callbacks_accepted + bindparam("accepted"),
        callbacks_rejected=upstream_health.c.callbacks_rejected + bindparam("rejected"),
    )
)


class HealthStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def ensure_rows(self, names: Iterable[str], now: datetime) -> None:
        """Create the missing rows; instances starting together on one database may both try."""
        existing = set(self.connection.execute(select(upstream_health.c.upstream)).scalars())
        missing = [name for name in dict.fromkeys(names) if name not in existing]
        if not missing:
            return
        self.connection.execute(
            insert_or_skip(self.connection, upstream_health, upstream_health.c.upstream).values(
                [
                    {"upstream": name, "callbacks_accepted": 0, "callbacks_rejected": 0, "updated_at": now}
                    for name in missing
                ]
            )
        )

    def update(self, upstream: str, values: Mapping[str, Any], now: datetime) -> None:
        self.ensure_rows([upstream], now)
        self.connection.execute(
            update(upstream_health)
            .where(upstream_health.c.upstream == upstream)
            .values(**values, updated_at=now)
        )

    def count_callbacks(self, counts: Mapping[str, tuple[int, int]], now: datetime) -> None:
        """Add ``(accepted, rejected)`` callbacks per upstream."""
        if not counts:
            return
        self.ensure_rows(counts, now)
        self.connection.execute(
            _COUNT_CALLBACKS,
            [
                {"b_upstream": name, "accepted": accepted, "rejected": rejected}
                for name, (accepted, rejected) in counts.items()
            ],
        )

    def currency(self, upstream: str) -> str | None:
        """The currency the upstream's last successful ping reported, if any."""
        statement = select(upstream_health.c.currency).where(upstream_health.c.upstream == upstream)
        value = self.connection.execute(statement).scalar()
        return None if value is None else str(value)

    def all(self) -> dict[str, UpstreamHealth]:
        rows = self.connection.execute(select(upstream_health)).mappings()
        return {row["upstream"]: UpstreamHealth(**row) for row in rows}
