"""Schema migrations with Alembic, shipped inside the package (no ini file needed)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text
from sqlalchemy.ext.asyncio import AsyncEngine

# An arbitrary constant: every procurd instance takes this PostgreSQL advisory lock around an upgrade.
MIGRATION_LOCK_ID = 0x70726F63


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", "procurd:migrations")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


async def upgrade(engine: AsyncEngine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to ``revision``; return the revisions before and after."""
    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
        before = await connection.run_sync(_current)
        await connection.run_sync(lambda sync: command.upgrade(alembic_config(sync), revision))
        after = await connection.run_sync(_current)
    return before, after


async def current_revision(engine: AsyncEngine) -> str | None:
    async with engine.connect() as connection:
        return await connection.run_sync(_current)


def _current(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
