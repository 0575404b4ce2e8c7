"""``procurd catalog``: mirror the upstream catalogues into the local database, selling prices and holds."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click

from procurd.cli.base import (
    EXIT_FAILURE,
    CliState,
    common_options,
    database_errors,
    fail_usage,
    main,
    open_current_database,
    pass_state,
    run_async,
)
from procurd.config import Settings, UpstreamSettings
from procurd.instance import instance_id
from procurd.logs import log_stream

if TYPE_CHECKING:
    from procurd.catalog.pricing import ReleasedHold
    from procurd.catalog.sync import SyncReport


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
    failed = run_async(_sync_all(settings, upstreams, show_progress, full, allow_mass_removal))
    if failed:
        raise SystemExit(EXIT_FAILURE)


async def _sync_all(
    settings: Settings,
    upstreams: list[UpstreamSettings],
    show_progress: bool,
    full: bool,
    allow_mass_removal: bool,
) -> int:
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

    from procurd.catalog.sync import SyncOptions, run_sync
    from procurd.upstream.client import UpstreamClient

    database = await open_current_database(settings)
    failed = 0
    console = Console(stderr=True)
    try:
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
                    async with UpstreamClient(upstream) as client:
                        report = await run_sync(
                            database,
                            client,
                            upstream.name,
                            options=SyncOptions.from_settings(settings, upstream.name),
                            full=full,
                            allow_mass_removal=allow_mass_removal,
                            holder=instance_id(),
                            progress=pages.update,
                        )
                if report.status == "ok":
                    pages.complete(report.pages)
            click.echo(describe(report))
            for violation in report.violations:
                click.echo(f"  category rule: {violation}")
            for hold in report.new_holds:
                click.echo(
                    f"  price held: SKU {hold.sku_id} at {hold.sell_price} "
                    f"(cost {hold.old_cost} -> {hold.new_cost}, +{hold.percent}%)"
                )
            if report.status in ("failed", "suspicious"):
                failed += 1
    finally:
        await database.close()
    return failed


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
        f"{report.upstream}: {report.status} ({report.kind}) in {seconds:.1f}s: {report.pages} pages, "
        f"{report.categories} categories, {report.products} products, {report.skus} SKUs; "
        f"{report.added} added, {report.restored} restored, {report.changed} changed, "
        f"{report.removed} removed, {report.rows_written} rows written"
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
    problems = run_async(_reprice_all(settings, upstreams))
    if problems:
        raise SystemExit(EXIT_FAILURE)


async def _reprice_all(settings: Settings, upstreams: list[UpstreamSettings]) -> int:
    from procurd.catalog.pricing import reprice_upstream
    from procurd.upstream.client import UpstreamClient

    database = await open_current_database(settings)
    problems = 0
    try:
        for upstream in upstreams:
            async with UpstreamClient(upstream) as client:
                report = await database_errors(
                    reprice_upstream(database, upstream.name, settings.pricing, client=client)
                )
            click.echo(
                f"{upstream.name}: {report.priced} SKUs priced; {report.sku_prices_changed} SKU and "
                f"{report.product_prices_changed} product prices changed; {len(report.new_holds)} held"
            )
            for problem in report.problems:
                click.echo(f"  problem: {problem}", err=True)
            problems += len(report.problems)
    finally:
        await database.close()
    return problems


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
    held = run_async(_holds(settings, upstream_name))
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


async def _holds(settings: Settings, upstream: str | None) -> list[dict[str, object]]:
    from procurd.catalog.pricing import holds

    database = await open_current_database(settings)
    try:
        return await database_errors(holds(database, upstream))
    finally:
        await database.close()


@catalog.command("release-hold")
@click.argument("upstream_name", metavar="UPSTREAM")
@click.argument("sku_id", type=click.IntRange(min=0))
@common_options
@pass_state
def catalog_release_hold(state: CliState, upstream_name: str, sku_id: int) -> None:
    """Release a SKU's price hold: its selling price follows the rules and its current cost again."""
    settings = state.settings(secrets=True)
    (upstream,) = state.upstreams(upstream_name)
    released = run_async(_release(settings, upstream, sku_id))
    if released is None:
        click.echo(f"procurd: SKU {sku_id} of {upstream_name} has no price hold", err=True)
        raise SystemExit(EXIT_FAILURE)
    click.echo(
        f"{upstream_name} SKU {sku_id}: hold released; selling price now {released.sell_price} "
        f"{released.sell_currency or ''}".rstrip()
    )


async def _release(settings: Settings, upstream: UpstreamSettings, sku_id: int) -> ReleasedHold | None:
    from procurd.catalog.pricing import release_hold
    from procurd.upstream.client import UpstreamClient

    database = await open_current_database(settings)
    try:
        async with UpstreamClient(upstream) as client:
            return await database_errors(
                release_hold(database, upstream.name, sku_id, settings.pricing, client=client)
            )
    finally:
        await database.close()
