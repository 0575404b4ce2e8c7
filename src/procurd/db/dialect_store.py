"""Statements of ``upstream_dialects``: what each upstream's answers showed of the dialect it speaks."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, or_, select, update

from procurd.core.dialect import Learned
from procurd.db.dialect import insert_or_skip
from procurd.db.schema import mirror_products, upstream_dialects

LEARNED_FIELDS = frozenset(column.name for column in upstream_dialects.columns) - {"upstream", "updated_at"}


class DialectStore:
    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def learn(self, upstream: str, values: Mapping[str, Any], now: datetime) -> None:
        """Record what an answer of ``upstream`` showed (only the columns named; others keep theirs)."""
        unknown = set(values) - LEARNED_FIELDS
        if unknown:
            raise ValueError(f"not something an upstream's answers show: {', '.join(sorted(unknown))}")
        self.connection.execute(
            insert_or_skip(self.connection, upstream_dialects, upstream_dialects.c.upstream).values(
                upstream=upstream, updated_at=now
            )
        )
        self.connection.execute(
            update(upstream_dialects)
            .where(upstream_dialects.c.upstream == upstream)
            .values(**values, updated_at=now)
        )

    def all(self) -> dict[str, Learned]:
        """What is known of every upstream that answered anything, by name."""
        rows = self.connection.execute(select(upstream_dialects)).mappings()
        return {str(row["upstream"]): Learned(**dict(row)) for row in rows}

    def of(self, upstream: str) -> Learned:
        """What is known of ``upstream`` (nothing yet: every field ``None``)."""
        row = (
            self.connection.execute(select(upstream_dialects).where(upstream_dialects.c.upstream == upstream))
            .mappings()
            .first()
        )
        return Learned(upstream=upstream) if row is None else Learned(**dict(row))

    def off_sale(self, upstream: str, limit: int) -> list[int]:
        """Products of ``upstream`` the mirror holds off sale (inactive, or no longer listed), the most
        recently written first: whose detail shows what the upstream answers for an inactive product."""
        statement = (
            select(mirror_products.c.id)
            .where(
                mirror_products.c.upstream == upstream,
                or_(mirror_products.c.is_active.is_(False), mirror_products.c.removed_at.is_not(None)),
            )
            .order_by(mirror_products.c.synced_at.desc(), mirror_products.c.id)
            .limit(limit)
        )
        return [int(identity) for identity in self.connection.execute(statement).scalars()]
