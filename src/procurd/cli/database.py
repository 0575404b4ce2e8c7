"""``procurd db``: schema management."""

from __future__ import annotations

import click

from procurd.cli.base import (
    CliState,
    common_options,
    database_errors,
    ensure_database_directory,
    main,
    open_database,
    pass_state,
    run_async,
)


@main.group()
def db() -> None:
    """Database schema management."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@common_options
@pass_state
def db_upgrade(state: CliState, revision: str) -> None:
    """Create the schema or migrate it to the current version (safe to run on every start)."""
    from procurd.db import migrate

    settings = state.settings()
    ensure_database_directory(settings)

    async def upgrade() -> tuple[str | None, str | None]:
        database = open_database(settings.database.url)
        try:
            return await database_errors(migrate.upgrade(database, revision))
        finally:
            await database.close()

    before, after = run_async(upgrade())
    if before == after:
        click.echo(f"database already at revision {after}")
    else:
        click.echo(f"database migrated from {before or 'empty'} to revision {after}")
