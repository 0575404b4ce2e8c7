"""The vocabulary the engine speaks to every upstream, whatever its protocol: seed 000's resources (part 2)
as pydantic models. Dujiao-Next's client reads them off its wire as they are; acg-faka's adapter builds them
from its supplier's answers (a product per commodity, a SKU per orderable choice).

Fields carry the upstream's names. Fields a real site adds are kept (``model_extra``). Amounts keep the
exact decimal text the upstream sent (``"9.90"`` stays ``"9.90"``); a JSON number is taken from its JSON
text, never through a binary float. ``to_json()`` gives back what came in: fields the upstream left out stay
out, amounts are unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def _decimal_text(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError("an amount must be a decimal string, not a boolean")
    if isinstance(value, int | Decimal):
        text = str(value)
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, str):
        text = value
    else:
        raise ValueError("an amount must be a decimal string")
    try:
        parsed = Decimal(text)
    except InvalidOperation:
        raise ValueError("not a decimal number") from None
    if not parsed.is_finite():
        raise ValueError("an amount must be finite")
    return text


DecimalText = Annotated[str, BeforeValidator(_decimal_text)]
"""An amount as the exact decimal text the upstream sent; ``Decimal(value)`` gives the number."""

Multilingual = dict[str, str]


def _none_as_empty_list(value: Any) -> Any:
    return [] if value is None else value


def _flag_or_none(value: Any) -> bool | None:
    """A JSON boolean as it is; anything else says nothing."""
    return value if isinstance(value, bool) else None


class UpstreamModel(BaseModel):
    """Base of every upstream resource: unknown fields are kept, nothing is coerced away."""

    model_config = ConfigDict(extra="allow", frozen=True)

    def to_json(self) -> dict[str, Any]:
        """The resource as JSON-ready data: the fields the upstream sent, amounts unchanged."""
        return self.model_dump(mode="json", exclude_unset=True)


class Category(UpstreamModel):
    id: int
    parent_id: int | None = None
    slug: str | None = None
    name: Multilingual | None = None
    icon: str | None = None
    sort_order: int | None = None


class Sku(UpstreamModel):
    id: int
    sku_code: str | None = None
    spec_values: dict[str, Any] | None = None
    price_amount: DecimalText | None = None
    original_price: DecimalText | None = None
    member_price: DecimalText | None = None
    stock_status: str | None = None
    stock_quantity: int | None = None
    is_active: bool = True


class Product(UpstreamModel):
    id: int
    slug: str | None = None
    title: Multilingual | None = None
    description: Multilingual | None = None
    content: Multilingual | None = None
    seo_meta: dict[str, Any] | None = None
    images: list[str] | None = None
    tags: list[str] | None = None
    price_amount: DecimalText | None = None
    original_price: DecimalText | None = None
    member_price: DecimalText | None = None
    fulfillment_type: str | None = None
    manual_form_schema: dict[str, Any] | None = None
    is_active: bool = True
    category_id: int | None = None
    skus: Annotated[list[Sku], BeforeValidator(_none_as_empty_list)] = Field(default_factory=list)
    created_at: str | None = None
    updated_at: str | None = None

    def sku(self, sku_id: int) -> Sku | None:
        """The SKU with this id, if the upstream listed it."""
        return next((sku for sku in self.skus if sku.id == sku_id), None)


class ProductPage(UpstreamModel):
    """One page of ``GET /products``, with the page and page size the upstream actually used, and whether
    it lists inactive products too (``includes_inactive``; ``None`` when the answer does not say)."""

    items: Annotated[list[Product], BeforeValidator(_none_as_empty_list)]
    total: int
    page: int
    page_size: int
    includes_inactive: Annotated[bool | None, BeforeValidator(_flag_or_none)] = None


@dataclass(frozen=True, slots=True)
class CatalogPage:
    """One page of ``GET /products`` as decoded JSON, for the catalogue mirror.

    Only what the mirror relies on is checked (integer ``total``, ``page`` and ``page_size``; every item an
    object with an integer ``id``; ``skus`` absent, null or a list of objects with an integer ``id``); the
    mirror judges the other fields record by record.
    """

    items: list[dict[str, Any]]
    total: int
    page: int
    page_size: int
    body_digest: bytes = b""
    """SHA-256 of the answer's body as received, when the caller asked (``seen`` given); else empty."""
    includes_inactive: bool | None = None
    """The answer's ``includes_inactive``: True when the upstream lists the products it took off sale too
    (asked with ``include_inactive=true``, Dujiao-Next since 2026), False or ``None`` (not said) otherwise."""


@dataclass(frozen=True, slots=True)
class SeenPage:
    """A ``GET /products`` answer whose body is byte for byte one the caller has seen before, left undecoded:
    ``body_digest`` names it among the digests the caller passed as ``seen``."""

    body_digest: bytes


class MemberLevel(UpstreamModel):
    id: int
    name: Multilingual | None = None
    slug: str | None = None
    icon: str | None = None


class PingResult(UpstreamModel):
    site_name: str | None = None
    protocol_version: str | None = None
    user_id: int
    balance: Decimal = Field(allow_inf_nan=False)
    currency: str
    member_level: MemberLevel | None = None
    latency_ms: float = 0.0
    """Measured by the client: from sending the request to reading the whole answer."""
    clock_offset_seconds: float | None = None
    """Measured by the client: how far this machine's clock is ahead of the upstream's (negative: behind),
    from the Date header of the signed answer; None when the upstream sends none."""


class OrderCreated(UpstreamModel):
    """The answer to ``POST /orders`` (also to an idempotent repeat, with the order's current status).

    ``fulfillment`` is set by a protocol whose purchase delivers in its answer (acg-faka's card goods): the
    goods, with ``status`` delivered; seed 000's answer has none (its goods come by callback or poll)."""

    order_id: int
    order_no: str
    status: str
    amount: DecimalText | None = None
    currency: str | None = None
    fulfillment: Fulfillment | None = None


class OrderItem(UpstreamModel):
    product_id: int | None = None
    sku_id: int | None = None
    title: Multilingual | None = None
    quantity: int | None = None
    unit_price: DecimalText | None = None
    total_price: DecimalText | None = None
    fulfillment_type: str | None = None


class Fulfillment(UpstreamModel):
    """Delivered goods. ``payload`` and ``delivery_data`` are secrets: they never show in a repr."""

    type: str | None = None
    status: str | None = None
    payload: str | None = Field(default=None, repr=False)
    delivery_data: dict[str, Any] | None = Field(default=None, repr=False)
    delivered_at: str | None = None

    def __repr_args__(self) -> Any:
        return [(name, getattr(self, name)) for name in ("type", "status", "delivered_at")]


class UpstreamOrder(UpstreamModel):
    """The answer to ``GET /orders/:id``; ``fulfillment`` is present once delivered."""

    order_id: int
    order_no: str
    status: str
    amount: DecimalText | None = None
    currency: str | None = None
    items: Annotated[list[OrderItem], BeforeValidator(_none_as_empty_list)] = Field(default_factory=list)
    fulfillment: Fulfillment | None = None
    refunded_amount: Decimal | None = Field(default=None, allow_inf_nan=False)
    refund_records: list[Any] | None = None
    # The number procurd bought it under (real sites and procurd's provider answer it): what makes an answer
    # confirm a callback's claim (procurd.core.claims).
    downstream_order_no: str | None = None


OrderCreated.model_rebuild()


class CancelResult(UpstreamModel):
    order_id: int
    order_no: str | None = None
    status: str


class CreateOrderRequest(BaseModel):
    """The body of ``POST /orders``. ``downstream_order_no`` is the idempotency key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sku_id: int = Field(gt=0)
    quantity: int = Field(ge=1)
    manual_form_data: dict[str, Any] | None = None
    downstream_order_no: str | None = Field(default=None, min_length=1, max_length=128)
    trace_id: str | None = Field(default=None, max_length=128)
    callback_url: str | None = None
    # What the procurement knows besides the wire body, for a protocol without a price guard or a seed-000
    # catalogue of its own (acg-faka): never sent (``body()`` leaves them out).
    unit_limit: DecimalText | None = Field(default=None, exclude=True)
    """The most a unit may cost (the item's ``max_unit_price``, or the loss guard's limit)."""
    limit_given: bool = Field(default=False, exclude=True)
    """``unit_limit`` is the item's own ``max_unit_price`` (for the refusal's words)."""
    fulfillment_type: str | None = Field(default=None, exclude=True)
    """The mirrored product's ``fulfillment_type`` (``auto``, ``manual``)."""

    def body(self) -> bytes:
        """Compact JSON (no spaces), fields in declaration order, ``None`` fields left out."""
        data = self.model_dump(mode="json", exclude_none=True)
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
