"""What a person (or a storefront) reads of the procurements, kept apart from the commands that change them.

The order view, one procurement, a page of the exception queue, an order's audit trail, the exception
reasons procurd knows and the check of an exception filter, an intake's preview, and when an upstream's next
submission falls due. The admin API, the console, the command line (through
:mod:`procurd.operations.orders`) and the provider's operations read through these; each is one read
transaction, and none changes anything.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from procurd.core.intake import OrderRequest
from procurd.core.orders import exception_view, iso, order_view
from procurd.core.procurement import Reason
from procurd.db.procurement_store import AuditRow
from procurd.operations.runtime import Runtime
from procurd.procurement.admission import preview, preview_facts
from procurd.upstream.errors import AUTH_ERROR_CODES, BUSINESS_ERROR_CODES

# Exception reasons: procurd's own, and the upstream's refusal codes it records as they come.
ASSIGNED_REASONS = frozenset(
    {reason.value for reason in Reason}
    | AUTH_ERROR_CODES
    | BUSINESS_ERROR_CODES
    | {"auth_error", "business_error"}
)


class ProcurementViews:
    """The reads of one runtime's procurements."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def order(self, order_no: str) -> dict[str, Any] | None:
        """The order view (``GET /api/v1/orders/{order_no}``); ``None`` when there is no such order."""
        found = await self.runtime.database.read(lambda tx: tx.procurements.order(order_no))
        return None if found is None else order_view(*found)

    async def procurement(self, procurement_id: int) -> dict[str, Any] | None:
        """One procurement as the exception queue shows it; ``None`` when there is none."""
        found = await self.runtime.database.read(lambda tx: tx.procurements.procurement(procurement_id))
        return None if found is None else exception_view(found)

    async def exceptions(
        self, upstream: str | None, reason: str | None, page: int, page_size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """A page of the exception queue, oldest first, and how many match in all."""
        total, items = await self.runtime.database.read(
            lambda tx: tx.procurements.exceptions(upstream, reason, page, page_size)
        )
        return total, [exception_view(item) for item in items]

    async def audit(self, order_no: str) -> list[dict[str, Any]]:
        """The order's audit trail, oldest first."""
        rows = await self.runtime.database.read(lambda tx: tx.procurements.audit_trail(order_no))
        return [_audit_entry(row) for row in rows]

    async def filter_problem(self, upstream: str | None, reason: str | None) -> tuple[str, str] | None:
        """``(code, message)`` when an exception filter names no upstream or reason procurd knows (a typo),
        with the known values; ``None`` when it is fine."""
        names = self.runtime.service.upstream_names
        if upstream is not None and upstream not in names:
            return "unknown_upstream", f"no upstream {upstream!r} (configured: {', '.join(names)})"
        if reason is not None:
            reasons = await self.known_reasons()
            if reason not in reasons:
                return "unknown_reason", f"no exception reason {reason!r} (known: {', '.join(reasons)})"
        return None

    async def known_reasons(self) -> list[str]:
        """Every exception reason procurd assigns, and those the database holds (upstreams may add codes)."""
        held = await self.runtime.database.read(lambda tx: tx.procurements.exception_reasons())
        found = {reason for reasons in held.values() for reason in reasons}
        return sorted(ASSIGNED_REASONS | found)

    async def preview(self, request: OrderRequest) -> dict[str, Any]:
        """What intake would do with ``request`` now, writing nothing (``POST /api/v1/orders/preview``; see
        :func:`procurd.procurement.admission.preview`)."""
        service = self.runtime.service
        rules = service.rules
        request = request.with_upstream(rules.default_upstream)
        facts = await self.runtime.database.read(preview_facts, request)
        return preview(
            request, facts, upstreams=rules.upstreams, pricing=rules.pricing, policy=rules.policy,
            now=service.clock(),
        )  # fmt: skip

    async def next_submission_due(self, upstream: str) -> datetime | None:
        """When the earliest queued procurement of ``upstream`` can next be claimed (a claimed one counts
        from its claim's expiry); ``None`` when none is queued. (A submitter learns it from its claim.)"""
        return await self.runtime.database.read(lambda tx: tx.procurements.next_submission_due(upstream))


def _audit_entry(row: AuditRow) -> dict[str, Any]:
    return {
        "at": iso(row.at),
        "procurement_id": row.procurement_id,
        "source": row.source,
        "event": row.event,
        "old_state": row.old_state,
        "new_state": row.new_state,
        "detail": row.detail,
        "count": row.count,
        "last_at": iso(row.last_at) if row.last_at is not None else None,
    }
