"""The upstream's answer to ``GET /orders/{id}``, as the state path takes it (a poll's, reconciliation's, or
the one that confirms a callback's claim), and a finding where the upstream and procurd disagree."""

from __future__ import annotations

from datetime import datetime

from procurd.core.procurement import Procurement, UpstreamReport
from procurd.core.reconcile import Mismatch
from procurd.db.reconcile_store import Finding
from procurd.upstream.models import UpstreamOrder


def report_of(order: UpstreamOrder, *, polled: bool = True, verified: bool = False) -> UpstreamReport:
    """The upstream's answer to ``GET /orders/{id}`` as a report (``verified``: it confirmed a claim)."""
    return UpstreamReport(
        order_id=order.order_id,
        status=order.status,
        order_no=order.order_no,
        fulfillment=order.fulfillment.to_json() if order.fulfillment is not None else None,
        amount=None if order.amount is None else str(order.amount),
        currency=order.currency,
        refunded_amount=None if order.refunded_amount is None else str(order.refunded_amount),
        polled=polled,
        verified=verified,
    )


def answer_problem(procurement: Procurement, order: UpstreamOrder) -> str | None:
    """Why the upstream's answer for the procurement's recorded order is not about that order (another id,
    or another downstream number than the procurement's): it is then not adopted."""
    if order.order_id != procurement.upstream_order_id:
        asked = procurement.upstream_order_id
        return f"asked for order {asked}, the upstream answered order {order.order_id}"
    number = order.downstream_order_no
    if number and number not in procurement.downstream_order_nos:
        return f"the upstream holds order {order.order_id} under another downstream_order_no"
    return None


def finding_of(p: Procurement, mismatch: Mismatch, repair: str | None, now: datetime) -> Finding:
    """The finding that ``p`` and the upstream disagree on ``mismatch`` (``repair``: what was done about it),
    found ``now``: a reconciliation's, or goods that came after a person resolved ``p``."""
    return Finding(
        procurement_id=p.id,
        order_no=p.order_no,
        upstream=p.upstream,
        downstream_order_no=p.downstream_order_no,
        upstream_order_id=p.upstream_order_id,
        field=mismatch.field,
        local_value=mismatch.local,
        upstream_value=mismatch.upstream,
        repair=repair,
        found_at=now,
    )
