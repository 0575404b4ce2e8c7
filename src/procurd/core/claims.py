"""Claims checked (pure): does the upstream's own answer confirm what a report claimed?

A callback may name an upstream order that procurd has not recorded for the procurement (the answer to its
submission was lost, or has not arrived yet). Such a claim changes nothing until the upstream, asked with a
signed ``GET /orders/{order_id}``, answers with that very order, under that ``downstream_order_no``, in a
status that supports the change the claim asks for.
"""

from __future__ import annotations

from procurd.core.procurement import CANCELED_STATUS, DELIVERED_STATUSES, REFUNDED_STATUSES

# Statuses after which an order is no longer live: a claim of a live status is not supported by them.
_ENDED = frozenset({CANCELED_STATUS, *REFUNDED_STATUSES})


def supports(claimed: str, answered: str) -> bool:
    """Whether the upstream's answered status supports the claimed one: a delivery by a delivered (or
    completed) order, a cancel by a canceled one, a refund by a refunded one, and any other (live) status by
    an order that is not canceled or refunded (it may have moved on since)."""
    if claimed in DELIVERED_STATUSES:
        return answered in DELIVERED_STATUSES
    if claimed == CANCELED_STATUS:
        return answered == CANCELED_STATUS
    if claimed in REFUNDED_STATUSES:
        return answered in REFUNDED_STATUSES
    return answered not in _ENDED


def claim_problem(
    *,
    number: str,
    claimed_order_id: int,
    claimed_status: str,
    answered_order_id: int,
    answered_number: str | None,
    answered_status: str,
) -> str | None:
    """Why the upstream's answer does not confirm the claim about the order under ``number``; ``None`` when
    it does."""
    if answered_order_id != claimed_order_id:
        return f"the upstream answered order {answered_order_id} when asked for order {claimed_order_id}"
    if not answered_number:
        return f"the upstream's order {answered_order_id} names no downstream_order_no"
    if answered_number != number:
        return f"the upstream holds order {answered_order_id} under another downstream_order_no"
    if not supports(claimed_status, answered_status):
        return f"the upstream says order {answered_order_id} is {answered_status}, not {claimed_status}"
    return None
