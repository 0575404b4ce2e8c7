"""``procurd alerts``: what procurd told (or tried to tell) a person, and a test message to every URL."""

from __future__ import annotations

import math

import click

from procurd.cli.base import (
    EXIT_FAILURE,
    CliState,
    common_options,
    emit_json,
    fail_usage,
    main,
    pass_state,
    run_async,
    run_command,
)
from procurd.cli.orders import json_option
from procurd.config import Settings
from procurd.core.times import count
from procurd.operations import Refused, open_operations
from procurd.operations.housekeeping import send_test_alert
from procurd.output import Column, ago, echo, print_table

MAX_PAGE_SIZE = 100


@main.group("alerts")
def alerts_group() -> None:
    """Alerts: failed orders, low balance, an unhealthy upstream, stuck orders and more."""


@alerts_group.command("list")
@click.option("--kind", metavar="KIND", help="Only this kind (exception_opened, low_balance ...).")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=20, show_default=True)
@json_option
@common_options
@pass_state
def alerts_list(state: CliState, kind: str | None, page: int, page_size: int, as_json: bool) -> None:
    """Recent alerts, the latest first, with whether and when each was sent."""
    run_command(_list(state.settings(), kind, page, page_size, as_json), as_json)


async def _list(settings: Settings, kind: str | None, page: int, page_size: int, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        try:
            total, items = await operations.housekeeping.alerts(page, page_size, kind)
        except Refused as refused:
            fail_usage(f"{refused.code}: {refused.message}")
    if as_json:
        emit_json({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})
        return
    if total == 0:
        echo("no alerts" + (f" of kind {kind}" if kind else ""))
        return
    rows = [
        [item["kind"], item["subject"], item["count"], ago(item["last_at"]), _delivery(item)]
        for item in items
    ]
    notes = [item["message"] for item in items]
    columns = [Column("kind"), Column("subject"), Column("times", right=True), Column("last"), Column("sent")]
    print_table(columns, rows, notes=notes)
    pages = max(1, math.ceil(total / page_size))
    echo(f"{count(total, 'alert')}; page {page} of {pages}")


def _delivery(item: dict[str, object]) -> str:
    if item["error"]:
        return "failing (retrying)"
    if item["send_due_at"]:
        return "due"
    if item["sent_at"]:
        return ago(str(item["sent_at"]))
    return "recorded only"


@alerts_group.command("test")
@common_options
@pass_state
def alerts_test(state: CliState) -> None:
    """Send a test alert to every [alerts] urls entry and say how each answered."""
    try:
        results = run_async(send_test_alert(state.settings()))
    except Refused as refused:
        fail_usage(refused.message)
    for result in results:
        echo(f"{'✔' if result.ok else '✗'} {result.url}" + ("" if result.ok else f": {result.error}"))
    failed = sum(1 for result in results if not result.ok)
    echo(f"{count(len(results) - failed, 'URL')} reached, {failed} failed")
    if failed:
        raise SystemExit(EXIT_FAILURE)
