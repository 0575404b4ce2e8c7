"""The sandbox shop's endpoints: what each answers, with the fields, types and ``msg`` of the version set.

Prices are JSON numbers (PHP floats) in ``items``, ``item``, ``inventory``, ``connect`` and ``trade``; the
``valuation`` price a decimal string; ``stock`` a string; ``tradeNo`` 18 digits.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from aiohttp import web

from procurd.protocol.acgfaka.ini import IniError, parse_ini
from procurd.sandbox.acgfaka.faults import AFTER_KINDS, TRADE_KINDS, Fault, ShopFaults
from procurd.sandbox.acgfaka.php import Post, php_int, sanitised, text
from procurd.sandbox.acgfaka.shop import (
    NEW_KERNEL_FROM,
    QUERY_FROM,
    SHARED_CODE_ITEM_FROM,
    STOCK_FROM,
    VALUATION_FROM,
    Commodity,
    Member,
    Shop,
    ShopCrash,
    ShopRefusal,
)
from procurd.sandbox.acgfaka.trade import TradeFaults, trade


@dataclass(frozen=True)
class Call:
    shop: Shop
    faults: ShopFaults
    member: Member
    post: Post
    request: web.Request

    def value(self, name: str, *, escape: bool = False) -> str:
        return sanitised(text(self.post.get(name)), escape=escape)

    def sku(self, *, escape: bool = False) -> dict[Any, Any]:
        raw = self.post.get("sku")
        if raw is None or raw == "":
            return {}
        if not isinstance(raw, dict):
            raise ShopCrash("sku must be an array")
        return {
            key: sanitised(value, escape=escape) if isinstance(value, str) else value
            for key, value in raw.items()
        }


@dataclass(frozen=True)
class AfterCommit:
    """A committed trade's answer, and the knob (if any) that loses or spoils it."""

    body: dict[str, Any]
    fault: Fault | None


def success(data: Any, msg: bool) -> dict[str, Any]:
    return {"code": 200, "msg": "success", "data": data} if msg else {"code": 200, "data": data}


def _decoded_config(commodity: Commodity) -> Any:
    """``item``'s config: the parsed INI, a section keyed 0..n-1 as a list."""
    try:
        sections = parse_ini(commodity.config)
    except IniError as exc:
        raise ShopRefusal(
            f"该商品配置异常，请商家检查商品[{commodity.id}]的批发/规格/会员价配置：{exc}"
        ) from None
    result: dict[str, Any] = {}
    for name, section in sections.items():
        keys = list(section)
        result[name] = list(section.values()) if keys == [str(i) for i in range(len(keys))] else section
    return result


def _factory_config(shop: Shop, commodity: Commodity) -> str:
    """The config with ``[category_factory]``: each variant's unit cost for the member (older answers)."""
    races = shop.races(commodity)
    if not races:
        return commodity.config
    lines = [f"{race}={shop.unit_cost(commodity, race)}" for race in races]
    return "\n".join([commodity.config, "[category_factory]", *lines])


def commodity_row(shop: Shop, commodity: Commodity) -> dict[str, Any]:
    """A commodity as ``items`` lists it: every column but the two messages, per the version."""
    old_costs = not shop.has(STOCK_FROM)  # before 3.1.3 the listing priced every commodity for the caller
    has_races = old_costs and bool(shop.races(commodity))
    factory = commodity.factory_price
    if old_costs:
        factory = shop.unit_cost(commodity) if not has_races else Decimal(0)
    return {
        "id": commodity.id,
        "category_id": commodity.category_id,
        "name": commodity.name,
        "description": commodity.description,
        "cover": commodity.cover,
        "factory_price": factory,
        "price": commodity.price,
        "user_price": commodity.user_price,
        "status": commodity.status,
        "owner": 0,
        "create_time": commodity.create_time,
        "api_status": commodity.api_status,
        "code": commodity.code,
        "delivery_way": commodity.delivery_way,
        "delivery_auto_mode": 0,
        "contact_type": 0,
        "password_status": 0,
        "sort": commodity.id,
        "coupon": 0,
        "shared_id": commodity.shared_id,
        "shared_code": "",
        "shared_premium": 0,
        "shared_premium_type": 0,
        "shared_premium_template": None,
        "shared_stock": None,
        "stock": shop.listed_stock(commodity),
        "seckill_status": 0,
        "seckill_start_time": None,
        "seckill_end_time": None,
        "draft_status": 0,
        "draft_premium": 0,
        "inventory_hidden": 0,
        "recommend": 0,
        "send_email": 0,
        "only_user": 0,
        "purchase_count": commodity.purchase_count,
        "widget": json.dumps(commodity.widgets, ensure_ascii=False) if commodity.widgets else None,
        "tags": json.dumps(commodity.tags, ensure_ascii=False) if commodity.tags else None,
        "level_price": None,
        "level_disable": 0,
        "minimum": commodity.minimum,
        "maximum": commodity.maximum,
        "shared_sync": 0,
        "config": _factory_config(shop, commodity) if old_costs and has_races else commodity.config,
        "hide": commodity.hide,
        "inventory_sync": 0,
        "shared_amount_sync": 0,
        "shared_config_sync": 0,
    }


def _listing(shop: Shop, only: str | None = None) -> list[dict[str, Any]]:
    categories = []
    for category in sorted(shop.categories.values(), key=lambda c: c.id):
        children = [
            commodity_row(shop, commodity)
            for commodity in shop.commodities.values()
            if commodity.category_id == category.id
            and commodity.status == 1
            and commodity.api_status == 1
            and commodity.hide == 0
            and (only is None or commodity.code == only)
        ]
        if children:
            row = {
                "id": category.id,
                "name": category.name,
                "sort": category.sort,
                "create_time": "2026-01-01 00:00:00",
                "owner": 0,
                "icon": category.icon,
                "status": 1,
                "hide": category.hide,
                "user_level_config": None,
                "pid": category.pid,
            }
            categories.append({**row, "children": children})
    return categories


async def connect(call: Call) -> dict[str, Any]:
    return success({"shopName": call.shop.config.shop_name, "balance": call.member.balance}, msg=True)


async def items(call: Call) -> dict[str, Any]:
    return success(_listing(call.shop), msg=not call.shop.has(STOCK_FROM))


async def item(call: Call) -> dict[str, Any]:
    shop = call.shop
    if not shop.has(STOCK_FROM):
        return success(_listing(shop, call.value("sharedCode")), msg=True)
    code = call.value("code")
    if not code:
        raise ShopRefusal("对接CODE不能为空")
    commodity = shop.find(code)
    if commodity.status != 1:
        raise ShopRefusal("该商品暂未上架")
    row = commodity_row(shop, commodity)
    for name in ("factory_price", "create_time", "api_status", "hide", "sort", "recommend", "send_email"):
        row.pop(name, None)
    row.update(
        cover=commodity.cover or "/favicon.ico",
        owner=None,
        widget=commodity.widgets or None,
        tags=commodity.tags,
        config=_decoded_config(commodity),
        order_sold=sum(1 for order in shop.orders.values() if order.commodity_id == commodity.id),
        service_url="",
        service_qq="",
        share_url="",
        login=False,
        trade_captcha=0,
    )
    return success(row, msg=False)


def _on_sale(call: Call, field: str) -> Commodity:
    """The commodity whose code the field ``field`` names, refused as the shop refuses it when the code is
    missing or the commodity is off sale."""
    code = call.value(field, escape=True)
    if not code:
        raise ShopRefusal("商品代码不能为空")
    commodity = call.shop.find(code)
    if commodity.status != 1:
        raise ShopRefusal("当前商品已停售")
    return commodity


async def inventory(call: Call) -> dict[str, Any]:
    shop = call.shop
    commodity = _on_sale(call, "sharedCode")
    race = call.value("race", escape=True) or None
    races = shop.races(commodity)
    if race is None and races:
        race = next(iter(races))
    count = len(shop.matching_cards(commodity, race, None)) if commodity.delivery_way == 0 else 0
    data = {
        "count": count,
        "delivery_way": commodity.delivery_way,
        "draft_status": 0,
        "price": commodity.price,
        "user_price": commodity.user_price,
        "config": _factory_config(shop, commodity),
        "factory_price": shop.unit_cost(commodity) if not races else Decimal(0),
        "is_category": bool(races),
    }
    return success(data, msg=True)


async def inventory_state(call: Call) -> dict[str, Any]:
    shop = call.shop
    commodity = _on_sale(call, "shared_code")
    if commodity.delivery_way == 0:
        race = call.value("race", escape=True) or None
        if len(shop.matching_cards(commodity, race, None)) < php_int(call.post.get("num")):
            raise ShopRefusal("库存不足")
    return success([], msg=True)


async def stock(call: Call) -> dict[str, Any]:
    if "code" not in call.post:
        raise ShopCrash('Undefined array key "code"')
    commodity = call.shop.find(call.value("code"))
    return success(
        {"stock": call.shop.stock_text(commodity, call.value("race") or None, call.sku())}, msg=False
    )


async def valuation(call: Call) -> dict[str, Any]:
    shop = call.shop
    commodity = shop.by_code(call.value("code", escape=True))
    if commodity is None:
        raise ShopRefusal("商品不存在#0")
    price = shop.valuation(
        commodity,
        php_int(call.post.get("num")),
        call.value("race", escape=True) or None,
        call.sku(escape=True),
    )
    return success({"price": f"{price:.2f}"}, msg=False)


async def buy(call: Call) -> AfterCommit:
    shop, faults = call.shop, call.faults
    knobs = TradeFaults(
        price_changed=faults.take("trade", (TRADE_KINDS[0],)) is not None,
        sold_out=faults.take("trade", (TRADE_KINDS[1],)) is not None,
    )
    base_url = str(call.request.url.origin())
    traded = trade(shop, call.member, call.post, base_url, knobs)
    data = traded.data
    if shop.has(STOCK_FROM):
        commodity = shop.commodities[traded.order.commodity_id]
        data["stock"] = shop.stock_text(commodity, traded.order.race, traded.order.sku)
    return AfterCommit(success(data, msg=True), faults.take("trade", AFTER_KINDS))


async def query(call: Call) -> dict[str, Any]:
    shop = call.shop
    trade_no = text(call.post.get("tradeNo"))
    if not trade_no and shop.has(NEW_KERNEL_FROM):
        trade_no = call.request.query.get("tradeNo", "")
    if not trade_no and not shop.has(NEW_KERNEL_FROM):
        raise ShopRefusal("tradeNo can not be empty")
    order = shop.orders.get(trade_no.strip())
    if order is None or order.owner != call.member.id:
        raise ShopRefusal("订单不存在")
    return success({"secret": order.secret, "widget": order.widget, "status": order.status}, msg=True)


async def draft_card(call: Call) -> dict[str, Any]:
    call.shop.find(call.value("code") or call.value("sharedCode"))
    raise ShopRefusal("该商品不支持预选")


async def draft(call: Call) -> dict[str, Any]:
    call.shop.find(call.value("code"))
    raise ShopRefusal("预选的宝贝不存在")


async def face(call: Call) -> dict[str, Any]:
    raise ShopCrash("not a docking endpoint")


Handler = Callable[[Call], Awaitable[Any]]
CONTROLLERS: dict[tuple[str, ...], dict[str, tuple[Handler, tuple[int, int, int]]]] = {
    ("Shared", "Authentication"): {"connect": (connect, (0, 0, 1))},
    ("Shared", "Commodity"): {
        "items": (items, (0, 0, 1)),
        "item": (item, SHARED_CODE_ITEM_FROM),
        "inventory": (inventory, (0, 0, 1)),
        "inventorystate": (inventory_state, (0, 0, 1)),
        "stock": (stock, STOCK_FROM),
        "valuation": (valuation, VALUATION_FROM),
        "trade": (buy, (0, 0, 1)),
        "query": (query, QUERY_FROM),
        "draftcard": (draft_card, (0, 0, 1)),
        "draft": (draft, STOCK_FROM),
    },
    ("Shared", "Plugin"): {"face": (face, (0, 7, 2))},
}
ENDPOINT_NAMES: dict[Handler, str] = {
    connect: "connect",
    items: "items",
    item: "item",
    inventory: "inventory",
    inventory_state: "inventoryState",
    stock: "stock",
    valuation: "valuation",
    buy: "trade",
    query: "query",
    draft_card: "draftCard",
    draft: "draft",
    face: "face",
}


def known_controller(controller: tuple[str, ...]) -> bool:
    return controller in CONTROLLERS


def handler_for(shop: Shop, controller: tuple[str, ...], method: str) -> Handler | None:
    """The endpoint a route names, if the shop's version has it (method names ignore case, as PHP's)."""
    found = CONTROLLERS.get(controller, {}).get(method.lower())
    if found is None or shop.version < found[1]:
        return None
    return found[0]
