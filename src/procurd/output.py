"""Human output of the command line: aligned plain text.

Tables have short columns that never wrap; free text (an error message, an audit detail) goes on a line of
its own under its row. On a terminal that text, and long values of labelled fields, wrap at word boundaries
to the terminal's width, indented under themselves; on a pipe nothing is wrapped or cut, one line per
record, for grep and awk. Times are shown in UTC with their age ("3 min ago"); counts agree with their nouns
("1 exception", "2 exceptions").
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import click

from procurd.core.instances import fold_stopped
from procurd.core.times import count, parse_time, terse_ago, terse_duration, utc_text


def on_terminal() -> bool:
    return sys.stdout.isatty()


def echo(line: str = "") -> None:
    """One line of output, printed as it is (no markup)."""
    click.echo(line)


def utc(value: str | datetime | None) -> str:
    """``2026-11-23 15:09:54`` in UTC (the zone every time is shown in); ``-`` when there is none."""
    text = utc_text(value)
    if text is None:
        return "-" if value is None else str(value)
    return text


def duration(seconds: float) -> str:
    """A length of time for a person: ``12 s``, ``3 min``, ``2 h 5 min``, ``4 days``."""
    return terse_duration(seconds)


def ago(value: str | datetime | None, now: datetime | None = None) -> str:
    """How long ago ``value`` was: ``just now``, ``12 s ago``, ``3 min ago`` (``in 5 s`` when ahead)."""
    return terse_ago(value, now) or "never"


def when(value: str | datetime | None, now: datetime | None = None) -> str:
    """``3 min ago (2026-11-23 15:09:54 UTC)``, or ``never``."""
    if value is None:
        return "never"
    return f"{ago(value, now)} ({utc(value)} UTC)"


def cell(value: Any) -> str:
    """A value as text: empty when missing, ``yes``/``no``, ``key=value`` pairs for an object."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return " ".join(f"{key}={compact(item)}" for key, item in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(compact(item) for item in value)
    return " ".join(str(value).split())


def compact(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False


def print_table(
    columns: Sequence[Column],
    rows: Sequence[Sequence[Any]],
    *,
    notes: Sequence[str | None] = (),
    title: str | None = None,
) -> None:
    """A table of short values; ``notes[i]``, when given, is free text on its own line under row ``i``."""
    cells = [[cell(value) for value in row] for row in rows]
    if title:
        echo(title)
    widths = [max([len(column.header), *(len(row[i]) for row in cells)]) for i, column in enumerate(columns)]

    def line(texts: Sequence[str]) -> str:
        padded = [
            text.rjust(width) if column.right else text.ljust(width)
            for text, width, column in zip(texts, widths, columns, strict=True)
        ]
        return "  " + "  ".join(padded).rstrip()

    echo(line([column.header for column in columns]))
    for index, row in enumerate(cells):
        echo(line(row))
        note = notes[index] if index < len(notes) else None
        if note:
            echo(wrapped(cell(note), indent=6))


def print_fields(fields: Sequence[tuple[str, Any]], *, indent: int = 2) -> None:
    """Labelled values, one per line, the values aligned (a long one wraps under itself on a terminal)."""
    shown = [(label, cell(value)) for label, value in fields]
    if not shown:
        return
    width = max(len(label) for label, _ in shown)
    for label, value in shown:
        head = f"{' ' * indent}{label.ljust(width)}  "
        echo(wrapped(value, indent=len(head), first=head).rstrip())


def wrapped(text: str, *, indent: int, first: str | None = None) -> str:
    """``text`` after ``first`` (default: ``indent`` spaces): on a terminal wrapped at word boundaries to its
    width with every further line indented by ``indent``; on a pipe one line."""
    lead = " " * indent if first is None else first
    if not on_terminal():
        return lead + text
    width = max(shutil.get_terminal_size((80, 24)).columns, indent + 20)
    return (
        textwrap.fill(
            text,
            width=width,
            initial_indent=lead,
            subsequent_indent=" " * indent,
            break_on_hyphens=False,
        )
        or lead
    )


# --- the status report ------------------------------------------------------------------------------


PROTOCOL_NAMES = {
    "dujiao": "dujiao (Dujiao-Next's procurement API)",
    "acg-faka": "acg-faka (an acg-faka shop's shared-shop API)",
}


def print_status(report: dict[str, Any]) -> None:
    """The status report for a person: the daemon, a block per upstream, then the storefront and alerts."""
    echo(f"procurd status at {utc(report['generated_at'])} UTC")
    instances = report.get("instances") or []
    alive = [instance for instance in instances if instance["alive"]]
    if alive:
        running = ", ".join(
            f"{i['id']} (procurd {i['version']}, beat {when(i['heartbeat_at'])})" for i in alive
        )
        echo(wrapped(f"running: {running}", indent=8, first="daemon: "))
    else:
        last = max((i["heartbeat_at"] for i in instances), default=None)
        seen = f"the last heartbeat was {when(last)}" if last else "none has ever run on this database"
        text = (
            f"NOT RUNNING: no procurd daemon is alive ({seen}). Orders are taken in but not procured until "
            "`procurd run` (systemctl start procurd) runs."
        )
        echo(wrapped(text, indent=8, first="daemon: "))
    for failed in report.get("daemon_failures") or []:
        times = count(failed["count"], "time")
        text = (
            f"{failed['host']}: failed {times} since {utc(failed['first_at'])} UTC, the last "
            f"{ago(failed['last_at'])}: {failed['last_failure']}"
        )
        echo(wrapped(text, indent=10, first=" " * 8))
    shown, folded = fold_stopped(instances, parse_time(report["generated_at"]) or datetime.now(UTC))
    for instance in shown:
        if instance["state"] != "down":
            continue
        if instance.get("down_at"):
            gone = f"instance {instance['id']} went down without a clean shutdown {when(instance['down_at'])}"
        else:
            gone = (
                f"instance {instance['id']} is down: no heartbeat since {when(instance['heartbeat_at'])}, "
                "and no clean shutdown"
            )
        echo(wrapped(gone, indent=8))
    stopped = [f"{i['id']} {ago(i['stopped_at'])}" for i in shown if i["state"] == "stopped"]
    if folded:
        stopped.append(f"{count(len(folded), 'instance')} more than a day ago")
    if stopped:
        echo(wrapped(f"stopped cleanly: {', '.join(stopped)}", indent=8, first=" " * 8))
    for upstream in report["upstreams"]:
        echo()
        echo(f"upstream {upstream['name']}: {'healthy' if upstream['healthy'] else 'NOT HEALTHY'}")
        print_fields(_upstream_fields(upstream))
    storefront = report["storefront"]
    pending = storefront["events_pending"]
    events = f"{count(pending, 'event')} pending" if pending else "no events pending"
    webhook = "webhook" if storefront["webhook_configured"] else "no webhook (the storefront polls)"
    provider = report.get("provider") or {}
    if provider.get("enabled"):
        echo()
        print_provider(provider)
    echo()
    echo(f"storefront: {webhook}; {events}")
    alerts = (report.get("alerts") or {}).get("last_24h", 0)
    echo(
        f"alerts: {count(alerts, 'alert')} in the last 24 h"
        + (": see `procurd alerts list`" if alerts else "")
    )
    reconcile = report.get("last_reconcile")
    if reconcile:
        checked = count(reconcile["checked"], "order")
        echo(
            f"reconciliation: {reconcile['status']} {when(reconcile['at'])}: {checked} checked, "
            f"{count(reconcile['mismatches'], 'mismatch')}, {reconcile['repaired']} repaired"
        )
    else:
        echo("reconciliation: never run")


LOWEST_BALANCES = 3


def _amount(text: Any) -> Decimal:
    try:
        return Decimal(str(text))
    except InvalidOperation:
        return Decimal(0)


def print_provider(provider: Mapping[str, Any]) -> None:
    """The provider's part of the status report: accounts, wallets (the lowest first), orders by status,
    callbacks to downstream sites, the offered catalogue."""
    currency = provider.get("currency") or ""
    accounts = int(provider.get("accounts") or 0)
    disabled = int(provider.get("accounts_disabled") or 0)
    if accounts == 0:
        echo("provider: on; no accounts yet (procurd provider account add NAME)")
    else:
        held = f" ({disabled} disabled)" if disabled else ""
        echo(
            f"provider: {count(accounts, 'account')}{held}; "
            f"{provider.get('balance_total')} {currency} in their wallets"
        )
    fields: list[tuple[str, Any]] = []
    balances = sorted(
        provider.get("balances") or [], key=lambda entry: (_amount(entry.get("balance")), entry.get("name"))
    )
    # The wallets that may run dry: an active account's (a disabled one's only when none is active).
    balances = [entry for entry in balances if entry.get("status") in (None, "active")] or balances
    if balances:
        lowest = [
            f"{entry['name']} {entry['balance']} {entry.get('currency') or currency}"
            + (f" ({entry['status']})" if entry.get("status") not in (None, "active") else "")
            for entry in balances[:LOWEST_BALANCES]
        ]
        fields.append(("lowest" if len(balances) > 1 else "balance", ", ".join(lowest)))
    orders = provider.get("orders") or {}
    by_status = ", ".join(f"{status} {number}" for status, number in sorted(orders.items()) if number)
    fields.append(("orders", f"{count(sum(orders.values()), 'order')}: {by_status}" if by_status else "none"))
    callbacks = provider.get("callbacks") or {}
    pending = int(callbacks.get("pending") or 0)
    failing = int(callbacks.get("failing") or 0)
    given_up = int(callbacks.get("given_up") or 0)
    told = f"{pending} pending" + (f" ({failing} failing)" if failing else "") + f", {given_up} given up"
    if given_up or failing:
        told += ": see `procurd provider orders`, replay with `procurd provider order replay ID`"
    fields.append(("callbacks", told))
    listed = int(provider.get("products_listed") or 0)
    offered = int(provider.get("products_offered") or 0)
    on_sale = f"{count(listed, 'product')} on sale" + (f" ({offered} in all)" if offered != listed else "")
    problem = provider.get("offer_problem")
    fields.append(("offered", f"{on_sale}: WARNING: nothing is offered: {problem}" if problem else on_sale))
    print_fields(fields)


def mirror_text(mirror: dict[str, int]) -> str:
    """What the mirror holds of an upstream: its products, SKUs and categories still listed."""
    return (
        f"{count(mirror['products'], 'product')}, {count(mirror['skus'], 'SKU')}, "
        f"{count(mirror['categories'], 'category')}"
    )


def runway_text(upstream: dict[str, Any]) -> str:
    """``77.3 h at the 24 h spend of 310.50 CNY (alert below 24 h)``, or why there is none."""
    currency = upstream["last_ping"].get("currency") or ""
    spent = f"{upstream.get('spend_24h') or '0.00'} {currency}".strip()
    limit = upstream.get("runway_alert_hours")
    alert = f" (alert below {limit:g} h)" if limit else ""
    hours = upstream.get("runway_hours")
    if hours is None:
        return f"nothing spent in the last 24 h{alert}"
    low = " LOW" if limit and hours < limit else ""
    return f"{hours:,.1f} h{low} at the last 24 h's spend of {spent}{alert}"


def _upstream_fields(upstream: dict[str, Any]) -> list[tuple[str, Any]]:
    ping = upstream["last_ping"]
    sync = upstream["last_sync"]
    if ping["at"] is None:
        ping_text = "never"
    elif ping["ok"]:
        ping_text = f"ok {when(ping['at'])}, {ping['latency_ms']} ms"
    else:
        # The recorded error names the upstream and the request; the block is the upstream's already.
        error = str(ping["error"] or "").removeprefix(f"{upstream['name']} ping: ")
        ping_text = f"failed {when(ping['at'])}: {error}"
    fields: list[tuple[str, Any]] = []
    protocol = upstream.get("protocol") or "dujiao"
    fields.append(("protocol", PROTOCOL_NAMES.get(protocol, protocol)))
    if upstream.get("site_name"):
        fields.append(("site", f"{upstream['site_name']} ({upstream['base_url']})"))
    fields.append(("last ping", ping_text))
    balance = " ".join(str(part) for part in (ping["balance"], ping["currency"]) if part is not None)
    threshold = upstream.get("low_balance_threshold")
    if balance and threshold:
        balance += f" (alert below {threshold})"
    fields.append(("balance", balance or "unknown (no successful ping yet)"))
    fields.append(("runway", runway_text(upstream)))
    auth = upstream.get("auth_error")
    if auth:
        fields.append(
            ("auth error", f"{auth['code']} {when(auth['at'])}: run `procurd ping` for what to check")
        )
    mirror = upstream.get("mirror")
    if mirror is not None:
        fields.append(("mirror", mirror_text(mirror)))
    if sync["at"] is None:
        fields.append(("last sync", "never"))
    else:
        kind = f" ({sync['kind']} pass)" if sync.get("kind") else ""
        products, skus = count(sync["products"] or 0, "product"), count(sync["skus"] or 0, "SKU")
        listed = f"this pass listed {products} and {skus}"
        if sync.get("kind") == "incremental":
            listed += " (only those changed since the pass before)"
        sync_text = f"{sync['status']}{kind} {when(sync['at'])}: {listed}"
        fields.append(("last sync", sync_text + (f" ({sync['error']})" if sync.get("error") else "")))
    dialect = upstream.get("dialect")
    if dialect is not None and protocol == "dujiao":  # the dialects are Dujiao-Next's
        fields.append(("dialect", dialect["summary"]))
    queue = upstream["queue"]
    by_state = ", ".join(f"{state} {number}" for state, number in queue.items() if number)
    fields.append(("procurements", by_state or "none"))
    if queue.get("queued"):
        fields.append(("oldest queued", f"{duration(upstream['oldest_queued_seconds'])} ago"))
    open_exceptions = upstream["open_exceptions"]
    reasons = ", ".join(
        f"{reason} {n}" for reason, n in sorted((upstream.get("exceptions_by_reason") or {}).items())
    )
    opened = count(open_exceptions, "open exception")
    fields.append(
        (
            "exceptions",
            f"{opened} ({reasons}): see `procurd exceptions list`" if open_exceptions else "none open",
        )
    )
    callbacks = upstream["callbacks"]
    if protocol == "acg-faka":
        fields.append(
            ("callbacks", "none (acg-faka calls nothing back: trades answer at once or are polled)")
        )
    else:
        fields.append(("callbacks", f"{callbacks['accepted']} accepted, {callbacks['rejected']} rejected"))
    return fields
