"""Reconciliation (pure): where a procurement and the upstream's order disagree."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from procurd.core.procurement import (
    CANCELED_STATUS,
    DELIVERED_STATUSES,
    REFUNDED_STATUSES,
    Procurement,
    State,
)


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One field on which procurd and the upstream disagree."""

    field: str  # status | amount | currency | order | goods
    local: str | None
    upstream: str | None


GOODS_RECORDED = "goods_recorded"  # the repair of goods that came for a resolved procurement: kept with it


def goods_after_resolution(p: Procurement, status: str) -> Mismatch:
    """The finding for goods the upstream delivered (in ``status``) for ``p`` after a person resolved it."""
    return Mismatch("goods", p.state.value, status)


def status_class(status: str | None) -> str:
    """What an upstream status means for procurd: delivered, canceled, refunded, or live (anything else)."""
    if status in DELIVERED_STATUSES:
        return "delivered"
    if status == CANCELED_STATUS:
        return "canceled"
    if status in REFUNDED_STATUSES:
        return "refunded"
    return "live"


def local_class(p: Procurement) -> str:
    """What procurd holds the upstream order to be, in the classes of :func:`status_class`."""
    if p.state is State.DELIVERED:
        return "delivered"
    if p.state is State.CANCELED:
        return "canceled"
    return status_class(p.upstream_status)


def mismatches(p: Procurement, status: str, amount: str | None, currency: str | None) -> list[Mismatch]:
    """Where the upstream's order (``status``, ``amount``, ``currency``) disagrees with ``p``."""
    found = []
    if local_class(p) != status_class(status):
        found.append(Mismatch("status", p.upstream_status or p.state.value, status))
    if amount is not None and p.amount is not None and _decimal(amount) != _decimal(p.amount):
        found.append(Mismatch("amount", p.amount, amount))
    if currency is not None and p.currency is not None and currency != p.currency:
        found.append(Mismatch("currency", p.currency, currency))
    return found


def _decimal(text: str) -> Decimal | str:
    try:
        return Decimal(text)
    except InvalidOperation:
        return text
