"""The schema revision this version of procurd needs, the one a database is at (read without Alembic), and
the migration to another (Alembic, loaded only then: a running daemon never loads it)."""

from __future__ import annotations

from sqlalchemy import Connection, inspect, text

HEAD_REVISION = "0009"  # the newest file in procurd/migrations/versions (a test keeps them in step)


class SchemaStore:
    """The schema as a transaction sees it."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def revision(self) -> str | None:
        """The revision the database is at, or ``None`` when it has no schema yet."""
        if not inspect(self.connection).has_table("alembic_version"):
            return None
        value = self.connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one_or_none()
        return None if value is None else str(value)

    def upgrade(self, revision: str = "head") -> tuple[str | None, str | None]:
        """Migrate to ``revision`` (Alembic); the revisions before and after."""
        from procurd.db.migrate import upgrade  # Alembic is loaded only here

        return upgrade(self.connection, revision)


def describe_mismatch(current: str | None) -> str | None:
    """Why a database at ``current`` cannot be used by this version, or ``None`` when it can."""
    if current == HEAD_REVISION:
        return None
    where = "empty" if current is None else f"at revision {current}"
    return f"the database is {where}, this version needs {HEAD_REVISION}: run `procurd db upgrade`"
