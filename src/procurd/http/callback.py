"""The upstream's callback body (seed 000, 4.8): strict parsing into an :class:`UpstreamReport` (pure).

Required: ``order_id`` (an integer, not a boolean or a string), ``downstream_order_no`` and ``status``
(non-empty strings). Optional: ``event``, ``order_no``, ``fulfillment`` (an object with seed 000 2.5's
fields), ``timestamp`` (a number). Fields an upstream adds beyond these are tolerated and ignored. No text
procurd keeps may hold a NUL character or an unpaired surrogate, and a fulfillment nests at most 32 levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from procurd.core.exact import loads_exact
from procurd.core.json_limits import json_problem, raw_json_is_plain, text_problem
from procurd.core.numbers import MAX_ID
from procurd.core.procurement import UpstreamReport
from procurd.upstream.models import Fulfillment

MAX_NUMBER_CHARS = 96  # the longest downstream / upstream order number procurd stores
MAX_STATUS_CHARS = 32
MAX_EVENT_CHARS = 64
FULFILLMENT_TEXT_FIELDS = ("type", "status", "payload", "delivered_at")


class CallbackBodyError(Exception):
    """The body is not a callback procurd can read; the message names the field, never its content."""


@dataclass(frozen=True, slots=True)
class Callback:
    downstream_order_no: str
    report: UpstreamReport
    event: str | None


def parse_callback(raw: bytes) -> Callback:
    """Parse and check one callback body; raise :class:`CallbackBodyError` on any problem."""
    try:
        data = loads_exact(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise CallbackBodyError("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise CallbackBodyError("the body must be a JSON object")
    walk = not raw_json_is_plain(raw)
    order_id = data.get("order_id")
    if isinstance(order_id, bool) or not isinstance(order_id, int):
        raise CallbackBodyError("order_id is required and must be an integer")
    if not 0 < order_id <= MAX_ID:
        raise CallbackBodyError("order_id is out of range")
    number = _text(data, "downstream_order_no", MAX_NUMBER_CHARS, walk, required=True)
    status = _text(data, "status", MAX_STATUS_CHARS, walk, required=True)
    assert number is not None
    assert status is not None
    event = _text(data, "event", MAX_EVENT_CHARS, walk)
    order_no = _text(data, "order_no", MAX_NUMBER_CHARS, walk) or None
    timestamp = data.get("timestamp")
    if timestamp is not None and (isinstance(timestamp, bool) or not isinstance(timestamp, int | Decimal)):
        raise CallbackBodyError("timestamp must be a number")
    fulfillment = _fulfillment(data.get("fulfillment"), walk)
    report = UpstreamReport(order_id=order_id, status=status, order_no=order_no, fulfillment=fulfillment)
    return Callback(number, report, event)


def _text(data: dict[str, Any], key: str, limit: int, walk: bool, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None:
        if required:
            raise CallbackBodyError(f"{key} is required")
        return None
    if not isinstance(value, str):
        raise CallbackBodyError(f"{key} must be a string")
    if required and not value.strip():
        raise CallbackBodyError(f"{key} must not be empty")
    if len(value) > limit:
        raise CallbackBodyError(f"{key} is longer than {limit} characters")
    problem = text_problem(value) if walk else None
    if problem is not None:
        raise CallbackBodyError(f"{key} {problem}")
    return value


def _fulfillment(value: Any, walk: bool) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CallbackBodyError("fulfillment must be an object")
    for key in FULFILLMENT_TEXT_FIELDS:
        if value.get(key) is not None and not isinstance(value[key], str):
            raise CallbackBodyError(f"fulfillment.{key} must be a string")
    delivery_data = value.get("delivery_data")
    if delivery_data is not None and not isinstance(delivery_data, dict):
        raise CallbackBodyError("fulfillment.delivery_data must be an object or null")
    problem = json_problem(value) if walk else None
    if problem is not None:
        raise CallbackBodyError(f"fulfillment cannot be stored: {problem}")
    try:
        # The same normalisation as a polled order's fulfillment, so both paths store identical data.
        return Fulfillment.model_validate(value).to_json()
    except ValidationError:
        raise CallbackBodyError("fulfillment has fields of the wrong type") from None
