"""Operations that keep an installation in order and tell people about it: retention, the periodic checks,
the alerts, and the status report."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from procurd.catalog.sync import SyncReport
from procurd.config import Settings
from procurd.core.alerts import KINDS, Kind, Occurrence
from procurd.core.clock import utcnow
from procurd.core.refusals import Refused
from procurd.db.database import Database
from procurd.operations.alerts import Alerts, SendResult, alert_view, reachability, send, shown_url
from procurd.operations.retention import TABLES, PruneReport, prune
from procurd.operations.runtime import Runtime
from procurd.operations.status import last_sync, refresh_metrics, status_report

__all__ = ["TABLES", "HousekeepingOperations", "PruneReport", "SendResult"]

TEST_TITLE = "procurd test alert"
TEST_BODY = "This is a test of procurd's alerts. Nothing needs doing."


class HousekeepingOperations:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def prune(self) -> PruneReport:
        """Apply ``[retention]`` now; 409 ``prune_in_progress`` while another process prunes."""
        runtime = self.runtime
        report = await prune(runtime.database, runtime.settings.retention, runtime.instance)
        if report.skipped:
            raise Refused(
                409, "prune_in_progress", "another instance is pruning now; try again when it is done"
            )
        return report

    async def check_stuck_orders(self) -> int:
        """Alert ``order_stuck`` for procurements submitted too long ago and not delivered; how many."""
        runtime = self.runtime
        return await stuck_orders(runtime.database, runtime.settings, runtime.alerts)

    async def status(self) -> dict[str, Any]:
        """The status report (``GET /api/v1/status``)."""
        return await status_report(self.runtime)

    async def last_sync(self, upstream: str) -> SyncReport | None:
        """The most recent catalogue pass of ``upstream`` that ran (the one under way while one runs)."""
        return await last_sync(self.runtime, upstream)

    async def refresh_metrics(self) -> dict[str, Any]:
        """The gauges of ``/metrics`` set from a fresh status report (and this instance's own); the report."""
        return await refresh_metrics(self.runtime)

    async def alerts(
        self, page: int, page_size: int, kind: str | None = None
    ) -> tuple[int, list[dict[str, Any]]]:
        """Recent alerts, the latest first; 400 ``unknown_kind`` for a kind procurd does not raise."""
        if kind is not None and kind not in KINDS:
            raise Refused(400, "unknown_kind", f"no alert kind {kind!r} (known: {', '.join(KINDS)})")
        total, found = await self.runtime.alerts.recent(page, page_size, kind)
        return total, [alert_view(alert) for alert in found]


async def send_test_alert(settings: Settings) -> list[SendResult]:
    """Send a test message to every ``[alerts] urls`` entry; how each answered (no database needed)."""
    urls = settings.alerts.urls
    if not urls:
        raise Refused(
            400,
            "no_alert_urls",
            "no [alerts] urls are configured: alerts are only recorded (procurd alerts list)",
        )
    return await send(urls, TEST_TITLE, TEST_BODY)


async def alert_url_problems(settings: Settings) -> list[tuple[str, str | None]]:
    """Each ``[alerts] urls`` entry as it may be shown, and why it cannot be used (not a notification URL
    Apprise knows, or its host refuses a connection), or ``None``. Nothing is sent."""
    urls = settings.alerts.urls
    return [(shown_url(url), problem) for url, problem in zip(urls, await reachability(urls), strict=True)]


async def stuck_orders(database: Database, settings: Settings, alerts: Alerts) -> int:
    """An ``order_stuck`` alert for each submitted procurement undelivered for ``stuck_after_seconds`` that
    has none for this wait yet; how many were raised."""
    cutoff = utcnow() - timedelta(seconds=settings.alerts.stuck_after_seconds)
    stuck = await database.read(lambda tx: tx.procurements.stuck_without_alert(cutoff))
    occurrences = [
        Occurrence(
            Kind.ORDER_STUCK,
            p.order_no,
            f"order {p.order_no}: item {p.downstream_order_no} on {p.upstream} was submitted "
            f"{p.submitted_at.isoformat() if p.submitted_at else '?'} (upstream order {p.upstream_order_id}, "
            f"status {p.upstream_status}) and is not delivered yet; callbacks may be lost: check the "
            "upstream order, then wait, or cancel upstream-first",
            p.upstream,
        )
        for p in stuck
    ]
    await alerts.raise_(*occurrences)
    return len(occurrences)
