"""The local order's status (seed 001's order statuses) derived from its procurements (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from procurd.procurement.model import State


@dataclass(frozen=True, slots=True)
class ItemState:
    state: State
    attempted: bool  # a submission was ever attempted
    delivered: bool  # holds a fulfillment (a resolved item may too)


def derive_status(items: Iterable[ItemState]) -> tuple[str, bool]:
    """``(status, exception)`` of an order.

    * ``canceled``: every item canceled (or closed by hand without delivery, when nothing was delivered);
    * ``delivered``: every item that is not canceled or closed is delivered;
    * ``partially_delivered``: some delivered, others still open;
    * ``fulfilling``: something has gone upstream;
    * ``paid``: accepted, nothing sent yet.

    ``exception`` is true while any item is in state ``exception``.
    """
    items = list(items)
    exception = any(item.state is State.EXCEPTION for item in items)
    delivered = [item for item in items if item.delivered]
    closed = [item for item in items if not item.delivered and item.state in (State.CANCELED, State.RESOLVED)]
    open_items = [item for item in items if not item.delivered and item not in closed]
    if not open_items:
        if delivered:
            return "delivered", exception
        return "canceled", exception
    if delivered:
        return "partially_delivered", exception
    if any(item.attempted or item.state is State.SUBMITTED for item in open_items):
        return "fulfilling", exception
    return "paid", exception


def event_for(old: tuple[str, bool] | None, new: tuple[str, bool]) -> str | None:
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
