"""``procurd catalog``: mirror the upstream catalogues into the local database."""

from __future__ import annotations

import sys
from typing import Any

import click

from procurd.cli.base import (
    EXIT_FAILURE,
    CliState,
    common_options,
    main,
    open_current_database,
    pass_state,
    run_async,
)
from procurd.config import Settings, UpstreamSettings
from procurd.instance import instance_id
from procurd.logs import log_stream


@main.group()
def catalog() -> None:
    """The local catalogue mirror."""


@catalog.command("sync")
@click.option("--upstream", "upstream_name", metavar="NAME", help="Only this upstream (default: all).")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
@common_options
@pass_state
def catalog_sync(state: CliState, upstream_name: str | None, progress: bool | None) -> None:
    """One full mirror pass now: categories, every page of products, their SKUs."""
    settings = state.settings(secrets=True)
    upstreams = state.upstreams(upstream_name)
    show_progress = sys.stderr.isatty() if progress is None else progress
    failed = run_async(_sync_all(settings, upstreams, show_progress))
    if failed:
        raise SystemExit(EXIT_FAILURE)


async def _sync_all(settings: Settings, upstreams: list[UpstreamSettings], show_progress: bool) -> int:
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

    from procurd.catalog.sync import SyncReport, run_sync
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
                        report: SyncReport = await run_sync(
                            database,
                            client,
                            upstream.name,
                            page_size=settings.catalog.page_size,
                            concurrency=settings.catalog.concurrency,
                            holder=instance_id(),
                            progress=pages.update,
                        )
                if report.status == "ok":
                    pages.complete(report.pages)
            click.echo(_describe(report))
            for violation in report.violations:
                click.echo(f"  category rule: {violation}")
            if report.status == "failed":
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


def _describe(report: object) -> str:
    from procurd.catalog.sync import SyncReport

    assert isinstance(report, SyncReport)
    if report.status == "skipped":
        return f"{report.upstream}: skipped: {report.error}"
    seconds = (
        (report.finished_at - report.started_at).total_seconds()
        if report.finished_at and report.started_at
        else 0.0
    )
    line = (
        f"{report.upstream}: {report.status} in {seconds:.1f}s: {report.pages} pages, "
        f"{report.categories} categories, {report.products} products, {report.skus} SKUs; "
        f"{report.added} added, {report.changed} changed, {report.removed} removed, "
        f"{report.rows_written} rows written"
    )
    if report.error:
        line += f"\n  error: {report.error}"
    return line
