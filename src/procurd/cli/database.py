"""``procurd db``: schema management."""

from __future__ import annotations

import click

from procurd.cli.base import CliState, common_options, main, pass_state, run_command
from procurd.config import Settings
from procurd.operations import upgrade_database


@main.group()
def db() -> None:
    """Database schema management."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@common_options
@pass_state
def db_upgrade(state: CliState, revision: str) -> None:
    """Create the schema or migrate it to the current version (safe to run on every start)."""
    run_command(_upgrade(state.settings(), revision))


async def _upgrade(settings: Settings, revision: str) -> None:
    before, after = await upgrade_database(settings, revision)
    if before == after:
        click.echo(f"database already at revision {after}")
    else:
        click.echo(f"database migrated from {before or 'empty'} to revision {after}")
