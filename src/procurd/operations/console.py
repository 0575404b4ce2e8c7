"""The reads of the web console that no other operation makes: order search, the catalogue browser, the sync
runs, the exception counts, the reconciliation findings and the rows its charts are drawn from.

Each is one read transaction (one snapshot); the console (:mod:`procurd.http.console.data`) shapes what they
return into its pages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from procurd.core.records import CatalogSlice, Finding, OrderSummary
from procurd.db.database import Database
from procurd.db.views import WithCharts
from procurd.operations.runtime import Runtime


@dataclass(frozen=True, slots=True)
class UpstreamHistory:
    """What an upstream's charts are drawn from: its hourly rollup, its daily one, its wallet's balances."""

    hours: list[tuple[Any, ...]]
    days: list[tuple[Any, ...]]
    balances: list[tuple[datetime, str, str | None]]  # (at, balance, currency), oldest first


@dataclass(frozen=True, slots=True)
class AccountHistory:
    """What a downstream account's charts are drawn from: its share of the rollups, its wallet at the end of
    each hour asked for, and what its orders were charged in the last day (cents)."""

    hours: list[tuple[Any, ...]]
    days: list[tuple[Any, ...]]
    wallet: list[int | None]
    spent_cents: int


class ConsoleReads:
    """The console's own reads, each one read transaction."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    @property
    def database(self) -> Database:
        return self.runtime.database

    async def orders(
        self, text: str | None, status: str | None, page: int, page_size: int
    ) -> tuple[int, list[OrderSummary]]:
        """Orders, newest first; ``text`` matches an order number (or its start), a downstream number, an
        upstream order id or an upstream order number. The total and one page."""
        return await self.database.read(lambda tx: tx.console.find_orders(text, status, page, page_size))

    async def catalog(
        self, text: str | None, upstream: str | None, page: int, page_size: int
    ) -> CatalogSlice:
        """One page of mirrored products matching ``text``, each with its SKUs."""
        return await self.database.read(lambda tx: tx.console.catalog(text, upstream, page, page_size))

    async def sync_runs(
        self, upstream: str | None, page: int, page_size: int
    ) -> tuple[int, list[dict[str, Any]]]:
        """Catalogue passes, newest first: the total and one page."""
        return await self.database.read(lambda tx: tx.console.sync_runs(upstream, page, page_size))

    async def exception_reasons(self) -> dict[str, dict[str, int]]:
        """Open exceptions per upstream and reason."""
        return await self.database.read(lambda tx: tx.procurements.exception_reasons())

    async def findings(self, page: int, page_size: int) -> tuple[int, list[Finding]]:
        """Reconciliation findings, newest first: the total and one page."""
        return await self.database.read(lambda tx: tx.reconcile.recent_findings(page, page_size))

    async def upstream_history(
        self, names: Sequence[str], hours_since: datetime, days_since: datetime, balance_since: datetime
    ) -> dict[str, UpstreamHistory]:
        """Each upstream's rollups (hourly from ``hours_since``, daily from ``days_since``) and balances
        (from ``balance_since``), in one snapshot."""

        def read(tx: WithCharts) -> dict[str, UpstreamHistory]:
            charts = tx.charts
            return {
                name: UpstreamHistory(
                    charts.hours([name], 0, hours_since),
                    charts.days([name], 0, days_since),
                    charts.balances(name, balance_since),
                )
                for name in names
            }

        return await self.database.read(read)

    async def account_history(
        self,
        account_id: int,
        upstreams: Sequence[str],
        since: tuple[datetime, datetime],
        ends: Sequence[datetime],
        spend_since: datetime,
    ) -> AccountHistory:
        """A downstream account's rollups on ``upstreams`` (hourly, daily: ``since``), its wallet at each of
        ``ends`` and what it was charged from ``spend_since``, in one snapshot."""
        hours_since, days_since = since

        def read(tx: WithCharts) -> AccountHistory:
            return AccountHistory(
                tx.charts.hours(upstreams, account_id, hours_since),
                tx.charts.days(upstreams, account_id, days_since),
                tx.charts.wallet_at(account_id, ends),
                tx.charts.wallet_spend(account_id, spend_since),
            )

        return await self.database.read(read)
