"""The catalogue's operations: a mirror pass, repricing, price holds.

Whoever asks (the daemon's schedule, ``POST /api/v1/catalog/sync``, the console's button, ``procurd catalog
sync``), a pass records the same ``sync_runs`` row, raises the same alerts (``mass_removal_blocked``,
``price_held``, ``sync_failed``) and logs the same ``catalog.synced`` line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import structlog

from procurd.catalog.pricing import RepriceReport
from procurd.catalog.sync import CatalogAlert, SyncOptions, SyncReport
from procurd.core.alerts import Kind, Occurrence
from procurd.core.pricing import ReleasedHold
from procurd.core.refusals import Refused
from procurd.db.errors import DatabaseError
from procurd.operations.catalog_pass import holds, release_hold, reprice_upstream, run_sync
from procurd.operations.runtime import Runtime

log = structlog.get_logger("procurd.catalog")

__all__ = ["CatalogOperations", "ReleasedHold", "RepriceReport", "SyncReport"]

Progress = Callable[[int, int | None], None]
"""``progress(pages_done, pages_total)`` while a pass fetches; ``pages_total`` is None until known."""
OfferedRefresh = Callable[..., Awaitable[Any]]
"""Brings the provider's offered catalogue in step with the mirror (``upstreams``: those that changed)."""

HELD_SHOWN = 20  # SKUs a price_held alert names one by one


class CatalogOperations:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        # Passes and repricings started in the background of this process, by name.
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.offered: OfferedRefresh | None = None  # set when the provider's catalogue follows the mirror

    def upstream(self, name: str | None) -> str:
        """``name`` when it is configured, or the only upstream when ``name`` is None; refused otherwise."""
        names = [upstream.name for upstream in self.runtime.settings.upstreams]
        if name is None:
            if len(names) != 1:
                raise Refused(400, "upstream_required", f"name the upstream: one of {', '.join(names)}")
            return names[0]
        if name not in names:
            raise Refused(404, "unknown_upstream", f"no upstream {name!r} is configured")
        return name

    async def sync(
        self,
        upstream: str,
        *,
        full: bool = False,
        allow_mass_removal: bool = False,
        progress: Progress | None = None,
        lease_ttl_seconds: float | None = None,
    ) -> SyncReport:
        """One catalogue pass of ``upstream`` now, in this process (the report of a pass skipped because
        another process holds the upstream's pass is ``skipped``).

        ``lease_ttl_seconds``: how long the pass's lease outlives a holder that dies (the daemon passes its
        singleton lease's, so that another instance takes the catalogue over as soon as it takes the job)."""
        if allow_mass_removal and not full:
            raise Refused(400, "invalid_request", "allow_mass_removal needs full: only a full pass removes")
        runtime = self.runtime
        report = await run_sync(
            runtime.database,
            runtime.client(upstream),
            upstream,
            options=SyncOptions.from_settings(runtime.settings, upstream),
            full=full,
            allow_mass_removal=allow_mass_removal,
            holder=runtime.instance,
            lease_ttl_seconds=lease_ttl_seconds,
            progress=progress,
            pages=runtime.catalog_pages[upstream],
        )
        log.info(
            "catalog.synced",
            upstream=upstream,
            run_id=report.run_id,
            status=report.status,
            kind=report.kind,
            products=report.products,
            rows_written=report.rows_written,
            error=report.error,
        )
        await runtime.save_dialects()
        if report.status in ("ok", "suspicious"):
            await self._follow([upstream])
        occurrences = catalogue_alerts(report.alerts())
        if report.status == "failed":
            message = f"{upstream}: the catalogue pass {report.run_id} failed: {report.error}"
            occurrences.append(Occurrence(Kind.SYNC_FAILED, upstream, message, upstream))
        await runtime.alerts.raise_(*occurrences)
        return report

    def start_sync(self, upstream: str, *, full: bool = False, allow_mass_removal: bool = False) -> bool:
        """Start a pass of ``upstream`` in the background of this process; False when one runs already."""
        if allow_mass_removal and not full:
            raise Refused(400, "invalid_request", "allow_mass_removal needs full: only a full pass removes")
        return self.start_task(
            f"catalog-sync:{upstream}",
            lambda: self.sync(upstream, full=full, allow_mass_removal=allow_mass_removal),
        )

    async def reprice(self, upstream: str | None = None) -> list[RepriceReport]:
        """Selling prices recomputed from ``[pricing]`` without fetching (every upstream, or one)."""
        runtime = self.runtime
        names = [u.name for u in runtime.settings.upstreams if upstream is None or u.name == upstream]
        reports = []
        for name in names:
            report = await reprice_upstream(
                runtime.database, name, runtime.settings.pricing, client=runtime.client(name)
            )
            log.info(
                "catalog.repriced",
                upstream=name,
                priced=report.priced,
                sku_prices_changed=report.sku_prices_changed,
                held=len(report.new_holds),
                problems=len(report.problems),
            )
            await runtime.alerts.raise_(*held_alerts(report))
            reports.append(report)
        await self._follow(names)
        return reports

    def start_reprice(self) -> bool:
        """Reprice every upstream in the background (the daemon does at start-up)."""
        return self.start_task("catalog-reprice", self.reprice)

    async def release_hold(self, upstream: str, sku_id: int) -> ReleasedHold:
        """A SKU's price hold released: it is priced from the rules and its current cost at once."""
        runtime = self.runtime
        released = await release_hold(
            runtime.database, upstream, sku_id, runtime.settings.pricing, client=runtime.client(upstream)
        )
        if released is None:
            raise Refused(404, "hold_not_found", f"SKU {sku_id} of {upstream} has no price hold")
        await self._follow([upstream])
        return released

    async def _follow(self, upstreams: list[str]) -> None:
        """The provider's offered catalogue follows what the mirror's prices and rows now are (a refresh that
        fails is logged; the next pass or repricing brings it in step)."""
        if self.offered is None:
            return
        try:
            await self.offered(upstreams)
        except (DatabaseError, TimeoutError) as exc:
            log.error("provider.catalog_refresh_failed", upstreams=upstreams, error=str(exc))

    async def holds(self, upstream: str | None = None) -> list[dict[str, Any]]:
        """Held SKUs, oldest hold first."""
        return await holds(self.runtime.database, upstream)

    def start_task(self, name: str, work: Callable[[], Coroutine[Any, Any, Any]]) -> bool:
        """Run ``work`` in the background of this process unless a task of that name runs; whether it
        started."""
        running = self.tasks.get(name)
        if running is not None and not running.done():
            return False
        task = asyncio.create_task(work(), name=name)
        self.tasks[name] = task
        task.add_done_callback(_log_failure)
        return True

    async def close(self) -> None:
        """Cut short what runs in the background (a pass resumes on its next schedule)."""
        running = [task for task in self.tasks.values() if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)


def _log_failure(task: asyncio.Task[Any]) -> None:
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
        for hold in report.new_holds[:HELD_SHOWN]
    )
    more = len(report.new_holds) - HELD_SHOWN
    message = (
        f"{len(report.new_holds)} selling prices of {report.upstream} held: {held}"
        + (f" and {more} more" if more > 0 else "")
        + ". Check the upstream's new costs, then `procurd catalog release-hold UPSTREAM SKU_ID`."
    )
    return [Occurrence(Kind.PRICE_HELD, report.upstream, message, report.upstream)]
