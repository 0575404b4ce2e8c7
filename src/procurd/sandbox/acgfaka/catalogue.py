"""The sandbox shop's generated catalogue: the same seed gives the same goods.

Commodities come in eight kinds, in turn: plain card goods, goods with variants (races) and a wholesale tier,
variants with an add-on group, manual goods with buyer inputs and a stock counter, card goods with wholesale
tiers, hidden goods (``hide``), goods not opened for docking (``api_status`` 0), and add-ons without
variants. About one card commodity in six has no cards left (out of stock), one manual commodity in four a
counter of 0. Categories are flat with a parent id, as the shop lists them; one has no goods for docking.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from procurd.sandbox.acgfaka.shop import CENT, Category, Commodity, Shop

KINDS = ("plain", "races", "races_addons", "manual", "wholesale", "hidden", "not_docked", "addons")
RACES = (("月卡", Decimal("1")), ("季卡", Decimal("2.8")), ("年卡", Decimal("10")))
REGIONS = (("一区", Decimal("0")), ("二区", Decimal("1.00")))
DURATIONS = (("7天", Decimal("0")), ("30天", Decimal("5.00")))
_ADJECTIVES = ("星辰", "极光", "青竹", "赤焰", "流云", "山海", "琉璃", "白露")
_NOUNS = ("点卡", "会员", "激活码", "兑换券", "通行证")
GAME_UID = {
    "cn": "游戏ID",
    "name": "game_uid",
    "placeholder": "请输入5到12位数字",
    "type": "text",
    "regex": "^[0-9]{5,12}$",
    "error": "游戏ID格式错误",
    "dict": "",
}
SERVER = {
    "cn": "区服",
    "name": "server",
    "placeholder": "",
    "type": "select",
    "regex": "^(qq|wx)$",
    "error": "请选择区服",
    "dict": "QQ区=qq,微信区=wx",
}
NOTE = {
    "cn": "备注",
    "name": "note",
    "placeholder": "",
    "type": "textarea",
    "regex": "",
    "error": "",
    "dict": "",
}


def config_text(
    races: Mapping[str, Decimal] | None = None,
    race_wholesale: Mapping[str, Mapping[int, Decimal]] | None = None,
    wholesale: Mapping[int, Decimal] | None = None,
    groups: Mapping[str, Mapping[str, Decimal]] | None = None,
) -> str:
    """A commodity's INI config, as the shop's editor writes it."""
    lines: list[str] = []
    if races:
        lines += ["[category]", *(f"{name}={price}" for name, price in races.items())]
    if race_wholesale:
        lines.append("[category_wholesale]")
        lines += [
            f"{race}.{qty}={price}" for race, tiers in race_wholesale.items() for qty, price in tiers.items()
        ]
    if wholesale:
        lines += ["[wholesale]", *(f"{qty}={price}" for qty, price in wholesale.items())]
    if groups:
        lines.append("[sku]")
        lines += [
            f"{group}.{option}={amount}"
            for group, options in groups.items()
            for option, amount in options.items()
        ]
    return "\n".join(lines)


def _categories(shop: Shop) -> list[Category]:
    games = shop.add_category("游戏点卡", sort=10, icon="/assets/icon/game.png")
    monthly = shop.add_category("月卡会员", sort=11, pid=games.id)
    topup = shop.add_category("充值代充", sort=12, pid=games.id)
    software = shop.add_category("软件激活", sort=20)
    media = shop.add_category("影音会员", sort=30)
    shop.add_category("暂无对接商品", sort=40)
    return [monthly, topup, software, media]


def _money(rng: random.Random, low: int, high: int) -> Decimal:
    return Decimal(rng.randint(low * 100, high * 100)) / 100


def _cards(
    shop: Shop, commodity: Commodity, rng: random.Random, race: str | None, sku: dict[str, str]
) -> None:
    count = rng.randint(1, 4)
    secrets = [f"{commodity.code[:6]}-{commodity.id}-{rng.getrandbits(40):010X}" for _ in range(count)]
    shop.add_cards(commodity, secrets, race, sku)


def _generate_one(shop: Shop, index: int, category: Category, rng: random.Random) -> None:
    kind = KINDS[index % len(KINDS)]
    base = _money(rng, 1, 200)
    commodity = Commodity(
        id=shop.next_commodity_id(),
        code=shop.new_code(),
        category_id=category.id,
        name=f"{rng.choice(_ADJECTIVES)}{rng.choice(_NOUNS)} {index + 1}",
        price=(base * Decimal("1.2")).quantize(CENT),
        user_price=base,
        factory_price=(base * Decimal("0.6")).quantize(CENT),
        description=f"<p>第 {index + 1} 件商品，{kind}</p>",
        cover=f"/assets/cover/{index + 1}.png" if index % 3 else "",
        tags=[{"text": "热销", "color": "red"}] if index % 5 == 0 else [],
        create_time=f"2026-01-{index % 28 + 1:02d} {index % 24:02d}:{index % 60:02d}:00",
        hide=1 if kind == "hidden" else 0,
        api_status=0 if kind == "not_docked" else 1,
    )
    races: dict[str, Decimal] = {}
    groups: dict[str, dict[str, Decimal]] = {}
    if kind in ("races", "races_addons"):
        races = {name: (base * factor).quantize(CENT) for name, factor in RACES}
    if kind == "races_addons":
        groups = {"区服": dict(REGIONS)}
    if kind == "addons":
        groups = {"时长": dict(DURATIONS)}
    commodity.config = config_text(
        races,
        {"月卡": {10: (races["月卡"] * Decimal("0.9")).quantize(CENT)}} if kind == "races" else None,
        {10: (base * Decimal("0.95")).quantize(CENT), 50: (base * Decimal("0.9")).quantize(CENT)}
        if kind == "wholesale"
        else None,
        groups,
    )
    if kind == "manual":
        commodity.delivery_way = 1
        commodity.widgets = [GAME_UID, SERVER, NOTE]
        commodity.stock = 0 if rng.random() < 0.25 else rng.randint(1, 50)
        commodity.delivery_message = "" if index % 2 else "已收到订单，客服将在10分钟内为您充值。"
        commodity.leave_message = "充值到账后请重新登录游戏。"
    shop.add_commodity(commodity)
    if kind == "manual" or rng.random() < 1 / 6:
        return  # manual goods hold no cards; some card goods have none left
    race_names: list[str | None] = list(races) or [None]
    option_sets: list[dict[str, str]] = [{}]
    for group, options in groups.items():
        option_sets = [{**chosen, group: option} for chosen in option_sets for option in options]
    for race in race_names:
        for chosen in option_sets:
            _cards(shop, commodity, rng, race, chosen)


def generate(shop: Shop, count: int, seed: int) -> None:
    """``count`` commodities spread over the categories."""
    rng = random.Random(seed)
    leaves = _categories(shop)
    for index in range(count):
        _generate_one(shop, index, leaves[index % len(leaves)], rng)


def describe(shop: Shop) -> dict[str, Any]:
    """How many commodities of each sort the shop holds."""
    commodities = list(shop.commodities.values())
    return {
        "commodities": len(commodities),
        "docked": sum(1 for c in commodities if c.api_status == 1 and c.hide == 0 and c.status == 1),
        "hidden": sum(1 for c in commodities if c.hide == 1),
        "not_docked": sum(1 for c in commodities if c.api_status == 0),
        "manual": sum(1 for c in commodities if c.delivery_way == 1),
        "cards_unsold": sum(1 for cards in shop.cards.values() for card in cards if not card.sold),
    }
