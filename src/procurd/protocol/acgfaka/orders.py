"""A trade with an acg-faka supplier, without I/O: the request number, the request's fields, the answer, and
what the answer's ``secret`` means.

**The request number.** acg-faka refuses a second order under a ``request_no`` it already holds (``The
request ID already exists``), across every member of the shop, ignoring case, in a column of 19 characters.
It never looks an order up by that number. :func:`request_no` derives one from a procurement's downstream
number: ``PC`` and the first 17 characters of the base-32 SHA-256 digest of the member id and the number
(upper-case letters and digits 2-7, 85 bits). The same procurement always gets the same number, so a try
repeated after a lost answer cannot buy a second time; two installations that use one member account and
the same downstream numbers would collide, and the second would be told the number exists (an outcome
procurd reports as unknown, never a second purchase).

**The secret.** A paid trade answers ``secret``: the cards (one per line) for card goods, but also notices
that look like goods: a manual commodity's delivery notice (the seller's text, or the default one), the notice
that someone else took the cards while this order was being paid (paid, nothing delivered), or an upstream's
text for chained goods. :func:`interpret_delivery` tells them apart as far as the protocol allows.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from procurd.protocol.acgfaka.envelope import StockReading
from procurd.protocol.acgfaka.refusals import MANUAL_NOTICE, SOLD_OUT_NOTICE
from procurd.protocol.acgfaka.signing import FieldValue, check_field_name
from procurd.protocol.acgfaka.widgets import PROTOCOL_FIELDS

REQUEST_NO_PREFIX = "PC"
REQUEST_NO_LENGTH = 19
_REQUEST_NO = re.compile(r"[A-Za-z0-9_-]{1,19}")
TRADE_NO = re.compile(r"[0-9]{18}")


def request_no(downstream_order_no: str, app_id: str) -> str:
    """The ``request_no`` of the trade for ``downstream_order_no`` by member ``app_id`` (19 characters)."""
    digest = hashlib.sha256(f"procurd\n{app_id}\n{downstream_order_no}".encode()).digest()
    code = base64.b32encode(digest).decode("ascii")
    return (REQUEST_NO_PREFIX + code)[:REQUEST_NO_LENGTH]


@dataclass(frozen=True, slots=True)
class TradeRequest:
    """One purchase: ``quantity`` units of the commodity ``code``, the variant, one option per add-on group
    (in the commodity's order) and the buyer inputs by their field names."""

    code: str
    quantity: int
    request_no: str
    race: str | None = None
    options: tuple[tuple[str, str], ...] = ()
    inputs: Mapping[str, str] = field(default_factory=dict, repr=False)

    def fields(self) -> dict[str, FieldValue]:
        """The trade's form fields (``app_id`` and ``sign`` are added by the client); :class:`ValueError`
        for a request the supplier would misread."""
        if not self.code:
            raise ValueError("the commodity code is empty")
        if self.quantity < 1:
            raise ValueError("the quantity must be at least 1")
        if not _REQUEST_NO.fullmatch(self.request_no):
            raise ValueError("request_no must be 1 to 19 letters, digits, '-' or '_'")
        fields: dict[str, FieldValue] = {
            "shared_code": self.code,
            "num": str(self.quantity),
            "card_id": "0",
            "device": "0",
            "request_no": self.request_no,
        }
        if self.race is not None:
            fields["race"] = self.race
        if self.options:
            groups = [group for group, _ in self.options]
            for group in groups:
                problem = check_field_name(group, nested=True)
                if problem is not None:
                    raise ValueError(f"add-on group {group!r}: {problem}")
                if groups.count(group) > 1:
                    raise ValueError(f"add-on group {group!r} is given twice")
            fields["sku"] = dict(self.options)
        for name, value in self.inputs.items():
            problem = check_field_name(name)
            if problem is not None:
                raise ValueError(f"buyer input {name!r}: {problem}")
            if name in PROTOCOL_FIELDS:
                raise ValueError(f"buyer input {name!r} has the name of a protocol field")
            if not isinstance(value, str):
                raise ValueError(f"buyer input {name!r} is not text")
            fields[name] = value
        return fields


@dataclass(frozen=True, slots=True)
class TradeResult:
    """A paid trade as the supplier answered it. ``secret`` is delivered goods (or a notice): never log it."""

    trade_no: str
    amount: Decimal
    secret: str = field(repr=False)
    request_no: str
    url: str | None = None
    leave_message: str | None = field(default=None, repr=False)
    stock: StockReading | None = None


@dataclass(frozen=True, slots=True)
class QueryResult:
    """``query``: an order's current ``secret`` (goods or a notice; never log it), inputs and status."""

    trade_no: str
    secret: str | None = field(repr=False)
    status: int | None
    inputs: Mapping[str, Any] | None = field(default=None, repr=False)


DeliveryKind = Literal["delivered", "pending", "not_delivered"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """What a paid trade's ``secret`` is: goods (``lines`` for cards, ``text`` as given), a notice while a
    person at the supplier delivers (poll ``query`` until the text changes), or a paid order that will not
    deliver by itself (``reason``: a person settles it with the supplier)."""

    kind: DeliveryKind
    text: str = field(default="", repr=False)
    lines: tuple[str, ...] = field(default=(), repr=False)
    reason: str | None = None


def interpret_delivery(secret: str | None, *, quantity: int, manual: bool, chained: bool = False) -> Delivery:
    """What the ``secret`` of a paid trade of ``quantity`` units is.

    Card goods must answer exactly ``quantity`` non-empty lines; the sold-out notice, or any other number of
    lines, is a paid order without its goods. A manual commodity's answer is its delivery notice (whatever
    the seller wrote): pending. Chained goods (the supplier bought them from a shop of its own and never
    refreshes the text) count as delivered only as ``quantity`` lines that are no known notice."""
    text = secret or ""
    if text.strip() == SOLD_OUT_NOTICE:
        return Delivery(
            "not_delivered", text, reason="sold out while the order was paid (paid, nothing delivered)"
        )
    if manual and not chained:
        return Delivery("pending", text)
    if text.strip() == MANUAL_NOTICE:
        return Delivery(
            "not_delivered", text, reason="an upstream's delivery notice, which is never refreshed"
        )
    lines = tuple(line.rstrip("\r") for line in text.split("\n"))
    if len(lines) != quantity or not all(line.strip() for line in lines):
        count = sum(1 for line in lines if line.strip())
        return Delivery("not_delivered", text, reason=f"{count} lines of goods for {quantity} units bought")
    return Delivery("delivered", text, lines)


def delivered_later(first: str | None, current: str | None) -> bool:
    """Whether a manual order's ``secret`` (as ``query`` answers it now) is no longer the notice its trade
    answered: the supplier's operator typed the goods in."""
    if current is None or not current.strip():
        return False
    return current != first and current.strip() not in (MANUAL_NOTICE, SOLD_OUT_NOTICE)
