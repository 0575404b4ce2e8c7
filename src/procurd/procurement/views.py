"""The order view of the HTTP API and the storefront events (INTERFACE.md), built from database rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from procurd.procurement.model import State
from procurd.procurement.order_status import ItemState


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


def procurement_view(row: Any) -> dict[str, Any]:
    return {
        "id": row.id,
        "downstream_order_no": row.downstream_order_no,
        "upstream": row.upstream,
        "sku_id": row.sku_id,
        "quantity": row.quantity,
        "state": row.state,
        "upstream_status": row.upstream_status,
        "upstream_order_id": row.upstream_order_id,
        "upstream_order_no": row.upstream_order_no,
        "amount": row.amount,
        "currency": row.currency,
        "attempts": row.attempts,
        "last_error_code": row.last_error_code,
        "last_error_message": row.last_error_message,
        "exception_reason": row.exception_reason,
        "unit_price": row.unit_price,
        "max_unit_price": row.max_unit_price,
        "fulfillment_type": row.fulfillment_type,
        "resolution_note": row.resolution_note,
        "fulfillment": fulfillment_view(row.fulfillment),
        "created_at": iso(row.created_at),
        "updated_at": iso(row.updated_at),
    }


def exception_view(row: Any) -> dict[str, Any]:
    return dict(procurement_view(row), order_no=row.order_no)


def order_view(
    order: Any, items: Sequence[Any], numbers: Mapping[int, list[str]] | None = None
) -> dict[str, Any]:
    views = []
    for item in items:
        view = procurement_view(item)
        if numbers is not None:
            view["downstream_order_nos"] = numbers.get(item.id, [item.downstream_order_no])
        views.append(view)
    return {
        "order_no": order.order_no,
        "status": order.status,
        "exception": bool(order.exception),
        "trace_id": order.trace_id,
        "created_at": iso(order.created_at),
        "updated_at": iso(order.updated_at),
        "procurements": views,
    }


def item_state(row: Any) -> ItemState:
    return ItemState(
        state=State(row.state),
        attempted=row.attempts > 0 or row.upstream_order_id is not None,
        delivered=row.fulfillment is not None and row.state in (State.DELIVERED.value, State.RESOLVED.value),
    )
