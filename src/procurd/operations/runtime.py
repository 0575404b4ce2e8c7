"""The parts of a running procurd, built once from the settings: the database, the procurement service, one
upstream client per upstream (each taking its slots from the request budget that every process of the
installation shares), metrics, alerts and the watches. The daemon and every command build the same
runtime; :mod:`procurd.operations` acts through it, and composes every part below it here."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import structlog

from procurd.catalog.pages import PageMemory
from procurd.config import Settings, UpstreamSettings
from procurd.core.clock import utcnow
from procurd.db.database import Database, open_database
from procurd.db.errors import DatabaseError
from procurd.db.rate_budget import budget_key
from procurd.db.views import WithDialects
from procurd.instance import instance_id
from procurd.metrics import Metrics
from procurd.operations.alerts import Alerts
from procurd.operations.budgets import SharedBudget
from procurd.operations.choices import DatabaseChoices
from procurd.operations.trades import DatabaseTrades
from procurd.procurement.service import ProcurementService, Wakeups
from procurd.protocol.acgfaka.upstream import AcgFakaUpstream
from procurd.protocol.dujiao.client import UpstreamClient
from procurd.protocol.transport import RequestObserver
from procurd.upstream.errors import AuthError, UpstreamError
from procurd.upstream.interface import Upstream
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


@dataclass
class DialectNotes:
    """What requests showed of an upstream's dialect between two saves (the HTTP status of its answer over
    its limit), kept in memory by the request observer and written to ``upstream_dialects`` now and then."""

    unsaved: dict[str, dict[str, object]] = field(default_factory=dict)

    def observe(self, upstream: str, outcome: str, error: object) -> None:
        if outcome == "rate_limited" and isinstance(error, UpstreamError) and error.http_status is not None:
            values = {"limiter_status": error.http_status, "limiter_at": utcnow()}
            self.unsaved.setdefault(upstream, {}).update(values)

    def take(self) -> dict[str, dict[str, object]]:
        taken, self.unsaved = self.unsaved, {}
        return taken

    def restore(self, notes: dict[str, dict[str, object]]) -> None:
        for upstream, values in notes.items():
            self.unsaved[upstream] = {**values, **self.unsaved.get(upstream, {})}


def rate_limiters(settings: Settings, database: Database, instance: str) -> dict[str, RateLimiter]:
    """Each upstream's limiter, one per API key, taking its slots from the budget of that key that every
    process of the installation shares through the database (the daemons and the commands run beside them);
    requests are sent a hair slower than the budget (:func:`sending_rate`)."""
    by_key: dict[str, RateLimiter] = {}
    limiters: dict[str, RateLimiter] = {}
    for upstream in settings.upstreams:
        key = budget_key(*upstream.budget_identity())
        if key not in by_key:
            rate = sending_rate(upstream.max_requests_per_second)
            budget = SharedBudget(database, key, upstream.name, instance, rate)
            by_key[key] = SharedRateLimiter(budget, rate)
        limiters[upstream.name] = by_key[key]
    return limiters


def upstream_of(
    settings: UpstreamSettings,
    *,
    limiter: RateLimiter,
    observer: RequestObserver,
    database: Database,
    instance: str,
) -> Upstream:
    """The client of one ``[[upstreams]]`` block, for the protocol it names (``instance``: this process,
    the holder of the leases its trades take)."""
    if settings.protocol == "acg-faka":
        choices = DatabaseChoices(database)
        trades = DatabaseTrades(database, instance)
        return AcgFakaUpstream(settings, choices=choices, trades=trades, limiter=limiter, observer=observer)
    return UpstreamClient(settings, limiter=limiter, observer=observer)


@dataclass
class Runtime:
    settings: Settings
    database: Database
    service: ProcurementService
    clients: dict[str, Upstream]
    metrics: Metrics
    alerts: Alerts
    health: HealthWatch
    rejections: RejectionWatch
    instance: str = field(default_factory=instance_id)
    callbacks: CallbackCounts = field(default_factory=CallbackCounts)
    dialects: DialectNotes = field(default_factory=DialectNotes)
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
        dialects = DialectNotes()

        def observe(upstream: str, endpoint: str, outcome: str, seconds: float, error: object) -> None:
            metrics.observe_upstream_request(upstream, endpoint, outcome, seconds)
            health.observe(upstream, endpoint, outcome, seconds, error)
            dialects.observe(upstream, outcome, error)

        limiters = rate_limiters(settings, database, instance)
        clients = {
            upstream.name: upstream_of(
                upstream,
                limiter=limiters[upstream.name],
                observer=observe,
                database=database,
                instance=instance,
            )
            for upstream in settings.upstreams
        }
        alerts = Alerts(database, settings.alerts, metrics)
        observers = [metrics.observe_transition, alerts.observe_applied]
        service = ProcurementService(
            database, settings, wakeups=Wakeups(), observers=observers, writer=instance, clients=clients
        )
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
            dialects=dialects,
        )

    def client(self, upstream: str) -> Upstream:
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

    async def save_dialects(self) -> None:
        """Write what requests showed of the upstreams' dialects since the last save."""
        notes = self.dialects.take()
        if not notes:
            return
        now = utcnow()

        def learn(tx: WithDialects) -> None:
            for upstream, values in notes.items():
                tx.dialects.learn(upstream, values, now)

        try:
            await self.database.write(learn)
        except BaseException:
            self.dialects.restore(notes)
            raise

    async def cancel_upstream(self, upstream: str, order_id: int) -> None:
        await self.clients[upstream].cancel_order(order_id)

    async def close(self) -> None:
        await self.service.close()
        try:
            await self.save_callback_counts()
        except DatabaseError as exc:
            log.warning("callbacks.count_not_saved", reason=exc.reason)
        try:
            await self.save_dialects()
        except DatabaseError as exc:
            log.warning("dialects.not_saved", reason=exc.reason)
        for client in self.clients.values():
            await client.close()
        for limiter in {id(client.limiter): client.limiter for client in self.clients.values()}.values():
            await limiter.close()
        await self.database.close()
