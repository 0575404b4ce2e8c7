"""Shared pieces of the command line: the root group, configuration loading, exit codes."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click
import structlog

from procurd import __version__
from procurd.config import ConfigError, Settings, UpstreamSettings, load_settings
from procurd.logs import configure_logging, register_secrets

if TYPE_CHECKING:
    from procurd.db.database import Database

T = TypeVar("T")

EXIT_CONFIG = 2
EXIT_FAILURE = 1

log = structlog.get_logger("procurd.cli")


@dataclass
class CliState:
    config_path: str | None
    log_level: str | None
    log_format: str | None
    _settings: Settings | None = None

    def settings(self) -> Settings:
        """Load the configuration once; a problem ends the program with exit code 2."""
        if self._settings is None:
            try:
                self._settings = load_settings(self.config_path)
            except ConfigError as exc:
                fail_config(str(exc))
            register_secrets(
                [u.secret() for u in self._settings.upstreams]
                + [
                    self._settings.server.admin_token.get_secret_value(),
                    self._settings.storefront.webhook_secret.get_secret_value(),
                ]
            )
            configure_logging(
                self.log_level or self._settings.logging.level,
                self.log_format or self._settings.logging.format,
            )
        return self._settings

    def upstreams(self, name: str | None) -> list[UpstreamSettings]:
        settings = self.settings()
        if name is None:
            return list(settings.upstreams)
        try:
            return [settings.upstream(name)]
        except KeyError:
            known = ", ".join(u.name for u in settings.upstreams)
            fail_usage(f"no upstream named {name!r} is configured (configured: {known})")


def fail_config(message: str) -> NoReturn:
    click.echo(f"procurd: configuration error\n{message}", err=True)
    sys.exit(EXIT_CONFIG)


def fail_usage(message: str) -> NoReturn:
    click.echo(f"procurd: {message}", err=True)
    sys.exit(EXIT_CONFIG)


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


pass_state = click.make_pass_decorator(CliState)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="Configuration file (default: $PROCURD_CONFIG, ./procurd.toml, /etc/procurd/procurd.toml).",
)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), help="Override [logging] level."
)
@click.option(
    "--log-format", type=click.Choice(["json", "console", "auto"]), help="Override [logging] format."
)
@click.version_option(__version__, prog_name="procurd")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, log_level: str | None, log_format: str | None) -> None:
    """procurd: mirror upstream catalogues and procure paid orders over the signed upstream API."""
    ctx.obj = CliState(config_path, log_level, log_format)
    configure_logging(log_level or "warning", log_format or "auto")


async def database_errors(awaitable: Awaitable[T]) -> T:
    """Turn database failures into one clear line and exit code 1."""
    from procurd.db.errors import DatabaseError

    try:
        return await awaitable
    except DatabaseError as exc:
        click.echo(f"procurd: database error: {exc.reason}", err=True)
        sys.exit(EXIT_FAILURE)


def open_database(url: str) -> Database:
    """The configured database; one that cannot even be opened ends the program with exit code 1."""
    from procurd.db.database import open_database as open_backend
    from procurd.db.errors import DatabaseError

    try:
        return open_backend(url)
    except DatabaseError as exc:
        click.echo(f"procurd: database error: {exc.reason}", err=True)
        sys.exit(EXIT_FAILURE)


async def open_current_database(url: str) -> Database:
    """The database, at the current migration; otherwise a clear message and exit 1."""
    from procurd.db.revision import current_revision, describe_mismatch

    database = open_database(url)
    mismatch = describe_mismatch(await database_errors(current_revision(database)))
    if mismatch is not None:
        await database.close()
        click.echo(f"procurd: {mismatch}", err=True)
        sys.exit(EXIT_FAILURE)
    return database
