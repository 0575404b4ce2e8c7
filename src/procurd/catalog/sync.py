"""One catalogue sync pass of one upstream: categories, every page of products, their SKUs.

The pass is orchestration over parts that each hold one concern: the fetch pipeline
(:mod:`procurd.catalog.fetch`: pages fetched by ``concurrency`` workers, decoded once and digested against
the mirror's snapshot as they arrive, handed to a single writer through a bounded queue), the page memory of
earlier passes (:mod:`procurd.catalog.pages`), the listing's bookkeeping
(:class:`procurd.core.listing.Listing`: what was listed, what differs from the mirror, completeness,
removals), the lease (:mod:`procurd.catalog.lease`) and storage, reached through the port
:class:`procurd.catalog.ports.CatalogStore` (each batch of pages stored in one transaction while the next
pages are fetched).

A pass is *full* (every page) or *incremental* (only products updated since the last complete pass, asked
with ``updated_after``). Only a full pass marks rows removed, and only once its listing is known to be
complete (every page fetched, as many distinct products as the upstream's ``total``) and the removal is not
suspiciously large (``max_removed_fraction``). After the listing, the products it touched are repriced.

Only one pass per upstream runs at a time across every process on the database: the pass holds the lease
``catalog-sync:<upstream>`` and renews it while it runs; when another instance holds it the pass is skipped
(and recorded as such).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

import structlog

from procurd.aio import undone_if_cancelled
from procurd.catalog.errors import describe_error
from procurd.catalog.fetch import Failure, PageFetcher
from procurd.catalog.lease import DEFAULT_LEASE_TTL_SECONDS, LeaseKeeper
from procurd.catalog.pages import FetchedPage, PackedPage, PageMemory
from procurd.catalog.ports import CatalogClient, CatalogStore, NotingClient
from procurd.catalog.pricing import reprice_products
from procurd.config import PricingSettings, Settings
from procurd.core.catalog import (
    IncrementalMode,
    PassKind,
    PassPlan,
    Plan,
    choose_pass,
    older_than_asked,
    total_suggests_full_listing,
)
from procurd.core.clock import utcnow
from procurd.core.listing import (
    COMPLETE_STATUSES,
    MAX_PAGE_SIZE,
    Batch,
    Closing,
    Listing,
    RunOutcome,
    RunTotals,
    SyncStatus,
    Written,
)
from procurd.core.pricing import NewHold
from procurd.instance import instance_id
from procurd.upstream.errors import UpstreamError
from procurd.upstream.models import CatalogPage
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.catalog")
T = TypeVar("T")

SKIPPED_BUSY: Final = "another instance is syncing"
CANCELLED: Final = "cancelled before it finished"

ProgressCallback = Callable[[int, int], None]
"""``progress(pages_done, pages_total)``, called after each batch of pages is stored."""


@dataclass(frozen=True, slots=True)
class CatalogAlert:
    """An alert a pass calls for (kinds ``mass_removal_blocked`` and ``price_held``), keyed by upstream."""

    kind: str
    upstream: str
    subject: str
    message: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.upstream}"


@dataclass(frozen=True, slots=True)
class SyncReport:
    """The outcome of one sync pass (also what ``sync_runs`` records of it).

    ``removals_blocked`` and ``deactivations_blocked`` (products a suspicious pass would have removed, and
    taken off sale), ``new_holds`` and what the listing said of the upstream (``includes_inactive``, the page
    sizes) are known to the pass itself only; :meth:`alerts` turns them into the alerts they call for.
    """

    run_id: int | None
    upstream: str
    status: SyncStatus
    pages: int
    categories: int
    products: int
    skus: int
    added: int
    changed: int
    removed: int
    rows_written: int
    violations: list[str]
    error: str | None
    started_at: datetime
    finished_at: datetime | None
    kind: PassKind = "full"
    restored: int = 0
    ignored_updated_after: bool = False
    removals_blocked: int = 0
    new_holds: tuple[NewHold, ...] = ()
    unchanged_pages: int = 0
    """Pages answered byte for byte as in this process's previous pass, and so not decoded (not stored)."""
    deactivations_blocked: int = 0
    # What the listing said of the upstream (``sync_runs`` keeps none of it; see procurd.db.dialect_store).
    includes_inactive: bool | None = field(default=None, compare=False)
    """The listing's ``includes_inactive``: True when the upstream listed what it took off sale too (asked
    with ``include_inactive=true``), False or None (not said) when it did not (or nothing was listed)."""
    page_size_asked: int | None = field(default=None, compare=False)
    page_size_answered: int | None = field(default=None, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> SyncReport:
        """The report of a stored ``sync_runs`` row."""
        return cls(
            run_id=int(row["id"]),
            upstream=str(row["upstream"]),
            status=row["status"],
            pages=int(row["pages"]),
            categories=int(row["categories"]),
            products=int(row["products"]),
            skus=int(row["skus"]),
            added=int(row["added"]),
            changed=int(row["changed"]),
            removed=int(row["removed"]),
            rows_written=int(row["rows_written"]),
            violations=list(row["violations"] or []),
            error=row["error"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            kind=row["kind"],
            restored=int(row["restored"]),
            ignored_updated_after=bool(row["ignored_updated_after"]),
        )

    def alerts(self) -> list[CatalogAlert]:
        """The alerts this pass calls for: ``mass_removal_blocked`` for a suspicious pass, ``price_held``
        for SKUs it held. Alert delivery takes them from here."""
        alerts = []
        if self.status == "suspicious":
            alerts.append(
                CatalogAlert(
                    "mass_removal_blocked",
                    self.upstream,
                    f"catalogue removals of {self.upstream} blocked",
                    self.error or "",
                )
            )
        if self.new_holds:
            held = ", ".join(
                f"SKU {hold.sku_id} ({hold.old_cost} -> {hold.new_cost}, +{hold.percent}%)"
                for hold in self.new_holds[:20]
            )
            more = len(self.new_holds) - 20
            alerts.append(
                CatalogAlert(
                    "price_held",
                    self.upstream,
                    f"{len(self.new_holds)} selling prices of {self.upstream} held",
                    held + (f" and {more} more" if more > 0 else ""),
                )
            )
        return alerts


@dataclass(frozen=True, slots=True)
class SyncOptions:
    """How passes of one upstream run (from the configuration, see :meth:`from_settings`)."""

    page_size: int = 50
    concurrency: int = 4
    incremental: IncrementalMode = "off"
    full_interval_seconds: float = 86400
    max_removed_fraction: float = 0.2
    pricing: PricingSettings = field(default_factory=PricingSettings)
    lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS

    @classmethod
    def from_settings(cls, settings: Settings, upstream: str) -> SyncOptions:
        catalog = settings.catalog
        block = settings.upstream(upstream)
        return cls(
            page_size=catalog.page_size,
            concurrency=catalog.concurrency,
            # An acg-faka shop has no updated_after: each of its listings is the whole shop.
            incremental="off" if block.protocol == "acg-faka" else block.incremental_sync,
            full_interval_seconds=catalog.full_sync_interval_seconds,
            max_removed_fraction=catalog.max_removed_fraction,
            pricing=settings.pricing,
        )


async def run_pass(
    store: CatalogStore,
    client: CatalogClient,
    upstream_name: str,
    *,
    options: SyncOptions | None = None,
    full: bool = False,
    allow_mass_removal: bool = False,
    holder: str | None = None,
    progress: ProgressCallback | None = None,
    page_size: int | None = None,
    concurrency: int | None = None,
    lease_ttl_seconds: float | None = None,
    pages: PageMemory | None = None,
) -> SyncReport:
    """Mirror ``upstream_name``'s catalogue once, storing it in ``store``, and report how it went.

    Failures of the upstream, and of storage during the pass, end the pass as ``failed`` and are recorded on
    its run; only storage too broken to take the lease or record the run raises.

    ``full`` asks for a full pass whatever ``options.incremental`` says; ``allow_mass_removal`` applies
    removals that ``options.max_removed_fraction`` would block. ``page_size`` is what is asked for; the page
    size and total the upstream answers with are followed. ``holder`` names this instance in the lease
    (default ``host:pid``); a pass that finds the lease held elsewhere is recorded as ``skipped`` without
    touching the mirror. ``page_size``, ``concurrency`` and ``lease_ttl_seconds`` override ``options``.
    ``pages``: what this process's earlier passes of the upstream listed (the daemon keeps one per upstream),
    so that pages answered as before are not decoded again.
    """
    options = options or SyncOptions()
    if page_size is not None:
        options = replace(options, page_size=page_size)
    if concurrency is not None:
        options = replace(options, concurrency=concurrency)
    if lease_ttl_seconds is not None:
        options = replace(options, lease_ttl_seconds=lease_ttl_seconds)
    if options.concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    lease = LeaseKeeper(store, upstream_name, holder or instance_id(), options.lease_ttl_seconds)
    now = utcnow()
    if not await lease.acquire(now):
        kind: PassKind = "full" if full or options.incremental == "off" else "incremental"
        run_id = await store.record_skipped(upstream_name, now, kind, SKIPPED_BUSY)
        log.info("catalog.sync_skipped", upstream=upstream_name, reason=SKIPPED_BUSY, run_id=run_id)
        return SyncReport(
            run_id, upstream_name, "skipped", 0, 0, 0, 0, 0, 0, 0, 0, [], SKIPPED_BUSY, now, now, kind
        )
    try:
        sync = _SyncPass(
            store,
            client,
            upstream_name,
            options=replace(options, page_size=min(max(options.page_size, 1), MAX_PAGE_SIZE)),
            force_full=full,
            allow_mass_removal=allow_mass_removal,
            progress=progress,
            lease=lease,
            pages=pages if pages is not None else PageMemory(),
        )
        return await sync.run()
    finally:
        await lease.release()


class _SyncPass:
    """One pass: the order of its steps, and what it reports. Each step is another part's (see the module's
    docstring); what is here is the sequence, the failures, and the run's record."""

    def __init__(
        self,
        store: CatalogStore,
        client: CatalogClient,
        upstream: str,
        *,
        options: SyncOptions,
        force_full: bool,
        allow_mass_removal: bool,
        progress: ProgressCallback | None,
        lease: LeaseKeeper,
        pages: PageMemory,
    ) -> None:
        self._store = store
        self._client = client
        self._upstream = upstream
        self._options = options
        self._force_full = force_full
        self._allow_mass_removal = allow_mass_removal
        self._progress = progress
        self._lease = lease
        self._memory = pages
        self._remembered: dict[bytes, PackedPage] = {}
        self._failure = Failure()
        self._fetcher = PageFetcher(client, upstream, concurrency=options.concurrency, failure=self._failure)
        self._totals = RunTotals()
        # Not a method of the pass: the listing keeps it, and a cycle would keep the pass's snapshot alive
        # after the pass, until the garbage collector finds it (with the next pass's snapshot beside it).
        self._violation = _violations(self._totals, upstream)
        self._listing = Listing(self._violation)
        self._written = Written()
        self._run_id = 0
        self._started_at = utcnow()
        self._finished = asyncio.Event()
        self._plan = PassPlan("full", None, "")
        self._initial = False
        self._ignored_updated_after = False
        self._blocked: Closing | None = None  # what the mass-removal guard held back
        self._partial = False  # the upstream said its listing left some of its goods for a later one
        self._new_holds: tuple[NewHold, ...] = ()

    @property
    def _page_size(self) -> int:
        return self._options.page_size

    async def run(self) -> SyncReport:
        self._started_at = utcnow()
        started = self._started_at
        history = await self._store.pass_history(self._upstream)
        self._initial = history.last_complete_at is None
        self._plan = choose_pass(
            history,
            started,
            mode=self._options.incremental,
            full_interval=timedelta(seconds=self._options.full_interval_seconds),
            force_full=self._force_full,
        )
        recalled = self._memory.recall(history.last_run_id)
        self._fetcher.seen = recalled if self._plan.kind == "full" else {}
        self._fetcher.updated_after = self._plan.updated_after
        self._run_id = await undone_if_cancelled(
            self._store.start_run(self._upstream, started, self._plan.kind), self._cut_short
        )
        log.info(
            "catalog.sync_started",
            upstream=self._upstream,
            run_id=self._run_id,
            kind=self._plan.kind,
            reason=self._plan.reason,
            updated_after=self._plan.updated_after,
        )
        keeper = asyncio.create_task(self._lease.keep(self._finished, self._failure.set))
        try:
            return await self._execute()
        finally:
            self._finished.set()
            await keeper

    async def _cut_short(self, run_id: int) -> None:
        """A pass cancelled as its run was being recorded: the run is recorded as cut short."""
        self._run_id = run_id
        await self._finish("failed", CANCELLED, (), reprice=False)

    async def _record_kind(self) -> None:
        await self._store.set_run_kind(self._run_id, self._plan.kind, self._plan.updated_after)

    async def _execute(self) -> SyncReport:
        try:
            if self._plan.updated_after is not None:
                await self._record_kind()
            await self._collect()
            closing = await self._closing_plans()
            status: SyncStatus = "suspicious" if self._blocked is not None else "ok"
            error = None if self._blocked is None else self._blocked.guard.reason
        except asyncio.CancelledError:
            await self._finish("failed", CANCELLED, (), reprice=False)
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is recorded on the run, never raised
            return await self._finish("failed", describe_error(exc, self._store), ())
        return await self._finish(status, error, closing)

    async def _finish(
        self, status: SyncStatus, error: str | None, closing: Sequence[Plan], *, reprice: bool = True
    ) -> SyncReport:
        if closing:
            try:
                await self._write(closing)
            except Exception as exc:  # noqa: BLE001 - recorded on the run
                status, error = "failed", describe_error(exc, self._store)
        if reprice:
            await self._reprice()
        self._totals.close(self._listing.counts)
        finished_at = utcnow()
        outcome = RunOutcome(
            status, self._plan.kind, finished_at, self._totals, error, self._ignored_updated_after
        )
        said = self._listing.said(self._page_size, finished_at)
        await self._store.finish_run(self._upstream, self._run_id, outcome, said)
        if status in COMPLETE_STATUSES:
            self._memory.passed(self._run_id, self._remembered if self._plan.kind == "full" else None)
        else:
            self._memory.forget()
        report = self._report(status, error, finished_at)
        event = "catalog_sync_finished" if status == "ok" else f"catalog_sync_{status}"
        emit = log.info if status == "ok" else log.warning
        emit(
            event,
            upstream=self._upstream,
            run_id=self._run_id,
            kind=report.kind,
            seconds=round((finished_at - self._started_at).total_seconds(), 3),
            pages=report.pages,
            unchanged_pages=report.unchanged_pages,
            products=report.products,
            skus=report.skus,
            added=report.added,
            restored=report.restored,
            changed=report.changed,
            removed=report.removed,
            rows_written=report.rows_written,
            violations=len(report.violations),
            held=len(report.new_holds),
            error=error,
        )
        return report

    async def _reprice(self) -> None:
        """Reprice the products this pass wrote (a failure is a violation: the listing stays stored)."""
        try:
            repriced = await reprice_products(
                self._store,
                self._upstream,
                self._options.pricing,
                client=self._client,
                product_ids=self._written.products,
                cost_rises=self._written.cost_rises,
                run_id=self._run_id,
                log_changes=not self._initial,
            )
        except Exception as exc:
            if not isinstance(exc, UpstreamError) and self._store.failure(exc) is None:
                raise
            self._violation(f"selling prices not recomputed: {describe_error(exc, self._store)}")
            return
        for problem in repriced.problems:
            self._violation(problem)
        self._new_holds = tuple(repriced.new_holds)

    def _report(self, status: SyncStatus, error: str | None, finished_at: datetime) -> SyncReport:
        totals, listing, blocked = self._totals, self._listing, self._blocked
        return SyncReport(
            run_id=self._run_id,
            upstream=self._upstream,
            status=status,
            pages=totals.pages,
            categories=totals.categories,
            products=totals.products,
            skus=totals.skus,
            added=totals.added,
            changed=totals.changed,
            removed=totals.removed,
            rows_written=totals.rows_written,
            violations=list(totals.violations),
            error=error,
            started_at=self._started_at,
            finished_at=finished_at,
            kind=self._plan.kind,
            restored=totals.restored,
            ignored_updated_after=self._ignored_updated_after,
            removals_blocked=blocked.products_removed if blocked else 0,
            new_holds=self._new_holds,
            unchanged_pages=self._fetcher.unchanged_pages,
            deactivations_blocked=blocked.products_deactivated if blocked else 0,
            includes_inactive=listing.includes_inactive,
            page_size_asked=self._page_size if listing.page_size else None,
            page_size_answered=listing.page_size or None,
        )

    # --- the listing ----------------------------------------------------------------------------------------

    async def _collect(self) -> None:
        fetcher, listing = self._fetcher, self._listing
        # The snapshot loads from storage while the first answers come from the upstream. When one of them
        # fails the others still finish: a database read cut off mid-way can leave SQLite locked.
        snapshot, categories, first = await asyncio.gather(
            self._store.load_snapshot(self._upstream),
            self._client.catalog_categories(priority=Priority.CATALOG),
            fetcher.first(self._page_size),
            return_exceptions=True,
        )
        listing.load(_outcome(snapshot))
        fetcher.snapshot = listing.snapshot
        first_page = await fetcher.resolve(1, self._page_size, _outcome(first))
        ignored = (
            self._plan.kind == "incremental"
            and isinstance(first_page, CatalogPage)
            and self._upstream_ignores_filter(first_page, first=True)
        )
        if ignored and self._options.incremental == "auto":
            first_page = await self._fall_back_to_full()
        await self._write([listing.categories(_outcome(categories))])
        listed = len(first_page.items) if isinstance(first_page, CatalogPage) else len(first_page.products)
        listing.first_page(first_page, listed, self._page_size)
        if listing.page_size != self._page_size:
            log.info(
                "catalog.page_size_clamped",
                upstream=self._upstream,
                asked=self._page_size,
                answered=listing.page_size,
            )
        await fetcher.run(
            fetcher.decoded(first_page),
            listing.pages_total,
            listing.page_size,
            check=self._check_page,
            store=self._write_products,
        )
        self._failure.raise_if_set()
        if isinstance(self._client, NotingClient):
            for note in self._client.catalog_notes():
                self._violation(note)
            self._partial = not self._client.catalog_complete()
        if self._plan.kind == "full" and not self._partial:
            listing.check_complete()

    def _check_page(self, page: CatalogPage | FetchedPage, number: int) -> None:
        self._listing.page(page, number)
        if self._plan.kind == "incremental" and isinstance(page, CatalogPage):
            self._upstream_ignores_filter(page, first=False)

    def _upstream_ignores_filter(self, page: CatalogPage, *, first: bool) -> bool:
        """Whether an incremental answer shows that the upstream did not filter by ``updated_after``: a
        product updated before it, or (first page) a total as long as the whole mirrored catalogue."""
        since = self._plan.updated_after
        assert since is not None
        live_products = self._listing.live_products
        older = older_than_asked(page.items, since)
        if older is not None:
            evidence = f"product {older} was last updated before the updated_after asked for"
        elif first and total_suggests_full_listing(page.total, live_products, page.page_size):
            evidence = f"its total {page.total} covers the {live_products} products already mirrored"
        else:
            return False
        if not self._ignored_updated_after:
            log.warning(
                "catalog.updated_after_ignored",
                upstream=self._upstream,
                evidence=evidence,
                mode=self._options.incremental,
            )
        self._ignored_updated_after = True
        return True

    async def _fall_back_to_full(self) -> CatalogPage | FetchedPage:
        self._plan = PassPlan("full", None, "the upstream ignored updated_after")
        self._fetcher.updated_after = None
        await self._record_kind()
        return await self._fetcher.page(1, self._page_size)

    async def _write_products(self, pages: Sequence[FetchedPage]) -> None:
        """Store one batch of pages: what differs from the mirror is written, the rest only noted."""
        batch = Batch()
        stored_as_listed = []
        for page in pages:
            as_listed = self._listing.take(batch, page.products, page.includes_inactive)
            if as_listed and page.body_digest:
                stored_as_listed.append(page)
        await self._write(self._listing.plans(batch))
        for page in stored_as_listed:
            self._remember(page)
        self._totals.pages += len(pages)
        if self._progress is not None:
            self._progress(self._totals.pages, self._listing.pages_total)

    def _remember(self, page: FetchedPage) -> None:
        """Remember a page stored as listed, for the next pass."""
        packed = page.pack()
        if packed is not None:
            self._remembered[page.body_digest] = packed

    async def _write(self, plans: Sequence[Plan]) -> None:
        self._failure.raise_if_set()
        if not any(plan.rows for plan in plans):
            return
        written = await self._store.write_plans(
            self._upstream, plans, run_id=self._run_id, now=utcnow(), log_additions=not self._initial
        )
        self._listing.stored(plans)
        self._totals.count(plans)
        self._written.add(written)

    async def _closing_plans(self) -> list[Plan]:
        """What the pass writes once its listing is done (see :meth:`Listing.closing`); nothing of it when
        the pass is suspicious."""
        held = self._listing.held_ids()
        as_stored = await self._store.products_as_stored(self._upstream, held) if held else {}
        closing = self._listing.closing(
            full=self._plan.kind == "full" and not self._partial,  # a partial listing removes nothing
            held_as_stored=as_stored,
            max_fraction=self._options.max_removed_fraction,
            allowed=self._allow_mass_removal,
        )
        guard = closing.guard
        if guard.reason is not None:
            log.warning("catalog.sync_mass_removal_blocked", upstream=self._upstream, reason=guard.reason)
        if guard.blocked:
            self._blocked = closing
        return closing.plans


def _violations(totals: RunTotals, upstream: str) -> Callable[[str], None]:
    """Where a pass's violations go: its totals (the first hundred) and the log."""

    def violation(text: str) -> None:
        if totals.violation(text):
            log.warning("catalog.violation", upstream=upstream, violation=text)

    return violation


def _outcome(result: T | BaseException) -> T:
    """A result of ``gather(..., return_exceptions=True)``, raising the exception it stands for."""
    if isinstance(result, BaseException):
        raise result
    return result
