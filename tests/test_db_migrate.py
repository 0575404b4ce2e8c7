"""Schema migrations."""

from __future__ import annotations

from sqlalchemy import inspect

from procurd.db import migrate
from procurd.db.database import Database
from procurd.db.revision import HEAD_REVISION, current_revision
from procurd.db.schema import metadata


async def test_upgrade_creates_every_table(database: Database) -> None:
    """After an upgrade the database holds every table of the schema at the head revision."""
    names = await database.read(lambda tx: set(inspect(tx.connection).get_table_names()))
    assert set(metadata.tables) <= names
    assert await current_revision(database) == migrate.head_revision() == HEAD_REVISION


async def test_upgrade_is_idempotent(database: Database) -> None:
    """A second upgrade of a current database changes nothing and reports the same revision."""
    before, after = await migrate.upgrade(database)
    assert before == after == migrate.head_revision()
