"""Reading what the JSON admin API and the web console are sent: query parameters and path ids, checked
alike by both. The operations themselves are :mod:`procurd.operations`; a bad input is answered 400 (or
404 for an id no record can have) with the same codes on both doors.

The JSON API reads a query parameter exactly as ``openapi.yaml`` describes it (``strict``): a parameter
given empty, or a text with surrounding spaces, is refused rather than read as left out. The console reads
its forms' fields leniently: an empty field is one left out, and a filter's surrounding spaces are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from procurd.core.json_limits import text_problem
from procurd.core.numbers import MAX_ID
from procurd.http.errors import ApiError, read_body
from procurd.operations.orders import decode_json

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
MAX_PAGE = 1_000_000
MAX_FILTER_CHARS = 64


def query_int(
    query: Mapping[str, str], name: str, default: int, low: int, high: int, *, strict: bool = False
) -> int:
    """An integer query parameter from ``low`` to ``high`` (``default`` when left out, or, unless
    ``strict``, given empty); 400 ``invalid_query`` otherwise."""
    raw = query.get(name)
    if raw is None:
        return default
    if not strict:
        raw = raw.strip()
        if not raw:
            return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ApiError(400, "invalid_query", f"{name} must be an integer from {low} to {high}")
    return int(raw)


def query_text(
    query: Mapping[str, str], name: str, max_chars: int = MAX_FILTER_CHARS, *, strict: bool = False
) -> str | None:
    """A text query parameter (a filter); ``None`` when left out. Unless ``strict`` it is stripped and an
    empty one is left out; ``strict``, an empty value or one with surrounding spaces is refused. 400
    ``invalid_query`` when too long or not storable text."""
    raw = query.get(name)
    if raw is None:
        return None
    value = raw if strict else raw.strip()
    if strict and (not value or value != value.strip()):
        raise ApiError(
            400, "invalid_query", f"{name} must not be empty or start or end with a space: leave it out"
        )
    if len(value) > max_chars:
        raise ApiError(400, "invalid_query", f"{name} is longer than {max_chars} characters")
    problem = text_problem(value)
    if problem is not None:
        raise ApiError(400, "invalid_query", f"{name} {problem}")
    return value or None


def parse_id(raw: str, what: str, not_found: str) -> int:
    """A record's id from a path or a form: 400 ``invalid_id`` when not a number, 404 ``not_found`` when no
    such record can have it."""
    if not (raw.isascii() and raw.isdigit()):
        raise ApiError(400, "invalid_id", f"the {what} id must be a positive integer")
    value = int(raw)
    if not 0 < value <= MAX_ID:
        raise ApiError(404, not_found, f"no {what} {raw}")
    return value


def parse_procurement_id(raw: str) -> int:
    """A procurement id: 404 ``procurement_not_found`` when no procurement can have it."""
    return parse_id(raw, "procurement", "procurement_not_found")


def parse_provider_order_id(raw: str) -> int:
    """A provider order id: 404 ``order_not_found`` when no order can have it."""
    return parse_id(raw, "provider order", "order_not_found")


async def json_object(
    request: web.Request, *, allowed: set[str] | None = None, optional: bool = False
) -> dict[str, Any]:
    """The JSON object sent (``{}`` for no body at all when ``optional``); 400 ``invalid_json`` /
    ``invalid_request`` for anything else (a body of only spaces is not JSON) or, with ``allowed``, a field
    not in it."""
    raw = await read_body(request)
    if optional and not raw:
        return {}
    body = decode_json(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - allowed) if allowed is not None else []
    if unknown:
        raise ApiError(400, "invalid_request", f"unknown field {unknown[0]!r}")
    return body
