"""The status report (``GET /api/v1/status`` and ``procurd status``) and the gauges of ``/metrics`` set
from it.

Everything comes from the database, so every instance on a shared database (and the command line, with or
without a running daemon) reports the same thing. An upstream is healthy when its last ping succeeded and no
authentication failure was seen since: an auth error recorded by a worker stays until a ping succeeds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

from procurd.catalog.sync import SyncReport
from procurd.config import UpstreamSettings
from procurd.core.alerts import Alert, Kind
from procurd.core.clock import utcnow
from procurd.core.dialect import Learned, dialect_text
from procurd.core.offering import OfferFacts, why_nothing_is_offered
from procurd.core.orders import iso
from procurd.core.procurement import State
from procurd.core.provider import cents_text
from procurd.core.records import Instance, ReconcileRun, UpstreamHealth
from procurd.core.rollup import runway_hours, window_start
from procurd.db.views import (
    WithAlerts,
    WithCharts,
    WithDialects,
    WithHealth,
    WithInstances,
    WithMirror,
    WithOffered,
    WithOutbox,
    WithProvider,
    WithReconcile,
)
from procurd.operations.runtime import Runtime

QUEUE_STATES = tuple(state.value for state in State)
ALIVE_BEATS = 3  # an instance is alive while its heartbeat is at most this many heartbeat_seconds old


@dataclass(frozen=True, slots=True)
class _Facts:
    queue: dict[tuple[str, str], int]
    oldest: dict[str, datetime]
    health: dict[str, UpstreamHealth]
    dialects: dict[str, Learned]
    events_pending: int
    syncs: dict[str, SyncReport | None]
    exceptions: dict[str, dict[str, int]]
    instances: list[Instance]
    alerts_last_day: int
    last_reconcile: ReconcileRun | None
    mirror: dict[str, dict[str, int]]
    provider: dict[str, Any] | None
    spend: dict[str, dict[str, Decimal]]  # per upstream and currency, since the runway's window began
    daemon_failures: list[Alert]


@dataclass(frozen=True, slots=True)
class _ProviderScope:
    currency: str
    upstreams: tuple[str, ...]
    rules: int


class ProviderFactsTx(WithProvider, WithOffered, Protocol):
    """What the provider's part of the status report reads."""


class StatusTx(
    WithMirror, WithCharts, WithHealth, WithDialects, WithOutbox, WithInstances, WithAlerts, WithReconcile,
    ProviderFactsTx, Protocol,
):  # fmt: skip
    """What the status report reads, in one snapshot."""


def _provider_facts(tx: ProviderFactsTx, scope: _ProviderScope) -> dict[str, Any]:
    """The provider's accounts (with each balance), orders by status, callbacks, offered products; when it
    lists none, why (``offer_problem``)."""
    currency = scope.currency
    accounts = tx.provider.accounts()
    listed, offered = tx.offered.counts()
    problem = None
    if not listed:
        facts = OfferFacts(
            currency, scope.upstreams, tx.offered.selling_currencies(scope.upstreams), scope.rules
        )
        shortfall = why_nothing_is_offered(facts)
        problem = (
            str(shortfall)
            if shortfall
            else (
                "the offered catalogue is not built yet: the daemon builds it when it starts and after each "
                "catalogue pass (`procurd run`)"
            )
        )
    return {
        "enabled": True,
        "currency": currency,
        "accounts": len(accounts),
        "accounts_disabled": sum(1 for account in accounts if not account.active),
        "balance_total": cents_text(sum(account.balance_cents for account in accounts)),
        "balances": [
            {"name": account.name, "balance": cents_text(account.balance_cents), "currency": account.currency,
             "status": account.status, "level": account.level}
            for account in accounts
        ],
        "orders": tx.provider.status_counts(),
        "callbacks": tx.provider.callback_counts(),
        "products_listed": listed,
        "products_offered": offered,
        "offer_problem": problem,
    }  # fmt: skip


def _facts(
    tx: StatusTx,
    upstreams: list[str],
    day_ago: datetime,
    provider: _ProviderScope | None,
    spend_from: datetime,
) -> _Facts:
    syncs = {name: _last_pass(tx, name) for name in upstreams}
    return _Facts(
        queue=tx.charts.states(),  # from the hourly rollup, not a count of every procurement
        oldest=tx.charts.oldest_queued(upstreams),
        health=tx.health.all(),
        dialects=tx.dialects.all(),
        events_pending=tx.outbox.pending_events(),
        syncs=syncs,
        exceptions=tx.charts.exception_reasons(upstreams),
        instances=tx.instances.all(),
        alerts_last_day=tx.alerts.count_since(day_ago),
        last_reconcile=tx.reconcile.last_finished(),
        mirror=tx.mirror.totals(),
        provider=None if provider is None else _provider_facts(tx, provider),
        spend={name: tx.charts.spend_since(name, spend_from) for name in upstreams},
        daemon_failures=[
            alert
            for alert in tx.alerts.recent(1, 20, Kind.DAEMON_FAILED.value)[1]
            if alert.last_at >= day_ago
        ],
    )


def _last_pass(tx: WithMirror, upstream: str, finished: bool = False) -> SyncReport | None:
    row = tx.mirror.last_run(upstream, finished=finished)
    return None if row is None else SyncReport.from_row(row)


async def last_sync(runtime: Runtime, upstream: str, *, finished: bool = False) -> SyncReport | None:
    """The most recent catalogue pass of ``upstream`` that ran (skipped ones are not), or ``None``: while a
    pass is under way the ``running`` one, unless ``finished`` asks for the last that ended."""
    return await runtime.database.read(_last_pass, upstream, finished)


async def status_report(runtime: Runtime) -> dict[str, Any]:
    """Per configured upstream: health, last ping and sync, queue depths, open exceptions, callbacks."""
    now = utcnow()
    names = [upstream.name for upstream in runtime.settings.upstreams]
    settings = runtime.settings
    scope = (
        _ProviderScope(
            settings.provider.currency, tuple(settings.offered_upstreams()), len(settings.pricing.rules)
        )
        if settings.provider.enabled
        else None
    )
    facts = await runtime.database.read(_facts, names, now - timedelta(days=1), scope, window_start(now))
    upstreams = []
    for upstream in runtime.settings.upstreams:
        status = _upstream_status(
            upstream, facts.health.get(upstream.name), facts.syncs[upstream.name], facts.queue,
            facts.oldest.get(upstream.name), now,
        )  # fmt: skip
        accepted, rejected = runtime.callbacks.pending(upstream.name)
        status["callbacks"]["accepted"] += accepted
        status["callbacks"]["rejected"] += rejected
        status["exceptions_by_reason"] = facts.exceptions.get(upstream.name, {})
        status.update(runway(upstream, status["last_ping"], facts.spend[upstream.name]))
        learned = facts.dialects.get(upstream.name) or Learned(upstream=upstream.name)
        status["dialect"] = dialect_view(learned, status["protocol_version"], status["last_ping"]["currency"])
        status["mirror"] = facts.mirror.get(upstream.name, {"categories": 0, "products": 0, "skus": 0})
        upstreams.append(status)
    events_pending = facts.events_pending
    stale_before = now - timedelta(seconds=ALIVE_BEATS * runtime.settings.server.heartbeat_seconds)
    instances = [_instance(instance, stale_before) for instance in facts.instances]
    return {
        "ok": True,
        "generated_at": iso(now),
        "instance": runtime.instance,
        "daemon_alive": any(instance["alive"] for instance in instances),
        "instances": instances,
        "daemon_failures": [_daemon_failure(alert) for alert in facts.daemon_failures],
        "alerts": {"last_24h": facts.alerts_last_day},
        "last_reconcile": _last_reconcile(facts.last_reconcile),
        "upstreams": upstreams,
        "storefront": {
            "webhook_configured": bool(runtime.settings.storefront.webhook_url),
            "events_pending": events_pending,
        },
        "provider": facts.provider or {"enabled": False},
    }


def dialect_view(learned: Learned, protocol_version: str | None, currency: str | None) -> dict[str, Any]:
    """What an upstream's answers showed of the dialect it speaks (``None``: not seen yet), with its name
    (``seed``, ``2026``) and a summary in words; the protocol version and currency of its last ping."""
    return {
        "name": learned.dialect,
        "summary": dialect_text(learned),
        "includes_inactive": learned.includes_inactive,
        "page_size": learned.page_size,
        "page_size_asked": learned.page_size_asked,
        "page_size_max": learned.page_size_max,
        "limiter_status": learned.limiter_status,
        "inactive_detail": learned.inactive_detail,
        "clock_offset_seconds": learned.clock_offset_seconds,
        "protocol_version": protocol_version,
        "currency": currency,
        "learned_at": iso(learned.updated_at),
    }


def _daemon_failure(alert: Alert) -> dict[str, Any]:
    """A host whose daemon could not start, or stopped on a failure, in the last 24 h (alert
    ``daemon_failed``): how many times, and the last reason."""
    return {
        "host": alert.subject,
        "count": alert.count,
        "first_at": iso(alert.first_at),
        "last_at": iso(alert.last_at),
        "last_failure": alert.message.splitlines()[0] if alert.message else "",
    }


def runway(upstream: UpstreamSettings, ping: dict[str, Any], spend: dict[str, Decimal]) -> dict[str, Any]:
    """``spend_24h``: the upstream amounts of the procurements submitted in the last 24 h (counted by the
    hour: the current hour so far and the 23 before it) that the upstream holds money for, in the wallet's
    currency; ``runway_hours``: the last known balance divided by that spend per hour (``None`` when nothing
    was spent or no balance is known)."""
    currency = ping.get("currency") or (next(iter(spend)) if len(spend) == 1 else None)
    spent = spend.get(currency or "", Decimal(0))
    try:
        balance = Decimal(ping["balance"]) if ping.get("balance") not in (None, "") else None
    except InvalidOperation:
        balance = None
    return {
        "spend_24h": str(spent if spent else Decimal("0.00")),
        "runway_hours": runway_hours(balance, spent),
        "runway_alert_hours": upstream.runway_alert_hours or None,
    }


def instance_state(instance: Instance, stale_before: datetime) -> str:
    """One of :data:`procurd.core.instances.INSTANCE_STATES`; the status report, ``procurd status`` and the
    console all read it."""
    if instance.stopped_at is not None:
        return "stopped"
    if instance.down_at is None and instance.heartbeat_at >= stale_before:
        return "alive"
    return "down"


def _instance(instance: Instance, stale_before: datetime) -> dict[str, Any]:
    state = instance_state(instance, stale_before)
    return {
        "id": instance.id,
        "host": instance.host,
        "pid": instance.pid,
        "version": instance.version,
        "started_at": iso(instance.started_at),
        "heartbeat_at": iso(instance.heartbeat_at),
        "state": state,
        "alive": state == "alive",
        "stopped_at": iso(instance.stopped_at),
        "down_at": iso(instance.down_at),
    }


def _last_reconcile(run: ReconcileRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    return {
        "at": iso(run.finished_at or run.started_at),
        "status": run.status,
        "checked": run.checked,
        "mismatches": run.mismatches,
        "repaired": run.repaired,
        "errors": run.errors,
    }


def _upstream_status(
    upstream: UpstreamSettings,
    health: UpstreamHealth | None,
    sync: SyncReport | None,
    counts: dict[tuple[str, str], int],
    oldest_queued: datetime | None,
    now: datetime,
) -> dict[str, Any]:
    row = health or UpstreamHealth(upstream=upstream.name)
    queue = {state: counts.get((upstream.name, state), 0) for state in QUEUE_STATES}
    return {
        "name": upstream.name,
        "protocol": upstream.protocol,
        "base_url": upstream.base_url,
        "low_balance_threshold": upstream.low_balance_threshold or None,
        "healthy": row.last_ping_ok is True and row.auth_error_code is None,
        "site_name": row.site_name,
        "protocol_version": row.protocol_version,
        "member_level": row.member_level,
        "last_ping": {
            "at": iso(row.last_ping_at),
            "ok": row.last_ping_ok,
            "balance": row.balance,
            "currency": row.currency,
            "latency_ms": row.latency_ms,
            "error": row.last_ping_error,
        },
        "auth_error": (
            {"code": row.auth_error_code, "at": iso(row.auth_error_at)}
            if row.auth_error_code is not None
            else None
        ),
        "last_sync": _last_sync(sync),
        "queue": queue,
        "oldest_queued_seconds": (
            max(0, int((now - oldest_queued).total_seconds())) if oldest_queued is not None else 0
        ),
        "open_exceptions": queue[State.EXCEPTION.value],
        "callbacks": {"accepted": row.callbacks_accepted, "rejected": row.callbacks_rejected},
    }


def _last_sync(sync: SyncReport | None) -> dict[str, Any]:
    if sync is None:
        return {
            "at": None, "ok": None, "status": None, "kind": None, "products": None, "skus": None,
            "categories": None, "error": None, "started_at": None, "finished_at": None,
        }  # fmt: skip
    return {
        "at": iso(sync.finished_at or sync.started_at),
        "ok": sync.ok,
        "status": sync.status,
        "kind": sync.kind,
        "products": sync.products,
        "skus": sync.skus,
        "categories": sync.categories,
        "error": sync.error,
        "started_at": iso(sync.started_at),
        "finished_at": iso(sync.finished_at),
    }


async def refresh_metrics(runtime: Runtime) -> dict[str, Any]:
    """Set the database-derived Prometheus gauges from a fresh status report, and this instance's gauges;
    return the report."""
    report = await status_report(runtime)
    runtime.metrics.set_status(report)
    for name, client in runtime.clients.items():
        runtime.metrics.set_waiting(name, client.limiter.waiting)
    return report
