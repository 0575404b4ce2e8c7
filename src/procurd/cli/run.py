"""``procurd run``: the daemon."""

from __future__ import annotations

import sys

import click

from procurd.cli.base import CliState, common_options, main, pass_state, run_async
from procurd.operations import InstallationError, check_database_location


@main.command()
@common_options
@pass_state
def run(state: CliState) -> None:
    """The daemon: both listeners, the procurement workers, the scheduled catalogue sync, pings and polls."""
    from procurd.daemon import StartupError, run_daemon

    settings = state.settings(secrets=True, daemon=True)
    try:
        check_database_location(settings)
    except InstallationError as exc:
        click.echo(f"procurd: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    try:
        code = run_async(run_daemon(settings))
    except StartupError as exc:
        click.echo(f"procurd: not starting: {exc}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code)
