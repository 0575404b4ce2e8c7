"""Schema migrations."""

from __future__ import annotations

from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine

from procurd.db import migrate
from procurd.db.schema import metadata


async def test_upgrade_creates_every_table(engine: AsyncEngine) -> None:
    """After an upgrade the database holds every table of the schema at the head revision."""
    async with engine.connect() as connection:
        names = await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    assert set(metadata.tables) <= names
    assert await migrate.current_revision(engine) == migrate.head_revision()


async def test_upgrade_is_idempotent(engine: AsyncEngine) -> None:
    """A second upgrade of a current database changes nothing and reports the same revision."""
    before, after = await migrate.upgrade(engine)
    assert before == after == migrate.head_revision()
