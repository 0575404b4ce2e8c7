"""The parts of a running procurd, built once from the settings and shared by the daemon, the HTTP apps and
the command line."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from procurd.config import Settings
from procurd.db import procurement_store as store
from procurd.db.engine import create_engine
from procurd.db.types import utcnow
from procurd.metrics import Metrics
from procurd.procurement.service import ProcurementService, Wakeups
from procurd.upstream.client import UpstreamClient
from procurd.upstream.errors import AuthError
from procurd.upstream.ratelimit import PriorityRateLimiter


def instance_id() -> str:
    """Identifies this process in claims, leases and logs."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Runtime:
    settings: Settings
    engine: AsyncEngine
    service: ProcurementService
    clients: dict[str, UpstreamClient]
    metrics: Metrics
    instance: str = field(default_factory=instance_id)

    @classmethod
    def build(
        cls, settings: Settings, *, engine: AsyncEngine | None = None, instance: str | None = None
    ) -> Runtime:
        engine = engine or create_engine(settings.database.url)
        metrics = Metrics()
        clients = {
            upstream.name: UpstreamClient(
                upstream,
                limiter=PriorityRateLimiter(upstream.max_requests_per_second),
                observer=metrics.observe_upstream_request,
            )
            for upstream in settings.upstreams
        }
        service = ProcurementService(
            engine, settings, wakeups=Wakeups(), on_change=metrics.observe_transition
        )
        return cls(settings, engine, service, clients, metrics, instance or instance_id())

    def client(self, upstream: str) -> UpstreamClient:
        return self.clients[upstream]

    async def start(self) -> None:
        """Make sure every configured upstream has a health row (status and callback counters)."""
        async with self.engine.begin() as conn:
            await store.ensure_health_rows(conn, self.clients, utcnow())

    async def record_auth_failure(self, upstream: str, error: AuthError) -> None:
        """An auth error makes the upstream unhealthy until a ping succeeds."""
        now = utcnow()
        async with self.engine.begin() as conn:
            await store.update_health(
                conn, upstream, {"auth_error_code": error.code, "auth_error_at": now}, now
            )

    async def cancel_upstream(self, upstream: str, order_id: int) -> None:
        await self.clients[upstream].cancel_order(order_id)

    async def close(self) -> None:
        for client in self.clients.values():
            await client.close()
        await self.engine.dispose()
