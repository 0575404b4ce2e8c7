"""``procurd reconcile``: one reconciliation pass now, with its findings."""

from __future__ import annotations

import click

from procurd.cli.base import CliState, common_options, emit_json, main, pass_state, run_command
from procurd.cli.orders import json_option
from procurd.config import Settings
from procurd.core.times import count
from procurd.operations import open_operations
from procurd.operations.upstreams import finding_view
from procurd.output import Column, echo, print_table


@main.command("reconcile")
@click.option("--upstream", metavar="NAME", help="Only this upstream's orders.")
@click.option(
    "--window",
    "window_seconds",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="How far back to look (default: [reconcile] window_seconds).",
)
@click.option("--no-repair", is_flag=True, help="Only report what disagrees; change nothing.")
@json_option
@common_options
@pass_state
def reconcile_command(
    state: CliState, upstream: str | None, window_seconds: float | None, no_repair: bool, as_json: bool
) -> None:
    """Compare every procurement in the window with the upstream's order (status, amount, currency); apply
    what the upstream says through the normal state path unless --no-repair."""
    settings = state.settings()
    state.upstreams(upstream)  # a name that is not configured is a usage error
    window = window_seconds or settings.reconcile.window_seconds
    repair = settings.reconcile.repair and not no_repair
    run_command(_reconcile(settings, upstream, window, repair, as_json), as_json)


async def _reconcile(
    settings: Settings, upstream: str | None, window: float, repair: bool, as_json: bool
) -> None:
    async with open_operations(settings) as operations:
        report = await operations.upstreams.reconcile(
            upstream=upstream, window_seconds=window, repair=repair, trigger="manual"
        )
    findings = [finding_view(finding) for finding in report.findings]
    if as_json:
        emit_json(
            {
                "ok": True,
                "run_id": report.run_id,
                "checked": report.checked,
                "mismatches": report.mismatches,
                "repaired": report.repaired,
                "errors": report.errors,
                "findings": findings,
            }
        )
        return
    echo(
        f"reconciliation {report.run_id}: {count(report.checked, 'order')} checked, "
        f"{count(report.mismatches, 'mismatch')}, {report.repaired} repaired, "
        f"{count(report.errors, 'upstream error')}" + ("" if repair else " (repair off)")
    )
    if findings:
        rows = [
            [
                f["order_no"],
                f["downstream_order_no"],
                f["field"],
                f["procurd"],
                f["upstream_value"],
                f["repair"],
            ]
            for f in findings
        ]
        columns = [Column("order"), Column("number"), Column("field"), Column("procurd"), Column("upstream"),
                   Column("repair")]  # fmt: skip
        print_table(columns, rows)
