"""``procurd offers``: storefront offers and their upstream sources, first choice first."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import click

from procurd.cli.base import CliState, common_options, emit_json, main, pass_state, run_command
from procurd.cli.orders import json_option
from procurd.config import Settings
from procurd.core.times import count
from procurd.operations import open_operations
from procurd.output import Column, echo, print_table

MAX_PAGE_SIZE = 100


@main.group("offers")
def offers_group() -> None:
    """Offers: a storefront SKU code bought from the first of its upstream SKUs that can supply it."""


@offers_group.command("set")
@click.argument("code")
@click.option(
    "--source",
    "sources",
    metavar="UPSTREAM:SKU_ID",
    multiple=True,
    required=True,
    help="A source, in priority order: repeat it for each backup (--source main:12 --source backup:7).",
)
@json_option
@common_options
@pass_state
def offers_set(state: CliState, code: str, sources: tuple[str, ...], as_json: bool) -> None:
    """Create the offer CODE or replace its sources."""
    run_command(_set(state.settings(), code, sources, as_json), as_json)


async def _set(settings: Settings, code: str, raw: tuple[str, ...], as_json: bool) -> None:
    async with open_operations(settings) as operations:
        sources = [operations.offers.parse_source(text) for text in raw]
        stored = await operations.offers.put(code, sources)
    if as_json:
        emit_json({"ok": True, "created": stored.created, "offer": stored.view})
        return
    echo(f"offer {code} {'created' if stored.created else 'updated'}")
    print_offer(stored.view)


@offers_group.command("show")
@click.argument("code")
@json_option
@common_options
@pass_state
def offers_show(state: CliState, code: str, as_json: bool) -> None:
    """An offer: each source as the mirror knows it, and the one in use now."""
    run_command(_show(state.settings(), code, as_json), as_json)


async def _show(settings: Settings, code: str, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        view = await operations.offers.view(code)
    if as_json:
        emit_json({"ok": True, "offer": view})
        return
    print_offer(view)


@offers_group.command("list")
@click.option("--page", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--page-size", type=click.IntRange(1, MAX_PAGE_SIZE), default=50, show_default=True)
@json_option
@common_options
@pass_state
def offers_list(state: CliState, page: int, page_size: int, as_json: bool) -> None:
    """Every offer by code, with the source in use now, its selling price and stock."""
    run_command(_list(state.settings(), page, page_size, as_json), as_json)


async def _list(settings: Settings, page: int, page_size: int, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        total, items = await operations.offers.page(page, page_size)
    if as_json:
        emit_json({"ok": True, "items": items, "total": total, "page": page, "page_size": page_size})
        return
    if total == 0:
        echo("no offers")
        return
    rows = [
        [item["code"], len(item["sources"]), _in_use(item), _price(item), item["stock_status"]]
        for item in items
    ]
    columns = [
        Column("code"),
        Column("sources", right=True),
        Column("in use"),
        Column("price"),
        Column("stock"),
    ]
    print_table(columns, rows)
    echo(f"{count(total, 'offer')}; page {page} of {max(1, math.ceil(total / page_size))}")


@offers_group.command("delete")
@click.argument("code")
@json_option
@common_options
@pass_state
def offers_delete(state: CliState, code: str, as_json: bool) -> None:
    """Delete the offer CODE (orders already taken keep the sources they were given)."""
    run_command(_delete(state.settings(), code, as_json), as_json)


async def _delete(settings: Settings, code: str, as_json: bool) -> None:
    async with open_operations(settings) as operations:
        await operations.offers.delete(code)
    if as_json:
        emit_json({"ok": True, "code": code, "deleted": True})
        return
    echo(f"offer {code} deleted")


def print_offer(view: Mapping[str, Any]) -> None:
    echo(f"offer {view['code']}: in use {_in_use(view)}, {_price(view)}, {view['stock_status']}")
    rows = [
        [
            source["position"] + 1,
            f"{source['upstream']}:{source['sku_id']}",
            source["cost"],
            " ".join(part for part in (source["sell_price"], source["sell_currency"]) if part) or None,
            source["stock_status"],
            "yes" if source["available"] else source["reason"],
        ]
        for source in view["sources"]
    ]
    columns = [
        Column("#", right=True), Column("source"), Column("cost", right=True), Column("sells at", right=True),
        Column("stock"), Column("available"),
    ]  # fmt: skip
    print_table(columns, rows)


def _in_use(view: Mapping[str, Any]) -> str:
    in_use = view["in_use"]
    return "no source available" if in_use is None else f"{in_use['upstream']}:{in_use['sku_id']}"


def _price(view: Mapping[str, Any]) -> str:
    if view["sell_price"] is None:
        return "no selling price"
    return " ".join(part for part in (view["sell_price"], view["sell_currency"]) if part)
