"""The sandbox acg-faka shop in memory: members, categories, commodities with their INI config and cards,
orders; prices and stock computed as the shop computes them. The trade itself is :mod:`.trade`."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_DOWN, Decimal
from typing import Any

from procurd.protocol.acgfaka.goods import SHANGHAI
from procurd.protocol.acgfaka.ini import IniError, parse_ini

DEFAULT_APP_ID = 1000
DEFAULT_APP_KEY = "0123456789ABCDEF"
DEFAULT_VERSION = "3.6.0"
CENT = Decimal("0.01")
_VERSION = re.compile(r"([0-9]+)\.([0-9]+)\.([0-9]+)")

Version = tuple[int, int, int]


def parse_version(text: str) -> Version:
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"version {text!r} is not like 3.6.0")
    major, minor, patch = (int(part) for part in match.groups())
    return major, minor, patch


# What each version has (acg-faka's history, protocols/acg-faka.md section 6).
REQUEST_NO_FROM: Version = (1, 0, 9)
QUERY_FROM: Version = (1, 3, 6)
SHARED_CODE_ITEM_FROM: Version = (1, 3, 9)
NEW_KERNEL_FROM: Version = (3, 0, 0)  # unknown routes answered before authentication; new firewall text
RAW_SIGNATURE_FROM: Version = (3, 1, 3)  # 3.0.0 - 3.1.0 signed the sanitised values
STOCK_FROM: Version = (3, 1, 3)  # stock, draft, item by code, sku add-ons, raw factory_price in items
VALUATION_FROM: Version = (3, 4, 6)
SNAPSHOT_CHECK_FROM: Version = (3, 5, 5)
MANDATORY_CHOICE_FROM: Version = (3, 5, 8)
LEAVE_MESSAGE_FROM: Version = (3, 5, 9)


class ShopRefusal(Exception):
    """The shop's ``JSONException``: answered ``{"code": 0, "msg": message}``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ShopCrash(Exception):
    """Any other PHP error: answered with the HTML page, everything rolled back."""


@dataclass
class ShopConfig:
    """How the sandbox shop behaves; fields may change while it runs."""

    version: str = DEFAULT_VERSION
    shop_name: str = "procurd acg-faka sandbox"
    app_id: int = DEFAULT_APP_ID
    app_key: str = field(default=DEFAULT_APP_KEY, repr=False)
    balance: Decimal = Decimal("1000.00")
    commodities: int = 40
    seed: int = 1
    balance_payment: bool = True  # the payment method "余额" is enabled for goods
    debug: bool = False  # a crash page shows the error (DEBUG on) instead of the shop's 404 page

    @property
    def parsed_version(self) -> Version:
        return parse_version(self.version)


@dataclass
class Member:
    id: int
    app_key: str = field(repr=False)
    balance: Decimal
    banned: bool = False


@dataclass
class Category:
    id: int
    name: str
    sort: int = 0
    pid: int | None = None
    icon: str = ""
    hide: int = 0


@dataclass
class Card:
    id: int
    commodity_id: int
    secret: str = field(repr=False)
    race: str | None = None
    sku: dict[str, str] = field(default_factory=dict)
    sold: bool = False


@dataclass
class Commodity:
    id: int
    code: str
    category_id: int
    name: str
    price: Decimal  # guests
    user_price: Decimal  # members (API buyers are members)
    factory_price: Decimal = Decimal(0)  # the seller's own cost bookkeeping
    config: str = ""  # INI text: [category], [category_wholesale], [wholesale], [sku]
    widgets: list[dict[str, Any]] = field(default_factory=list)
    delivery_way: int = 0  # 0 cards, 1 manual
    delivery_message: str = ""
    # Imported by this shop from another shop ("chained" goods): the id of that docking, None for its own.
    # A trade buys upstream inside its own and answers what the upstream answered (its cards, or its
    # notice), and never refreshes that text; the cards and delivery way stand for the upstream's goods.
    shared_id: int | None = None
    leave_message: str = ""
    stock: int | None = None  # the manual goods' counter
    status: int = 1
    api_status: int = 1
    hide: int = 0
    minimum: int = 0
    maximum: int = 0
    purchase_count: int = 0
    description: str = ""
    cover: str = ""
    tags: list[dict[str, str]] = field(default_factory=list)
    create_time: str = "2026-01-01 00:00:00"

    def sections(self) -> dict[str, Any]:
        """The parsed config; a config the shop cannot parse refuses as the shop does."""
        try:
            return parse_ini(self.config)
        except IniError as exc:
            raise ShopRefusal(f"配置解析异常，{exc}") from None


@dataclass
class Order:
    id: int
    trade_no: str
    owner: int
    commodity_id: int
    amount: Decimal
    num: int
    secret: str = field(repr=False)
    race: str | None = None
    sku: dict[str, str] | None = None
    widget: dict[str, dict[str, str]] | None = None
    request_no: str | None = None
    created_at: float = 0.0
    delivered: bool = True
    status: int = 1

    def to_control(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "trade_no": self.trade_no,
            "owner": self.owner,
            "commodity_id": self.commodity_id,
            "amount": f"{self.amount:.2f}",
            "num": self.num,
            "race": self.race,
            "sku": self.sku,
            "widget": self.widget,
            "request_no": self.request_no,
            "secret": self.secret,
            "delivered": self.delivered,
            "created_at": self.created_at,
        }


def truncated(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, rounding=ROUND_DOWN)


def _tiers(section: Any) -> list[tuple[int, Decimal]]:
    """Wholesale tiers (quantity → unit price), highest quantity first."""
    if not isinstance(section, Mapping):
        return []
    tiers = []
    for quantity, price in section.items():
        try:
            tiers.append((int(quantity), Decimal(str(price))))
        except (ValueError, ArithmeticError):
            continue
    return sorted(tiers, reverse=True)


class Shop:
    """Everything the shop holds, and its rules for prices and stock."""

    def __init__(self, config: ShopConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.members: dict[int, Member] = {
            config.app_id: Member(config.app_id, config.app_key, config.balance)
        }
        self.categories: dict[int, Category] = {}
        self.commodities: dict[int, Commodity] = {}
        self.cards: dict[int, list[Card]] = {}
        self.orders: dict[str, Order] = {}
        self.random = random.Random(config.seed)
        self._next_card = 1
        self._next_order = 1

    @property
    def version(self) -> Version:
        return self.config.parsed_version

    def has(self, since: Version) -> bool:
        return self.version >= since

    # -- lookups ----------------------------------------------------------------------------------------

    def member(self, raw: Any) -> Member | None:
        """The member a posted ``app_id`` names (the primary key lookup)."""
        if not isinstance(raw, str) or not raw.strip().isdigit():
            return None
        return self.members.get(int(raw.strip()))

    def by_code(self, code: str) -> Commodity | None:
        return next((c for c in self.commodities.values() if c.code == code), None)

    def find(self, code: str) -> Commodity:
        commodity = self.by_code(code)
        if commodity is None:
            raise ShopRefusal("商品不存在")
        return commodity

    # -- changes ----------------------------------------------------------------------------------------

    def add_category(self, name: str, *, sort: int = 0, pid: int | None = None, icon: str = "") -> Category:
        category = Category(max(self.categories, default=0) + 1, name, sort, pid, icon)
        self.categories[category.id] = category
        return category

    def add_commodity(self, commodity: Commodity) -> Commodity:
        if self.by_code(commodity.code) is not None:
            raise ValueError(f"code {commodity.code!r} is taken")
        if commodity.category_id not in self.categories:
            raise KeyError(f"category {commodity.category_id}")
        self.commodities[commodity.id] = commodity
        self.cards.setdefault(commodity.id, [])
        return commodity

    def add_cards(
        self,
        commodity: Commodity,
        secrets: list[str],
        race: str | None = None,
        sku: Mapping[str, str] | None = None,
    ) -> list[Card]:
        added = []
        for secret in secrets:
            card = Card(self._next_card, commodity.id, secret, race or None, dict(sku or {}))
            self._next_card += 1
            added.append(card)
        self.cards.setdefault(commodity.id, []).extend(added)
        return added

    def next_commodity_id(self) -> int:
        return max(self.commodities, default=0) + 1

    def new_code(self) -> str:
        while True:
            code = f"{self.random.getrandbits(64):016X}"
            if self.by_code(code) is None:
                return code

    # -- prices -----------------------------------------------------------------------------------------

    def valuation(
        self, commodity: Commodity, num: int, race: str | None, sku: Mapping[Any, Any] | None
    ) -> Decimal:
        """What a member pays for ``num`` units (the shop's own routine; no member levels in the sandbox)."""
        sections = commodity.sections()
        races = sections.get("category") or {}
        price = commodity.user_price
        if race and races:
            if not isinstance(races, Mapping) or race not in races:
                raise ShopRefusal(f"此商品类型不存在[{race}]")
            price = Decimal(str(races[race]))
            for quantity, unit in _tiers((sections.get("category_wholesale") or {}).get(race)):
                if num >= quantity:
                    price = unit
                    break
        else:
            for quantity, unit in _tiers(sections.get("wholesale")):
                if num >= quantity:
                    price = unit
                    break
        groups = sections.get("sku") or {}
        if sku and groups:
            for group, option in sku.items():
                options = groups.get(str(group)) if isinstance(groups, Mapping) else None
                if not isinstance(options, Mapping):
                    raise ShopRefusal(f"此SKU不存在[{group}]")
                if not isinstance(option, str) or option not in options:
                    raise ShopRefusal(f"此SKU不存在[{option}]")
                add_on = options[option] or "0"
                try:
                    amount = Decimal(str(add_on))
                except ArithmeticError:
                    amount = Decimal(0)
                if amount > 0:
                    price += amount
        return truncated(truncated(price) * num)

    def unit_cost(self, commodity: Commodity, race: str | None = None) -> Decimal:
        """The member's cost of one unit as older versions report it (no add-ons)."""
        return self.valuation(commodity, 1, race, None)

    def races(self, commodity: Commodity) -> dict[str, Any]:
        races = commodity.sections().get("category") or {}
        return dict(races) if isinstance(races, Mapping) else {}

    def groups(self, commodity: Commodity) -> dict[str, dict[str, Any]]:
        groups = commodity.sections().get("sku") or {}
        if not isinstance(groups, Mapping):
            return {}
        return {str(name): dict(options) for name, options in groups.items() if isinstance(options, Mapping)}

    # -- stock ------------------------------------------------------------------------------------------

    def matching_cards(
        self,
        commodity: Commodity,
        race: str | None,
        sku: Mapping[Any, Any] | None,
        *,
        strict_race: bool = False,
    ) -> list[Card]:
        """Unsold cards of the race (any race when none is given, unless ``strict_race``: then race-less
        cards only) that carry every add-on option asked for."""
        cards = []
        for card in self.cards.get(commodity.id, []):
            if card.sold:
                continue
            if race and card.race != race:
                continue
            if not race and strict_race and card.race is not None:
                continue
            if sku and any(card.sku.get(str(group)) != option for group, option in sku.items()):
                continue
            cards.append(card)
        return cards

    def stock_text(self, commodity: Commodity, race: str | None, sku: Mapping[Any, Any] | None) -> str:
        """The ``stock`` endpoint's string: unsold matching cards, or the manual counter ("" for none)."""
        if commodity.delivery_way == 0:
            return str(len(self.matching_cards(commodity, race, sku)))
        return "" if commodity.stock is None else str(commodity.stock)

    def listed_stock(self, commodity: Commodity) -> int | None:
        """``items``' and ``item``'s stock: the live card count (3.1.3 on) or the stored counter."""
        if commodity.delivery_way == 0:
            return len(self.matching_cards(commodity, None, None)) if self.has(STOCK_FROM) else 0
        return commodity.stock

    # -- orders -----------------------------------------------------------------------------------------

    def trade_no(self) -> str:
        """18 digits: 3 random, the time as yymmddHHMMSS (Asia/Shanghai), 3 random."""
        moment = datetime.fromtimestamp(self.clock(), SHANGHAI).strftime("%y%m%d%H%M%S")
        while True:
            number = f"{self.random.randrange(1000):03d}{moment}{self.random.randrange(1000):03d}"
            if number not in self.orders:
                return number

    def request_no_taken(self, request_no: str) -> bool:
        """Whether an order holds this request number (MySQL's utf8mb4_general_ci: case and trailing
        spaces do not count)."""
        wanted = request_no.rstrip(" ").casefold()
        return any(
            order.request_no is not None and order.request_no.rstrip(" ").casefold() == wanted
            for order in self.orders.values()
        )

    def add_order(self, order: Order) -> Order:
        order.id = self._next_order
        self._next_order += 1
        self.orders[order.trade_no] = order
        return order

    def orders_of(self, member: int, commodity: int) -> int:
        return sum(1 for o in self.orders.values() if o.owner == member and o.commodity_id == commodity)

    def deliver(self, trade_no: str, secret: str) -> Order:
        """The seller types the goods of a manual order in: its secret is replaced."""
        order = self.orders[trade_no]
        order.secret = secret
        order.delivered = True
        return order
