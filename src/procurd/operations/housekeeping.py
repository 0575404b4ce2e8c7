"""Operations that keep an installation in order and tell people about it: retention, the periodic checks,
the alerts, and the status report."""

from __future__ import annotations

from typing import Any

from procurd.alerts import SendResult, alert_view, reachability, send, shown_url
from procurd.config import Settings
from procurd.core.alerts import KINDS
from procurd.core.refusals import Refused
from procurd.retention import TABLES, PruneReport, prune
from procurd.runtime import Runtime
from procurd.status import status_report
from procurd.watch import stuck_orders

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
