"""The intake request (``POST /api/v1/orders``): strict parsing, normalisation and its fingerprint."""

from __future__ import annotations

import hashlib
import json
import re
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from procurd.core.numbers import MAX_ID, ORDER_NO_PATTERN
from procurd.core.problems import problems

MAX_ITEMS = 100
MAX_QUANTITY = 100_000
ORDER_NO_RULE = "1 to 64 characters: letters, digits, and _ . : - ; starting with a letter or digit"
MAX_AMOUNT_CHARS = 40  # the database's Money column
MAX_FORM_NUMBER_EXPONENT = 308  # a float's range


class IntakeError(Exception):
    """A request procurd refuses; nothing was stored. ``code`` says why (grouped below)."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


# Why intake refuses an order: the request itself is malformed, it cannot be bought as asked, it collides
# with an order taken in before, or the mirror knows it cannot be filled now.
MALFORMED = frozenset({"invalid_request", "manual_form_data_invalid"})
UNPROCESSABLE = frozenset(
    {
        "upstream_required",
        "unknown_upstream",
        "sku_not_found",
        "sku_inactive",
        "product_not_found",
        "product_inactive",
        "manual_form_data_required",
        "offer_not_found",
    }
)
CONFLICTS = frozenset({"order_conflict", "downstream_order_no_taken"})
# The mirror knows an item cannot be filled now (unless the request allows a backorder): 409.
UNAVAILABLE = frozenset({"insufficient_stock"})


def refusal_status(code: str) -> int:
    """The HTTP status intake answers a refusal with: 400 for a malformed request, 409 for one that collides
    with an earlier order or that the mirror knows cannot be filled now, 422 otherwise."""
    return 400 if code in MALFORMED else 409 if code in CONFLICTS | UNAVAILABLE else 422


def _decimal_text(value: Any) -> str:
    """An amount as exact decimal text: a JSON string such as ``"9.90"``, never a JSON number."""
    if not isinstance(value, str):
        raise ValueError('must be a decimal string such as "9.90" (a JSON string, not a number)')
    try:
        amount = Decimal(value.strip())
    except InvalidOperation:
        raise ValueError('must be a decimal string such as "9.90"') from None
    if not amount.is_finite() or amount < 0:
        raise ValueError("must be a finite, non-negative amount")
    if len(value.strip()) > MAX_AMOUNT_CHARS:
        raise ValueError(f"must be at most {MAX_AMOUNT_CHARS} characters")
    return value.strip()


def plain_json(value: Any) -> Any:
    """Buyer form data as plain JSON: its numbers are not amounts, so exact decimals become ints or floats.

    A number beyond a float's range is refused: ``int(Decimal("1e999999"))`` alone takes half a minute.
    """
    if isinstance(value, Decimal):
        if not value.is_finite() or value.adjusted() > MAX_FORM_NUMBER_EXPONENT:
            raise ValueError("manual_form_data holds a number too large")
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {key: plain_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain_json(item) for item in value]
    return value


OFFER_CODE_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
OFFER_CODE_RULE = "1 to 64 characters: letters, digits, and _ . : - ; starting with a letter or digit"


class ItemRequest(BaseModel):
    """One item: an upstream SKU (``upstream``, ``sku_id``) or a storefront offer (``offer``)."""

    model_config = ConfigDict(extra="forbid")

    upstream: StrictStr | None = None
    sku_id: Annotated[StrictInt, Field(gt=0, le=MAX_ID)] | None = None
    offer: StrictStr | None = None
    quantity: Annotated[StrictInt, Field(ge=1, le=MAX_QUANTITY)]
    manual_form_data: dict[str, Any] | None = None
    max_unit_price: str | None = None

    @field_validator("manual_form_data", mode="before")
    @classmethod
    def _plain_form(cls, value: Any) -> Any:
        return plain_json(value)

    @field_validator("max_unit_price", mode="before")
    @classmethod
    def _exact_amount(cls, value: Any) -> str | None:
        return None if value is None else _decimal_text(value)

    @field_validator("offer")
    @classmethod
    def _offer_code_rule(cls, value: str | None) -> str | None:
        if value is not None and not OFFER_CODE_PATTERN.fullmatch(value):
            raise ValueError(f"must be {OFFER_CODE_RULE}")
        return value

    @model_validator(mode="after")
    def _sku_or_offer(self) -> ItemRequest:
        if self.offer is None and self.sku_id is None:
            raise ValueError('name a SKU ("sku_id") or an offer ("offer")')
        if self.offer is not None and (self.sku_id is not None or self.upstream is not None):
            raise ValueError('an "offer" item names no "sku_id" or "upstream": the offer lists its sources')
        return self


class OrderRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    order_no: StrictStr
    trace_id: Annotated[StrictStr, Field(max_length=128)] | None = None
    items: Annotated[list[ItemRequest], Field(min_length=1, max_length=MAX_ITEMS)]
    # Take in an item the mirror knows to be out of stock (or short of the quantity) anyway, and let the
    # upstream decide: without it such an item is refused 409 insufficient_stock.
    allow_backorder: StrictBool = False

    @field_validator("order_no")
    @classmethod
    def _order_number_rule(cls, value: str) -> str:
        if not ORDER_NO_PATTERN.fullmatch(value):
            raise ValueError(f"must be {ORDER_NO_RULE}")
        return value

    def with_upstream(self, default: str | None) -> OrderRequest:
        """Items without an upstream take ``default`` (only possible when one upstream is configured)."""
        items = [
            item if item.upstream or item.offer else item.model_copy(update={"upstream": default})
            for item in self.items
        ]
        return self.model_copy(update={"items": items})

    def canonical(self) -> dict[str, Any]:
        """The normalised request, as stored and compared for repeats (an item names a SKU or an offer:
        the other key is left out, so orders taken in before offers existed keep their fingerprint)."""
        data = self.model_dump(mode="json")
        for item in data["items"]:
            if item["offer"] is None:
                del item["offer"]
            else:
                del item["sku_id"], item["upstream"]
        if not data["allow_backorder"]:
            del data["allow_backorder"]
        return data

    def fingerprint(self) -> str:
        """Digest of the canonical request: a repeat with the same body has the same fingerprint.
        ``allow_backorder`` only decides whether the order is taken in: a repeat that says it (or not) is the
        same order."""
        data = self.canonical()
        data.pop("allow_backorder", None)
        for item in data["items"]:
            if item.get("max_unit_price") is not None:
                item["max_unit_price"] = str(Decimal(item["max_unit_price"]).normalize())
        encoded = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(encoded.encode()).hexdigest()


def parse_order_request(body: Any) -> OrderRequest:
    """Validate a decoded JSON body; raise :class:`IntakeError` naming every problem."""
    if not isinstance(body, dict):
        raise IntakeError("invalid_request", "the body must be a JSON object")
    try:
        return OrderRequest.model_validate(body)
    except ValidationError as exc:
        found = problems(exc)
        raise IntakeError("invalid_request", "; ".join(found), found) from None
