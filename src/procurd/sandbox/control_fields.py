"""The fields of the control API's requests, checked: JSON types, decimal amounts, ranges. Every bad field
is a 400 ``bad_request`` whose body names it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from aiohttp import web


class ControlError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field


def bad_field(name: str, message: str) -> ControlError:
    """A 400 whose body names the offending field."""
    return ControlError(400, "bad_request", message, field=name)


class Money:
    """Marks a field holding a decimal amount, given as a JSON string such as "9.90" (never a number)."""


class Title:
    """Marks a multilingual text: one string for every locale, or an object of locale to string."""


Kind = type | tuple[str | None, ...]  # a JSON type, a marker above, or the values allowed (strings, null)


EXPECTED = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    bytes: "a string",
    list: "a list",
    Money: 'a decimal string such as "9.90"',
    Title: "a string, or an object of locale to string",
}


def typed(name: str, value: Any, expected: Kind) -> Any:
    """``value`` as ``expected`` (``Money`` gives a Decimal of at least 0), or a 400 naming ``name``."""
    if isinstance(expected, tuple):
        if value in expected:
            return value
        raise bad_field(name, f"{name} must be one of {', '.join(map(repr, expected))}")
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif expected is float:
        if isinstance(value, int | float | Decimal) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif expected is bytes:
        if isinstance(value, str):
            return value.encode()
    elif expected is Money:
        amount = _amount(value)
        if amount is not None:
            return amount
    elif expected is Title:
        if isinstance(value, str) and value:
            return value
        if isinstance(value, dict) and value and all(isinstance(text, str) for text in value.values()):
            return value
    elif isinstance(value, expected):
        return value
    raise bad_field(name, f"{name} must be {EXPECTED.get(expected, expected.__name__)}")


def _amount(value: Any) -> Decimal | None:
    if not isinstance(value, str):
        return None
    try:
        amount = Decimal(value.strip())
    except InvalidOperation:
        return None
    return amount if amount.is_finite() and amount >= 0 else None


def checked_fields(body: Any, schema: Mapping[str, Kind], prefix: str = "") -> dict[str, Any]:
    """The body's fields, each checked against ``schema``; a field the schema lacks is a 400. Errors name
    the field as ``prefix`` + its name."""
    if not isinstance(body, dict):
        raise bad_field(prefix.rstrip("."), f"{prefix.rstrip('.')} must be an object")
    unknown = sorted(set(body) - set(schema))
    if unknown:
        names = ", ".join(prefix + name for name in unknown)
        raise bad_field(prefix + unknown[0], f"unknown fields: {names}; known: {', '.join(schema)}")
    return {name: typed(prefix + name, value, schema[name]) for name, value in body.items()}


def at_least(
    fields: Mapping[str, Any], name: str, minimum: float, *, above: bool = False, prefix: str = ""
) -> None:
    value = fields.get(name)
    if value is not None and (value <= minimum if above else value < minimum):
        label = prefix + name
        raise bad_field(label, f"{label} must be {'above' if above else 'at least'} {minimum:g}")


async def json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw, parse_float=Decimal)
    except ValueError:
        raise ControlError(400, "bad_request", "the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise ControlError(400, "bad_request", "the body must be a JSON object")
    return data


def query_number(raw: str) -> Decimal | str:
    try:
        return Decimal(raw)
    except InvalidOperation:
        return raw


def path_id(request: web.Request) -> int:
    raw = request.match_info["id"]
    if not (raw.isascii() and raw.isdigit()):
        raise ControlError(400, "bad_request", "the id must be a number")
    return int(raw)
