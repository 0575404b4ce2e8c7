"""The provider role, pure: wallets in cents, the status a provider order shows its downstream site, member
prices, the offered catalogue's documents and ids, and the callbacks' bodies.

procurd as the upstream of other sites sells what its mirror holds at the selling prices ``[pricing]`` sets,
in ``[provider] currency``, and buys each order through its own procurement; the downstream sees seed 000's
resources and statuses.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any

from procurd.core.orders import iso
from procurd.core.procurement import COMPLETED_STATUS, Procurement, State

CENT = Decimal("0.01")
PLAIN_AMOUNT = re.compile(r"[0-9]+(\.[0-9]+)?")
MAX_CENTS = 10**15  # the most a wallet, a price or an order holds (ten trillion), far below BIGINT's limit
ACCOUNT_NAME_RULE = "1 to 64 characters: letters, digits, and _ . - ; starting with a letter or digit"
LEDGER_KINDS = ("topup", "debit", "order", "refund")
ACTIVE = "active"
DISABLED = "disabled"
# Statuses of a provider order (seed 000 part 3); what a downstream is told.
PAID = "paid"
CANCELED = "canceled"
DELIVERED = "delivered"
PASSED_THROUGH = frozenset({"fulfilling", "partially_delivered"})
ORDER_STATUSES = (PAID, "fulfilling", "partially_delivered", DELIVERED, COMPLETED_STATUS, CANCELED)
"""Every status a provider order can show, in the order an order goes through them."""


class AmountError(ValueError):
    """An amount that cannot be a wallet movement: not a decimal, not positive, finer than a cent, too
    large."""


def to_cents(amount: Decimal | str, *, what: str = "amount") -> int:
    """An exact amount of at most two decimals as integer cents."""
    try:
        value = Decimal(amount) if isinstance(amount, str) else amount
    except InvalidOperation:
        raise AmountError(f'{what} must be a decimal amount such as "10.00"') from None
    if not value.is_finite():
        raise AmountError(f"{what} must be a finite amount")
    cents = value * 100
    if cents != cents.to_integral_value():
        raise AmountError(f"{what} must have at most two decimals")
    if abs(cents) > MAX_CENTS:
        raise AmountError(f"{what} is too large")
    return int(cents)


def positive_cents(amount: str, *, what: str = "amount") -> int:
    """A wallet movement given by a person: a positive decimal string of at most two decimals (ASCII digits
    and a point: no sign, exponent, underscore or other script's digits, which ``Decimal`` would read)."""
    text = amount.strip() if isinstance(amount, str) else None
    if text is not None and text.startswith("-") and PLAIN_AMOUNT.fullmatch(text[1:].strip()):
        raise AmountError(
            f'{what} must be positive (a decimal string such as "100.00"): a topup adds it, a debit takes it'
        )
    if text is None or not PLAIN_AMOUNT.fullmatch(text):
        raise AmountError(f'{what} must be a decimal string such as "100.00"')
    cents = to_cents(text, what=what)
    if cents <= 0:
        raise AmountError(f"{what} must be positive (above zero)")
    return cents


def cents_text(cents: int) -> str:
    """Cents as the protocol's decimal text: ``"12.30"``, ``"-5.00"``."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(cents), 100)
    return f"{sign}{whole}.{part:02d}"


def price_cents(price: str) -> int:
    """A selling price (decimal text, rounded to the cent by the pricing rules) in cents."""
    return to_cents(Decimal(price).quantize(CENT, rounding=ROUND_HALF_UP), what="price")


# --- accounts and orders as stored -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Account:
    """A downstream site's account (``provider_accounts`` row)."""

    id: int
    name: str
    api_key: str
    api_secret: str = field(repr=False)
    status: str
    level: str | None
    balance_cents: int
    currency: str
    created_at: datetime
    updated_at: datetime

    @property
    def active(self) -> bool:
        return self.status == ACTIVE


@dataclass(frozen=True, slots=True, kw_only=True)
class OldSecret:
    """An account's previous API secret after a rotation (``provider_old_secrets`` row): it still verifies
    signatures until ``valid_until``, and the requests it verified are counted."""

    id: int
    account_id: int
    api_secret: str = field(repr=False)
    replaced_at: datetime
    valid_until: datetime
    requests: int
    last_used_at: datetime | None


def account_view(
    account: Account, orders: dict[str, int] | None = None, old_secrets: Sequence[OldSecret] = ()
) -> dict[str, Any]:
    """An account as the admin API shows it (never a secret): with its orders by status and the previous
    secrets that still verify its requests (each's end, and the requests it verified: when they stop, the
    downstream has switched to the new one)."""
    return {
        "id": account.id,
        "name": account.name,
        "api_key": account.api_key,
        "status": account.status,
        "level": account.level,
        "balance": cents_text(account.balance_cents),
        "currency": account.currency,
        "orders": orders or {},
        "old_secrets": [_old_secret_view(old) for old in old_secrets],
        "created_at": iso(account.created_at),
        "updated_at": iso(account.updated_at),
    }


def _old_secret_view(old: OldSecret) -> dict[str, Any]:
    return {
        "replaced_at": iso(old.replaced_at),
        "valid_until": iso(old.valid_until),
        "requests": old.requests,
        "last_used_at": iso(old.last_used_at),
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderOrder:
    """An order received from a downstream site (``provider_orders`` row)."""

    id: int
    order_no: str
    account_id: int
    downstream_order_no: str | None
    trace_id: str | None
    callback_url: str | None
    upstream: str
    product_id: int
    sku_id: int
    upstream_sku_id: int
    title: Mapping[str, Any] | None
    fulfillment_type: str
    quantity: int
    unit_price: str
    amount_cents: int
    currency: str
    status: str
    fulfillment: Mapping[str, Any] | None
    refunded_cents: int
    created_at: datetime
    updated_at: datetime

    @property
    def charged(self) -> bool:
        """The wallet paid for it, and a local order (under ``order_no``) buys it: every order but one
        refused for the balance, which is recorded ``canceled`` and bought nowhere."""
        return self.status != CANCELED or self.refunded_cents > 0

    def summary(self) -> dict[str, Any]:
        """``POST /orders``'s answer (and a repeat's): ok, order_id, order_no, status, amount, currency."""
        return {
            "ok": True,
            "order_id": self.id,
            "order_no": self.order_no,
            "status": self.status,
            "amount": cents_text(self.amount_cents),
            "currency": self.currency,
        }

    def to_api(self) -> dict[str, Any]:
        """``GET /orders/:id`` (seed 000 2.4): the items, and the fulfillment once delivered."""
        data = self.summary()
        data["items"] = [
            {
                "product_id": self.product_id,
                "sku_id": self.sku_id,
                "title": dict(self.title or {}),
                "quantity": self.quantity,
                "unit_price": self.unit_price,
                "total_price": cents_text(self.amount_cents),
                "fulfillment_type": self.fulfillment_type,
            }
        ]
        if self.fulfillment is not None and self.status not in (PAID, CANCELED, *PASSED_THROUGH):
            data["fulfillment"] = dict(self.fulfillment)
        if self.refunded_cents:
            data["refunded_amount"] = cents_text(self.refunded_cents)
        data["downstream_order_no"] = self.downstream_order_no or ""
        data["trace_id"] = self.trace_id or ""
        data["created_at"] = iso(self.created_at)
        data["updated_at"] = iso(self.updated_at)
        return data


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderIntake:
    """A downstream site's order, checked and priced, for the state path to charge and buy in one
    transaction: the account, what it ordered (offered ids) and what that is upstream, and the price."""

    account_id: int
    order_no: str  # the provider order's number, and the local order's that buys it
    downstream_order_no: str | None
    trace_id: str | None
    callback_url: str | None
    upstream: str
    product_id: int
    sku_id: int
    upstream_sku_id: int
    title: Mapping[str, Any] | None
    fulfillment_type: str
    quantity: int
    unit_price: str
    amount_cents: int
    currency: str


@dataclass(frozen=True, slots=True)
class ProviderTerms:
    """What the provider's configuration decides of a downstream's order: the currency it sells in, the
    upstreams it offers, and each configured level's discount (a level no longer configured has none)."""

    currency: str
    upstreams: frozenset[str]
    discounts: Mapping[str, Decimal] = field(default_factory=dict)


def provider_status(p: Procurement) -> str:
    """What the provider order bought by ``p`` shows its downstream site.

    Delivered goods are ``delivered`` (``completed`` once the upstream says so); an item canceled, or closed
    by a person without goods, is ``canceled`` (and refunded); the upstream's ``fulfilling`` and
    ``partially_delivered`` are passed through; anything else, an exception included, is ``paid``: the
    downstream paid, and a person here decides (seed 000 rule 4).
    """
    if p.holds_fulfillment:
        return COMPLETED_STATUS if p.upstream_status == COMPLETED_STATUS else DELIVERED
    if p.state in (State.CANCELED, State.RESOLVED):
        return CANCELED
    if p.state is State.SUBMITTED and p.upstream_status in PASSED_THROUGH:
        return str(p.upstream_status)
    return PAID


# --- member prices ------------------------------------------------------------------------------------------


def member_price(price: str, discount_percent: Decimal, floor: str | None) -> str:
    """The price an account of a level with ``discount_percent`` pays: the offered price less the discount,
    to the cent (rounded up, never a cent under), but never under ``floor`` (what procurd pays for it, in the
    selling currency): there the tier stops."""
    offered = Decimal(price)
    discounted = (offered * (Decimal(100) - discount_percent) / Decimal(100)).quantize(
        CENT, rounding="ROUND_UP"
    )
    if floor is not None:
        least = Decimal(floor).quantize(CENT, rounding="ROUND_UP")
        discounted = max(discounted, min(least, offered))
    return format(min(discounted, offered).quantize(CENT), "f")


def member_document(
    document: Mapping[str, Any], discount_percent: Decimal, floors: Mapping[str, str]
) -> dict[str, Any]:
    """A product as an account of a level sees it: every SKU and the product carry ``original_price`` (the
    offered price), ``member_price`` and ``price_amount`` = ``member_price`` (seed 000 2.2)."""
    skus = []
    for sku in document.get("skus", []):
        offered = str(sku["price_amount"])
        member = member_price(offered, discount_percent, floors.get(str(sku["id"])))
        skus.append({**sku, "price_amount": member, "original_price": offered, "member_price": member})
    active = [Decimal(sku["price_amount"]) for sku in skus if sku.get("is_active")]
    member = format(min(active), "f") if active else document.get("price_amount", "0.00")
    return {
        **document,
        "skus": skus,
        "price_amount": member,
        "original_price": document.get("price_amount"),
        "member_price": member,
    }


# --- the offered catalogue ----------------------------------------------------------------------------------

Entity = str  # category | product | sku


@dataclass(frozen=True, slots=True)
class OfferedSku:
    """A mirrored SKU as the provider may offer it: priced in the provider's currency, or not offered."""

    upstream_id: int
    sku_code: str
    spec_values: Any
    price: str | None  # the selling price, when in the provider's currency
    floor: str | None  # its cost through the pricing rule's exchange rate
    stock_status: str
    stock_quantity: int
    active: bool  # the SKU is active upstream and still listed


@dataclass(frozen=True, slots=True)
class OfferedProduct:
    """A mirrored product with its SKUs, as the offered catalogue's refresh reads them."""

    upstream: str
    upstream_id: int
    category_upstream_id: int
    fields: Mapping[str, Any]  # slug, title, description, content, seo_meta, images, tags, fulfillment_type,
    #                            manual_form_schema, created_at
    active: bool  # active upstream and still listed
    skus: Sequence[OfferedSku]


@dataclass(frozen=True, slots=True)
class OfferedDocument:
    """A product as the provider shows it, and what that needs beside it."""

    document: dict[str, Any]
    floors: dict[str, str]
    listed: bool
    digest: str


def offered_document(
    product: OfferedProduct, ids: Mapping[tuple[Entity, int], int], updated_at: str
) -> OfferedDocument:
    """The product under its offered ids, at its selling prices. Only SKUs priced in the provider's currency
    are shown; a product is listed while it is active upstream and one of its shown SKUs is active. The
    digest covers everything any downstream sees (a tier's member prices follow the floors) but
    ``updated_at`` itself, which moves when the digest does."""
    skus = [sku for sku in product.skus if sku.price is not None]
    shown = []
    floors: dict[str, str] = {}
    for sku in skus:
        offered_id = ids[("sku", sku.upstream_id)]
        assert sku.price is not None
        shown.append(
            {
                "id": offered_id,
                "sku_code": sku.sku_code,
                "spec_values": sku.spec_values,
                "price_amount": sku.price,
                "stock_status": sku.stock_status,
                "stock_quantity": sku.stock_quantity,
                "is_active": sku.active,
            }
        )
        if sku.floor is not None:
            floors[str(offered_id)] = sku.floor
    active_prices = [Decimal(sku["price_amount"]) for sku in shown if sku["is_active"]]
    listed = product.active and bool(active_prices)
    fields = product.fields
    document: dict[str, Any] = {
        "id": ids[("product", product.upstream_id)],
        "slug": fields.get("slug"),
        "title": fields.get("title"),
        "description": fields.get("description"),
        "content": fields.get("content"),
        "seo_meta": fields.get("seo_meta"),
        "images": fields.get("images") or [],
        "tags": fields.get("tags") or [],
        "price_amount": format(min(active_prices), "f") if active_prices else "0.00",
        "fulfillment_type": fields.get("fulfillment_type"),
        "manual_form_schema": fields.get("manual_form_schema"),
        "is_active": listed,
        "category_id": ids[("category", product.category_upstream_id)],
        "skus": shown,
        "created_at": fields.get("created_at") or updated_at,
    }
    # The floors are in the digest too: a tier's member prices move with the cost, not only with the document.
    digest = hashlib.sha256(canonical([document, floors]).encode()).hexdigest()[:32]
    return OfferedDocument({**document, "updated_at": updated_at}, floors, listed, digest)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def allocate_ids(
    wanted: Iterable[tuple[Entity, str, int]],
    known: Mapping[tuple[Entity, str, int], int],
    taken: Mapping[Entity, set[int]],
) -> dict[tuple[Entity, str, int], int]:
    """Offered ids for the ``(entity, upstream, upstream_id)`` not ``known`` yet: the upstream's own id when
    no other source has it, else the next id above every one of that entity. Ids are kept forever, so one
    offered upstream keeps its ids, and a second one's that collide get new ones."""
    used = {entity: set(ids) for entity, ids in taken.items()}
    new: dict[tuple[Entity, str, int], int] = {}
    for key in sorted(set(wanted)):
        if key in known or key in new:
            continue
        entity, _, upstream_id = key
        ids = used.setdefault(entity, set())
        offered = upstream_id if upstream_id not in ids else max(ids) + 1
        ids.add(offered)
        new[key] = offered
    return new
