"""The catalogue mirror of an acg-faka supplier: the sandbox acg-faka shop over real sockets, procurd's
acg-faka upstream and the catalogue pass on a real database (SQLite, or PostgreSQL in its pass)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import select

from procurd.catalog.sync import SyncReport
from procurd.db.database import Database
from procurd.db.schema import mirror_categories, mirror_products, mirror_skus, upstream_choices
from procurd.operations.catalog_pass import run_sync
from procurd.operations.choices import DatabaseChoices
from procurd.operations.trades import DatabaseTrades
from procurd.protocol.acgfaka.upstream import AcgFakaUpstream
from procurd.sandbox.acgfaka import AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.testing import ControlClient, shop_settings
from procurd.upstream.errors import BusinessError

UPSTREAM = "acg"
CARD = "C0000000000000A1"  # variants 月卡 / 年卡, add-on group 区服
ADDONS = "C0000000000000B2"  # add-on group 时长, no variants
MANUAL = "C0000000000000C3"  # delivered by hand, with buyer inputs
EMPTY = "C0000000000000D4"  # no cards left
HIDDEN = "C0000000000000E5"  # hide = 1
PLAIN = "C0000000000000F6"  # the commodity alone
GAME_UID = {
    "cn": "游戏ID",
    "name": "game_uid",
    "type": "text",
    "regex": "^[0-9]{5,12}$",
    "error": "游戏ID格式错误",
}
CARD_RACES = {"月卡": "10.00", "年卡": "100.00"}
CARD_GROUPS = {"区服": {"一区": "0", "二区": "1.50"}}
# Bookkeeping writes of any pass: its lease taken, its run started and finished, its lease released.
RUN_WRITES = 4


async def build_shop(control: ControlClient) -> dict[str, int]:
    category = (await control.post("/categories", {"name": "测试"}))["category"]["id"]
    ids = {}

    async def add(code: str, **spec: Any) -> None:
        answer = await control.post(
            "/commodities", {"code": code, "name": code, "category_id": category, **spec}
        )
        ids[code] = answer["commodity"]["id"]

    await add(CARD, price="12.00", user_price="10.00", races=CARD_RACES, groups=CARD_GROUPS)
    cards = [{"secret": f"M-{n}", "race": "月卡", "sku": {"区服": "一区"}} for n in range(3)]
    cards.append({"secret": "Y-1", "race": "年卡", "sku": {"区服": "二区"}})
    await control.post(f"/commodities/{CARD}/cards", {"cards": cards})
    await add(ADDONS, price="5.00", groups={"时长": {"7天": "0", "30天": "5.00"}})
    await control.post(
        f"/commodities/{ADDONS}/cards", {"cards": [{"secret": "A-1", "sku": {"时长": "30天"}}]}
    )
    await add(MANUAL, price="30.00", delivery_way=1, stock=5, widgets=[GAME_UID])
    await add(EMPTY, price="1.00")
    await add(HIDDEN, price="2.00", hide=1)
    await control.post(f"/commodities/{HIDDEN}/cards", {"cards": [{"secret": "H-1"}]})
    await add(PLAIN, price="3.00")
    await control.post(f"/commodities/{PLAIN}/cards", {"cards": [{"secret": f"P-{n}"} for n in range(7)]})
    return ids


@pytest.fixture
async def shop() -> AsyncIterator[AcgFakaSandbox]:
    async with AcgFakaSandbox(ShopConfig(commodities=0)) as sandbox:
        yield sandbox


@pytest.fixture
async def control(shop: AcgFakaSandbox) -> AsyncIterator[ControlClient]:
    async with ControlClient(shop.base_url) as control:
        yield control


def upstream_of(shop: AcgFakaSandbox, database: Database, **block: Any) -> AcgFakaUpstream:
    settings = shop_settings(shop.base_url, UPSTREAM, **block)
    return AcgFakaUpstream(
        settings, choices=DatabaseChoices(database), trades=DatabaseTrades(database, "test-host:1")
    )


async def sync(database: Database, upstream: AcgFakaUpstream, **options: Any) -> SyncReport:
    options.setdefault("holder", "test-host:1")
    return await run_sync(database, upstream, UPSTREAM, **options)


async def rows(database: Database, table: Any, order: str = "id") -> list[dict[str, Any]]:
    statement = select(table).where(table.c.upstream == UPSTREAM).order_by(table.c[order])
    return await database.read(lambda tx: [dict(row) for row in tx.connection.execute(statement).mappings()])


async def skus_by_choice(database: Database) -> dict[str, dict[str, Any]]:
    return {row["extra"]["choice_key"]: row for row in await rows(database, mirror_skus)}


def key(code: str, race: str = "", *options: tuple[str, str]) -> str:
    pairs = ",".join(f'["{group}","{option}"]' for group, option in sorted(options))
    return f'["{code}","{race}",[{pairs}]]'


def paid_requests(shop: AcgFakaSandbox) -> int:
    return sum(shop.request_counts[name] for name in ("valuation", "stock", "inventory", "item"))


@pytest.mark.parametrize(("version", "source"), [("3.6.0", "valuation"), ("3.2.0", "inventory")])
async def test_the_mirror_of_a_shop(
    shop: AcgFakaSandbox, control: ControlClient, database: Database, version: str, source: str
) -> None:
    """One product per commodity listed for docking (the hidden one is not), one SKU per variant and add-on
    option with procurd's ids, priced by valuation (3.2.0: inventory's cost fields plus the add-ons, the same
    amounts here) and stocked by stock, buyer inputs as the form schema."""
    await control.post("/config", {"version": version})
    ids = await build_shop(control)
    async with upstream_of(shop, database) as upstream:
        report = await sync(database, upstream)
        card_product = await upstream.product(ids[CARD])
        with pytest.raises(BusinessError) as hidden:
            await upstream.product(ids[HIDDEN])
    assert hidden.value.code == "product_unavailable"
    assert (report.status, report.violations) == ("ok", [])
    products = {row["slug"]: row for row in await rows(database, mirror_products)}
    assert set(products) == {CARD, ADDONS, MANUAL, EMPTY, PLAIN}
    assert all(products[code]["id"] == ids[code] for code in products)
    assert [row["name"] for row in await rows(database, mirror_categories)] == [{"zh-CN": "测试"}]

    skus = await skus_by_choice(database)
    card = {k: v for k, v in skus.items() if k.startswith(f'["{CARD}"')}
    assert {
        k: (Decimal(v["price_amount"]), v["stock_quantity"], v["spec_values"]) for k, v in card.items()
    } == {
        key(CARD, "月卡", ("区服", "一区")): (Decimal("10.00"), 3, {"商品类型": "月卡", "区服": "一区"}),
        key(CARD, "月卡", ("区服", "二区")): (Decimal("11.50"), 0, {"商品类型": "月卡", "区服": "二区"}),
        key(CARD, "年卡", ("区服", "一区")): (Decimal("100.00"), 0, {"商品类型": "年卡", "区服": "一区"}),
        key(CARD, "年卡", ("区服", "二区")): (Decimal("101.50"), 1, {"商品类型": "年卡", "区服": "二区"}),
    }
    assert all(row["product_id"] == ids[CARD] for row in card.values())
    assert sorted(sku.id for sku in card_product.skus) == sorted(row["id"] for row in card.values())
    assert Decimal(skus[key(ADDONS, "", ("时长", "30天"))]["price_amount"]) == Decimal("10.00")
    assert skus[key(ADDONS, "", ("时长", "30天"))]["stock_quantity"] == 1
    assert skus[key(ADDONS, "", ("时长", "7天"))]["stock_quantity"] == 0
    assert (skus[key(EMPTY)]["stock_quantity"], skus[key(EMPTY)]["stock_status"]) == (0, "out_of_stock")
    assert skus[key(PLAIN)]["stock_quantity"] == 7
    assert skus[key(MANUAL)]["stock_quantity"] == 5
    assert {row["extra"]["price_source"] for row in skus.values()} == {source}
    sku_ids = [row["id"] for row in skus.values()]
    assert len(set(sku_ids)) == len(sku_ids) == 9

    manual = products[MANUAL]
    assert manual["fulfillment_type"] == "manual"
    assert products[CARD]["fulfillment_type"] == "auto"
    (field,) = manual["manual_form_schema"]["fields"]
    assert (field["key"], field["pattern"], field["pattern_error"]) == (
        "game_uid",
        "^[0-9]{5,12}$",
        {"zh-CN": "游戏ID格式错误"},
    )
    assert field["required"] is True


async def test_passes_that_find_nothing_changed_write_nothing(
    shop: AcgFakaSandbox, control: ControlClient, database: Database
) -> None:
    """A second pass over an unchanged shop asks items alone and writes nothing but its run; a restarted
    process (no memory) asks again but writes nothing either; SKU ids stay, a choice that goes is removed,
    and one that comes back gets its old id."""
    await build_shop(control)
    async with upstream_of(shop, database) as upstream:
        first = await sync(database, upstream)
        ids = {k: row["id"] for k, row in (await skus_by_choice(database)).items()}
        shop.reset_requests()
        writes = database.counts.writes
        second = await sync(database, upstream)
        assert (second.status, second.rows_written, second.added, second.changed) == ("ok", 0, 0, 0)
        assert database.counts.writes - writes == RUN_WRITES
        assert (shop.request_counts["items"], paid_requests(shop)) == (1, 0)

    async with upstream_of(shop, database) as restarted:
        shop.reset_requests()
        writes = database.counts.writes
        again = await sync(database, restarted)
        assert (again.status, again.rows_written) == ("ok", 0)
        assert database.counts.writes - writes == RUN_WRITES
        assert paid_requests(shop) > 0

        # 年卡 goes: its two SKUs are removed by the full pass, the others keep their ids.
        await control.post(f"/commodities/{CARD}", {"races": {"月卡": "10.00"}, "groups": CARD_GROUPS})
        gone = await sync(database, restarted, allow_mass_removal=True)
        assert (gone.status, gone.removed) == ("ok", 2)
        skus = await skus_by_choice(database)
        assert {k: row["id"] for k, row in skus.items()} == ids
        removed = {k for k, row in skus.items() if row["removed_at"] is not None}
        assert removed == {key(CARD, "年卡", ("区服", "一区")), key(CARD, "年卡", ("区服", "二区"))}

        # 年卡 comes back at another price: the same ids, live again.
        await control.post(
            f"/commodities/{CARD}", {"races": {**CARD_RACES, "年卡": "90.00"}, "groups": CARD_GROUPS}
        )
        back = await sync(database, restarted)
        assert (back.status, back.restored) == ("ok", 2)
        skus = await skus_by_choice(database)
        assert {k: row["id"] for k, row in skus.items()} == ids
        assert all(row["removed_at"] is None for row in skus.values())
        assert Decimal(skus[key(CARD, "年卡", ("区服", "一区"))]["price_amount"]) == Decimal("90.00")
    choices = await rows(database, upstream_choices, "sku_id")
    assert len(choices) == len(ids) == first.skus


async def test_requests_a_pass_makes_are_bounded(
    shop: AcgFakaSandbox, control: ControlClient, database: Database
) -> None:
    """With a bound of 8 price and stock requests, each pass reads what fits (the card goods' 4 choices
    first, then the next three commodities, then the last), says how many wait and removes nothing until it
    has read them all; a changed commodity alone costs requests; after a restart, what the shop stopped
    listing is removed only once every listed commodity was read again."""
    await build_shop(control)
    async with upstream_of(shop, database, catalog_requests_per_pass=8) as upstream:
        reports: list[SyncReport] = []
        priced: list[int] = []
        mirrored: list[int] = []
        for _ in range(3):
            shop.reset_requests()
            reports.append(await sync(database, upstream))
            priced.append(shop.request_counts["valuation"] + shop.request_counts["stock"])
            mirrored.append(len(await rows(database, mirror_products)))
        assert [(report.status, report.error) for report in reports] == [("ok", None)] * 3
        # The first pass also asks the version's features: one valuation and one stock about nothing.
        assert priced == [8 + 2, 8, 2]
        assert mirrored == [1, 4, 5]
        assert reports[0].violations == [
            "4 commodities wait for the next pass: this pass's 8 price and stock requests were spent "
            "(0 kept as last read, 4 not read yet; nothing is removed until every listed commodity was read)"
        ]
        assert reports[2].violations == []

        await control.post(f"/commodities/{PLAIN}", {"user_price": "3.30"})
        shop.reset_requests()
        changed = await sync(database, upstream)
        assert (changed.status, changed.changed) == ("ok", 2)  # the product and its SKU
        assert (shop.request_counts["valuation"], shop.request_counts["stock"]) == (1, 1)
        assert Decimal((await skus_by_choice(database))[key(PLAIN)]["price_amount"]) == Decimal("3.30")

    await control.post(f"/commodities/{EMPTY}", {"api_status": 0})  # no longer open for docking
    async with upstream_of(shop, database, catalog_requests_per_pass=8) as restarted:
        partial = await sync(database, restarted)  # reads the card goods only
        assert (partial.status, partial.removed) == ("ok", 0)
        assert await live_slugs(database) == {CARD, ADDONS, MANUAL, EMPTY, PLAIN}
        complete = await sync(database, restarted)  # ADDONS, MANUAL, PLAIN: every listed one read
        assert (complete.status, complete.removed, complete.violations) == ("ok", 2, [])  # EMPTY and its SKU
        assert await live_slugs(database) == {CARD, ADDONS, MANUAL, PLAIN}


async def live_slugs(database: Database) -> set[str]:
    return {row["slug"] for row in await rows(database, mirror_products) if row["removed_at"] is None}


async def test_a_commodity_beyond_the_bound_is_named(
    shop: AcgFakaSandbox, control: ControlClient, database: Database
) -> None:
    """A commodity that alone needs more requests than the bound is not read, not mirrored and named on
    every run; the others are mirrored and the pass completes."""
    await build_shop(control)
    async with upstream_of(shop, database, catalog_requests_per_pass=7) as upstream:
        reports = [await sync(database, upstream), await sync(database, upstream)]
    assert [report.status for report in reports] == ["ok", "ok"]  # 6 requests, then 4
    assert {row["slug"] for row in await rows(database, mirror_products)} == {ADDONS, MANUAL, EMPTY, PLAIN}
    named = f"too_many_requests: {CARD}: needs 8 price and stock requests, more than catalog_requests"
    for report in reports:
        assert any(named in violation for violation in report.violations)


async def test_codes_choose_what_is_mirrored(
    shop: AcgFakaSandbox, control: ControlClient, database: Database
) -> None:
    """``codes`` mirrors those commodities only; a code the supplier does not list for docking (hidden,
    unknown) is named on the run, not mirrored."""
    await build_shop(control)
    async with upstream_of(shop, database, codes=[CARD, HIDDEN, "NOSUCHCODE"]) as upstream:
        report = await sync(database, upstream)
    assert report.status == "ok"
    assert [row["slug"] for row in await rows(database, mirror_products)] == [CARD]
    assert len(await rows(database, mirror_skus)) == 4
    assert sorted(report.violations) == [
        f"code {code} is not listed for docking by the supplier (hidden, off sale, not opened for docking "
        "or unknown): not mirrored"
        for code in sorted([HIDDEN, "NOSUCHCODE"])
    ]


async def test_what_the_api_cannot_buy_is_named_on_the_run(
    shop: AcgFakaSandbox, control: ControlClient, database: Database
) -> None:
    """A commodity whose buyer input is named like a protocol field, and a variant holding a character the
    shop alters in what a buyer sends, are not mirrored (the rest of their commodity is) and the run names
    them with the reason."""
    await build_shop(control)
    category = (await control.post("/categories", {"name": "其他"}))["category"]["id"]
    clash = {**GAME_UID, "name": "num"}
    await control.post(
        "/commodities", {"code": "C0000000000000G7", "name": "G", "category_id": category, "widgets": [clash]}
    )
    await control.post(
        f"/commodities/{CARD}", {"races": {**CARD_RACES, "<b>": "1.00"}, "groups": CARD_GROUPS}
    )
    async with upstream_of(shop, database) as upstream:
        report = await sync(database, upstream)
    assert report.status == "ok"
    assert "C0000000000000G7" not in {row["slug"] for row in await rows(database, mirror_products)}
    assert len([k for k in await skus_by_choice(database) if k.startswith(f'["{CARD}"')]) == 4
    (widget,) = [text for text in report.violations if "C0000000000000G7" in text]
    assert "num" in widget
    assert widget.endswith("not mirrored")
    variants = [text for text in report.violations if f"({CARD}), choice" in text]
    assert len(variants) == 2  # <b> with each 区服 option
    assert all("'<b>' holds characters the supplier alters" in text for text in variants)
