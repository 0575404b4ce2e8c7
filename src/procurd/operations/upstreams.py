"""Operations that ask an upstream about itself or its orders: a ping, a probe of its dialect, a
reconciliation pass.

A ping from the command line, the daemon's schedule or ``procurd doctor`` is the same signed request through
the same budget, and records the same health row and alerts (``low_balance``). A probe
(:mod:`procurd.operations.probe`) starts with that ping.
"""

from __future__ import annotations

from typing import Any

from procurd.core.dialect import Learned, Point, dialect_text
from procurd.operations.pings import ping_upstream
from procurd.operations.probe import Probe, acg_faka_summary, probe
from procurd.operations.reconcile import ReconcileReport, finding_view, recent_runs, reconcile
from procurd.operations.runtime import Runtime
from procurd.protocol.acgfaka.client import Features
from procurd.protocol.acgfaka.upstream import AcgFakaUpstream
from procurd.upstream.errors import AuthError, UpstreamError
from procurd.upstream.models import PingResult
from procurd.upstream.ratelimit import Priority

__all__ = [
    "AuthError",
    "Features",
    "Learned",
    "PingResult",
    "Point",
    "Probe",
    "ReconcileReport",
    "UpstreamError",
    "UpstreamOperations",
    "acg_faka_summary",
    "dialect_text",
    "finding_view",
]


class UpstreamOperations:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def ping(self, upstream: str) -> PingResult | UpstreamError:
        """Ping ``upstream`` now (signed, at ping priority in the shared budget) and record the outcome: the
        health row, the balance, and alert ``low_balance`` when it is under the threshold."""
        return await ping_upstream(self.runtime, upstream)

    async def probe(self, upstream: str) -> Probe:
        """A read-only conversation with ``upstream`` that finds out the dialect it speaks (never orders)."""
        return await probe(self.runtime, upstream)

    async def features(self, upstream: str) -> Features | UpstreamError | None:
        """Which later endpoints an acg-faka supplier's version has (four read-only requests at ping
        priority); None for an upstream of another protocol."""
        client = self.runtime.client(upstream)
        if not isinstance(client, AcgFakaUpstream):
            return None
        try:
            return await client.features(priority=Priority.PING)
        except UpstreamError as exc:
            return exc

    async def dialect(self, upstream: str) -> Learned:
        """What ``upstream``'s answers have shown of its dialect so far."""
        return await self.runtime.database.read(lambda tx: tx.dialects.of(upstream))

    async def reconcile(
        self,
        *,
        upstream: str | None = None,
        window_seconds: float | None = None,
        repair: bool | None = None,
        trigger: str = "manual",
    ) -> ReconcileReport:
        """One reconciliation pass (``manual``: every procurement of the window that has an upstream order;
        ``scheduled``: those not settled in agreement, and the settled ones once a day)."""
        runtime = self.runtime
        settings = runtime.settings.reconcile
        return await reconcile(
            runtime.service,
            runtime.clients,
            runtime.alerts,
            upstream=upstream,
            window_seconds=window_seconds or settings.window_seconds,
            repair=settings.repair if repair is None else repair,
            trigger=trigger,
        )

    async def reconcile_runs(self, limit: int) -> list[dict[str, Any]]:
        """The last ``limit`` reconciliation passes, the newest first, each with its findings."""
        return await recent_runs(self.runtime.database, limit)
