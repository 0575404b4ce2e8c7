"""Prometheus metrics (``procurd_`` prefix), one registry per running instance."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from procurd.procurement.service import Applied

REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
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
        self.upstream_balance = Gauge(
            "procurd_upstream_balance", "Wallet balance at the last ping (for alerting only; exact value in status).",
            ["upstream", "currency"], registry=r,
        )  # fmt: skip
        self.pending_events = Gauge(
            "procurd_storefront_events_pending", "Undelivered storefront events.", registry=r
        )

    def observe_upstream_request(self, upstream: str, endpoint: str, outcome: str, seconds: float) -> None:
        self.upstream_requests.labels(upstream, endpoint, outcome).inc()
        self.upstream_request_seconds.labels(upstream, endpoint).observe(seconds)

    def observe_transition(self, applied: Applied, source: str) -> None:
        if applied.decision.state is not applied.old_state:
            self.transitions.labels(source, applied.old_state.value, applied.decision.state.value).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
