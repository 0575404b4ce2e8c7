"""``procurd ping``: connectivity check of each configured upstream."""

from __future__ import annotations

import click

from procurd.cli.base import EXIT_FAILURE, CliState, common_options, main, pass_state, run_async
from procurd.config import UpstreamSettings

SUPPORTED_PROTOCOL = "1.0"


@main.command()
@click.option("--upstream", "upstream_name", metavar="NAME", help="Only this upstream (default: all).")
@common_options
@pass_state
def ping(state: CliState, upstream_name: str | None) -> None:
    """Check connectivity: site name, protocol version, balance, currency, member level, latency."""
    upstreams = state.upstreams(upstream_name)
    failures = run_async(_ping_all(upstreams))
    if failures:
        raise SystemExit(EXIT_FAILURE)


async def _ping_all(upstreams: list[UpstreamSettings]) -> int:
    failures = 0
    for upstream in upstreams:
        ok = await _ping_one(upstream)
        failures += not ok
    return failures


async def _ping_one(upstream: UpstreamSettings) -> bool:
    from procurd.upstream.client import UpstreamClient
    from procurd.upstream.errors import AuthError, UpstreamError

    async with UpstreamClient(upstream) as client:
        try:
            result = await client.ping()
        except AuthError as exc:
            click.echo(f"{upstream.name}: authentication failed: {exc.code}: {exc.hint}", err=True)
            return False
        except UpstreamError as exc:
            click.echo(f"{upstream.name}: {exc}", err=True)
            return False
    level = "none"
    if result.member_level is not None:
        names = result.member_level.name or {}
        level = next(iter(names.values()), None) or result.member_level.slug or "unnamed"
    click.echo(f"{upstream.name}: ok ({upstream.base_url})")
    click.echo(f"  site name:        {result.site_name}")
    click.echo(f"  protocol version: {result.protocol_version}")
    click.echo(f"  balance:          {result.balance} {result.currency}")
    click.echo(f"  member level:     {level}")
    click.echo(f"  latency:          {result.latency_ms} ms")
    if result.protocol_version != SUPPORTED_PROTOCOL:
        click.echo(
            f"{upstream.name}: warning: protocol version {result.protocol_version!r} is not "
            f"{SUPPORTED_PROTOCOL!r}; procurd speaks {SUPPORTED_PROTOCOL}",
            err=True,
        )
    return True
