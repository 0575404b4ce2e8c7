"""Shared pieces of the command line: the root group, configuration loading, exit codes."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

import click
import structlog

from procurd import __version__
from procurd.config import ConfigError, Settings, UpstreamSettings, load_settings
from procurd.logs import configure_logging, register_secrets

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

EXIT_CONFIG = 2
EXIT_FAILURE = 1
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
QUIET = "critical"  # the level of a command whose answer is all a person at a terminal needs

log = structlog.get_logger("procurd.cli")


@dataclass
class CliState:
    config_path: str | None
    log_level: str | None
    log_format: str | None
    _loaded: dict[bool, Settings] = field(default_factory=dict)

    def settings(self, *, secrets: bool = False, daemon: bool = False) -> Settings:
        """The configuration, loaded once; a problem ends the program with exit code 2.

        Secret files are read only with ``secrets`` (commands that talk to an upstream or serve): everything
        else works on the database alone. One-shot commands log warnings and worse unless ``--log-level``
        says otherwise; the ``daemon`` logs at ``[logging] level``.
        """
        try:
            return self.load(secrets=secrets, daemon=daemon)
        except ConfigError as exc:
            fail_config(str(exc))

    def load(self, *, secrets: bool = False, daemon: bool = False) -> Settings:
        """:meth:`settings`, raising :class:`ConfigError` instead of ending the program."""
        settings = self._loaded.get(secrets)
        if settings is None:
            settings = load_settings(self.config_path, read_secret_files=secrets)
            self._loaded[secrets] = settings
            register_secrets(known_secrets(settings))
        configured = settings.logging.level
        if self.log_level is not None:
            level = self.log_level
        elif daemon:
            level = configured
        elif answer_only(self.log_level, self.log_format):
            level = QUIET
        else:
            level = max(configured, "warning", key=LOG_LEVELS.index)
        configure_logging(level, self.log_format or settings.logging.format)
        return settings

    def upstreams(self, name: str | None) -> list[UpstreamSettings]:
        settings = self.settings(secrets=True)
        if name is None:
            return list(settings.upstreams)
        try:
            return [settings.upstream(name)]
        except KeyError:
            known = ", ".join(u.name for u in settings.upstreams)
            fail_usage(f"no upstream named {name!r} is configured (configured: {known})")


def answer_only(log_level: str | None, log_format: str | None) -> bool:
    """Whether a one-shot command shows its answer alone: on a terminal, unless ``--log-level`` or
    ``--log-format`` asks for log lines (a pipe, a file or the journal gets warnings and worse)."""
    return log_level is None and log_format is None and sys.stderr.isatty()


def known_secrets(settings: Settings) -> list[str]:
    """Every secret value the settings hold (those read so far)."""
    return [
        *(u.api_secret.get_secret_value() for u in settings.upstreams if u.api_secret is not None),
        *(u.app_key.get_secret_value() for u in settings.upstreams if u.app_key is not None),
        settings.server.admin_token.get_secret_value(),
        settings.storefront.webhook_secret.get_secret_value(),
    ]


def fail_config(message: str) -> NoReturn:
    """``procurd: configuration error: PROBLEM``, or the heading and one line per problem."""
    separator = "\n" if "\n" in message else ": "
    click.echo(f"procurd: configuration error{separator}{message}", err=True)
    sys.exit(EXIT_CONFIG)


def fail_usage(message: str) -> NoReturn:
    click.echo(f"procurd: {message}", err=True)
    sys.exit(EXIT_CONFIG)


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


pass_state = click.make_pass_decorator(CliState)


def _remember(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A common option given after the subcommand overrides the one given before it."""
    if value is not None and param.name is not None:
        setattr(ctx.find_object(CliState), param.name, value)
    return value


def _common_options(**extra: Any) -> list[Callable[[F], F]]:
    return [
        click.option(
            "--config",
            "config_path",
            type=click.Path(),  # checked when read, with the same words as $PROCURD_CONFIG
            help="Configuration file (default: $PROCURD_CONFIG, ./procurd.toml, /etc/procurd/procurd.toml).",
            **extra,
        ),
        click.option(
            "--log-level",
            type=click.Choice(LOG_LEVELS),
            help="Override [logging] level. One-shot commands show their answer alone on a terminal, and "
            "log warnings and worse elsewhere, unless this or --log-format asks for log lines.",
            **extra,
        ),
        click.option(
            "--log-format",
            type=click.Choice(["json", "console", "auto"]),
            help="Override [logging] format (auto: readable lines on a terminal, JSON elsewhere).",
            **extra,
        ),
    ]


def common_options(command: F) -> F:
    """``--config``, ``--log-level`` and ``--log-format`` on a subcommand, so they work after it as well
    (``procurd status --config x.toml``)."""
    for option in reversed(_common_options(expose_value=False, callback=_remember)):
        command = option(command)
    return command


def _group_options(group: F) -> F:
    for option in reversed(_common_options()):
        group = option(group)
    return group


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@_group_options
@click.version_option(__version__, prog_name="procurd")
@click.pass_context
def main(ctx: click.Context, config_path: str | None, log_level: str | None, log_format: str | None) -> None:
    """procurd: mirror upstream catalogues and procure paid orders over the signed upstream API."""
    ctx.obj = CliState(config_path, log_level, log_format)
    configure_logging(
        log_level or (QUIET if answer_only(log_level, log_format) else "warning"), log_format or "auto"
    )


def run_command(coroutine: Coroutine[Any, Any, Any], as_json: bool = False) -> None:
    """Run a command's coroutine. A refusal prints ``procurd: CODE: MESSAGE`` (and the admin API's answer
    with ``--json``) and exits 1; a database that cannot be used prints one line and exits 1 (2 for a
    configuration mistake)."""
    from procurd.operations import DatabaseError, InstallationError, Refused

    try:
        run_async(coroutine)
    except Refused as refused:
        click.echo(f"procurd: {refused.code}: {refused.message}", err=True)
        if as_json:
            emit_json(
                {"ok": False, "error_code": refused.code, "error_message": refused.message, **refused.extra}
            )
        sys.exit(EXIT_FAILURE)
    except InstallationError as exc:
        click.echo(f"procurd: {exc.message}", err=True)
        sys.exit(exc.exit_code)
    except DatabaseError as exc:
        click.echo(f"procurd: database error: {exc.reason}", err=True)
        sys.exit(EXIT_FAILURE)


def emit_json(data: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
    click.echo(json.dumps(data, ensure_ascii=False, indent=2, default=str))
