"""``procurd catalog``: mirror the upstream catalogues into the local database, selling prices and holds.

Each command is the installation's operation (:mod:`procurd.operations.catalog`), as the daemon's schedule,
the admin API and the console run it: the same budget, ``sync_runs`` row, alerts and log lines.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from procurd.cli.base import EXIT_FAILURE, CliState, common_options, fail_usage, main, pass_state, run_command
from procurd.config import Settings, UpstreamSettings
from procurd.core.times import count
from procurd.logs import log_stream
from procurd.operations import open_operations

if TYPE_CHECKING:
    from procurd.operations.catalog import SyncReport


@main.group()
def catalog() -> None:
    """The local catalogue mirror."""


@catalog.command("sync")
@click.option("--upstream", "upstream_name", metavar="NAME", help="Only this upstream (default: all).")
@click.option(
    "--full", is_flag=True, help="A full pass (the only kind that removes), whatever incremental_sync says."
)
@click.option(
    "--allow-mass-removal",
    is_flag=True,
    help="Apply removals that [catalog] max_removed_fraction would block (after checking the upstream).",
)
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@common_options
@pass_state
def catalog_sync(
    state: CliState, upstream_name: str | None, full: bool, allow_mass_removal: bool, progress: bool | None
) -> None:
    """One mirror pass now: incremental where incremental_sync allows it, full with --full.

    Exit code 1 when a pass failed or was suspicious (removals blocked).
    """
    settings = state.settings(secrets=True)
    upstreams = state.upstreams(upstream_name)
    if allow_mass_removal and not full:
        fail_usage("--allow-mass-removal needs --full: only a full pass removes")
    show_progress = sys.stderr.isatty() if progress is None else progress
    failed: list[int] = []
    run_command(_sync_all(settings, upstreams, show_progress, full, allow_mass_removal, failed))
    if failed:
        raise SystemExit(EXIT_FAILURE)


async def _sync_all(
    settings: Settings,
    upstreams: list[UpstreamSettings],
    show_progress: bool,
    full: bool,
    allow_mass_removal: bool,
    failed: list[int],
) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(stderr=True)
    async with open_operations(settings) as operations:
        for upstream in upstreams:
            with Progress(
                TextColumn(f"[bold]{escape(upstream.name)}[/bold] pages"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                console=console,
                disable=not show_progress,
            ) as bar:
                pages = PageProgress(bar)
                # Log lines go through the display's console, above the bar, while it is shown.
                with log_stream(sys.stderr):
                    report = await operations.catalog.sync(
                        upstream.name, full=full, allow_mass_removal=allow_mass_removal, progress=pages.update
                    )
                if report.status == "ok":
                    pages.complete(report.pages)
            click.echo(describe(report))
            for violation in report.violations:
                click.echo(f"  not as expected: {violation}")
            for hold in report.new_holds:
                click.echo(
                    f"  price held: SKU {hold.sku_id} at {hold.sell_price} "
                    f"(cost {hold.old_cost} -> {hold.new_cost}, +{hold.percent}%)"
                )
            if report.status in ("failed", "suspicious"):
                failed.append(1)


class PageProgress:
    """The pages of one sync on a progress bar; a finished sync shows every page done."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar
        self.task = bar.add_task("sync", total=None)
        self.done = 0
        self.total = 0

    def update(self, done: int, total: int | None) -> None:
        self.done, self.total = done, total or 0
        self.bar.update(self.task, completed=done, total=total)

    def complete(self, pages: int) -> None:
        whole = max(self.done, self.total, pages)
        self.bar.update(self.task, completed=whole, total=whole)


def describe(report: SyncReport) -> str:
    """One line (two with an error) about a pass, for a person."""
    if report.status == "skipped":
        return f"{report.upstream}: skipped: {report.error}"
    seconds = (
        (report.finished_at - report.started_at).total_seconds()
        if report.finished_at and report.started_at
        else 0.0
    )
    line = (
        f"{report.upstream}: {report.status} ({report.kind}) in {seconds:.1f}s: "
        f"{count(report.pages, 'page')}, {count(report.categories, 'category')}, "
        f"{count(report.products, 'product')}, {count(report.skus, 'SKU')}; {report.added} added, "
        f"{report.restored} restored, {report.changed} changed, {report.removed} removed, "
        f"{count(report.rows_written, 'row')} written"
    )
    if report.error:
        line += f"\n  {'removals blocked' if report.status == 'suspicious' else 'error'}: {report.error}"
    return line


@catalog.command("reprice")
@click.option("--upstream", "upstream_name", metavar="NAME", help="Only this upstream (default: all).")
@common_options
@pass_state
def catalog_reprice(state: CliState, upstream_name: str | None) -> None:
    """Recompute selling prices from [pricing] without fetching anything.

    Exit code 1 when the rules have problems (such as a category the upstream does not have); the prices
    are recomputed all the same.
    """
    settings = state.settings(secrets=True)
    upstreams = state.upstreams(upstream_name)
    problems: list[str] = []
    run_command(_reprice_all(settings, upstreams, problems))
    if problems:
        raise SystemExit(EXIT_FAILURE)


async def _reprice_all(settings: Settings, upstreams: list[UpstreamSettings], problems: list[str]) -> None:
    async with open_operations(settings) as operations:
        for upstream in upstreams:
            (report,) = await operations.catalog.reprice(upstream.name)
            click.echo(
                f"{upstream.name}: {count(report.priced, 'SKU')} priced; {report.sku_prices_changed} SKU "
                f"and {report.product_prices_changed} product prices changed; {len(report.new_holds)} held"
            )
            for problem in report.problems:
                click.echo(f"  problem: {problem}", err=True)
            problems.extend(report.problems)


@catalog.command("holds")
@click.option("--upstream", "upstream_name", metavar="NAME", help="Only this upstream (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (what the admin API answers).")
@click.option(
    "--output", type=click.Choice(["table", "json"]), default=None, help="table or json (as --json)."
)
@common_options
@pass_state
def catalog_holds(state: CliState, upstream_name: str | None, as_json: bool, output: str | None) -> None:
    """SKUs whose selling price is held after a steep cost increase, oldest first."""
    settings = state.settings()
    if upstream_name is not None:
        state.upstreams(upstream_name)
    held: list[dict[str, object]] = []
    run_command(_holds(settings, upstream_name, held))
    if as_json or output == "json":
        click.echo(json.dumps({"holds": held}, ensure_ascii=False, indent=2))
        return
    if not held:
        click.echo("no price holds")
    for hold in held:
        click.echo(
            f"{hold['upstream']} SKU {hold['sku_id']} ({hold['sku_code']}): selling at {hold['sell_price']} "
            f"{hold['sell_currency'] or ''}, held since {hold['price_held_at']} when the cost rose to "
            f"{hold['held_cost']} (now {hold['cost']})"
        )


async def _holds(settings: Settings, upstream: str | None, held: list[dict[str, object]]) -> None:
    async with open_operations(settings) as operations:
        held.extend(await operations.catalog.holds(upstream))


@catalog.command("release-hold")
@click.argument("upstream_name", metavar="UPSTREAM")
@click.argument("sku_id", type=click.IntRange(min=0))
@common_options
@pass_state
def catalog_release_hold(state: CliState, upstream_name: str, sku_id: int) -> None:
    """Release a SKU's price hold: its selling price follows the rules and its current cost again."""
    settings = state.settings(secrets=True)
    state.upstreams(upstream_name)
    run_command(_release(settings, upstream_name, sku_id))


async def _release(settings: Settings, upstream: str, sku_id: int) -> None:
    async with open_operations(settings) as operations:
        released = await operations.catalog.release_hold(upstream, sku_id)
    click.echo(
        f"{upstream} SKU {sku_id}: hold released; selling price now {released.sell_price} "
        f"{released.sell_currency or ''}".rstrip()
    )
