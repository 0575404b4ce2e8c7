"""Statements whose SQL differs between SQLite and PostgreSQL.

Each dialect's module is imported on first use, so a daemon on SQLite never loads PostgreSQL's.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Column, Connection, Insert, Table


def insert_or_skip(connection: Connection, table: Table, *key: Column[Any]) -> Insert:
    """``INSERT ... ON CONFLICT (key) DO NOTHING`` into ``table`` in the connection's dialect."""
    if connection.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
    return insert(table).on_conflict_do_nothing(index_elements=list(key))
