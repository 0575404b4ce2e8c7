"""acg-faka's goods as procurd's mirror holds goods (seed 000's Category, Product and SKU), without I/O.

One product per commodity; one SKU per orderable choice: a variant (``race``, from the ``[category]``
section of the commodity's config) with one option of each add-on group (``[sku]``, ``group.option =
amount``), or the commodity alone when it has neither. acg-faka has no id for such a choice, so a SKU here is
named by its **choice key**: the commodity's code, the variant and the options sorted by group (JSON text);
procurd's own SKU ids are assigned to choice keys later, by the store.

A SKU's ``price_amount`` is what the member account is charged for one: the supplier's ``valuation`` where its
version has it, else its older cost fields (:func:`fallback_unit_cost`). Its stock is read as
:func:`~procurd.protocol.acgfaka.envelope.read_stock` says. A commodity the API cannot buy (a config or buyer
input the supplier itself would trip on, too many choices) is a :class:`Problem` of that commodity alone.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from enum import Enum
from typing import Any
from urllib.parse import urljoin

from procurd.protocol.acgfaka.envelope import (
    StockReading,
    decimal_value,
    integer_value,
    money_text,
    read_stock,
)
from procurd.protocol.acgfaka.ini import IniError, IniValue, parse_ini
from procurd.protocol.acgfaka.signing import check_field_name
from procurd.protocol.acgfaka.widgets import Widget, WidgetError, form_schema, input_errors, read_widgets

LOCALE = "zh-CN"
SHANGHAI = timezone(timedelta(hours=8))
MAX_CHOICES = 100
MAX_SKU_CODE = 255  # the mirror's column; a longer choice key is named by its digest there
RACE_SPEC = "商品类型"  # how spec_values names the variant (acg-faka's own word for it)
# Characters the supplier trims or HTML-escapes in what a buyer sends: a name holding them is not found.
_ALTERED = frozenset("<>&\"'")
_TRIMMED = " \t\n\r\x00\x0b"
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")


class GoodsError(ValueError):
    """A commodity (or one of its choices) procurd cannot offer; the text says why."""


class PriceSource(Enum):
    """Where a version's cost for the member account comes from."""

    VALUATION = "valuation"  # 3.4.6 on: the supplier prices the exact choice
    INVENTORY = "inventory"  # 3.1.3 - 3.4.5: inventory's factory_price / [category_factory], plus add-ons
    ITEMS = "items"  # 0.9.2 - 3.1.0: items' factory_price / [category_factory]


@dataclass(frozen=True, slots=True)
class Problem:
    code: str
    commodity_id: int | None
    reason: str
    choice_key: str | None = None


@dataclass(frozen=True, slots=True)
class Choice:
    """One orderable choice: the commodity, a variant or none, one option per add-on group (config order)."""

    code: str
    race: str | None
    options: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return choice_key(self.code, self.race, self.options)

    @property
    def sku(self) -> dict[str, str]:
        """The ``sku[<group>]`` fields of a request, in config order."""
        return dict(self.options)

    def spec_values(self) -> dict[str, str]:
        values = {RACE_SPEC: self.race} if self.race is not None else {}
        for group, option in self.options:
            values[group if group not in values else f"{group} (sku)"] = option
        return values


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def choice_key(code: str, race: str | None, options: Sequence[tuple[str, str]] = ()) -> str:
    """The stable name of a choice: ``["CODE","race",[["group","option"],...]]`` with the options sorted."""
    pairs = sorted([group, option] for group, option in options)
    return json.dumps([code, race or "", pairs], ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class GoodsConfig:
    """The priced parts of a commodity's config (amounts exact; names in config order)."""

    races: dict[str, Decimal] = field(default_factory=dict)
    groups: dict[str, dict[str, Decimal]] = field(default_factory=dict)
    race_factory: dict[str, Decimal] = field(default_factory=dict)  # [category_factory]: the caller's cost


def _section(sections: Mapping[str, Any], name: str) -> dict[str, Any]:
    value = sections.get(name)
    if value is None or value == "" or value == []:
        return {}
    if isinstance(value, list):  # a section keyed 0..n-1 arrives from item as a JSON list
        return {str(index): item for index, item in enumerate(value)}
    if not isinstance(value, Mapping):
        raise GoodsError(f"config [{name}] is not a section")
    return {str(key): item for key, item in value.items()}


def _price(value: Any, where: str, *, empty_is_zero: bool = False) -> Decimal:
    if empty_is_zero and value in ("", None):
        return Decimal(0)
    try:
        amount = decimal_value(value, where)
    except ValueError:
        raise GoodsError(f"config {where} = {value!r} is not an amount") from None
    if amount < 0:
        raise GoodsError(f"config {where} = {value!r} is negative")
    return amount


def read_config(raw: Any) -> GoodsConfig:
    """The variants, add-on groups and cost fields of a config, given as INI text (``items``) or as the
    parsed object (``item``)."""
    if raw is None or raw == "":
        return GoodsConfig()
    if isinstance(raw, str):
        try:
            sections: Mapping[str, Any] = parse_ini(raw)
        except IniError as exc:
            raise GoodsError(f"config: {exc}") from None
    elif isinstance(raw, Mapping):
        sections = raw
    elif isinstance(raw, list) and not raw:
        return GoodsConfig()
    else:
        raise GoodsError("config is neither INI text nor an object")
    races = {
        name: _price(value, f"[category] {name}") for name, value in _section(sections, "category").items()
    }
    factory = {
        name: _price(value, f"[category_factory] {name}")
        for name, value in _section(sections, "category_factory").items()
    }
    groups: dict[str, dict[str, Decimal]] = {}
    for group, options in _section(sections, "sku").items():
        if not isinstance(options, Mapping):
            raise GoodsError(f"config [sku] {group} has no options (expected {group}.<option>=<amount>)")
        groups[group] = {
            str(option): _add_on(amount, f"[sku] {group}.{option}") for option, amount in options.items()
        }
    return GoodsConfig(races, groups, factory)


def _add_on(value: IniValue | Any, where: str) -> Decimal:
    if isinstance(value, Mapping | list):
        raise GoodsError(f"config {where} nests deeper than group.option")
    return _price(value, where, empty_is_zero=True)


def _altered(name: str) -> bool:
    return name != name.strip(_TRIMMED) or any(character in _ALTERED for character in name)


@dataclass(frozen=True, slots=True)
class Commodity:
    """What procurd reads of one commodity object (``items`` child or ``item`` answer)."""

    id: int
    code: str
    category_id: int
    name: str
    description: str
    cover: str
    delivery_way: int
    chained: bool  # imported by the supplier from a shop of its own (shared_id set)
    status: int
    config: GoodsConfig
    widgets: tuple[Widget, ...]
    stock: StockReading
    factory_price: Decimal | None
    price: Decimal | None
    user_price: Decimal | None
    minimum: int = 0
    maximum: int = 0
    tags: tuple[str, ...] = ()
    created_at: str | None = None
    hidden: bool = False
    api_listed: bool = True

    @property
    def manual(self) -> bool:
        """Goods the supplier delivers later, or not through its cards: manual, plugin or chained goods."""
        return self.delivery_way != 0 or self.chained

    @property
    def input_errors(self) -> frozenset[str]:
        return input_errors(self.widgets)

    def choices(self, max_choices: int = MAX_CHOICES, *, add_ons: bool = True) -> list[Choice]:
        """Every orderable choice, in config order; :class:`GoodsError` beyond ``max_choices``. Without
        ``add_ons`` (versions before 3.1.3 have none) the variants alone."""
        races: list[str | None] = list(self.config.races) or [None]
        configured = self.config.groups.items() if add_ons else ()
        groups = [[(group, option) for option in options] for group, options in configured]
        count = len(races)
        for options in groups:
            count *= len(options)
        if count > max_choices:
            raise GoodsError(f"{count} combinations of variants and add-ons, more than {max_choices}")
        return [
            Choice(self.code, race, tuple(combination))
            for race in races
            for combination in itertools.product(*groups)
        ]

    def choice_problem(self, choice: Choice) -> str | None:
        """Why a choice cannot be ordered reliably through the API, or ``None``."""
        if choice.race is not None and _altered(choice.race):
            return f"the variant {choice.race!r} holds characters the supplier alters in what a buyer sends"
        for group, option in choice.options:
            problem = check_field_name(group, nested=True)
            if problem is not None:
                return f"the add-on group {group!r}: {problem}"
            if _altered(group) or _altered(option):
                return f"the add-on {group!r}: {option!r} holds characters the supplier alters"
        return None


def _optional_amount(raw: Mapping[str, Any], key: str) -> Decimal | None:
    value = raw.get(key)
    if value is None:
        return None
    try:
        return decimal_value(value, key)
    except ValueError:
        return None


def _tags(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw else []
        except (ValueError, RecursionError):
            return ()
    if not isinstance(raw, list):
        return ()
    texts = [tag.get("text") if isinstance(tag, Mapping) else tag for tag in raw]
    return tuple(text for text in texts if isinstance(text, str) and text)


def shanghai_time(text: Any) -> str | None:
    """An acg-faka timestamp (``Y-m-d H:i:s``, Asia/Shanghai) as ISO 8601 with its offset."""
    if not isinstance(text, str) or not _TIMESTAMP.fullmatch(text):
        return None
    try:
        moment = datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=SHANGHAI)
    except ValueError:
        return None
    return moment.isoformat()


def read_commodity(raw: Any) -> Commodity:
    """One commodity object; :class:`GoodsError` names what makes it unusable."""
    if not isinstance(raw, Mapping):
        raise GoodsError("a commodity is not an object")
    try:
        identity = integer_value(raw.get("id"), "id")
        category = integer_value(raw.get("category_id"), "category_id")
        delivery_way = integer_value(raw.get("delivery_way", 0), "delivery_way")
        status = integer_value(raw.get("status", 1), "status")
        minimum = integer_value(raw.get("minimum") or 0, "minimum")
        maximum = integer_value(raw.get("maximum") or 0, "maximum")
        stock = read_stock(raw.get("stock"))
    except ValueError as exc:
        raise GoodsError(str(exc)) from None
    code = raw.get("code")
    if not isinstance(code, str) or not code:
        raise GoodsError("the commodity has no docking code")
    try:
        widgets = read_widgets(raw.get("widget"))
    except WidgetError as exc:
        raise GoodsError(str(exc)) from None
    name, description, cover = (raw.get(key) for key in ("name", "description", "cover"))
    return Commodity(
        id=identity,
        code=code,
        category_id=category,
        name=name if isinstance(name, str) else code,
        description=description if isinstance(description, str) else "",
        cover=cover if isinstance(cover, str) else "",
        delivery_way=delivery_way,
        chained=raw.get("shared_id") not in (None, 0, "", "0"),
        status=status,
        config=read_config(raw.get("config")),
        widgets=widgets,
        stock=stock,
        factory_price=_optional_amount(raw, "factory_price"),
        price=_optional_amount(raw, "price"),
        user_price=_optional_amount(raw, "user_price"),
        minimum=max(minimum, 0),
        maximum=max(maximum, 0),
        tags=_tags(raw.get("tags")),
        created_at=shanghai_time(raw.get("create_time")),
        hidden=raw.get("hide") in (1, "1"),
        api_listed=raw.get("api_status", 1) in (1, "1"),
    )


# -- the listing ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class Listing:
    """What ``items`` lists: the categories as seed 000's Category, the commodities, and the problems."""

    categories: list[dict[str, Any]] = field(default_factory=list)
    commodities: list[Commodity] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def category_record(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An acg-faka category (flat, ``pid`` its parent) as seed 000's Category."""
    identity = integer_value(raw.get("id"), "category id")
    parent = raw.get("pid")
    icon, name = raw.get("icon"), raw.get("name")
    return {
        "id": identity,
        "parent_id": integer_value(parent, "pid") if parent not in (None, "") else 0,
        "slug": str(identity),
        "name": {LOCALE: name if isinstance(name, str) else str(identity)},
        "icon": icon if isinstance(icon, str) else "",
        "sort_order": integer_value(raw.get("sort") or 0, "sort"),
    }


def read_listing(data: Any) -> Listing:
    """The ``items`` answer (categories, each with its commodities as ``children``); a category or
    commodity that cannot be read is a problem, the rest is read."""
    listing = Listing()
    if not isinstance(data, list):
        raise GoodsError("items did not answer a list of categories")
    for entry in data:
        if not isinstance(entry, Mapping):
            listing.problems.append(Problem("bad_category", None, "a category is not an object"))
            continue
        try:
            listing.categories.append(category_record(entry))
        except ValueError as exc:
            listing.problems.append(Problem("bad_category", None, str(exc)))
            continue
        children = entry.get("children")
        for child in children if isinstance(children, list) else []:
            code = child.get("code") if isinstance(child, Mapping) else None
            try:
                listing.commodities.append(read_commodity(child))
            except GoodsError as exc:
                identity = child.get("id") if isinstance(child, Mapping) else None
                reason = f"{code}: {exc}" if isinstance(code, str) else str(exc)
                listing.problems.append(
                    Problem("bad_commodity", identity if isinstance(identity, int) else None, reason)
                )
    return listing


# -- prices and records ---------------------------------------------------------------------------------


def fallback_unit_cost(
    commodity: Commodity,
    choice: Choice,
    source: PriceSource,
    inventory: Mapping[str, Any] | None = None,
) -> Decimal:
    """What one unit of ``choice`` costs the member account on a supplier without ``valuation``.

    ``ITEMS`` (0.9.2 - 3.1.0): the listing's ``factory_price``, or the variant's ``[category_factory]``.
    ``INVENTORY`` (3.1.3 - 3.4.5): the same fields of the commodity's ``inventory`` answer, plus the add-ons'
    amounts (the supplier adds those per unit). Amounts are truncated to cents by the supplier already.
    """
    if source is PriceSource.VALUATION:
        raise GoodsError("a supplier with valuation is asked, not computed")
    if source is PriceSource.ITEMS:
        factory, base = commodity.config.race_factory, commodity.factory_price
    else:
        if inventory is None:
            raise GoodsError("no inventory answer to price it from")
        try:
            factory = read_config(inventory.get("config")).race_factory
            base = decimal_value(inventory.get("factory_price"), "inventory factory_price")
        except ValueError as exc:
            raise GoodsError(str(exc)) from None
    if choice.race is not None:
        if choice.race not in factory:
            raise GoodsError(f"no cost for the variant {choice.race!r} ([category_factory])")
        unit = factory[choice.race]
    elif base is None:
        raise GoodsError("no factory_price")
    else:
        unit = base
    if source is PriceSource.INVENTORY:
        unit += sum((commodity.config.groups[group][option] for group, option in choice.options), Decimal(0))
    return unit


def sku_record(
    choice: Choice, unit_price: Decimal, stock: StockReading, *, source: PriceSource, stock_exact: bool = True
) -> dict[str, Any]:
    """One choice as seed 000's SKU (without ``id``: procurd assigns it to the choice key)."""
    record: dict[str, Any] = {
        "sku_code": choice.key if len(choice.key) <= MAX_SKU_CODE else f"{choice.code}#{_digest(choice.key)}",
        "spec_values": choice.spec_values(),
        "price_amount": money_text(unit_price),
        "stock_status": stock.status,
        "stock_quantity": stock.quantity,
        "is_active": True,
        "choice_key": choice.key,
        "race": choice.race,
        "options": [[group, option] for group, option in choice.options],
        "price_source": source.value,
    }
    if stock.text is not None:
        record["stock_text"] = stock.text
    if not stock_exact:
        record["stock_exact"] = False
    return record


@dataclass(frozen=True, slots=True)
class Goods:
    product: dict[str, Any] | None  # None when not one choice could be offered
    problems: tuple[Problem, ...] = ()


def goods_of(
    commodity: Commodity,
    *,
    prices: Mapping[str, Decimal],
    stocks: Mapping[str, StockReading] | None = None,
    source: PriceSource = PriceSource.VALUATION,
    base_url: str = "",
    max_choices: int = MAX_CHOICES,
) -> Goods:
    """The product of ``commodity`` with one SKU per choice that has a price in ``prices`` (by choice key,
    for one unit). A choice's stock is ``stocks[key]``, else the commodity's own figure (exact only when it
    has one choice). Choices left out are problems. A version that prices from ``items`` (before 3.1.3)
    has no add-ons: its choices are the variants alone."""
    problems: list[Problem] = []
    try:
        choices = commodity.choices(max_choices, add_ons=source is not PriceSource.ITEMS)
    except GoodsError as exc:
        return Goods(None, (Problem("too_many_choices", commodity.id, f"{commodity.code}: {exc}"),))
    skus = []
    for choice in choices:
        problem = commodity.choice_problem(choice)
        if problem is None and choice.key not in prices:
            problem = "no price for it"
        if problem is not None:
            problems.append(Problem("choice_unavailable", commodity.id, problem, choice.key))
            continue
        reading = (stocks or {}).get(choice.key)
        exact = reading is not None or len(choices) == 1
        skus.append(
            sku_record(
                choice, prices[choice.key], reading or commodity.stock, source=source, stock_exact=exact
            )
        )
    if not skus:
        return Goods(None, tuple(problems))
    return Goods(product_record(commodity, skus, base_url), tuple(problems))


def product_record(commodity: Commodity, skus: list[dict[str, Any]], base_url: str = "") -> dict[str, Any]:
    """The commodity as seed 000's Product with ``skus``; its price is its cheapest SKU's."""
    cheapest = min(skus, key=lambda sku: Decimal(sku["price_amount"]))
    cover = urljoin(base_url.rstrip("/") + "/", commodity.cover) if commodity.cover else ""
    return {
        "id": commodity.id,
        "slug": commodity.code,
        "title": {LOCALE: commodity.name},
        "description": {LOCALE: commodity.description},
        "images": [cover] if cover else [],
        "tags": list(commodity.tags),
        "price_amount": cheapest["price_amount"],
        "fulfillment_type": "manual" if commodity.manual else "auto",
        "manual_form_schema": form_schema(commodity.widgets),
        "is_active": commodity.status == 1,
        "category_id": commodity.category_id,
        "created_at": commodity.created_at,
        "skus": skus,
        "acg_faka": {
            "code": commodity.code,
            "delivery_way": commodity.delivery_way,
            "chained": commodity.chained,
            "price": None if commodity.price is None else money_text(commodity.price),
            "user_price": None if commodity.user_price is None else money_text(commodity.user_price),
            "minimum": commodity.minimum,
            "maximum": commodity.maximum,
            "hidden": commodity.hidden,
            "api_listed": commodity.api_listed,
        },
    }
