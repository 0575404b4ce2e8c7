"""The sandbox shop's trade: a member buys with its balance, checked in the shop's order (the request number
late, after every validation), charged, delivered and answered in one step, as one transaction."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from procurd.protocol.acgfaka.refusals import MANUAL_NOTICE, PRICE_CHANGED, SOLD_OUT_NOTICE
from procurd.sandbox.acgfaka.php import Post, php_int, sanitised, text
from procurd.sandbox.acgfaka.shop import (
    LEAVE_MESSAGE_FROM,
    MANDATORY_CHOICE_FROM,
    REQUEST_NO_FROM,
    SNAPSHOT_CHECK_FROM,
    STOCK_FROM,
    Commodity,
    Member,
    Order,
    Shop,
    ShopCrash,
    ShopRefusal,
)

REQUEST_NO_COLUMN = 19  # char(19) under MySQL's strict mode: longer crashes the trade
CUSTOM_IGNORED_FROM = (3, 5, 7)
LEGACY_RACE_UNTIL = (3, 1, 0)


@dataclass(frozen=True)
class TradeFaults:
    """What a fault knob makes of this one trade (consumed by the caller)."""

    price_changed: bool = False  # the snapshot check inside the transaction fails
    sold_out: bool = False  # another buyer takes the cards between the check and the delivery


@dataclass(frozen=True)
class Traded:
    order: Order
    data: dict[str, Any]


def _regex_matches(pattern: str, value: str) -> bool:
    """``preg_match('/<pattern>/', value)``: an unescaped ``/`` (or a pattern PHP cannot compile) fails."""
    if re.search(r"(?<!\\)(?:\\\\)*/", pattern):
        return False
    try:
        return re.search(pattern, value) is not None
    except re.error:
        return False


def _check_inputs(shop: Shop, commodity: Commodity, post: Post) -> dict[str, dict[str, str]] | None:
    stored: dict[str, dict[str, str]] = {}
    for widget in commodity.widgets:
        if widget.get("type") == "custom" and shop.has(CUSTOM_IGNORED_FROM):
            continue
        name = str(widget.get("name", ""))
        value = sanitised(text(post.get(name)))
        pattern = str(widget.get("regex") or "")
        if pattern and not _regex_matches(pattern, value):
            raise ShopRefusal(str(widget.get("error") or ""))
        stored[name] = {"value": value, "cn": str(widget.get("cn", ""))}
    return stored or None


def _check_choice(shop: Shop, commodity: Commodity, race: str, sku: Mapping[Any, Any]) -> None:
    races = shop.races(commodity)
    if races and shop.has(MANDATORY_CHOICE_FROM):
        if not race:
            raise ShopRefusal("请选择商品类型")
        if race not in races:
            raise ShopRefusal(f"此商品类型不存在[{race}]")
    elif races and shop.version <= LEGACY_RACE_UNTIL:
        if not race:
            raise ShopRefusal("请选择商品种类")
        if race not in races:
            raise ShopRefusal("商品种类不存在")
    if shop.has(MANDATORY_CHOICE_FROM):
        for group, options in shop.groups(commodity).items():
            chosen = sku.get(group)
            if not chosen:
                raise ShopRefusal(f"请选择{group}")
            if chosen not in options:
                raise ShopRefusal(f"{group}选择错误")


def _stock_refused(stock: str, num: int) -> bool:
    """The trade's own comparison (PHP 8): "" and 0 are out, a word is available."""
    if stock == "":
        return True
    if re.fullmatch(r"-?[0-9]+", stock.strip()):
        count = int(stock.strip())
        return count == 0 or num > count
    return False


def trade(shop: Shop, member: Member, post: Post, base_url: str, faults: TradeFaults) -> Traded:
    """One trade of ``member`` with the posted fields; :class:`ShopRefusal` or :class:`ShopCrash` leave
    everything as it was."""
    if "request" in post and shop.has(STOCK_FROM):
        raise ShopCrash("the field 'request' collides with the injected Request parameter")
    commodity = shop.find(sanitised(text(post.get("shared_code"))))
    num = php_int(post.get("num"))
    if num <= 0:
        raise ShopRefusal("至少购买1个")
    if commodity.status != 1:
        raise ShopRefusal("当前商品已停售")
    if commodity.minimum > 0 and num < commodity.minimum:
        raise ShopRefusal(f"本商品最少购买{commodity.minimum}个")
    if commodity.maximum > 0 and num > commodity.maximum:
        raise ShopRefusal(f"本商品单次最多购买{commodity.maximum}个")
    widget = _check_inputs(shop, commodity, post)
    race = sanitised(text(post.get("race")))
    raw_sku = post.get("sku")
    sku: dict[Any, Any] = dict(raw_sku) if isinstance(raw_sku, dict) and shop.has(STOCK_FROM) else {}
    sku = {key: sanitised(value) if isinstance(value, str) else value for key, value in sku.items()}
    _check_choice(shop, commodity, race, sku)
    if _stock_refused(shop.stock_text(commodity, race or None, sku), num):
        raise ShopRefusal("库存不足")
    if commodity.purchase_count > 0 and shop.orders_of(member.id, commodity.id) >= commodity.purchase_count:
        raise ShopRefusal(f"该商品每人只能购买{commodity.purchase_count}件")
    amount = shop.valuation(commodity, num, race or None, sku)
    if text(post.get("coupon")) and num == 1:
        raise ShopRefusal("该优惠券不存在")
    if not shop.config.balance_payment:
        raise ShopRefusal("当前支付方式已停用，请换个支付方式再进行支付")
    # -- the transaction --
    if shop.has(SNAPSHOT_CHECK_FROM) and faults.price_changed:
        raise ShopRefusal(PRICE_CHANGED)
    request_no = text(post.get("request_no")) if shop.has(REQUEST_NO_FROM) else ""
    if len(request_no) > REQUEST_NO_COLUMN:
        raise ShopCrash("Data too long for column 'request_no'")
    if request_no and shop.request_no_taken(request_no):
        raise ShopRefusal("The request ID already exists")
    if member.banned:
        raise ShopRefusal("You have been banned")
    if amount > 0 and member.balance < amount:
        raise ShopRefusal("余额不足")
    member.balance -= amount if amount > 0 else Decimal(0)
    secret = _deliver(shop, commodity, num, race or None, sku, faults.sold_out)
    order = shop.add_order(
        Order(
            id=0,
            trade_no=shop.trade_no(),
            owner=member.id,
            commodity_id=commodity.id,
            amount=amount,
            num=num,
            secret=secret,
            race=race or None,
            sku={str(k): str(v) for k, v in sku.items()} or None,
            widget=widget,
            request_no=request_no or None,
            created_at=shop.clock(),
            # an imported commodity's order holds the upstream's answer: the shop never refreshes it
            delivered=commodity.delivery_way == 0 or commodity.shared_id is not None,
        )
    )
    data: dict[str, Any] = {
        "url": f"{base_url}/user/personal/purchaseRecord?tradeNo={order.trade_no}",
        "amount": amount,
        "tradeNo": order.trade_no,
        "secret": secret,
    }
    if shop.has(LEAVE_MESSAGE_FROM):
        data["leave_message"] = commodity.leave_message or None
    return Traded(order, data)


def _deliver(
    shop: Shop, commodity: Commodity, num: int, race: str | None, sku: Mapping[Any, Any], sold_out: bool
) -> str:
    if commodity.delivery_way != 0:
        if commodity.stock is not None:
            commodity.stock = commodity.stock - num if commodity.stock >= num else 0
        return commodity.delivery_message or MANUAL_NOTICE
    strict = shop.has(MANDATORY_CHOICE_FROM)
    cards = shop.matching_cards(commodity, race, sku, strict_race=strict)
    if sold_out:
        for card in cards:  # a concurrent buyer took them while this order was being paid
            card.sold = True
        cards = []
    if len(cards) < num:
        return SOLD_OUT_NOTICE
    taken = cards[:num]
    for card in taken:
        card.sold = True
    return "\n".join(card.secret for card in taken)
