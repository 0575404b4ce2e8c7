"""The parts of a running procurd, built once from the settings and shared by the daemon, the HTTP apps and
the command line."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import structlog

from procurd.alerts import Alerts
from procurd.catalog.pricing import RepriceReport, reprice_upstream
from procurd.catalog.sync import CatalogAlert, PageMemory, SyncOptions, SyncReport, run_sync
from procurd.config import Settings
from procurd.core.alerts import Kind, Occurrence
from procurd.db.database import Database, open_database
from procurd.db.errors import DatabaseError
from procurd.db.rate_budget import SharedBudget, budget_key
from procurd.db.types import utcnow
from procurd.instance import instance_id
from procurd.metrics import Metrics
from procurd.procurement.service import ProcurementService, Wakeups
from procurd.upstream.client import UpstreamClient
from procurd.upstream.errors import AuthError
from procurd.upstream.ratelimit import RateLimiter, SharedRateLimiter, sending_rate
from procurd.watch import HealthWatch, RejectionWatch

log = structlog.get_logger("procurd.runtime")


@dataclass
class CallbackCounts:
    """Callbacks counted in memory and added to the database now and then (a duplicate writes nothing)."""

    unsaved: Counter[tuple[str, bool]] = field(default_factory=Counter)

    def count(self, upstream: str, accepted: bool) -> None:
        self.unsaved[(upstream, accepted)] += 1

    def take(self) -> dict[str, tuple[int, int]]:
        """The counts not yet saved, per upstream ``(accepted, rejected)``; they are then forgotten."""
        taken: dict[str, tuple[int, int]] = {}
        for (upstream, accepted), count in self.unsaved.items():
            accepted_count, rejected_count = taken.get(upstream, (0, 0))
            taken[upstream] = (
                (accepted_count + count, rejected_count)
                if accepted
                else (accepted_count, rejected_count + count)
            )
        self.unsaved.clear()
        return taken

    def restore(self, counts: dict[str, tuple[int, int]]) -> None:
        """Put counts back after a failed save."""
        for upstream, (accepted, rejected) in counts.items():
            self.unsaved[(upstream, True)] += accepted
            self.unsaved[(upstream, False)] += rejected

    def pending(self, upstream: str) -> tuple[int, int]:
        return self.unsaved[(upstream, True)], self.unsaved[(upstream, False)]


def rate_limiters(settings: Settings, database: Database, instance: str) -> dict[str, RateLimiter]:
    """Each upstream's limiter, one per API key, taking its slots from the budget of that key that every
    process of the installation shares through the database (the daemons and the commands run beside them);
    requests are sent a hair slower than the budget (:func:`sending_rate`)."""
    by_key: dict[str, RateLimiter] = {}
    limiters: dict[str, RateLimiter] = {}
    for upstream in settings.upstreams:
        key = budget_key(upstream.api_root, upstream.api_key)
        if key not in by_key:
            rate = sending_rate(upstream.max_requests_per_second)
            budget = SharedBudget(database, key, upstream.name, instance, rate)
            by_key[key] = SharedRateLimiter(budget, rate)
        limiters[upstream.name] = by_key[key]
    return limiters


@dataclass
class Runtime:
    settings: Settings
    database: Database
    service: ProcurementService
    clients: dict[str, UpstreamClient]
    metrics: Metrics
    alerts: Alerts
    health: HealthWatch
    rejections: RejectionWatch
    instance: str = field(default_factory=instance_id)
    callbacks: CallbackCounts = field(default_factory=CallbackCounts)
    # Set by the daemon; ``None`` in a process without a scheduler (the command line).
    catalog_tasks: dict[str, asyncio.Task[Any]] = field(default_factory=dict)
    # What this process's passes of each upstream listed, so that unchanged pages are not decoded again.
    catalog_pages: dict[str, PageMemory] = field(default_factory=lambda: defaultdict(PageMemory))

    @classmethod
    def build(
        cls, settings: Settings, *, database: Database | None = None, instance: str | None = None
    ) -> Runtime:
        database = database or open_database(settings.database.url)
        instance = instance or instance_id()
        metrics = Metrics(instance, database.counts.transactions)
        health = HealthWatch(settings.alerts.unhealthy_after_seconds, {u.name: u for u in settings.upstreams})

        def observe(upstream: str, endpoint: str, outcome: str, seconds: float, error: object) -> None:
            metrics.observe_upstream_request(upstream, endpoint, outcome, seconds)
            health.observe(upstream, endpoint, outcome, seconds, error)

        limiters = rate_limiters(settings, database, instance)
        clients = {
            upstream.name: UpstreamClient(upstream, limiter=limiters[upstream.name], observer=observe)
            for upstream in settings.upstreams
        }
        alerts = Alerts(database, settings.alerts, metrics)
        observers = [metrics.observe_transition, alerts.observe_applied]
        service = ProcurementService(database, settings, wakeups=Wakeups(), observers=observers)
        return cls(
            settings,
            database,
            service,
            clients,
            metrics,
            alerts,
            health,
            RejectionWatch(),
            instance,
        )

    def client(self, upstream: str) -> UpstreamClient:
        return self.clients[upstream]

    async def start(self) -> None:
        """Make sure every configured upstream has a health row (status and callback counters)."""
        now = utcnow()
        await self.database.write(lambda tx: tx.health.ensure_rows(self.clients, now))

    async def record_auth_failure(self, upstream: str, error: AuthError) -> None:
        """An auth error makes the upstream unhealthy until a ping succeeds."""
        now = utcnow()
        values = {"auth_error_code": error.code, "auth_error_at": now}
        await self.database.write(lambda tx: tx.health.update(upstream, values, now))

    async def save_callback_counts(self) -> None:
        counts = self.callbacks.take()
        if not counts:
            return
        now = utcnow()
        try:
            await self.database.write(lambda tx: tx.health.count_callbacks(counts, now))
        except BaseException:
            self.callbacks.restore(counts)
            raise

    async def sync_catalog(
        self,
        upstream: str,
        *,
        full: bool = False,
        allow_mass_removal: bool = False,
        lease_ttl_seconds: float | None = None,
    ) -> SyncReport:
        """One catalogue pass of ``upstream`` as configured (what the daemon's scheduled job runs).

        ``lease_ttl_seconds``: how long the pass's lease outlives a holder that dies (the daemon passes its
        singleton lease's, so that another instance takes the catalogue over as soon as it takes the job)."""
        report = await run_sync(
            self.database,
            self.client(upstream),
            upstream,
            options=SyncOptions.from_settings(self.settings, upstream),
            full=full,
            allow_mass_removal=allow_mass_removal,
            holder=self.instance,
            lease_ttl_seconds=lease_ttl_seconds,
            pages=self.catalog_pages[upstream],
        )
        await self.alerts.raise_(*catalogue_alerts(report.alerts()))
        return report

    def start_catalog_sync(
        self, upstream: str, *, full: bool = False, allow_mass_removal: bool = False
    ) -> bool:
        """Start a pass of ``upstream`` now in the background; False when this process runs one already."""
        name = f"catalog-sync:{upstream}"
        running = self.catalog_tasks.get(name)
        if running is not None and not running.done():
            return False
        self._catalog_task(
            name, self.sync_catalog(upstream, full=full, allow_mass_removal=allow_mass_removal)
        )
        return True

    def start_catalog_reprice(self) -> None:
        """Reprice every upstream's mirror from the configured rules in the background (at start-up)."""
        self._catalog_task("catalog-reprice", self.reprice_catalogue())

    async def reprice_catalogue(self) -> list[RepriceReport]:
        reports = []
        for upstream in self.settings.upstreams:
            report = await reprice_upstream(
                self.database, upstream.name, self.settings.pricing, client=self.client(upstream.name)
            )
            await self.alerts.raise_(*held_alerts(report))
            reports.append(report)
        return reports

    def _catalog_task(self, name: str, work: Any) -> None:
        task = asyncio.create_task(work, name=name)
        self.catalog_tasks[name] = task
        task.add_done_callback(_log_catalog_task)

    async def cancel_upstream(self, upstream: str, order_id: int) -> None:
        await self.clients[upstream].cancel_order(order_id)

    async def close(self) -> None:
        tasks = [task for task in self.catalog_tasks.values() if not task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self.service.close()
        try:
            await self.save_callback_counts()
        except DatabaseError as exc:
            log.warning("callbacks.count_not_saved", reason=exc.reason)
        for client in self.clients.values():
            await client.close()
        for limiter in {id(client.limiter): client.limiter for client in self.clients.values()}.values():
            await limiter.close()
        await self.database.close()


def _log_catalog_task(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("catalog.task_failed", task=task.get_name(), error=repr(task.exception()))


def catalogue_alerts(alerts: list[CatalogAlert]) -> list[Occurrence]:
    """The alerts a catalogue pass calls for (``mass_removal_blocked``, ``price_held``) as occurrences."""
    return [
        Occurrence(Kind(alert.kind), alert.upstream, f"{alert.subject}: {alert.message}", alert.upstream)
        for alert in alerts
    ]


def held_alerts(report: RepriceReport) -> list[Occurrence]:
    """A ``price_held`` alert for the SKUs a repricing held."""
    if not report.new_holds:
        return []
    held = ", ".join(
        f"SKU {hold.sku_id} ({hold.old_cost} -> {hold.new_cost}, +{hold.percent}%)"
        for hold in report.new_holds[:20]
    )
    more = len(report.new_holds) - 20
    message = (
        f"{len(report.new_holds)} selling prices of {report.upstream} held: {held}"
        + (f" and {more} more" if more > 0 else "")
        + ". Check the upstream's new costs, then `procurd catalog release-hold UPSTREAM SKU_ID`."
    )
    return [Occurrence(Kind.PRICE_HELD, report.upstream, message, report.upstream)]
