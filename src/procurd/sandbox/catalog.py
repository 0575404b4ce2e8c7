"""The sandbox's catalogue: categories, products and SKUs (seed 000, 2.1 to 2.3) and their seeded generator.

Products cache their serialized JSON; assigning any public field of a product or of one of its SKUs drops
that cache (and bumps ``updated_at``), so tests may edit the dataclasses directly.

Generated products were last updated one minute apart in id order, from ``GENERATED_UPDATES_FROM`` on, all
long before the sandbox runs: product ``n`` is updated at ``GENERATED_UPDATES_FROM + 60 * n``. A change made
while the sandbox runs stamps the product with the site's clock, to the microsecond.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from procurd.protocol.web import dump_json

SITE_TIMEZONE = timezone(timedelta(hours=8))
CENT = Decimal("0.01")
LOW_STOCK_MAX = 20
UNLIMITED = -1
CATALOGUE_EPOCH = 1748736000  # 2025-06-01T00:00:00Z: generated created_at values start here
GENERATED_UPDATES_FROM = CATALOGUE_EPOCH + 183 * 86400  # 2025-12-01T00:00:00Z, after every created_at


def iso_time(unix_seconds: float) -> str:
    """ISO 8601 to the second with the site's +08:00 offset, like a Dujiao-Next site in China answers."""
    return datetime.fromtimestamp(unix_seconds, SITE_TIMEZONE).isoformat(timespec="seconds")


def precise_iso_time(unix_seconds: float) -> str:
    """Like :func:`iso_time`, with microseconds unless they are zero."""
    return datetime.fromtimestamp(unix_seconds, SITE_TIMEZONE).isoformat()


def parse_instant(text: str) -> datetime | None:
    """An ISO 8601 / RFC 3339 timestamp with a time zone (``Z`` or an offset); None for anything else."""
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        return None
    return instant if instant.tzinfo is not None else None


def money_text(value: Decimal) -> str:
    """A decimal amount as a string with at least two decimal places, never through float."""
    exponent = value.as_tuple().exponent
    if isinstance(exponent, int) and exponent > -2:
        value = value.quantize(CENT)
    return format(value, "f")


def cents_text(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def stock_status(quantity: int) -> str:
    """Seed 000, 2.3: unlimited at -1, in_stock above 20, low_stock 1 to 20, out_of_stock at 0."""
    if quantity == UNLIMITED:
        return "unlimited"
    if quantity > LOW_STOCK_MAX:
        return "in_stock"
    if quantity > 0:
        return "low_stock"
    return "out_of_stock"


@dataclass(eq=False)
class Category:
    id: int
    parent_id: int
    slug: str
    name: dict[str, str]
    icon: str
    sort_order: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parent_id": self.parent_id,
            "slug": self.slug,
            "name": self.name,
            "icon": self.icon,
            "sort_order": self.sort_order,
        }


@dataclass(eq=False)
class SKU:
    id: int
    product_id: int
    sku_code: str
    spec_values: dict[str, str]
    price_amount: str
    stock_quantity: int
    is_active: bool = True
    original_price: str | None = None
    member_price: str | None = None
    wholesale_prices: list[dict[str, Any]] | None = None
    _product: Product | None = field(default=None, init=False, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name[0] != "_":
            product = self.__dict__.get("_product")
            if product is not None:
                product.changed()

    @property
    def stock_status(self) -> str:
        return stock_status(self.stock_quantity)

    @property
    def unit_price(self) -> Decimal:
        """What one unit costs the API user: the member price when there is one, else price_amount."""
        return Decimal(self.member_price if self.member_price is not None else self.price_amount)

    def in_stock(self, quantity: int = 1) -> bool:
        return self.stock_quantity == UNLIMITED or self.stock_quantity >= quantity

    def charged_price(self, quantity: int) -> Decimal:
        """What one unit costs the API user in an order of ``quantity`` on a site that sells wholesale
        (Dujiao-Next since 2026): the cheaper of :attr:`unit_price` and the best tier whose
        ``min_quantity`` the quantity reaches."""
        price = self.unit_price
        for tier in self.wholesale_prices or ():
            if quantity >= int(tier.get("min_quantity", 0)):
                price = min(price, Decimal(str(tier["unit_price"])))
        return price

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "sku_code": self.sku_code,
            "spec_values": self.spec_values,
            "price_amount": self.price_amount,
        }
        if self.member_price is not None:
            data["original_price"] = self.original_price or self.price_amount
            data["member_price"] = self.member_price
        data["stock_status"] = self.stock_status
        data["stock_quantity"] = self.stock_quantity
        data["is_active"] = self.is_active
        if self.wholesale_prices is not None:
            data["wholesale_prices"] = self.wholesale_prices
        return data


@dataclass(eq=False)
class Product:
    id: int
    slug: str
    title: dict[str, str]
    description: dict[str, str]
    content: dict[str, str]
    seo_meta: dict[str, Any]
    images: list[str]
    tags: list[str]
    fulfillment_type: str
    manual_form_schema: dict[str, Any] | None
    is_active: bool
    category_id: int
    created_at: str
    updated_at: str
    skus: list[SKU] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # fields real sites add beyond the seed
    # Purchase limits of an order (Dujiao-Next's; not in any listing): None = no limit.
    min_purchase_quantity: int | None = None
    max_purchase_quantity: int | None = None
    _listing_json: bytes | None = field(default=None, init=False, repr=False)
    _detail_json: bytes | None = field(default=None, init=False, repr=False)
    _on_change: Callable[[Product], None] | None = field(default=None, init=False, repr=False)
    _updated: tuple[str, datetime] | None = field(default=None, init=False, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name[0] == "_" or "_on_change" not in self.__dict__:
            return
        if name == "updated_at":  # set by hand: shown as given
            self._drop_json()
        else:
            self.changed()

    def _drop_json(self) -> None:
        object.__setattr__(self, "_listing_json", None)
        object.__setattr__(self, "_detail_json", None)

    def changed(self) -> None:
        """Drop the cached JSON and tell the owner (which bumps ``updated_at`` and the listing)."""
        self._drop_json()
        if self._on_change is not None:
            self._on_change(self)

    def attach(self, on_change: Callable[[Product], None] | None) -> None:
        for sku in self.skus:
            object.__setattr__(sku, "_product", self)
        object.__setattr__(self, "_on_change", on_change)

    @property
    def is_manual(self) -> bool:
        return self.fulfillment_type == "manual"

    def updated_instant(self) -> datetime:
        """``updated_at`` as an aware datetime (parsed once per value)."""
        if self._updated is None or self._updated[0] != self.updated_at:
            instant = parse_instant(self.updated_at)
            if instant is None:
                raise ValueError(
                    f"product {self.id} has an updated_at without a time zone: {self.updated_at!r}"
                )
            object.__setattr__(self, "_updated", (self.updated_at, instant))
        assert self._updated is not None
        return self._updated[1]

    def price_source(self) -> SKU | None:
        """The SKU whose price the product shows: the cheapest active one (any one if none is active)."""
        pool = [sku for sku in self.skus if sku.is_active] or self.skus
        return min(pool, key=lambda sku: Decimal(sku.price_amount)) if pool else None

    def to_dict(self, *, include_inactive_skus: bool) -> dict[str, Any]:
        skus = self.skus if include_inactive_skus else [sku for sku in self.skus if sku.is_active]
        cheapest = self.price_source()
        data: dict[str, Any] = {
            "id": self.id,
            "slug": self.slug,
            "title": self.title,
            "description": self.description,
            "content": self.content,
            "seo_meta": self.seo_meta,
            "images": self.images,
            "tags": self.tags,
            "price_amount": cheapest.price_amount if cheapest is not None else "0.00",
        }
        if cheapest is not None and cheapest.member_price is not None:
            data["original_price"] = cheapest.original_price or cheapest.price_amount
            data["member_price"] = cheapest.member_price
        data.update(
            {
                "fulfillment_type": self.fulfillment_type,
                "manual_form_schema": self.manual_form_schema,
                "is_active": self.is_active,
                "category_id": self.category_id,
                "skus": [sku.to_dict() for sku in skus],
                "created_at": self.created_at,
                "updated_at": self.updated_at,
            }
        )
        data.update(self.extra)
        return data

    def listing_json(self) -> bytes:
        """The product as GET /products lists it (inactive SKUs left out), serialized once."""
        if self._listing_json is None:
            object.__setattr__(self, "_listing_json", dump_json(self.to_dict(include_inactive_skus=False)))
        assert self._listing_json is not None
        return self._listing_json

    def detail_json(self) -> bytes:
        """The product as GET /products/:id answers it (every SKU with its is_active), serialized once."""
        if self._detail_json is None:
            object.__setattr__(self, "_detail_json", dump_json(self.to_dict(include_inactive_skus=True)))
        assert self._detail_json is not None
        return self._detail_json


@dataclass
class Catalogue:
    categories: dict[int, Category]
    products: dict[int, Product]
    skus: dict[int, SKU]


_CATEGORY_TREE: tuple[tuple[str, str, str, tuple[tuple[str, str, str], ...]], ...] = (
    (
        "game-cards",
        "游戏点卡",
        "Game cards",
        (
            ("pc-games", "电脑游戏", "PC games"),
            ("console-games", "主机游戏", "Console games"),
            ("mobile-games", "手机游戏", "Mobile games"),
            ("game-currency", "游戏币", "In-game currency"),
        ),
    ),
    (
        "streaming",
        "影音会员",
        "Streaming",
        (
            ("video", "视频会员", "Video"),
            ("music", "音乐会员", "Music"),
            ("audiobooks", "有声书", "Audiobooks"),
        ),
    ),
    (
        "software",
        "软件授权",
        "Software",
        (
            ("office", "办公软件", "Office"),
            ("security", "安全软件", "Security"),
            ("design", "设计工具", "Design tools"),
            ("dev-tools", "开发工具", "Developer tools"),
        ),
    ),
    (
        "gift-cards",
        "礼品卡",
        "Gift cards",
        (("shopping", "购物卡", "Shopping"), ("dining", "餐饮卡", "Dining"), ("travel", "出行卡", "Travel")),
    ),
    (
        "cloud",
        "云服务",
        "Cloud services",
        (
            ("vps", "云服务器", "Virtual servers"),
            ("storage", "云存储", "Storage"),
            ("domains", "域名", "Domains"),
        ),
    ),
    ("other", "其他", "Other", ()),  # a top-level category without children is a leaf and holds products
)

_BRANDS = (
    ("Nova", "新星"),
    ("Apex", "巅峰"),
    ("Lumen", "流明"),
    ("Orbit", "轨道"),
    ("Zephyr", "西风"),
    ("Atlas", "擎天"),
    ("Pixel", "像素"),
    ("Quartz", "石英"),
    ("Vertex", "顶点"),
    ("Harbor", "港湾"),
    ("Ember", "余烬"),
    ("Cobalt", "钴蓝"),
)
_NOUNS = (("Card", "卡"), ("Pass", "通行证"), ("Key", "激活码"), ("Plan", "套餐"), ("Voucher", "兑换券"))
_SPEC_AXES = (
    ("denomination", ("50", "100", "200", "500", "1000")),
    ("duration", ("1 month", "3 months", "12 months", "24 months", "36 months")),
    ("edition", ("Standard", "Pro", "Ultimate", "Team", "Enterprise")),
    ("region", ("Global", "Asia", "Europe", "Americas", "Oceania")),
)
_TAGS = ("hot", "new", "instant", "official", "discount", "limited", "bestseller")
_IMAGE_ROOT = "https://cdn.sandbox.example/products"
_ICON_ROOT = "https://cdn.sandbox.example/icons"


def _manual_form_schema() -> dict[str, Any]:
    return {
        "fields": [
            {
                "key": "account",
                "type": "text",
                "required": True,
                "label": {"zh-CN": "充值账号", "en-US": "Account"},
            },
            {
                "key": "note",
                "type": "textarea",
                "required": False,
                "label": {"zh-CN": "备注", "en-US": "Note"},
            },
        ]
    }


def generate_categories() -> tuple[dict[int, Category], list[Category]]:
    """The fixed two-level category tree and its leaves (the only categories that hold products)."""
    categories: dict[int, Category] = {}
    leaves: list[Category] = []
    next_id = 1
    for top_index, (slug, zh, en, children) in enumerate(_CATEGORY_TREE):
        top = Category(next_id, 0, slug, {"zh-CN": zh, "en-US": en}, "", 100 - top_index * 10)
        if children:
            top.icon = f"{_ICON_ROOT}/{slug}.png"
        categories[top.id] = top
        next_id += 1
        if not children:
            leaves.append(top)
        for child_index, (child_slug, child_zh, child_en) in enumerate(children):
            child = Category(
                next_id,
                top.id,
                child_slug,
                {"zh-CN": child_zh, "en-US": child_en},
                f"{_ICON_ROOT}/{child_slug}.png",
                50 - child_index,
            )
            categories[child.id] = child
            leaves.append(child)
            next_id += 1
    return categories, leaves


def _stock_quantity(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.3:
        return UNLIMITED
    if roll < 0.7:
        return rng.randint(LOW_STOCK_MAX + 1, 999)
    if roll < 0.9:
        return rng.randint(1, LOW_STOCK_MAX)
    return 0


def _generate_skus(
    rng: random.Random, product_id: int, first_sku_id: int, count: int, discounted: bool
) -> list[SKU]:
    axis_name, axis_values = _SPEC_AXES[rng.randrange(len(_SPEC_AXES))]
    base_cents = rng.randint(99, 49900)
    skus = []
    for index in range(count):
        cents = base_cents * (index + 1) - rng.randint(0, base_cents // 10) * index
        value = axis_values[index] if index < len(axis_values) else f"option {index + 1}"
        sku = SKU(
            id=first_sku_id + index,
            product_id=product_id,
            sku_code=f"P{product_id:05d}-{index + 1}",
            spec_values={axis_name: value},
            price_amount=cents_text(cents),
            stock_quantity=_stock_quantity(rng),
            is_active=index == 0 or rng.random() >= 0.06,
        )
        if discounted:
            member_cents = (cents * 9 + 5) // 10
            sku.original_price = cents_text(cents)
            sku.member_price = sku.price_amount = cents_text(member_cents)
        if rng.random() < 0.15:
            sku.wholesale_prices = [
                {"min_quantity": 10, "unit_price": cents_text(cents * 95 // 100)},
                {"min_quantity": 50, "unit_price": cents_text(cents * 90 // 100)},
            ]
        skus.append(sku)
    return skus


def _generate_product(
    rng: random.Random, product_id: int, leaf: Category, manual: bool, active: bool, skus: list[SKU]
) -> Product:
    brand_en, brand_zh = _BRANDS[rng.randrange(len(_BRANDS))]
    noun_en, noun_zh = _NOUNS[rng.randrange(len(_NOUNS))]
    title_en = f"{brand_en} {leaf.name['en-US']} {noun_en}"
    title_zh = f"{brand_zh}{leaf.name['zh-CN']}{noun_zh}"
    delivery_en = "filled by hand after you order" if manual else "delivered instantly"
    delivery_zh = "下单后人工处理" if manual else "自动发货"
    description = {"zh-CN": f"{title_zh}，{delivery_zh}。", "en-US": f"{title_en}, {delivery_en}."}
    tags = rng.sample(_TAGS, rng.randint(0, 3))
    created = CATALOGUE_EPOCH + rng.randint(0, 180 * 86400)
    images = [f"{_IMAGE_ROOT}/{product_id}/cover.jpg"]
    if rng.random() < 0.5:
        images.append(f"{_IMAGE_ROOT}/{product_id}/detail-1.jpg")
    extra: dict[str, Any] = {"sales_count": rng.randint(0, 5000)}
    if manual:
        extra["purchase_notice"] = {"zh-CN": "请填写正确的账号。", "en-US": "Enter the account exactly."}
    return Product(
        id=product_id,
        slug=f"{brand_en.lower()}-{leaf.slug}-{noun_en.lower()}-{product_id}",
        title={"zh-CN": title_zh, "en-US": title_en},
        description=description,
        content={
            "zh-CN": f"<h2>{title_zh}</h2><p>{description['zh-CN']}</p>",
            "en-US": f"<h2>{title_en}</h2><p>{description['en-US']}</p>",
        },
        seo_meta={"title": title_en, "keywords": ",".join(tags), "description": description["en-US"]},
        images=images,
        tags=tags,
        fulfillment_type="manual" if manual else "auto",
        manual_form_schema=_manual_form_schema() if manual else None,
        is_active=active,
        category_id=leaf.id,
        created_at=iso_time(created),
        updated_at=iso_time(GENERATED_UPDATES_FROM + 60 * product_id),
        skus=skus,
        extra=extra,
    )


def is_manual_position(index: int, ratio: float) -> bool:
    """Spread manual products evenly: exactly floor(n * ratio) of the first n products are manual."""
    return math.floor((index + 1) * ratio + 1e-9) > math.floor(index * ratio + 1e-9)


def generate_catalogue(
    *,
    seed: int,
    products: int,
    skus_per_product: int,
    manual_ratio: float,
    inactive_products: int = 0,
) -> Catalogue:
    """The same arguments always give the same catalogue. Ids start at 1 and are dense."""
    rng = random.Random(seed)
    categories, leaves = generate_categories()
    product_map: dict[int, Product] = {}
    sku_map: dict[int, SKU] = {}
    next_sku_id = 1
    for index in range(products + inactive_products):
        product_id = index + 1
        discounted = rng.random() < 0.2
        skus = _generate_skus(rng, product_id, next_sku_id, skus_per_product, discounted)
        next_sku_id += len(skus)
        leaf = leaves[rng.randrange(len(leaves))]
        manual = is_manual_position(index, manual_ratio)
        product = _generate_product(rng, product_id, leaf, manual, index < products, skus)
        product_map[product_id] = product
        for sku in skus:
            sku_map[sku.id] = sku
    return Catalogue(categories, product_map, sku_map)
