"""``procurd status``: the status report (what ``GET /api/v1/status`` answers), for a person."""

from __future__ import annotations

from typing import Any

from procurd.cli.base import CliState, common_options, main, pass_state
from procurd.cli.orders import emit_json, json_option, open_runtime, run_command
from procurd.cli.output import count, duration, echo, print_fields, utc, when
from procurd.config import Settings


@main.command("status")
@json_option
@common_options
@pass_state
def status(state: CliState, as_json: bool) -> None:
    """Per upstream: health, last ping and balance, last catalogue sync, queue depths, exceptions."""
    run_command(_status(state.settings(), as_json), as_json)


async def _status(settings: Settings, as_json: bool) -> None:
    from procurd.status import status_report

    async with open_runtime(settings) as runtime:
        report = await status_report(runtime)
    if as_json:
        emit_json(report)
        return
    print_status(report)


def print_status(report: dict[str, Any]) -> None:
    """The status report for a person: a block per upstream, then the storefront."""
    echo(f"procurd status at {utc(report['generated_at'])} UTC")
    for upstream in report["upstreams"]:
        echo()
        echo(f"upstream {upstream['name']}: {'healthy' if upstream['healthy'] else 'NOT HEALTHY'}")
        print_fields(_upstream_fields(upstream))
    storefront = report["storefront"]
    pending = storefront["events_pending"]
    events = f"{count(pending, 'event')} pending" if pending else "no events pending"
    webhook = "webhook" if storefront["webhook_configured"] else "no webhook (the storefront polls)"
    echo()
    echo(f"storefront: {webhook}; {events}")


def _upstream_fields(upstream: dict[str, Any]) -> list[tuple[str, Any]]:
    ping = upstream["last_ping"]
    sync = upstream["last_sync"]
    if ping["at"] is None:
        ping_text = "never"
    elif ping["ok"]:
        ping_text = f"ok {when(ping['at'])}, {ping['latency_ms']} ms"
    else:
        ping_text = f"failed {when(ping['at'])}: {ping['error']}"
    fields: list[tuple[str, Any]] = []
    if upstream.get("site_name"):
        fields.append(("site", f"{upstream['site_name']} ({upstream['base_url']})"))
    fields.append(("last ping", ping_text))
    balance = " ".join(str(part) for part in (ping["balance"], ping["currency"]) if part is not None)
    fields.append(("balance", balance or "unknown (no successful ping yet)"))
    auth = upstream.get("auth_error")
    if auth:
        fields.append(
            ("auth error", f"{auth['code']} {when(auth['at'])}: run `procurd ping` for what to check")
        )
    if sync["at"] is None:
        fields.append(("last sync", "never"))
    else:
        sync_text = f"{sync['status']} {when(sync['at'])}: {count(sync['products'] or 0, 'product')}, "
        sync_text += count(sync["skus"] or 0, "SKU")
        fields.append(("last sync", sync_text + (f" ({sync['error']})" if sync.get("error") else "")))
    queue = upstream["queue"]
    by_state = ", ".join(f"{state} {number}" for state, number in queue.items() if number)
    fields.append(("procurements", by_state or "none"))
    if queue.get("queued"):
        fields.append(("oldest queued", f"{duration(upstream['oldest_queued_seconds'])} ago"))
    open_exceptions = upstream["open_exceptions"]
    fields.append(
        ("exceptions", f"{count(open_exceptions, 'open exception')}: see `procurd exceptions list`"
         if open_exceptions else "none open")
    )  # fmt: skip
    callbacks = upstream["callbacks"]
    fields.append(("callbacks", f"{callbacks['accepted']} accepted, {callbacks['rejected']} rejected"))
    return fields
