"""What the JSON admin API and the web console both do, so that both answer alike and take the same path.

Inputs are checked here (query parameters, ids, notes, filters) and every operator action — retry, resolve,
bulk retry, cancel — goes through :class:`~procurd.procurement.service.ProcurementService` with
``Source.ADMIN``. Failures are :class:`~procurd.http.errors.ApiError`: the JSON API answers them as JSON,
the console as an error page.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from procurd.core.numbers import MAX_ID, ORDER_NO_PATTERN
from procurd.core.procurement import NotAllowed, Resolve, Retry, Source
from procurd.http.errors import ApiError
from procurd.http.json_limits import text_problem
from procurd.procurement import cancel
from procurd.procurement.service import MAX_BULK_RETRY
from procurd.runtime import Runtime

log = structlog.get_logger("procurd.admin")

DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 100
MAX_PAGE = 1_000_000
MAX_FILTER_CHARS = 64
MAX_NOTE_CHARS = 4000


def query_int(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """An integer query parameter from ``low`` to ``high``; 400 ``invalid_query`` otherwise."""
    raw = query.get(name, "").strip()
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise ApiError(400, "invalid_query", f"{name} must be an integer from {low} to {high}")
    return int(raw)


def query_text(query: Mapping[str, str], name: str, max_chars: int = MAX_FILTER_CHARS) -> str | None:
    """A text query parameter (a filter), stripped; ``None`` when empty; 400 ``invalid_query`` when too
    long or not storable text."""
    value = query.get(name, "").strip()
    if len(value) > max_chars:
        raise ApiError(400, "invalid_query", f"{name} is longer than {max_chars} characters")
    problem = text_problem(value)
    if problem is not None:
        raise ApiError(400, "invalid_query", f"{name} {problem}")
    return value or None


def order_not_found(order_no: str) -> ApiError:
    return ApiError(404, "order_not_found", f"no order {order_no!r}")


def check_order_no(order_no: str) -> str:
    """An order number from a path; one that no order can have is answered 404 without asking the
    database."""
    if not ORDER_NO_PATTERN.fullmatch(order_no):
        raise order_not_found(order_no)
    return order_no


def parse_procurement_id(raw: str) -> int:
    if not (raw.isascii() and raw.isdigit()):
        raise ApiError(400, "invalid_id", "the procurement id must be a positive integer")
    value = int(raw)
    if not 0 < value <= MAX_ID:
        raise ApiError(404, "procurement_not_found", f"no procurement {raw}")
    return value


def check_note(note: Any, *, required: bool) -> str | None:
    """A person's note: stripped, ``None`` when empty and optional; 400 ``note_required`` when required and
    missing, 400 ``invalid_request`` when too long."""
    if note is None and not required:
        return None
    if not isinstance(note, str) or (required and not note.strip()):
        raise ApiError(400, "note_required", "note must be a non-empty string")
    if len(note) > MAX_NOTE_CHARS:
        raise ApiError(400, "invalid_request", f"note is longer than {MAX_NOTE_CHARS} characters")
    problem = text_problem(note)
    if problem is not None:
        raise ApiError(400, "invalid_request", f"note {problem}")
    return note.strip() or None


def check_bulk_limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_BULK_RETRY:
        raise ApiError(400, "invalid_request", f"limit must be an integer from 1 to {MAX_BULK_RETRY}")
    return limit


async def handle_exception(runtime: Runtime, procurement_id: int, event: Retry | Resolve) -> dict[str, Any]:
    """Retry or resolve one exception as a person (``Source.ADMIN``, the note in the audit trail).

    Returns the procurement and its order, as the JSON API answers them; 409 with the refusal's code when
    the action does not apply, 404 when there is no such procurement.
    """
    service = runtime.service
    try:
        applied = await service.apply(procurement_id, event, Source.ADMIN)
    except NotAllowed as exc:
        raise ApiError(409, exc.code, exc.message) from None
    if applied is None:
        raise ApiError(404, "procurement_not_found", f"no procurement {procurement_id}")
    log.info("exception.handled", procurement_id=procurement_id, action=applied.decision.event)
    return {
        "procurement": await service.procurement(procurement_id),
        "order": await service.order(applied.procurement.order_no),
    }


async def check_bulk_filter(
    runtime: Runtime, upstream: str | None, reason: str | None, everything: bool
) -> None:
    """A bulk retry names a reason or an upstream procurd knows, or asks for every exception."""
    if reason is None and upstream is None and not everything:
        raise ApiError(
            422, "filter_required", 'name a reason or an upstream, or send "all": true for every exception'
        )
    await check_known_filters(runtime, upstream, reason)


async def check_known_filters(runtime: Runtime, upstream: str | None, reason: str | None) -> None:
    """A filter naming no upstream or reason procurd knows is a typo: 400 naming the known values."""
    problem = await runtime.service.filter_problem(upstream, reason)
    if problem is not None:
        raise ApiError(400, *problem)


async def cancel_order(runtime: Runtime, order_no: str) -> dict[str, Any]:
    """Upstream-first cancel of the whole order; its order view, or 409 ``cancel_not_allowed`` with the
    reason of each item (``items``)."""
    try:
        view = await cancel.cancel_order(runtime.service, order_no, runtime.cancel_upstream)
    except cancel.OrderNotFound:
        raise order_not_found(order_no) from None
    except cancel.CancelDenied as exc:
        items = [
            {"procurement_id": item.procurement_id or None, "downstream_order_no": item.downstream_order_no,
             "reason": item.reason}
            for item in exc.items
        ]  # fmt: skip
        log.info("order.cancel_denied", order_no=order_no, reasons=[item["reason"] for item in items])
        raise ApiError(
            409, "cancel_not_allowed", f"order {order_no} cannot be canceled: {exc}", items=items
        ) from None
    log.info("order.canceled", order_no=order_no)
    return view
