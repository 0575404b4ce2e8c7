"""acg-faka's answers and the values in them, read without I/O.

Every answer of the shared API is HTTP 200. Success is ``{"code": 200, ["msg": "success",] "data": ...}``,
a refusal ``{"code": 0, "msg": TEXT}``. Anything else, an HTML page above all (the shop's "page not found"
page for an endpoint its version lacks, the same page for a crash), is not the protocol's answer:
:func:`read_envelope` says which of the four it got. What an HTML body means depends on the call: "not
there" when detecting a feature, "outcome unknown" for a trade (see :mod:`.refusals`).

Numbers arrive as JSON numbers or as numeric strings, depending on the column and the PHP version: they are
read leniently, but exactly (JSON is parsed with ``parse_float=Decimal``; nothing passes through a float).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal, InvalidOperation
from typing import Any

from procurd.core.exact import loads_exact

SUCCESS_CODE = 200
REFUSAL_CODE = 0
CENT = Decimal("0.01")
UNLIMITED = -1  # procurd's stock for "available, amount unknown"

_DECIMAL_TEXT = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
_INTEGER_TEXT = re.compile(r"-?[0-9]+")
# PHP 8's numeric strings, as the supplier's own stock comparison reads them.
_PHP_NUMERIC = re.compile(
    r"[ \t\n\r\v\f]*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)[ \t\n\r\v\f]*"
)


@dataclass(frozen=True, slots=True)
class Success:
    data: Any
    message: str | None  # "success" on the endpoints that send one; None when the key is absent


@dataclass(frozen=True, slots=True)
class Refusal:
    message: str


@dataclass(frozen=True, slots=True)
class NotJson:
    """A body that is no JSON object: the HTML page, an empty body, anything else."""

    size: int
    content_type: str | None

    def describe(self) -> str:
        kind = self.content_type or "no content type"
        if self.size == 0:
            return f"an empty body ({kind})"
        return f"a body that is not JSON ({kind}, {self.size} bytes): the shop's HTML page"


@dataclass(frozen=True, slots=True)
class Malformed:
    """JSON that is not the protocol's envelope."""

    reason: str


Answer = Success | Refusal | NotJson | Malformed


def read_envelope(body: bytes, content_type: str | None = None) -> Answer:
    """What one answer of the shared API is."""
    if not body.strip():
        return NotJson(0, content_type)
    try:
        parsed = loads_exact(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return NotJson(len(body), content_type)
    if not isinstance(parsed, dict):
        kind = "null" if parsed is None else type(parsed).__name__
        return Malformed(f"the body is a JSON {kind}, not an object")
    code = parsed.get("code")
    message = parsed.get("msg")
    if type(code) is int and code == SUCCESS_CODE:
        if "data" not in parsed:
            return Malformed("code 200 without data")
        if message is not None and not isinstance(message, str):
            return Malformed("msg is not text")
        return Success(parsed["data"], message)
    if type(code) is int and code == REFUSAL_CODE:
        if not isinstance(message, str):
            return Malformed("code 0 without a msg text")
        return Refusal(message)
    return Malformed(f"code is {code!r}, neither 200 nor 0")


# -- values ---------------------------------------------------------------------------------------------


def decimal_value(value: Any, name: str) -> Decimal:
    """An amount given as a JSON number or a decimal string (``10.0``, ``"1.50"``), exactly."""
    if isinstance(value, bool):
        raise ValueError(f"{name} is {value!r}, not an amount")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{name} is not a finite amount")
        return value
    if isinstance(value, str) and _DECIMAL_TEXT.fullmatch(value.strip()):
        return Decimal(value.strip())
    raise ValueError(f"{name} is {_shown(value)}, not an amount")


def integer_value(value: Any, name: str) -> int:
    """An integer given as a JSON number or as decimal text (PHP 8.0 sends uncast columns as text)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} is {value!r}, not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, Decimal) and value.is_finite() and value == value.to_integral_value():
        return int(value)
    if isinstance(value, str) and _INTEGER_TEXT.fullmatch(value.strip()):
        return int(value.strip())
    raise ValueError(f"{name} is {_shown(value)}, not an integer")


def money_text(amount: Decimal) -> str:
    """An amount as text with at least two decimals (``10`` → ``"10.00"``), never rounded up or down
    beyond what it holds: acg-faka works in cents, so longer fractions are kept as they are."""
    if amount == amount.quantize(CENT, rounding=ROUND_DOWN):
        return f"{amount.quantize(CENT):f}"
    return f"{amount:f}"


def cents(amount: Decimal) -> Decimal:
    """``amount`` truncated to cents, as the supplier truncates its prices."""
    return amount.quantize(CENT, rounding=ROUND_DOWN)


@dataclass(frozen=True, slots=True)
class StockReading:
    """A stock figure as procurd keeps it: a count, 0, or -1 (available, amount unknown) with the text the
    supplier gave instead of a number."""

    quantity: int
    text: str | None = None

    @property
    def status(self) -> str:
        """Seed 000's ``stock_status`` for this quantity."""
        if self.quantity < 0:
            return "unlimited"
        if self.quantity == 0:
            return "out_of_stock"
        return "low_stock" if self.quantity <= 20 else "in_stock"


def read_stock(value: Any) -> StockReading:
    """A stock value of any endpoint: a number (or numeric text) is a count, ``""`` and ``null`` are 0, a
    word is -1 with the word kept (the supplier's own trade treats a word as "available")."""
    if value is None:
        return StockReading(0)
    if isinstance(value, bool):
        raise ValueError(f"stock is {value!r}, not a stock figure")
    if isinstance(value, int | Decimal):
        return _count(Decimal(value), None)
    if not isinstance(value, str):
        raise ValueError(f"stock is {_shown(value)}, not a stock figure")
    if value == "":
        return StockReading(0)
    match = _PHP_NUMERIC.fullmatch(value)
    if match is None:
        return StockReading(UNLIMITED, value)
    try:
        number = Decimal(match.group(1))
    except InvalidOperation:
        return StockReading(UNLIMITED, value)
    return _count(number, None if value.strip() == match.group(1) else value)


def _count(number: Decimal, text: str | None) -> StockReading:
    if not number.is_finite():
        raise ValueError("stock is not a finite number")
    whole = int(number.to_integral_value(rounding=ROUND_DOWN))
    if whole < 0:
        return StockReading(0, text if text is not None else f"{number:f}")
    return StockReading(whole, text)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
