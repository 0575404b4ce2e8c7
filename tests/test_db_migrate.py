"""Schema migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from procurd.db import migrate
from procurd.db.database import Database
from procurd.db.revision import HEAD_REVISION, describe_mismatch
from procurd.db.schema import ddl_metadata, metadata
from procurd.db.stores import Tx
from procurd.operations.installation import current_revision, migrate_schema


async def test_upgrade_creates_every_table(database: Database) -> None:
    """After an upgrade the database holds every table of the schema at the head revision."""
    names = await database.read(lambda tx: set(inspect(tx.connection).get_table_names()))
    assert set(metadata.tables) <= names
    assert await current_revision(database) == migrate.head_revision() == HEAD_REVISION


async def test_upgrade_is_idempotent(database: Database) -> None:
    """A second upgrade of a current database changes nothing and reports the same revision."""
    before, after = await migrate_schema(database)
    assert before == after == migrate.head_revision()


async def test_migrations_build_exactly_the_schema(database: Database) -> None:
    """The migrated database has every table, column, type and index the schema declares, nothing else."""

    def differences(tx: Tx) -> list[object]:
        context = MigrationContext.configure(tx.connection, opts={"compare_type": True})
        return list(compare_metadata(context, ddl_metadata()))

    assert await database.read(differences) == []


def test_the_daemon_knows_the_newest_migration() -> None:
    """The revision the daemon checks at start-up (without loading Alembic) is the newest migration's."""
    assert migrate.head_revision() == HEAD_REVISION
    assert describe_mismatch(HEAD_REVISION) is None
    assert "procurd db upgrade" in (describe_mismatch(None) or "")
