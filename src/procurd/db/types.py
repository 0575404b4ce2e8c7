"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Dialect, String, TypeDecorator
from sqlalchemy.types import TypeEngine

from procurd.core.clock import (
    utcnow as utcnow,  # re-exported: the stores and their callers read the same clock
)


class JsonDocument(TypeDecorator[Any]):
    """JSON; JSONB on PostgreSQL, whose dialect is imported only there (a daemon on SQLite never loads it)."""

    impl = JSON
    cache_ok = True
    should_evaluate_none = True  # as JSON's: Python None is stored as JSON null

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


class UtcDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def Money() -> String:
    """An exact decimal amount kept as the text the upstream sent (never a float)."""
    return String(40)
