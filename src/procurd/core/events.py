"""Storefront events (pure): what the storefront's webhook receives when an order's status changes.

The event's name comes from :func:`procurd.core.orders.event_for`; its payload carries the order view as
``GET /api/v1/orders/{order_no}`` answers it at the moment of the change (INTERFACE.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from procurd.core.orders import Order, order_view
from procurd.core.procurement import Procurement


def order_event(
    name: str, event_id: str, now: datetime, order: Order, items: Sequence[Procurement]
) -> dict[str, Any]:
    """The payload of storefront event ``name`` (``order.delivered`` ...) about ``order`` and ``items``."""
    return {
        "event": name,
        "timestamp": int(now.timestamp()),
        "order": order_view(order, items),
        "event_id": event_id,
    }
