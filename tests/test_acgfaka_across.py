"""Across protocols, over real sockets: an offer that fails over from a Dujiao-Next source to an acg-faka one
before any money moved, and a chain whose top is an acg-faka shop: the shop → procurd B (buying there,
selling on as a provider) → procurd C (a Dujiao-Next downstream of B)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import select

from acgfaka_support import CARD, Choice, acg_block, mirror_shop, running_shop
from procurd.config import Settings
from procurd.daemon import Daemon
from procurd.db.schema import sync_runs
from procurd.sandbox import Sandbox, SandboxConfig
from procurd.sandbox.acgfaka import AcgFakaSandbox
from procurd.sandbox.acgfaka.testing import ControlClient
from provider_support import add_account, full_pass, provider_config, settled
from scale_cluster import own_database
from support import AdminClient, config_data, running_daemon, settings_for, sql_rows, wait_until

MONTH = Choice(CARD, "月卡", (("区服", "一区"),))  # 10.00


async def test_an_offer_fails_over_from_a_dujiao_source_to_an_acg_faka_one(database_url: str) -> None:
    """The Dujiao-Next site refuses with insufficient_stock (sold out since the mirror looked): procurd
    moves to the offer's acg-faka source, trades there once, and the order is delivered from the trade's
    answer. Nothing was bought at the first site; one trade at the shop."""
    config = SandboxConfig(products=2, balance=Decimal("1000"), allow_private_callbacks=True)
    async with Sandbox(config) as site, running_shop() as shop:
        data = config_data(database_url, ("main", site))
        data["upstreams"].append(acg_block(shop))
        settings = Settings(**data)
        [acg_sku] = (await mirror_shop(settings, MONTH)).skus  # and the site
        main_sku = site.state.first_sku("auto").id
        mirrored = len(await sql_rows(database_url, select(sync_runs.c.id)))  # the two passes just ended
        async with running_daemon(settings), aiohttp.ClientSession() as session:
            # The start-up passes end first, so that the mirror keeps showing the first source in stock.
            await wait_until(lambda: finished_passes(database_url, mirrored + 2))
            async with session.post(
                f"{site.base_url}/_sandbox/skus/{main_sku}", json={"stock_quantity": 0}
            ) as answer:
                assert answer.status == 200
            admin = AdminClient(settings, session)
            sources = [{"upstream": "main", "sku_id": main_sku}, {"upstream": "acg", "sku_id": acg_sku}]
            status, _ = await admin.call("PUT", "/api/v1/offers/MONTH", {"sources": sources})
            assert status == 201
            await admin.submit("F1", {"offer": "MONTH", "quantity": 1})
            order = await admin.wait_status("F1", "delivered")
        [item] = order["procurements"]
        assert (item["upstream"], item["sku_id"]) == ("acg", acg_sku)
        assert [(hop["upstream"], hop["reason"]) for hop in item["failovers"]] == [
            ("main", "insufficient_stock")
        ]
        assert item["fulfillment"]["payload_line_count"] == 1
        assert site.state.orders == {}
        assert len(shop.shop.orders) == 1
        assert shop.request_counts["trade"] == 1


async def finished_passes(database_url: str, count: int) -> bool:
    rows = await sql_rows(database_url, select(sync_runs.c.status))
    return sum(1 for row in rows if row.status != "running") >= count


@dataclass
class Chain:
    """The acg-faka shop → procurd B (a provider buying there as upstream ``top``) → procurd C (buying from
    B as upstream ``b``): B's daemon, C's storefront view, and B's SKU ids of the wanted choices."""

    b: Daemon
    c_admin: AdminClient
    skus: list[int]


@asynccontextmanager
async def chain(
    shop: AcgFakaSandbox, databases: tuple[Path, Path | None, str | None], *choices: Choice
) -> AsyncIterator[Chain]:
    tmp_path, sqlite_template, postgres_template = databases
    async with (
        own_database(tmp_path, "b", sqlite_template, postgres_template) as b_url,
        own_database(tmp_path, "c", sqlite_template, postgres_template) as c_url,
    ):
        b_data: dict[str, Any] = provider_config(b_url, provider={"site_name": "procurd B"})
        b_data["upstreams"] = [acg_block(shop, name="top")]
        b_settings = Settings(**b_data)
        skus = (await mirror_shop(b_settings, *choices, upstream="top")).skus
        async with running_daemon(b_settings) as b:
            await settled(b)
            site = await add_account(b.operations, "siteC", balance="100.00")
            c_settings = settings_for(c_url, ("b", site))
            async with running_daemon(c_settings) as c, aiohttp.ClientSession() as session:
                await full_pass(c.operations, "b")
                yield Chain(b, AdminClient(c_settings, session), skus)


async def test_a_chain_from_an_acg_faka_shop_to_a_dujiao_downstream(
    tmp_path: Path, sqlite_template: Path | None, postgres_template: str | None
) -> None:
    """C orders B's SKU (B's selling price, cost plus 10 %) through B's provider API; B buys it from the
    acg-faka shop in one trade, gets the cards in the trade's answer, and tells C by callback: the order is
    delivered at C with the cards, bought exactly once at the top, and B's wallet of C is charged once."""
    async with (
        running_shop() as shop,
        chain(shop, (tmp_path, sqlite_template, postgres_template), MONTH) as link,
    ):
        [sku] = link.skus
        await link.c_admin.submit("X1", {"sku_id": sku, "quantity": 2})
        order = await link.c_admin.wait_status("X1", "delivered")
        account = await link.b.operations.provider.accounts.get("siteC")
    [item] = order["procurements"]
    assert item["fulfillment"]["payload_line_count"] == 2
    assert item["amount"] == "22.00"
    [bought] = shop.shop.orders.values()
    assert (bought.num, bought.race) == (2, "月卡")
    assert shop.request_counts["trade"] == 1
    assert account.balance_cents == 7800


async def test_goods_without_buyer_inputs_go_down_a_chain_with_an_empty_form(
    tmp_path: Path, sqlite_template: Path | None, postgres_template: str | None
) -> None:
    """Goods the shop imported (manual, and with no buyer inputs) are manual at B and at C, with no form to
    fill: C takes an order of them only with manual_form_data (seed 000 requires it for a manual product),
    but an empty one does; B's provider API takes it as C sends it (``{}``), and the goods reach C."""
    async with running_shop() as shop, ControlClient(shop.base_url) as control:
        category = next(iter(shop.shop.categories))
        imported = {"code": "IMPORTED", "name": "IMPORTED", "category_id": category, "price": "8.00"}
        await control.post("/commodities", {**imported, "shared_id": 3, "delivery_way": 0})
        await control.post("/commodities/IMPORTED/cards", {"cards": [{"secret": "UP-1"}]})
        async with chain(shop, (tmp_path, sqlite_template, postgres_template), Choice("IMPORTED")) as link:
            [sku] = link.skus
            status, refused = await link.c_admin.call(
                "POST", "/api/v1/orders", {"order_no": "E0", "items": [{"sku_id": sku, "quantity": 1}]}
            )
            assert (status, refused["error_code"]) == (422, "manual_form_data_required"), refused
            await link.c_admin.submit("E1", {"sku_id": sku, "quantity": 1, "manual_form_data": {}})
            order = await link.c_admin.wait_status("E1", "delivered")
    [item] = order["procurements"]
    assert (item["fulfillment"]["type"], item["fulfillment"]["payload_line_count"]) == ("manual", 1)
    [bought] = shop.shop.orders.values()
    assert bought.num == 1
    assert shop.request_counts["trade"] == 1
