"""``procurd exceptions``: the exception queue (list, retry, resolve), through the installation's
operations (the same as the admin API's and the console's)."""

from __future__ import annotations

import math

import click

from procurd.cli.base import CliState, common_options, emit_json, fail_usage, main, pass_state, run_command
from procurd.cli.orders import json_option, print_procurement
from procurd.config import Settings
from procurd.core.times import count
from procurd.operations import Operations, Refused, open_operations
from procurd.operations.orders import DEFAULT_BULK_RETRY, MAX_BULK_RETRY
from procurd.output import Column, ago, echo, print_table

MAX_PAGE_SIZE = 100


@main.group("exceptions")
def exceptions_group() -> None:
    """Procurements that need a person: retry or resolve them."""


@exceptions_group.command("list")
@click.option("--upstream", metavar="NAME", help="Only this upstream's exceptions.")
@click.option("--reason", metavar="REASON", help="Only this reason (price_above_limit, payment_failed ...).")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=20, show_default=True)
@json_option
@common_options
@pass_state
def exceptions_list(
    state: CliState, upstream: str | None, reason: str | None, page: int, page_size: int, as_json: bool
) -> None:
    """The exception queue, oldest change first."""
    run_command(_list(state.settings(), upstream, reason, page, page_size, as_json), as_json)


async def _list(
    settings: Settings, upstream: str | None, reason: str | None, page: int, page_size: int, as_json: bool
) -> None:
    async with open_operations(settings) as operations:
        await _check_filters(operations, upstream, reason)
        total, items = await operations.orders.exceptions(upstream, reason, page, page_size)
    if as_json:
        emit_json({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})
        return
    pages = max(1, math.ceil(total / page_size))
    filters = " and ".join(
        f"{name} {value}" for name, value in (("upstream", upstream), ("reason", reason)) if value
    )
    matching = f" for {filters}" if filters else ""
    if total == 0:
        echo(f"no open exceptions{matching}")
        return
    if not items:
        in_all = count(total, "open exception") + matching
        echo(f"page {page} is past the end: {in_all} fill {count(pages, 'page')}")
        return
    rows = [
        [item["id"], item.get("order_no"), item["downstream_order_no"], item["upstream"],
         item["exception_reason"], ago(item.get("updated_at")), item["attempts"]]
        for item in items
    ]  # fmt: skip
    notes = [
        ": ".join(str(part) for part in (item["last_error_code"], item["last_error_message"]) if part) or None
        for item in items
    ]
    columns = [Column("id", right=True), Column("order"), Column("number"), Column("upstream"),
               Column("reason"), Column("since"), Column("tries", right=True)]  # fmt: skip
    print_table(columns, rows, notes=notes)
    echo(f"{count(total, 'open exception')}{matching}; page {page} of {pages}")


@exceptions_group.command("retry")
@click.argument("procurement_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--note", help="Why, for the audit trail.")
@click.option(
    "--nothing-bought",
    is_flag=True,
    help="outcome_unknown only: you checked the upstream and nothing was bought (needs --note).",
)
@json_option
@common_options
@pass_state
def exceptions_retry(
    state: CliState, procurement_id: int, note: str | None, nothing_bought: bool, as_json: bool
) -> None:
    """Send the procurement again (under a new number once the upstream canceled the old one)."""
    if nothing_bought and not (note or "").strip():
        fail_usage("--nothing-bought needs --note (what you checked at the upstream)")
    action = "retry-nothing-bought" if nothing_bought else "retry"
    run_command(_act(state.settings(), procurement_id, action, note, as_json), as_json)


@exceptions_group.command(
    "retry-all", options_metavar="(--reason REASON | --upstream NAME | --all) [OPTIONS]"
)
@click.option("--upstream", metavar="NAME", help="Only this upstream's exceptions.")
@click.option(
    "--reason", metavar="REASON", help="Only this reason (max_attempts_exceeded, timestamp_expired ...)."
)
@click.option("--all", "everything", is_flag=True, help="Every exception (when neither filter is given).")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_BULK_RETRY),
    default=DEFAULT_BULK_RETRY,
    show_default=True,
    help="At most this many, oldest first; run again for the rest.",
)
@click.option("--note", help="Why, for the audit trail.")
@json_option
@common_options
@pass_state
def exceptions_retry_all(
    state: CliState,
    upstream: str | None,
    reason: str | None,
    everything: bool,
    limit: int,
    note: str | None,
    as_json: bool,
) -> None:
    """Send every matching exception again, as one retry each (after an outage or a clock fix)."""
    if not (upstream or reason or everything):
        fail_usage("name --reason or --upstream, or pass --all to retry every exception")
    settings = state.settings()
    if upstream and upstream not in [configured.name for configured in settings.upstreams]:
        fail_usage(f"no upstream {upstream!r} in the configuration")
    run_command(_retry_all(settings, upstream, reason, everything, note, limit, as_json), as_json)


async def _retry_all(
    settings: Settings,
    upstream: str | None,
    reason: str | None,
    everything: bool,
    note: str | None,
    limit: int,
    as_json: bool,
) -> None:
    async with open_operations(settings) as operations:
        await _check_filters(operations, upstream, reason)
        result = await operations.orders.retry_exceptions(
            upstream=upstream, reason=reason, everything=everything, note=note, limit=limit
        )
    if as_json:
        emit_json(
            {"ok": True, "retried": result.retried, "skipped": result.skipped, "remaining": result.remaining}
        )
        return
    echo(f"{count(len(result.retried), 'exception')} queued again")
    for skipped in result.skipped:
        echo(f"procurement {skipped['id']} skipped: {skipped['error_code']} ({skipped['message']})")
    if result.remaining:
        more = "1 more matches" if result.remaining == 1 else f"{result.remaining} more match"
        echo(f"{more}; run the command again for them")


@exceptions_group.command("resolve")
@click.argument("procurement_id", metavar="ID", type=click.IntRange(min=1))
@click.option("--note", required=True, help="How it was settled (required).")
@json_option
@common_options
@pass_state
def exceptions_resolve(state: CliState, procurement_id: int, note: str, as_json: bool) -> None:
    """Close the exception by hand."""
    if not note.strip():
        fail_usage("--note must not be empty")
    run_command(_act(state.settings(), procurement_id, "resolve", note, as_json), as_json)


async def _check_filters(operations: Operations, upstream: str | None, reason: str | None) -> None:
    """A filter naming no upstream or reason procurd knows is a usage mistake (exit 2, the known values)."""
    try:
        await operations.orders.check_filters(upstream, reason)
    except Refused as refused:
        fail_usage(f"{refused.code}: {refused.message}")


async def _act(settings: Settings, procurement_id: int, action: str, note: str | None, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        if action == "retry":
            answer = await operations.orders.retry(procurement_id, note)
        elif action == "retry-nothing-bought":
            answer = await operations.orders.retry(procurement_id, note, nothing_bought=True)
        else:
            answer = await operations.orders.resolve(procurement_id, note or "")
    procurement, order = answer["procurement"], answer["order"]
    if as_json:
        emit_json({"ok": True, "procurement": procurement, "order": order})
        return
    if action.startswith("retry"):
        echo(f"procurement {procurement_id} queued again as {procurement['downstream_order_no']}")
    else:
        echo(f"procurement {procurement_id} resolved")
    print_procurement(dict(procurement, order_no=order["order_no"]))
