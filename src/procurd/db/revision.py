"""The schema revision this version of procurd needs, and the one a database is at (without Alembic)."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

from procurd.db.database import Database

HEAD_REVISION = "0006"  # the newest file in procurd/migrations/versions (a test keeps them in step)


async def current_revision(database: Database) -> str | None:
    """The revision the database is at, or ``None`` when it has no schema yet."""
    return await database.read(lambda tx: _current(tx.connection))


def _current(connection: Connection) -> str | None:
    if not inspect(connection).has_table("alembic_version"):
        return None
    value = connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()
    return None if value is None else str(value)


def describe_mismatch(current: str | None) -> str | None:
    """Why a database at ``current`` cannot be used by this version, or ``None`` when it can."""
    if current == HEAD_REVISION:
        return None
    where = "empty" if current is None else f"at revision {current}"
    return f"the database is {where}, this version needs {HEAD_REVISION}: run `procurd db upgrade`"
