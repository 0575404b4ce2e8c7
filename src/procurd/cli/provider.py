"""``procurd provider``: the accounts of downstream sites, their wallets, and the orders they send.

Each command is the provider's operation (:mod:`procurd.provider.operations`), as the admin API and the
console run it. An account's API secret is printed once, when the account is added or its secret rotated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import click

from procurd.cli.base import CliState, common_options, emit_json, main, pass_state, run_command
from procurd.cli.orders import json_option
from procurd.config import Settings
from procurd.core.orders import iso
from procurd.core.provider import ORDER_STATUSES, Account, account_view
from procurd.core.times import count
from procurd.operations import open_operations
from procurd.output import Column, ago, echo, print_fields, print_table, utc, when

MAX_PAGE_SIZE = 100
OFF_NOTE = (
    "the provider is off ([provider] enabled = false): accounts can be prepared, but no downstream site is "
    "served until it is on"
)


@main.group("provider")
def provider_group() -> None:
    """Selling to other sites: accounts, wallets, orders received (see [provider])."""


@provider_group.group("account")
def account_group() -> None:
    """Accounts of downstream sites (each with an API key and secret, a wallet and a level)."""


def _show_secret(account: Account, secret: str, as_json: bool, what: str) -> None:
    """The account's key and its secret, printed this once."""
    if as_json:
        emit_json({"name": account.name, "api_key": account.api_key, "api_secret": secret})
        return
    echo(f"{what} {account.name}")
    print_fields([("api_key", account.api_key), ("api_secret", secret)])
    echo(
        "The secret is shown this once: give it to the downstream site now (it signs every request with it)."
    )


@account_group.command("add")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='Print {"name", "api_key", "api_secret"}.')
@common_options
@pass_state
def account_add(state: CliState, name: str, as_json: bool) -> None:
    """Add an account; its API key and secret are printed once."""
    run_command(_add(state.settings(), name, as_json), as_json)


async def _add(settings: Settings, name: str, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        account, secret = await operations.provider.accounts.add(name)
    _show_secret(account, secret, as_json, "added account")


@account_group.command("list")
@json_option
@common_options
@pass_state
def account_list(state: CliState, as_json: bool) -> None:
    """Every account: status, level, balance, orders."""
    run_command(_list(state.settings(), as_json), as_json)


async def _list(settings: Settings, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        accounts = await operations.provider.accounts.list()
    if as_json:
        provider = settings.provider
        emit_json(
            {
                "ok": True,
                "provider_enabled": provider.enabled,
                "currency": provider.currency,
                "items": accounts,
            }
        )
        return
    if not settings.provider.enabled:
        echo(OFF_NOTE)
    if not accounts:
        echo("no provider accounts (procurd provider account add NAME)")
        return
    rows = [
        [
            a["name"],
            a["status"],
            a["level"] or "-",
            f"{a['balance']} {a['currency']}",
            sum(a["orders"].values()),
        ]
        for a in accounts
    ]
    columns = [Column("name"), Column("status"), Column("level"), Column("balance", right=True),
               Column("orders", right=True)]  # fmt: skip
    print_table(columns, rows)
    echo(count(len(accounts), "account"))


@account_group.command("show")
@click.argument("name")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True, help="Page of the ledger.")
@json_option
@common_options
@pass_state
def account_show(state: CliState, name: str, page: int, as_json: bool) -> None:
    """An account with its latest wallet movements."""
    run_command(_show(state.settings(), name, page, as_json), as_json)


async def _show(settings: Settings, name: str, page: int, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        view = await operations.provider.accounts.show(name, page)
    if as_json:
        emit_json({"ok": True, "account": view})
        return
    echo(f"account {view['name']}: {view['status']}")
    orders = ", ".join(f"{status} {number}" for status, number in sorted(view["orders"].items())) or "none"
    previous = [("old secret", old_secret_text(old)) for old in view["old_secrets"]]
    print_fields(
        [("api_key", view["api_key"]), ("level", view["level"] or "none"),
         ("balance", f"{view['balance']} {view['currency']}"), ("orders", orders),
         ("since", when(view["created_at"])), *previous]
    )  # fmt: skip
    echo()
    print_ledger(view["ledger"])


def old_secret_text(old: Mapping[str, Any]) -> str:
    """A previous secret in its overlap: until when it works, and whether the downstream still uses it."""
    used = (
        f"{count(old['requests'], 'request')} signed with it, the latest {ago(old['last_used_at'])}"
        if old["requests"]
        else "no request signed with it since the rotation"
    )
    return f"valid until {utc(old['valid_until'])} UTC ({ago(old['valid_until'])}); {used}"


def print_ledger(ledger: Mapping[str, Any]) -> None:
    entries = ledger["items"]
    if not entries:
        echo("no wallet movements")
        return
    rows = [
        [e["id"], ago(e["at"]), e["kind"], e["amount"], e["balance_after"], e["order_id"] or "-"]
        for e in entries
    ]
    columns = [Column("id", right=True), Column("when"), Column("kind"), Column("amount", right=True),
               Column("balance", right=True), Column("order", right=True)]  # fmt: skip
    print_table(columns, rows, notes=[entry["note"] for entry in entries], title="ledger")
    pages = max(1, math.ceil(ledger["total"] / ledger["page_size"]))
    echo(f"{count(ledger['total'], 'movement')}; page {ledger['page']} of {pages}")


def _changed(account: Account) -> dict[str, Any]:
    """What the admin API answers after a change to an account (its view without the order counts)."""
    view = account_view(account)
    del view["orders"], view["old_secrets"]
    return {"ok": True, "account": view}


def _status_command(name: str, active: bool) -> None:
    help_text = (
        "Let the account's requests in again." if active else "Refuse the account's requests until enabled."
    )

    @account_group.command(name, help=help_text)
    @click.argument("account")
    @json_option
    @common_options
    @pass_state
    def command(state: CliState, account: str, as_json: bool) -> None:
        run_command(_set_status(state.settings(), account, active, as_json), as_json)


async def _set_status(settings: Settings, name: str, active: bool, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        account = await operations.provider.accounts.set_status(name, active)
    if as_json:
        emit_json(_changed(account))
        return
    echo(f"account {account.name} is {account.status}")


_status_command("enable", True)
_status_command("disable", False)


@account_group.command("rotate")
@click.argument("name")
@click.option(
    "--overlap",
    "overlap_hours",
    type=float,
    default=None,
    metavar="HOURS",
    help="How long the previous secret keeps working ([provider] rotation_overlap_hours: 168).",
)
@click.option("--now", "end_now", is_flag=True, help="End every secret but the new one at once (a leak).")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"name", "api_key", "api_secret", "old_valid_until"}.'
)
@common_options
@pass_state
def account_rotate(
    state: CliState, name: str, overlap_hours: float | None, end_now: bool, as_json: bool
) -> None:
    """Give the account a new API secret, printed once; the previous one keeps working for the overlap,
    so that the downstream can switch without an outage (--now: it stops at once)."""
    if end_now and overlap_hours is not None:
        raise click.UsageError("--now and --overlap exclude each other")
    run_command(_rotate(state.settings(), name, overlap_hours, end_now, as_json), as_json)


async def _rotate(
    settings: Settings, name: str, overlap_hours: float | None, end_now: bool, as_json: bool
) -> None:
    async with open_operations(settings) as operations:
        rotation = await operations.provider.accounts.rotate(name, overlap_hours, end_now=end_now)
    account, until = rotation.account, rotation.old_valid_until
    if as_json:
        emit_json({"name": account.name, "api_key": account.api_key, "api_secret": rotation.api_secret,
                   "old_valid_until": iso(until)})  # fmt: skip
        return
    _show_secret(account, rotation.api_secret, False, "new secret for account")
    if until is None:
        echo("Every previous secret stopped working now: requests signed with one answer invalid_signature.")
    else:
        echo(
            f"The previous secret keeps working until {utc(until)} UTC, so the downstream can switch "
            f"meanwhile; `procurd provider account show {account.name}` counts the requests still signed "
            "with it (--now ends it at once). Callbacks are signed with the new secret from now on."
        )


@account_group.command("set-level")
@click.argument("name")
@click.argument("slug", metavar="SLUG|none")
@json_option
@common_options
@pass_state
def account_set_level(state: CliState, name: str, slug: str, as_json: bool) -> None:
    """Give the account a price tier of [[provider.levels]], or none."""
    run_command(_set_level(state.settings(), name, None if slug == "none" else slug, as_json), as_json)


async def _set_level(settings: Settings, name: str, slug: str | None, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        account = await operations.provider.accounts.set_level(name, slug)
    if as_json:
        emit_json(_changed(account))
        return
    echo(f"account {account.name}: level {account.level or 'none'}")


def _movement_command(name: str, topup: bool) -> None:
    help_text = (
        "Add AMOUNT to the account's wallet."
        if topup
        else "Take AMOUNT from the account's wallet (never below zero)."
    )

    # A negative AMOUNT ("-5") is read as the amount, and refused as such, not as an unknown option.
    @provider_group.command(name, help=help_text, context_settings={"ignore_unknown_options": True})
    @click.argument("account")
    @click.argument("amount")
    @click.option("--note", required=True, help="Why, for the ledger (required).")
    @json_option
    @common_options
    @pass_state
    def command(state: CliState, account: str, amount: str, note: str, as_json: bool) -> None:
        run_command(_move(state.settings(), account, amount, note, topup, as_json), as_json)


async def _move(settings: Settings, name: str, amount: str, note: str, topup: bool, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        moved = await operations.provider.accounts.move(name, amount, note, topup=topup)
    if as_json:
        emit_json({"ok": True, **moved})
        return
    echo(
        f"{moved['kind']} of {moved['amount']} {moved['currency']} on {name}: balance now {moved['balance']}"
    )


_movement_command("topup", True)
_movement_command("debit", False)


@provider_group.command("ledger")
@click.argument("name")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=20, show_default=True)
@json_option
@common_options
@pass_state
def ledger(state: CliState, name: str, page: int, page_size: int, as_json: bool) -> None:
    """The account's wallet movements, the newest first."""
    run_command(_ledger(state.settings(), name, page, page_size, as_json), as_json)


async def _ledger(settings: Settings, name: str, page: int, page_size: int, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        view = await operations.provider.accounts.show(name, page, page_size)
    if as_json:
        emit_json({"ok": True, **view["ledger"]})
        return
    print_ledger(view["ledger"])


@provider_group.command("orders")
@click.option("--account", "account_name", metavar="NAME", help="Only this account's orders.")
@click.option("--status", type=click.Choice(ORDER_STATUSES), help="Only orders in this status.")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=20, show_default=True)
@json_option
@common_options
@pass_state
def orders(
    state: CliState, account_name: str | None, status: str | None, page: int, page_size: int, as_json: bool
) -> None:
    """Orders received from downstream sites, the newest first, with the procurement behind each."""
    run_command(_orders(state.settings(), account_name, status, page, page_size, as_json), as_json)


async def _orders(
    settings: Settings, account: str | None, status: str | None, page: int, page_size: int, as_json: bool
) -> None:
    async with open_operations(settings) as operations:
        total, items = await operations.provider.orders(account, status, page, page_size)
    if as_json:
        emit_json({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})
        return
    if total == 0:
        echo("no provider orders")
        return
    rows = [
        [o["id"], o["account"], o["downstream_order_no"] or "-", o["status"],
         f"{o['amount']} {o['currency']}", o["order_no"] if o["procured"] else "- (payment refused)",
         ago(o["created_at"])]
        for o in items
    ]  # fmt: skip
    columns = [Column("id", right=True), Column("account"), Column("downstream no"), Column("status"),
               Column("amount", right=True), Column("procured as"), Column("received")]  # fmt: skip
    print_table(columns, rows)
    echo(f"{count(total, 'order')}; page {page} of {max(1, math.ceil(total / page_size))}")


@provider_group.group("order")
def order_group() -> None:
    """One order received from a downstream site."""


@order_group.command("show")
@click.argument("order_id", metavar="ID", type=click.IntRange(min=1))
@json_option
@common_options
@pass_state
def order_show(state: CliState, order_id: int, as_json: bool) -> None:
    """The order, the procurement behind it, and its callback delivery log."""
    run_command(_order_show(state.settings(), order_id, as_json), as_json)


async def _order_show(settings: Settings, order_id: int, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        view = await operations.provider.order_detail(order_id)
    if as_json:
        emit_json({"ok": True, "order": view})
        return
    print_order(view)


def print_order(view: Mapping[str, Any]) -> None:
    echo(f"provider order {view['id']} of {view['account']}: {view['status']}")
    bought = (
        f"{view['sku_id']} (upstream {view['upstream']} SKU {view['upstream_sku_id']}) × {view['quantity']}"
    )
    print_fields(
        [("downstream no", view["downstream_order_no"] or "-"), ("trace id", view["trace_id"] or "-"),
         ("sku", bought),
         ("amount", f"{view['amount']} {view['currency']} (refunded {view['refunded']})"),
         ("procured as", view["order_no"] if view["procured"] else "not bought (payment refused)"),
         ("received", when(view["created_at"]))]
    )  # fmt: skip
    procurement = view.get("procurement")
    if procurement:
        states = ", ".join(p["state"] for p in procurement["procurements"])
        echo(f"procurement: order {procurement['order_no']} {procurement['status']} ({states})")
    callback = view.get("callback")
    if callback:
        echo(f"callback: told {callback['status']}: {callback_state(callback)}")
    log = view.get("callback_log") or []
    if log:
        rows = [[ago(a["at"]), a["status"], a["http_status"] or "-", a["outcome"].replace("_", " "),
                 "replay" if a["replay"] else ""] for a in log]  # fmt: skip
        columns = [Column("when"), Column("status"), Column("HTTP"), Column("result"), Column("")]
        print_table(columns, rows, notes=[a["message"] for a in log], title="callback log")


def callback_state(callback: Mapping[str, Any]) -> str:
    """Where the callback of a provider order stands, in words (as the console's order page says it)."""
    tries = count(callback["attempts"], "try")
    if callback["delivered_at"] and not callback["pending"]:
        return f"taken by the downstream {when(callback['delivered_at'])} ({tries})"
    if callback["given_up_at"] and not callback["pending"]:
        return f"given up {when(callback['given_up_at'])} ({tries})"
    if callback["attempts"]:
        return f"failing, next try {when(callback['next_attempt_at'])} ({tries})"
    return "pending, not tried yet"


@order_group.command("replay")
@click.argument("order_id", metavar="ID", type=click.IntRange(min=1))
@json_option
@common_options
@pass_state
def order_replay(state: CliState, order_id: int, as_json: bool) -> None:
    """Tell the order's latest status to its downstream site now (signed afresh; safe to repeat)."""
    run_command(_replay(state.settings(secrets=True), order_id, as_json), as_json)


async def _replay(settings: Settings, order_id: int, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        view = await operations.provider.replay(order_id)
    if as_json:
        emit_json({"ok": True, "order": view})
        return
    print_order(view)
