"""Prometheus metrics (``procurd_`` prefix), one registry per running instance.

Counters and histograms are counted as things happen in this process: they carry the label ``instance``
(``host:pid``), so that the series of several instances are told apart and summed. Gauges derived from the
database (queue depths, oldest queued age, upstream health, pending storefront events, last catalogue sync)
are set from the status report by :meth:`Metrics.set_status` right before each scrape: every instance on a
shared database reports the same cluster-wide values, without an ``instance`` label of procurd's own, so
that Prometheus can take one of them (``max without (instance) (...)``). Gauges of the process itself
(requests waiting for the budget) carry ``instance`` too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from procurd.procurement.transitions import Applied
    from procurd.upstream.ratelimit import Priority

# *_created series double the output and say nothing an operator needs.
disable_created_metrics()  # type: ignore[no-untyped-call]

REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30)
UNKNOWN_UPSTREAM = "unknown"


class _WithLabel(Collector):
    """Every series of ``source`` with one more label."""

    def __init__(self, source: CollectorRegistry, name: str, value: str) -> None:
        self.source = source
        self.name = name
        self.value = value

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labels = {**sample.labels, self.name: self.value}
                labelled.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
            yield labelled


class _DatabaseCounts(Collector):
    def __init__(self, counts: Callable[[], Mapping[str, int]]) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "procurd_database_transactions",
            "Database transactions of this instance, by kind (autocommit: one statement in one round trip, "
            "as the shared request budget takes its slots; glance: a one-row read on the event loop, as the "
            "provider's catalogue version before a page kept in memory).",
            labels=["kind"],
        )
        for kind, count in self.counts().items():
            family.add_metric([kind], count)
        yield family


class Metrics:
    def __init__(self, instance: str, database_counts: Callable[[], Mapping[str, int]] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        of_this_instance = CollectorRegistry(auto_describe=True)
        self.registry.register(_WithLabel(of_this_instance, "instance", instance))
        if database_counts is not None:
            of_this_instance.register(_DatabaseCounts(database_counts))
        r = of_this_instance
        self.upstream_requests = Counter(
            "procurd_upstream_requests", "Requests sent to upstreams, by outcome (ok or error code).",
            ["upstream", "endpoint", "outcome"], registry=r,
        )  # fmt: skip
        self.upstream_request_seconds = Histogram(
            "procurd_upstream_request_seconds", "Upstream request latency.", ["upstream", "endpoint"],
            buckets=REQUEST_BUCKETS, registry=r,
        )  # fmt: skip
        self.transitions = Counter(
            "procurd_procurement_transitions", "Procurement state changes, by source.",
            ["source", "from_state", "to_state"], registry=r,
        )  # fmt: skip
        self.orders_accepted = Counter(
            "procurd_orders_accepted", "Orders accepted for procurement.", registry=r
        )
        self.callbacks = Counter(
            "procurd_callbacks", "Upstream callbacks received, by result.", ["upstream", "result"], registry=r
        )
        self.callback_rejections = Counter(
            "procurd_callback_rejections", "Upstream callbacks rejected, by reason.",
            ["upstream", "reason"], registry=r,
        )  # fmt: skip
        self.alerts = Counter("procurd_alerts", "Alerts raised, by kind.", ["kind"], registry=r)
        self.admin_auth_failures = Counter(
            "procurd_admin_auth_failures", "Wrong admin tokens at this instance, by door (console, api) and "
            "outcome (wrong_token: checked and refused 401; throttled: refused 429 unchecked).",
            ["door", "outcome"], registry=r,
        )  # fmt: skip
        self.provider_requests = Counter(
            "procurd_provider_requests", "Requests of downstream sites to the provider's API, by account "
            "(\"-\" before one is known), endpoint and outcome (ok, or the error code).",
            ["account", "endpoint", "outcome"], registry=r,
        )  # fmt: skip
        self.provider_orders = Counter(
            "procurd_provider_orders",
            "Orders of downstream sites, by account and outcome (paid, payment_failed, repeat).",
            ["account", "outcome"], registry=r,
        )  # fmt: skip
        self.provider_callbacks_refused = Counter(
            "procurd_provider_callbacks_refused", "Callbacks to downstream sites not sent because their "
            "callback_url's host is not, or resolves to no, public address, by account.",
            ["account"], registry=r,
        )  # fmt: skip
        self.provider_old_secret_requests = Counter(
            "procurd_provider_old_secret_requests", "Requests of downstream sites signed with an account's "
            "previous secret, inside the overlap after a rotation, by account.",
            ["account"], registry=r,
        )  # fmt: skip
        self.provider_balance = Gauge(
            "procurd_provider_account_balance", "Wallet balance of each provider account.",
            ["account", "currency"], registry=r,
        )  # fmt: skip
        self.http_requests = Counter(
            "procurd_http_requests", "HTTP requests answered, by listener, route and status.",
            ["listener", "route", "status"], registry=r,
        )  # fmt: skip
        # The labelled children of the counters every request touches (finding one costs a lock and a hash
        # of its labels; their label values are few: configured upstreams, routes, statuses).
        self._http_counted: dict[tuple[str, str, int], Counter] = {}
        self._callbacks_counted: dict[tuple[str, bool], Counter] = {}
        self.requests_waiting = Gauge(
            "procurd_upstream_requests_waiting",
            "Requests of this instance waiting for the upstream's request budget, by priority.",
            ["upstream", "priority"], registry=r,
        )  # fmt: skip
        r = self.registry  # the cluster-wide gauges below are the same on every instance
        self.queue_depth = Gauge(
            "procurd_procurements", "Procurements by upstream and state.", ["upstream", "state"], registry=r
        )
        self.oldest_queued_seconds = Gauge(
            "procurd_oldest_queued_seconds", "Age of the oldest queued procurement.", ["upstream"], registry=r
        )
        self.upstream_healthy = Gauge(
            "procurd_upstream_healthy", "1 when the last ping succeeded and no auth error is pending.",
            ["upstream"], registry=r,
        )  # fmt: skip
        self.upstream_info = Gauge(
            "procurd_upstream_info", "1 per configured upstream, naming the protocol it speaks (dujiao, "
            "acg-faka): join on upstream to break other series down by protocol.",
            ["upstream", "protocol"], registry=r,
        )  # fmt: skip
        self.upstream_balance = Gauge(
            "procurd_upstream_balance", "Wallet balance at the last ping (exact value in the status report).",
            ["upstream", "currency"], registry=r,
        )  # fmt: skip
        self.spend_24h = Gauge(
            "procurd_upstream_spend_24h", "Upstream amounts of the procurements submitted in the last 24 h "
            "(the current hour and the 23 before it) that the upstream holds money for.",
            ["upstream", "currency"], registry=r,
        )  # fmt: skip
        self.runway_hours = Gauge(
            "procurd_upstream_runway_hours", "Hours the wallet lasts at the last 24 h's spend (absent when "
            "nothing was spent).", ["upstream"], registry=r,
        )  # fmt: skip
        self.runway_alert_hours = Gauge(
            "procurd_upstream_runway_alert_hours", "The upstream's runway_alert_hours (absent when off).",
            ["upstream"], registry=r,
        )  # fmt: skip
        self.last_ping_timestamp = Gauge(
            "procurd_upstream_last_ping_timestamp_seconds", "When the upstream was last pinged (Unix time).",
            ["upstream"], registry=r,
        )  # fmt: skip
        self.last_sync_timestamp = Gauge(
            "procurd_catalog_last_sync_timestamp_seconds", "When the last catalogue sync ended (Unix time).",
            ["upstream"], registry=r,
        )  # fmt: skip
        self.last_sync_ok = Gauge(
            "procurd_catalog_last_sync_ok", "1 when the last catalogue sync pass succeeded.", ["upstream"],
            registry=r,
        )  # fmt: skip
        self.exceptions = Gauge(
            "procurd_exceptions",
            "Open exceptions by upstream and reason.",
            ["upstream", "reason"],
            registry=r,
        )
        self.instances_alive = Gauge(
            "procurd_instances_alive", "Instances whose heartbeat is recent (0: no daemon runs).", registry=r
        )
        self.pending_events = Gauge(
            "procurd_storefront_events_pending", "Undelivered storefront events.", registry=r
        )

    def observe_upstream_request(
        self, upstream: str, endpoint: str, outcome: str, seconds: float, error: object = None
    ) -> None:
        self.upstream_requests.labels(upstream, endpoint, outcome).inc()
        self.upstream_request_seconds.labels(upstream, endpoint).observe(seconds)

    def observe_transition(self, applied: Applied) -> None:
        if applied.state_changed:
            before, after = applied.before.state.value, applied.procurement.state.value
            self.transitions.labels(applied.source.value, before, after).inc()

    def observe_callback(self, upstream: str | None, accepted: bool, reason: str | None = None) -> None:
        """One callback answered; ``upstream`` is ``None`` when its API key matched no configured upstream."""
        name = upstream or UNKNOWN_UPSTREAM
        key = (name, accepted)
        counted = self._callbacks_counted.get(key)
        if counted is None:
            result = "accepted" if accepted else "rejected"
            counted = self._callbacks_counted[key] = self.callbacks.labels(name, result)
        counted.inc()
        if not accepted:
            self.callback_rejections.labels(name, reason or "unknown").inc()

    def observe_http(self, listener: str, route: str, status: int) -> None:
        key = (listener, route, status)
        counted = self._http_counted.get(key)
        if counted is None:
            counted = self._http_counted[key] = self.http_requests.labels(listener, route, str(status))
        counted.inc()

    def set_waiting(self, upstream: str, waiting: Mapping[Priority, int]) -> None:
        """How many requests wait for ``upstream``'s budget here, per priority."""
        for priority, count in waiting.items():
            self.requests_waiting.labels(upstream, priority.name.lower()).set(count)

    def set_status(self, report: Mapping[str, Any]) -> None:
        """Set the database-derived gauges from :func:`procurd.operations.status.status_report`'s answer."""
        self.queue_depth.clear()
        self.oldest_queued_seconds.clear()
        self.upstream_healthy.clear()
        self.upstream_info.clear()
        self.upstream_balance.clear()
        self.spend_24h.clear()
        self.runway_hours.clear()
        self.runway_alert_hours.clear()
        self.last_ping_timestamp.clear()
        self.last_sync_timestamp.clear()
        self.last_sync_ok.clear()
        self.exceptions.clear()
        for upstream in report.get("upstreams", []):
            self._set_upstream(upstream)
        self.instances_alive.set(sum(1 for instance in report.get("instances", []) if instance.get("alive")))
        storefront = report.get("storefront") or {}
        self.pending_events.set(int(storefront.get("events_pending", 0)))
        self.provider_balance.clear()
        for account in (report.get("provider") or {}).get("balances", []):
            balance = _number(account.get("balance"))
            if balance is not None:
                self.provider_balance.labels(account["name"], account["currency"]).set(balance)

    def _set_upstream(self, upstream: Mapping[str, Any]) -> None:
        name = str(upstream["name"])
        for state, count in upstream.get("queue", {}).items():
            self.queue_depth.labels(name, state).set(count)
        self.oldest_queued_seconds.labels(name).set(upstream.get("oldest_queued_seconds") or 0)
        self.upstream_healthy.labels(name).set(1 if upstream.get("healthy") else 0)
        self.upstream_info.labels(name, str(upstream.get("protocol") or "dujiao")).set(1)
        for reason, open_exceptions in (upstream.get("exceptions_by_reason") or {}).items():
            self.exceptions.labels(name, reason).set(open_exceptions)
        ping = upstream.get("last_ping") or {}
        balance = _number(ping.get("balance"))
        if balance is not None:
            self.upstream_balance.labels(name, str(ping.get("currency") or "")).set(balance)
        spent = _number(upstream.get("spend_24h"))
        if spent is not None:
            self.spend_24h.labels(name, str(ping.get("currency") or "")).set(spent)
        if upstream.get("runway_hours") is not None:
            self.runway_hours.labels(name).set(float(upstream["runway_hours"]))
        if upstream.get("runway_alert_hours"):
            self.runway_alert_hours.labels(name).set(float(upstream["runway_alert_hours"]))
        ping_at = _timestamp(ping.get("at"))
        if ping_at is not None:
            self.last_ping_timestamp.labels(name).set(ping_at)
        sync = upstream.get("last_sync") or {}
        sync_at = _timestamp(sync.get("at"))
        if sync_at is not None:
            self.last_sync_timestamp.labels(name).set(sync_at)
            self.last_sync_ok.labels(name).set(1 if sync.get("ok") else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _number(text: Any) -> float | None:
    # Prometheus samples are floats by nature; the exact amount stays in the status report.
    if text is None:
        return None
    try:
        value = Decimal(str(text))
    except InvalidOperation:
        return None
    return float(value) if value.is_finite() else None


def _timestamp(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
