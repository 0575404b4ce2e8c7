"""``procurd ping``: connectivity check of each configured upstream.

The ping is the installation's operation: signed, through the budget every process shares, and recorded
(the health row the status report shows, alert ``low_balance``) as the daemon's own pings are.
"""

from __future__ import annotations

import click

from procurd.cli.base import EXIT_FAILURE, CliState, common_options, main, pass_state, run_command
from procurd.config import Settings, UpstreamSettings
from procurd.operations import open_operations
from procurd.operations.upstreams import AuthError, PingResult, UpstreamError
from procurd.output import PROTOCOL_NAMES

SUPPORTED_PROTOCOL = "1.0"


@main.command()
@click.option("--upstream", "upstream_name", metavar="NAME", help="Only this upstream (default: all).")
@common_options
@pass_state
def ping(state: CliState, upstream_name: str | None) -> None:
    """Check connectivity: protocol, site name, protocol version, balance, currency, member level,
    latency."""
    upstreams = state.upstreams(upstream_name)
    failures: list[str] = []
    run_command(_ping_all(state.settings(secrets=True), upstreams, failures))
    if failures:
        raise SystemExit(EXIT_FAILURE)


async def _ping_all(settings: Settings, upstreams: list[UpstreamSettings], failures: list[str]) -> None:
    async with open_operations(settings) as operations:
        for upstream in upstreams:
            outcome = await operations.upstreams.ping(upstream.name)
            if not show_ping(upstream, outcome):
                failures.append(upstream.name)


def failure_text(error: UpstreamError) -> str:
    """What went wrong, without the upstream's name (the line names it already): ``HTTP 502 CODE: TEXT``."""
    status = f"HTTP {error.http_status} " if error.http_status is not None else ""
    message = f": {error.message}" if error.message else ""
    return f"{status}{error.code}{message}"


def show_ping(upstream: UpstreamSettings, outcome: PingResult | UpstreamError) -> bool:
    """Print what a ping found; whether it succeeded."""
    if isinstance(outcome, AuthError):
        click.echo(f"{upstream.name}: authentication failed: {outcome.code}: {outcome.hint}", err=True)
        return False
    if isinstance(outcome, UpstreamError):
        hint = f": {outcome.hint}" if outcome.hint else ""
        click.echo(f"{upstream.name}: {failure_text(outcome)}{hint}", err=True)
        return False
    level = "none"
    if outcome.member_level is not None:
        names = outcome.member_level.name or {}
        level = next(iter(names.values()), None) or outcome.member_level.slug or "unnamed"
    click.echo(f"{upstream.name}: ok ({upstream.base_url})")
    click.echo(f"  protocol:         {PROTOCOL_NAMES.get(upstream.protocol, upstream.protocol)}")
    click.echo(f"  site name:        {outcome.site_name}")
    if upstream.protocol == "acg-faka":
        # acg-faka reports no version, no member level: `procurd probe` reads the version's features.
        click.echo(f"  member id:        {outcome.user_id}")
        click.echo(f"  balance:          {outcome.balance} {outcome.currency} (the currency is the block's)")
        click.echo(f"  latency:          {outcome.latency_ms} ms")
        return True
    click.echo(f"  protocol version: {outcome.protocol_version}")
    click.echo(f"  balance:          {outcome.balance} {outcome.currency}")
    click.echo(f"  member level:     {level}")
    click.echo(f"  latency:          {outcome.latency_ms} ms")
    if outcome.protocol_version != SUPPORTED_PROTOCOL:
        click.echo(
            f"{upstream.name}: warning: protocol version {outcome.protocol_version!r} is not "
            f"{SUPPORTED_PROTOCOL!r}; procurd speaks {SUPPORTED_PROTOCOL}",
            err=True,
        )
    return True
