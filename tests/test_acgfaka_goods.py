"""The goods model over the sandbox shop's generated catalogue, read over real sockets: one product per
commodity, one SKU per variant and add-on choice, prices and stock as the supplier computes them, hidden and
out-of-stock goods, older versions' cost fields, and commodities the API cannot buy as problems."""

from __future__ import annotations

from collections.abc import AsyncIterator
from decimal import Decimal
from typing import Any

import pytest

from procurd.protocol.acgfaka import AcgFakaClient, Goods, choice_key, goods_of, read_commodity
from procurd.protocol.acgfaka.envelope import StockReading
from procurd.protocol.acgfaka.goods import PriceSource, read_config
from procurd.sandbox.acgfaka import AcgFakaSandbox, ShopConfig
from procurd.sandbox.acgfaka.shop import Shop
from procurd.sandbox.acgfaka.testing import ControlClient, shop_settings

COMMODITIES = 24  # three of each kind the generator makes


async def mirror(sandbox: AcgFakaSandbox) -> tuple[dict[str, Goods], list[Any]]:
    """What a catalogue pass would build: every listed commodity as goods, and the listing's problems."""
    async with AcgFakaClient(shop_settings(sandbox.base_url)) as client:
        features = await client.features()
        listing = await client.items()
        goods = {commodity.code: await client.goods(commodity, features) for commodity in listing.commodities}
    return goods, listing.problems


@pytest.fixture
async def shop() -> AsyncIterator[AcgFakaSandbox]:
    async with AcgFakaSandbox(ShopConfig(commodities=COMMODITIES, seed=7)) as sandbox:
        yield sandbox


def unit_price(shop: Shop, code: str, race: str | None, options: list[list[str]]) -> Decimal:
    commodity = shop.by_code(code)
    assert commodity is not None
    return shop.valuation(commodity, 1, race, dict(options))


async def test_generated_catalogue(shop: AcgFakaSandbox) -> None:
    """Listed goods only (hidden and not-docked ones are not); a SKU per choice with the supplier's own
    price for one and its stock; manual goods with their inputs' schema; out-of-stock goods at 0."""
    goods, problems = await mirror(shop)
    assert problems == []
    commodities = shop.shop.commodities.values()
    listed = {c.code for c in commodities if c.hide == 0 and c.api_status == 1}
    assert set(goods) == listed
    assert len(listed) == COMMODITIES - 6
    kinds_seen = set()
    for code, built in goods.items():
        commodity = shop.shop.by_code(code)
        assert commodity is not None
        product = built.product
        assert product is not None, built.problems
        assert built.problems == ()
        assert (product["id"], product["slug"], product["title"]) == (
            commodity.id,
            code,
            {"zh-CN": commodity.name},
        )
        assert product["fulfillment_type"] == ("manual" if commodity.delivery_way else "auto")
        assert product["images"] == ([f"{shop.base_url}{commodity.cover}"] if commodity.cover else [])
        races = list(shop.shop.races(commodity))
        groups = shop.shop.groups(commodity)
        combinations = max(len(races), 1) * (len(next(iter(groups.values()))) if groups else 1)
        assert len(product["skus"]) == combinations
        keys = {sku["choice_key"] for sku in product["skus"]}
        assert len(keys) == combinations
        for sku in product["skus"]:
            expected = unit_price(shop.shop, code, sku["race"], sku["options"])
            assert Decimal(sku["price_amount"]) == expected
            stock = shop.shop.stock_text(commodity, sku["race"], dict(map(tuple, sku["options"])))
            assert sku["stock_quantity"] == (int(stock) if stock else 0)
            assert sku["stock_status"] == StockReading(sku["stock_quantity"]).status
            if sku["race"] is not None:
                assert sku["spec_values"]["商品类型"] == sku["race"]
        assert product["price_amount"] == min((s["price_amount"] for s in product["skus"]), key=Decimal)
        if groups and races:
            kinds_seen.add("races_addons")
        elif groups:
            kinds_seen.add("addons")
        elif races:
            kinds_seen.add("races")
        if commodity.delivery_way:
            kinds_seen.add("manual")
            schema = product["manual_form_schema"]
            assert [field["key"] for field in schema["fields"]] == ["game_uid", "server", "note"]
            assert schema["fields"][0]["pattern"] == "^[0-9]{5,12}$"
            assert schema["fields"][0]["required"] is True
            assert schema["fields"][2]["required"] is False
        if all(sku["stock_quantity"] == 0 for sku in product["skus"]):
            kinds_seen.add("out_of_stock")
    assert kinds_seen == {"races", "races_addons", "addons", "manual", "out_of_stock"}


async def test_choice_keys_are_stable(shop: AcgFakaSandbox) -> None:
    """The same catalogue read twice gives the same choice keys; a key does not depend on option order."""
    first, _ = await mirror(shop)
    again, _ = await mirror(shop)
    keys = [[sku["choice_key"] for sku in g.product["skus"]] for g in first.values() if g.product]
    assert keys == [[sku["choice_key"] for sku in g.product["skus"]] for g in again.values() if g.product]
    assert choice_key("C", "月卡", [("b", "1"), ("a", "2")]) == choice_key(
        "C", "月卡", [("a", "2"), ("b", "1")]
    )
    assert choice_key("C", None, []) == '["C","",[]]'


async def test_hidden_goods_by_code(shop: AcgFakaSandbox) -> None:
    """A hidden or not-docked commodity is not listed, but item finds it by its code (codes = [...])."""
    hidden = [c for c in shop.shop.commodities.values() if c.hide or not c.api_status]
    async with AcgFakaClient(shop_settings(shop.base_url)) as client:
        features = await client.features()
        for commodity in hidden:
            built = await client.goods(await client.item(commodity.code), features)
            assert built.product is not None
            assert built.product["slug"] == commodity.code


@pytest.mark.parametrize(("version", "source"), [("3.2.0", "inventory"), ("3.0.5", "items")])
async def test_older_versions_price_from_their_cost_fields(
    shop: AcgFakaSandbox, version: str, source: str
) -> None:
    """Without valuation, a version's cost fields give the same price for one as valuation does on 3.6.0
    (3.1.3 - 3.4.5: inventory plus the add-ons; before: the listing's factory_price, with no add-ons)."""
    current, _ = await mirror(shop)
    shop.config.version = version
    older, problems = await mirror(shop)
    assert problems == []
    assert set(older) == set(current)
    for code, built in older.items():
        assert built.product is not None, built.problems
        prices = {sku["choice_key"]: sku["price_amount"] for sku in current[code].product["skus"]}  # type: ignore[index]
        for sku in built.product["skus"]:
            assert sku["price_source"] == source
            assert Decimal(sku["price_amount"]) == unit_price(shop.shop, code, sku["race"], sku["options"])
            if source == "items":
                assert sku["options"] == []  # add-ons came with 3.1.3
            else:
                assert sku["price_amount"] == prices[sku["choice_key"]]


async def test_problems_stay_with_their_commodity(shop: AcgFakaSandbox) -> None:
    """A config the supplier itself cannot parse, an input the API cannot fill, a variant whose name the
    supplier alters: problems of that commodity (or choice) alone; the rest is read."""
    category = next(iter(shop.shop.categories))
    async with ControlClient(shop.base_url) as control:
        spec = {"category_id": category, "price": "3.00"}
        await control.post(
            "/commodities",
            {**spec, "name": "坏配置", "code": "BAD0000000000001", "config": "[category]\n月卡"},
        )
        await control.post(
            "/commodities",
            {**spec, "name": "坏输入", "code": "BAD0000000000002", "widgets": [{"name": "a.b", "regex": ""}]},
        )
        await control.post(
            "/commodities",
            {**spec, "name": "坏名字", "code": "BAD0000000000003", "races": {"A&B": "1.00", "正常": "2.00"}},
        )
    goods, problems = await mirror(shop)
    reasons = {problem.reason.split(":", 1)[0]: problem.reason for problem in problems}
    assert "not one key=value" in reasons["BAD0000000000001"]
    assert "rewrites" in reasons["BAD0000000000002"]
    assert len(goods) == COMMODITIES - 6 + 1
    odd = goods["BAD0000000000003"]
    assert odd.product is not None
    assert [sku["race"] for sku in odd.product["skus"]] == ["正常"]
    assert [p.code for p in odd.problems] == ["choice_unavailable"]
    assert "alters" in odd.problems[0].reason


def test_too_many_choices_is_a_problem() -> None:
    """A commodity whose variants and add-ons multiply beyond the bound is not offered."""
    groups = "\n".join(f"g{g}.o{o}=0" for g in range(4) for o in range(6))
    commodity = read_commodity({"id": 1, "category_id": 1, "code": "X", "config": f"[sku]\n{groups}"})
    built = goods_of(commodity, prices={}, source=PriceSource.VALUATION)
    assert built.product is None
    assert "1296 combinations" in built.problems[0].reason


def test_config_as_item_sends_it() -> None:
    """item sends the config parsed, a section keyed 0..n-1 as a list: read the same as the INI text."""
    assert read_config({"category": ["1.00", "2.00"], "sku": {"区": {"一": "0"}}}).races == {
        "0": Decimal("1.00"),
        "1": Decimal("2.00"),
    }
    assert read_config("[category]\n0=1.00\n1=2.00").races == {"0": Decimal("1.00"), "1": Decimal("2.00")}
