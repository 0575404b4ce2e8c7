"""``procurd probe [UPSTREAM] [--json]``: which dialect each upstream speaks, and what procurd does about it.

The probe is the installation's operation (:mod:`procurd.operations.probe`): a handful of signed, read-only
requests through the budget every process shares, never an order. Exit codes as ``procurd ping``'s: 0 when
every upstream answered, 1 when one did not, 2 for a usage or configuration mistake.
"""

from __future__ import annotations

import click

from procurd.cli.base import EXIT_FAILURE, CliState, common_options, emit_json, main, pass_state, run_command
from procurd.cli.orders import json_option
from procurd.cli.ping import failure_text
from procurd.config import Settings, UpstreamSettings
from procurd.core.times import count
from procurd.operations import open_operations
from procurd.operations.upstreams import AuthError, Probe
from procurd.output import echo, print_fields


@main.command("probe")
@click.argument("upstream_name", metavar="[UPSTREAM]", required=False)
@json_option
@common_options
@pass_state
def probe_command(state: CliState, upstream_name: str | None, as_json: bool) -> None:
    """Find out which dialect each upstream (or UPSTREAM) speaks: protocol version, clock offset,
    include_inactive, page size, what an inactive product's detail answers, currency, member level; each
    with what procurd does about it. Read-only: a handful of signed requests, never an order."""
    upstreams = state.upstreams(upstream_name)
    probes: list[Probe] = []
    run_command(_probe_all(state.settings(secrets=True), upstreams, probes), as_json)
    if as_json:
        emit_json([found.as_json() for found in probes])
    else:
        for found in probes:
            show_probe(found)
    if any(not found.ok for found in probes):
        raise SystemExit(EXIT_FAILURE)


async def _probe_all(settings: Settings, upstreams: list[UpstreamSettings], probes: list[Probe]) -> None:
    async with open_operations(settings) as operations:
        for upstream in upstreams:
            probes.append(await operations.upstreams.probe(upstream.name))


def show_probe(found: Probe) -> None:
    """What a probe found, for a person: one line naming the dialect, then each point and what procurd
    does about it; a failure on stderr, as ``procurd ping`` prints it."""
    error = found.error
    if isinstance(error, AuthError):
        click.echo(f"{found.upstream}: authentication failed: {error.code}: {error.hint}", err=True)
        return
    if error is not None:
        click.echo(f"{found.upstream}: {failure_text(error)}", err=True)
        return
    json = found.as_json()
    echo(
        f"{found.upstream}: {json['summary']}; {count(found.requests, 'request')} to {found.base_url}, "
        "nothing ordered"
    )
    print_fields(
        [
            (point.point, f"{point.found}{'' if point.ok else ' (!)'}: {point.procurd}")
            for point in found.points()
        ]
    )
    for note in found.notes:
        echo(f"  note: {note}")
