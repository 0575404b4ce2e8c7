"""Orders (pure): the local order's status derived from its procurements, its storefront events, and the
order view of the HTTP API and the storefront events (INTERFACE.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from procurd.core.json_limits import text_problem
from procurd.core.procurement import Procurement, State
from procurd.core.refusals import Refused

MAX_NOTE_CHARS = 4000  # a person's note on an order, a wallet movement, an exception


@dataclass(frozen=True, slots=True, kw_only=True)
class Order:
    """One local order as stored (``orders`` row)."""

    order_no: str
    trace_id: str | None
    fingerprint: str
    status: str
    exception: bool
    created_at: datetime
    updated_at: datetime
    provider: bool = False  # taken in from a downstream site: a provider order follows it


OrderStatus = tuple[str, bool]
"""``(status, exception)`` of an order."""


def derive_status(items: Iterable[Procurement]) -> OrderStatus:
    """``(status, exception)`` of an order from its procurements: the one rule, which the README's order view
    and the console describe with :data:`STATUS_MEANINGS`.

    An item is *open* until it is delivered, canceled or closed by a person; an open item is *under way
    upstream* while the upstream holds, or may hold, a live order for it (:attr:`Procurement.under_way`).

    * ``canceled``: no item open and none delivered;
    * ``delivered``: no item open, at least one delivered;
    * ``partially_delivered``: some delivered, others still open;
    * ``fulfilling``: nothing delivered yet, and an open item is under way upstream;
    * ``paid``: accepted, nothing bought: every open item waits to be sent, is being sent for the first
      time, or was refused before any live upstream order (``insufficient_stock``, ``payment_failed``,
      ``invalid_callback_url`` ...: then with ``exception``).

    ``exception`` is true while any item is in state ``exception``.
    """
    items = list(items)
    exception = any(item.state is State.EXCEPTION for item in items)
    delivered = [item for item in items if item.holds_fulfillment]
    closed = [
        item
        for item in items
        if not item.holds_fulfillment and item.state in (State.CANCELED, State.RESOLVED)
    ]
    open_items = [item for item in items if not item.holds_fulfillment and item not in closed]
    if not open_items:
        return ("delivered" if delivered else "canceled"), exception
    if delivered:
        return "partially_delivered", exception
    if any(item.under_way for item in open_items):
        return "fulfilling", exception
    return "paid", exception


STATUS_MEANINGS = {
    "paid": "accepted; nothing bought upstream yet",
    "fulfilling": "bought (or possibly bought) upstream, waiting for the delivery",
    "partially_delivered": "some items delivered, others still open",
    "delivered": "every item delivered (items canceled or closed by hand aside)",
    "canceled": "nothing delivered, and nothing left open",
}
"""What each order status means, in the words the console shows beside it."""


def event_for(old: OrderStatus | None, new: OrderStatus) -> str | None:
    """The storefront event for a change of ``(status, exception)``, or ``None`` when nothing changed."""
    if old == new:
        return None
    status, exception = new
    if exception and (old is None or not old[1]):
        return "order.exception"
    if old is None or old[0] != status:
        if status == "delivered":
            return "order.delivered"
        if status == "partially_delivered":
            return "order.partially_delivered"
        if status == "canceled":
            return "order.canceled"
    return "order.status_changed"


# --- views ------------------------------------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def fulfillment_view(raw: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Seed 001's Fulfillment: the upstream's fields plus ``payload_line_count``."""
    if not raw:
        return None
    payload = raw.get("payload")
    text = payload if isinstance(payload, str) else ""
    return {
        "type": raw.get("type"),
        "status": raw.get("status", "delivered"),
        "payload": payload,
        "payload_line_count": sum(1 for line in text.splitlines() if line.strip()),
        "delivery_data": raw.get("delivery_data"),
        "delivered_at": raw.get("delivered_at"),
    }


def procurement_view(p: Procurement) -> dict[str, Any]:
    return {
        "id": p.id,
        "downstream_order_no": p.downstream_order_no,
        "upstream": p.upstream,
        "sku_id": p.sku_id,
        "quantity": p.quantity,
        "state": p.state.value,
        "upstream_status": p.upstream_status,
        "upstream_order_id": p.upstream_order_id,
        "upstream_order_no": p.upstream_order_no,
        "amount": p.amount,
        "currency": p.currency,
        "attempts": p.attempts,
        "last_error_code": p.last_error_code,
        "last_error_message": p.last_error_message,
        "exception_reason": p.exception_reason,
        "unit_price": p.unit_price,
        "max_unit_price": p.max_unit_price,
        "unit_limit": p.unit_limit,
        "offer": p.offer_code,
        "failovers": [dict(hop) for hop in p.failovers],
        "fulfillment_type": p.fulfillment_type,
        "resolution_note": p.resolution_note,
        "fulfillment": fulfillment_view(p.fulfillment),
        "created_at": iso(p.created_at),
        "updated_at": iso(p.updated_at),
    }


def exception_view(p: Procurement) -> dict[str, Any]:
    """An item of the exception queue: the procurement with its order number."""
    return dict(procurement_view(p), order_no=p.order_no)


def order_view(order: Order, items: Sequence[Procurement]) -> dict[str, Any]:
    views = [
        dict(procurement_view(item), downstream_order_nos=list(item.downstream_order_nos)) for item in items
    ]
    return {
        "order_no": order.order_no,
        "status": order.status,
        "exception": order.exception,
        "trace_id": order.trace_id,
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
        "procurements": views,
    }


def check_note(note: Any, *, required: bool) -> str | None:
    """A person's note: stripped, ``None`` when empty and optional; 400 ``note_required`` when required and
    missing, 400 ``invalid_request`` when too long or not storable text."""
    if note is None and not required:
        return None
    if not isinstance(note, str) or (required and not note.strip()):
        raise Refused(400, "note_required", "note must be a non-empty string")
    if len(note) > MAX_NOTE_CHARS:
        raise Refused(400, "invalid_request", f"note is longer than {MAX_NOTE_CHARS} characters")
    problem = text_problem(note)
    if problem is not None:
        raise Refused(400, "invalid_request", f"note {problem}")
    return note.strip() or None
