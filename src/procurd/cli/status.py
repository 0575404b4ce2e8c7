"""``procurd status``: the status report (what ``GET /api/v1/status`` answers), for a person."""

from __future__ import annotations

from typing import Any

from procurd.cli.base import CliState, main, pass_state
from procurd.cli.orders import console, emit_json, json_option, open_runtime, run_command, table
from procurd.config import Settings


@main.command("status")
@json_option
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
    out = console()
    out.print(table("upstreams", ["upstream", "healthy", "last ping", "balance", "last sync", "callbacks"],
                    [_health_row(upstream) for upstream in report["upstreams"]]))  # fmt: skip
    states = list(report["upstreams"][0]["queue"]) if report["upstreams"] else []
    rows = [
        [upstream["name"], *(upstream["queue"][name] for name in states), upstream["oldest_queued_seconds"]]
        for upstream in report["upstreams"]
    ]
    out.print(table("procurements", ["upstream", *states, "oldest queued (s)"], rows))
    storefront = report["storefront"]
    webhook = "webhook" if storefront["webhook_configured"] else "no webhook (the storefront polls)"
    out.print(f"storefront: {webhook}; {storefront['events_pending']} event(s) pending")


def _health_row(upstream: dict[str, Any]) -> list[Any]:
    ping = upstream["last_ping"]
    sync = upstream["last_sync"]
    if ping["at"] is None:
        ping_text = "never"
    elif ping["ok"]:
        ping_text = f"ok at {ping['at']} ({ping['latency_ms']} ms)"
    else:
        ping_text = f"failed at {ping['at']}: {ping['error']}"
    auth = upstream.get("auth_error")
    if auth:
        ping_text += f"; auth error {auth['code']} at {auth['at']}"
    if sync["at"] is None:
        sync_text = "never"
    else:
        counts = f"{sync['products']} products, {sync['skus']} SKUs"
        sync_text = f"{sync['status']} ({sync['kind']}) at {sync['at']}: {counts}"
        if sync.get("error"):
            sync_text += f" ({sync['error']})"
    balance = " ".join(str(part) for part in (ping["balance"], ping["currency"]) if part is not None)
    callbacks = f"{upstream['callbacks']['accepted']} accepted, {upstream['callbacks']['rejected']} rejected"
    return [upstream["name"], upstream["healthy"], ping_text, balance, sync_text, callbacks]
