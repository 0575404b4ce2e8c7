"""Telling a person: alerts recorded in ``alerts`` and sent through Apprise to the channels operators use.

Occurrences come from the state path (an exception opened is an effect of its transition, written in the
same transaction) and from the daemon's checks (balance, health, stuck orders, sync runs, rejected
callbacks, instances). The :class:`AlertDispatcher` sends what is due from the table, so delivery survives
restarts, a failing URL is retried with backoff, and no send ever holds up procurement.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog

from procurd.background import Worker
from procurd.config import AlertsSettings
from procurd.core.alerts import ERRORS, RECOVERIES, Alert, Occurrence
from procurd.core.clock import utcnow
from procurd.core.orders import iso
from procurd.core.procurement import ExceptionOpened
from procurd.db.database import Database
from procurd.db.errors import Conflict
from procurd.logs import register_secret, scrub
from procurd.metrics import Metrics
from procurd.procurement.transitions import Applied

log = structlog.get_logger("procurd.alerts")

SEND_LEASE = timedelta(seconds=120)
SEND_TIMEOUT_SECONDS = 30.0
SEND_BATCH = 20
# Threads that talk to notification services (each send to each URL holds one until it is answered).
_SENDERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="procurd-alerts")


class Alerts:
    """Raises alerts (records them, counts them, logs them) and wakes the dispatcher."""

    def __init__(self, database: Database, settings: AlertsSettings, metrics: Metrics) -> None:
        self.database = database
        self.settings = settings
        self.metrics = metrics
        self.wakeup = asyncio.Event()
        for url in settings.urls:
            _register_url_secrets(url)

    @property
    def delivering(self) -> bool:
        return bool(self.settings.urls)

    async def raise_(self, *occurrences: Occurrence) -> None:
        """Record ``occurrences`` (sent once due) and tell the log and the metrics."""
        if not occurrences:
            return
        now = utcnow()
        repeat_after = self.settings.repeat_after_seconds
        for attempt in range(2):
            try:
                await self.database.write(
                    lambda tx: tx.alerts.occur(occurrences, now, repeat_after, self.delivering)
                )
                break
            except Conflict:
                if attempt:  # another instance recorded the same new key at the same moment, twice
                    raise
        self.observe(occurrences)

    def observe(self, occurrences: Sequence[Occurrence]) -> None:
        """Occurrences just committed (by :meth:`raise_` or by the state path)."""
        for occurrence in occurrences:
            self.metrics.alerts.labels(occurrence.kind.value).inc()
            emit = (
                log.error
                if occurrence.kind in ERRORS
                else log.info
                if occurrence.kind in RECOVERIES
                else log.warning
            )
            emit(
                "alert.raised",
                kind=occurrence.kind.value,
                key=occurrence.key,
                upstream=occurrence.upstream,
                message=occurrence.message,
            )
        if occurrences and self.delivering:
            self.wakeup.set()

    def observe_applied(self, applied: Applied) -> None:
        """The state path opened an exception: its alert was written in the same transaction."""
        for effect in applied.decision.effects:
            if isinstance(effect, ExceptionOpened):
                p = applied.procurement
                self.metrics.alerts.labels("exception_opened").inc()
                log.warning(
                    "alert.raised",
                    kind="exception_opened",
                    key=f"exception_opened:{p.order_no}",
                    upstream=p.upstream,
                    reason=effect.reason,
                    code=effect.code,
                    message=effect.message,
                )
                if self.delivering:
                    self.wakeup.set()

    async def recent(self, page: int, page_size: int, kind: str | None = None) -> tuple[int, list[Alert]]:
        return await self.database.read(lambda tx: tx.alerts.recent(page, page_size, kind))


def alert_view(alert: Alert) -> dict[str, Any]:
    """An alert as ``GET /api/v1/alerts`` shows it."""
    return {
        "kind": alert.kind.value,
        "key": alert.key,
        "subject": alert.subject,
        "upstream": alert.upstream,
        "message": alert.message,
        "first_at": iso(alert.first_at),
        "last_at": iso(alert.last_at),
        "count": alert.count,
        "unsent": alert.unsent,
        "sent_at": iso(alert.sent_at),
        "send_due_at": iso(alert.send_due_at),
        "error": alert.error,
    }


@dataclass(frozen=True, slots=True)
class SendResult:
    """What one URL did with one message."""

    url: str  # without its secrets
    ok: bool
    error: str | None = None


class AlertDispatcher(Worker):
    """Sends the alerts that are due to every configured URL."""

    name = "alert dispatcher"

    def __init__(self, alerts: Alerts, owner: str, *, idle_seconds: float = 30.0) -> None:
        super().__init__()
        self.alerts = alerts
        self.owner = owner
        self.idle_seconds = idle_seconds
        self.wakeup = alerts.wakeup

    async def step(self) -> float | None:
        database = self.alerts.database
        now = utcnow()
        claimed = await database.write(
            lambda tx: tx.alerts.claim_sends(self.owner, now, now + SEND_LEASE, SEND_BATCH)
        )
        for alert in claimed:
            await self._send(alert)
        if len(claimed) == SEND_BATCH:
            return 0
        due = await database.read(lambda tx: tx.alerts.next_send_due())
        return None if due is None else (due - utcnow()).total_seconds()

    async def _send(self, alert: Alert) -> None:
        results = await send(self.alerts.settings.urls, alert.title, alert.body(), alert.kind in ERRORS)
        failed = [result for result in results if not result.ok]
        database = self.alerts.database
        now = utcnow()
        if not failed:
            repeat_after = self.alerts.settings.repeat_after_seconds
            await database.write(
                lambda tx: tx.alerts.settle_sent(alert.key, self.owner, alert.unsent, now, repeat_after)
            )
            return
        error = "; ".join(f"{result.url}: {result.error}" for result in failed)[:500]
        log.warning("alert.send_failed", key=alert.key, error=error, attempt=alert.attempts + 1)
        await database.write(lambda tx: tx.alerts.settle_failed(alert.key, self.owner, error, now))


async def send(urls: Sequence[str], title: str, body: str, error: bool = False) -> list[SendResult]:
    """Send one message to every URL (each on its own, so one failing URL names itself)."""
    return list(await asyncio.gather(*(_send_one(url, title, body, error) for url in urls)))


async def _send_one(url: str, title: str, body: str, error: bool) -> SendResult:
    shown = shown_url(url)
    try:
        return await _notify(url, shown, title, body, error)
    except Exception as exc:  # noqa: BLE001 - the notifier library failing is this URL failing, not procurd
        log.warning("alert.notifier_failed", url=shown, error=type(exc).__name__)
        return SendResult(shown, False, f"the notifier failed: {type(exc).__name__}")


async def _notify(url: str, shown: str, title: str, body: str, error: bool) -> SendResult:
    # Apprise is slow to load (its plugins are imported on first use) and its notifiers block, even behind
    # its async call: the whole send runs on a thread of its own, so that a dead or slow service, or the
    # first alert of a process, never stalls procurd's event loop.
    loop = asyncio.get_running_loop()
    sending = loop.run_in_executor(_SENDERS, _notify_blocking, url, shown, title, body, error)
    try:
        return await asyncio.wait_for(sending, SEND_TIMEOUT_SECONDS)
    except TimeoutError:
        return SendResult(shown, False, f"no answer within {SEND_TIMEOUT_SECONDS:g} s")


def load_notifiers(urls: Sequence[str]) -> None:
    """Import Apprise and the notifier of each URL (what the first send would otherwise do)."""
    import apprise

    notifier = apprise.Apprise()
    for url in urls:
        notifier.add(url)


def _notify_blocking(url: str, shown: str, title: str, body: str, error: bool) -> SendResult:
    import apprise

    notifier = apprise.Apprise()
    if not notifier.add(url):
        return SendResult(shown, False, "not a notification URL Apprise knows")
    notify_type = apprise.NotifyType.FAILURE if error else apprise.NotifyType.WARNING
    with apprise.LogCapture(level=logging.WARNING) as captured:  # type: ignore[no-untyped-call]
        ok = notifier.notify(title=title, body=body, notify_type=notify_type, timeout=SEND_TIMEOUT_SECONDS)
        log_text = _captured(captured)
    if ok:
        return SendResult(shown, True)
    return SendResult(
        shown, False, scrub(log_text.splitlines()[-1]) if log_text else "the service refused it"
    )


def _captured(capture: Any) -> str:
    with contextlib.suppress(Exception):
        return str(capture.getvalue()).strip()
    return ""


async def reachability(urls: Sequence[str], timeout: float = 5.0) -> list[str | None]:
    """For each URL, why it cannot be used (not an Apprise URL, or its host refuses a connection), or
    ``None``. Nothing is sent."""
    return list(await asyncio.gather(*(_reachable(url, timeout) for url in urls)))


async def _reachable(url: str, timeout: float) -> str | None:
    import apprise

    notifier = apprise.Apprise()
    if not notifier.add(url):
        return "not a notification URL Apprise knows"
    service = notifier[0]
    host = getattr(service, "host", None)
    if not host:
        return None  # a service without a host of its own (e-mail through a provider, say)
    secure = bool(getattr(service, "secure", False))
    port = getattr(service, "port", None) or (443 if secure else 80)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as exc:
        return f"{host}:{port} does not answer: {getattr(exc, 'strerror', None) or type(exc).__name__}"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


def shown_url(url: str) -> str:
    """A notification URL as it may be shown: its scheme and host, never the tokens in the rest."""
    scheme, _, rest = url.partition("://")
    host = rest.split("/", 1)[0].rsplit("@", 1)[-1]
    return f"{scheme}://{host}" if rest else scheme


def _register_url_secrets(url: str) -> None:
    """Notification URLs carry tokens: mask the whole URL and each part of it long enough to be one."""
    register_secret(url)
    _, _, rest = url.partition("://")
    for part in rest.replace("@", "/").replace(":", "/").replace("?", "/").replace("&", "/").split("/"):
        if len(part) >= 12:
            register_secret(part)
