"""Schema migrations with Alembic, shipped inside the package (no ini file needed).

Only a migration (``procurd db upgrade``, :meth:`procurd.db.revision.SchemaStore.upgrade`) and tests import
this module: a running daemon checks the schema's revision with :mod:`procurd.db.revision`, without loading
Alembic.
"""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, text

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


def upgrade(connection: Connection, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to ``revision`` in the transaction of ``connection``; the revisions before and after."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID})
    before = MigrationContext.configure(connection).get_current_revision()
    command.upgrade(alembic_config(connection), revision)
    after = MigrationContext.configure(connection).get_current_revision()
    return before, after
