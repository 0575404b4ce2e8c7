"""One catalogue sync pass of one upstream: categories, every page of products, their SKUs.

Pages are fetched by ``concurrency`` tasks, decoded once, and digested against the snapshot as they arrive;
only what differs from the mirror is kept and handed to a single writer task through a queue (pages fetched
but not yet stored are bounded). The writer builds records from the decoded values and stores each batch of
pages in one transaction on the database's writer (a thread on SQLite), while the next pages are fetched.

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
import contextlib
import math
import secrets
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Final, Literal, Protocol, TypeVar

import structlog

from procurd.aio import undone_if_cancelled
from procurd.catalog.listed import Changes, FetchedPage, HeldBack, ListedProduct, PackedPage
from procurd.catalog.listed import PageMemory as PageMemory  # re-exported: callers import it from here
from procurd.catalog.pricing import CurrencySource, reprice_upstream
from procurd.config import PricingSettings, Settings
from procurd.core.catalog import (
    ENTITIES,
    CategoryRules,
    Entity,
    IncompleteRecord,
    IncrementalMode,
    PassKind,
    PassPlan,
    Plan,
    Record,
    Snapshot,
    apply_plan,
    category_record,
    choose_pass,
    deactivated,
    diff_listed,
    diff_unlisted,
    digest_of,
    log_changes,
    older_than_asked,
    product_record,
    removal_guard,
    sku_record,
    total_suggests_full_listing,
)
from procurd.core.pricing import NewHold
from procurd.db.database import Database
from procurd.db.errors import DatabaseError
from procurd.db.mirror_store import COMPLETE_STATUSES, RunOutcome, RunTotals
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.instance import instance_id
from procurd.logs import scrub
from procurd.protocol.dujiao.models import CatalogPage, SeenPage
from procurd.upstream.errors import UpstreamError, truncate
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.catalog")
T = TypeVar("T")

LEASE_PREFIX: Final = "catalog-sync:"
DEFAULT_LEASE_TTL_SECONDS: Final = 60.0
SKIPPED_BUSY: Final = "another instance is syncing"
CANCELLED: Final = "cancelled before it finished"
MAX_PAGE_SIZE: Final = 100
# Rows (products plus SKUs) the writer gathers from queued pages into one transaction at most.
WRITE_BATCH_ROWS: Final = 2000
MAX_VIOLATIONS: Final = 100
MAX_ERROR_CHARS: Final = 500

SyncStatus = Literal["running", "ok", "failed", "skipped", "suspicious"]
ProgressCallback = Callable[[int, int], None]
"""``progress(pages_done, pages_total)``, called after each batch of pages is stored."""


class CatalogClient(CurrencySource, Protocol):
    """What a sync needs of :class:`procurd.upstream.UpstreamClient`."""

    async def catalog_categories(self, *, priority: Priority = ...) -> list[dict[str, Any]]: ...

    async def catalog_page(
        self,
        page: int = ...,
        page_size: int = ...,
        *,
        updated_after: datetime | None = ...,
        priority: Priority = ...,
        seen: Container[bytes],
    ) -> CatalogPage | SeenPage: ...


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
        return cls(
            page_size=catalog.page_size,
            concurrency=catalog.concurrency,
            incremental=settings.upstream(upstream).incremental_sync,
            full_interval_seconds=catalog.full_sync_interval_seconds,
            max_removed_fraction=catalog.max_removed_fraction,
            pricing=settings.pricing,
        )


class IncompleteListing(Exception):
    """The upstream's listing cannot be trusted to be complete, so nothing may be marked removed."""


class LeaseLost(Exception):
    """Another instance took the sync lease while this pass was running."""


async def run_sync(
    database: Database,
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
    """Mirror ``upstream_name``'s catalogue once and report how it went.

    Failures of the upstream, and of the database during the pass, end the pass as ``failed`` and are
    recorded on its run; only a database too broken to take the lease or record the run raises.

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
    lease_name = LEASE_PREFIX + upstream_name
    # A token per pass: two passes in one process exclude each other like passes on two machines.
    lease_holder = f"{holder or instance_id()}#{secrets.token_hex(4)}"
    now = utcnow()

    async def give_back(acquired: bool) -> None:
        if acquired:
            await _release(database, lease_name, lease_holder)

    acquiring = database.write(
        lambda tx: tx.leases.acquire(lease_name, lease_holder, now, options.lease_ttl_seconds)
    )
    if not await undone_if_cancelled(acquiring, give_back):
        kind: PassKind = "full" if full or options.incremental == "off" else "incremental"
        run_id = await database.write(
            lambda tx: tx.mirror.record_skipped(upstream_name, now, kind, SKIPPED_BUSY)
        )
        log.info("catalog.sync_skipped", upstream=upstream_name, reason=SKIPPED_BUSY, run_id=run_id)
        return SyncReport(
            run_id, upstream_name, "skipped", 0, 0, 0, 0, 0, 0, 0, 0, [], SKIPPED_BUSY, now, now, kind
        )
    try:
        sync = _SyncPass(
            database,
            client,
            upstream_name,
            options=replace(options, page_size=min(max(options.page_size, 1), MAX_PAGE_SIZE)),
            force_full=full,
            allow_mass_removal=allow_mass_removal,
            progress=progress,
            lease=_Lease(lease_name, lease_holder, options.lease_ttl_seconds),
            pages=pages if pages is not None else PageMemory(),
        )
        return await sync.run()
    finally:
        await _release(database, lease_name, lease_holder)


async def last_sync(database: Database, upstream: str, *, finished: bool = False) -> SyncReport | None:
    """The most recent pass of ``upstream`` that ran (skipped ones are not), or ``None``.

    While a pass is under way that is the ``running`` one, unless ``finished`` asks for the last that ended.
    """
    row = await database.read(lambda tx: tx.mirror.last_run(upstream, finished=finished))
    return None if row is None else SyncReport.from_row(row)


async def _release(database: Database, name: str, holder: str) -> None:
    try:
        await database.write(lambda tx: tx.leases.release(name, holder))
    except DatabaseError as exc:
        # The lease expires on its own; a failed release only delays the next pass.
        log.warning("catalog.sync_lease_release_failed", lease=name, error=describe_error(exc))


@dataclass(frozen=True, slots=True)
class _Lease:
    name: str
    holder: str
    ttl_seconds: float


def _start_run(tx: Tx, upstream: str, started: datetime, kind: PassKind) -> int:
    """Close the runs an earlier holder of the lease left running (it died), and record this one."""
    tx.mirror.close_interrupted_runs(upstream, started)
    return tx.mirror.start_run(upstream, started, kind)


def _renew(tx: Tx, lease: _Lease, now: datetime) -> bool:
    return tx.leases.renew(lease.name, lease.holder, now, lease.ttl_seconds)


class _Done:
    """The end of the page queue."""


_DONE: Final = _Done()


@dataclass(slots=True)
class _Listing:
    """What the upstream listed during this pass.

    Listed ids that the mirror holds are marked in the snapshot itself (:meth:`Snapshot.mark_listed`); only
    ids that could not be mirrored are kept here, to recognise them when a shifting listing repeats them.
    """

    counts: dict[Entity, int] = field(default_factory=lambda: dict.fromkeys(ENTITIES, 0))
    unmirrored: dict[Entity, set[int]] = field(default_factory=lambda: {entity: set() for entity in ENTITIES})
    totals: set[int] = field(default_factory=set)
    page_size: int = 0
    pages_total: int = 0
    includes_inactive: bool | None = None  # what the first page answered


@dataclass(slots=True)
class _Written:
    """What a batch's writes touched, for repricing: products, and SKUs' cost changes."""

    products: set[int] = field(default_factory=set)
    cost_rises: dict[int, tuple[str, str]] = field(default_factory=dict)

    def add(self, other: _Written) -> None:
        self.products |= other.products
        self.cost_rises.update(other.cost_rises)


def _write_plans(
    tx: Tx, upstream: str, plans: Sequence[Plan], *, run_id: int, now: datetime, log_additions: bool
) -> _Written:
    """Write ``plans`` with their change-log entries (old values read from the rows they rewrite)."""
    written = _Written()
    for plan in plans:
        # Rows in id order: concurrent writers on PostgreSQL then lock them in one order.
        for records in (plan.inserts, plan.updates, plan.restores):
            records.sort(key=lambda record: record.id)
        plan.removals.sort()
        known_ids = plan.known_ids()
        known = tx.mirror.known_rows(upstream, plan.entity, known_ids) if known_ids else None
        log_changes(plan, known.tracked if known else {}, log_additions=log_additions)
        tx.mirror.write_plan(upstream, plan, run_id=run_id, now=now)
        if plan.entity == "product":
            written.products.update(record.id for record in (*plan.inserts, *plan.updates, *plan.restores))
            written.products.update(plan.removals)
        elif plan.entity == "sku":
            written.products.update(
                record.values["product_id"] for record in (*plan.inserts, *plan.updates, *plan.restores)
            )
            if known is not None:
                written.products.update(known.product_of.values())
            for change in plan.changes:
                if change.field == "price_amount" and change.old_value is not None and change.new_value:
                    written.cost_rises[change.entity_id] = (change.old_value, change.new_value)
    return written


class _SyncPass:
    def __init__(
        self,
        database: Database,
        client: CatalogClient,
        upstream: str,
        *,
        options: SyncOptions,
        force_full: bool,
        allow_mass_removal: bool,
        progress: ProgressCallback | None,
        lease: _Lease,
        pages: PageMemory,
    ) -> None:
        self._database = database
        self._client = client
        self._upstream = upstream
        self._options = options
        self._force_full = force_full
        self._allow_mass_removal = allow_mass_removal
        self._progress = progress
        self._lease = lease
        self._totals = RunTotals()
        self._listing = _Listing()
        self._snapshot: dict[Entity, Snapshot] = {}
        self._rules = CategoryRules({}, {}, frozenset())
        self._violations_left_out = 0
        self._failure: BaseException | None = None
        self._run_id = 0
        self._started_at = utcnow()
        self._finished = asyncio.Event()
        self._plan = PassPlan("full", None, "")
        self._initial = False
        self._ignored_updated_after = False
        self._live_products = 0
        self._written = _Written()
        self._removals_blocked = 0
        self._deactivations_blocked = 0
        self._blocked_reason: str | None = None
        self._held = HeldBack()
        self._new_holds: tuple[NewHold, ...] = ()
        self._memory = pages
        self._seen: Mapping[bytes, PackedPage] = {}
        self._remembered: dict[bytes, PackedPage] = {}
        self._unchanged_pages = 0
        # Pages being fetched or waiting to be stored: bounded, so memory does not grow when fetching outpaces
        # writing, yet wide enough that fetching goes on while the writer stores a batch.
        self._window = asyncio.Semaphore(max(2, 2 * options.concurrency))

    @property
    def _page_size(self) -> int:
        return self._options.page_size

    async def run(self) -> SyncReport:
        self._started_at = utcnow()
        started = self._started_at
        history = await self._database.read(lambda tx: tx.mirror.pass_history(self._upstream))
        self._initial = history.last_complete_at is None
        self._plan = choose_pass(
            history,
            started,
            mode=self._options.incremental,
            full_interval=timedelta(seconds=self._options.full_interval_seconds),
            force_full=self._force_full,
        )
        recalled = self._memory.recall(history.last_run_id)
        self._seen = recalled if self._plan.kind == "full" else {}
        self._run_id = await undone_if_cancelled(
            self._database.write(_start_run, self._upstream, started, self._plan.kind), self._cut_short
        )
        log.info(
            "catalog.sync_started",
            upstream=self._upstream,
            run_id=self._run_id,
            kind=self._plan.kind,
            reason=self._plan.reason,
            updated_after=self._plan.updated_after,
        )
        keeper = asyncio.create_task(self._keep_lease())
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
        kind, since = self._plan.kind, self._plan.updated_after
        await self._database.write(lambda tx: tx.mirror.set_run_kind(self._run_id, kind, since))

    async def _execute(self) -> SyncReport:
        try:
            if self._plan.updated_after is not None:
                await self._record_kind()
            await self._collect()
            closing = await self._closing_plans()
            status: SyncStatus = "suspicious" if self._blocked_reason is not None else "ok"
            error = self._blocked_reason
        except asyncio.CancelledError:
            await self._finish("failed", CANCELLED, (), reprice=False)
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is recorded on the run, never raised
            return await self._finish("failed", describe_error(exc), ())
        return await self._finish(status, error, closing)

    async def _finish(
        self, status: SyncStatus, error: str | None, closing: Sequence[Plan], *, reprice: bool = True
    ) -> SyncReport:
        if closing:
            try:
                await self._write(closing)
            except Exception as exc:  # noqa: BLE001 - recorded on the run
                status, error = "failed", describe_error(exc)
        if reprice:
            await self._reprice()
        self._totals.categories = self._listing.counts["category"]
        self._totals.products = self._listing.counts["product"]
        self._totals.skus = self._listing.counts["sku"]
        if self._violations_left_out:
            self._totals.violations.append(f"... and {self._violations_left_out} more violations")
        finished_at = utcnow()
        outcome = RunOutcome(
            status, self._plan.kind, finished_at, self._totals, error, self._ignored_updated_after
        )
        learned = self._learned(finished_at)

        def record(tx: Tx) -> None:
            tx.mirror.finish_run(self._run_id, outcome)
            if learned:
                tx.dialects.learn(self._upstream, learned, finished_at)

        await self._database.write(record)
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

    def _learned(self, now: datetime) -> dict[str, Any]:
        """What the listing showed of the upstream's dialect, once its first page was answered."""
        if not self._listing.page_size:
            return {}
        return {
            "includes_inactive": self._listing.includes_inactive is True,
            "page_size_asked": self._page_size,
            "page_size": self._listing.page_size,
            "listing_at": now,
        }

    async def _reprice(self) -> None:
        """Reprice the products this pass wrote (a failure is a violation: the listing stays stored)."""
        try:
            repriced = await reprice_upstream(
                self._database,
                self._upstream,
                self._options.pricing,
                client=self._client,
                product_ids=self._written.products,
                cost_rises=self._written.cost_rises,
                run_id=self._run_id,
                log_changes=not self._initial,
            )
        except (DatabaseError, UpstreamError) as exc:
            self._violation(f"selling prices not recomputed: {describe_error(exc)}")
            return
        for problem in repriced.problems:
            self._violation(problem)
        self._new_holds = tuple(repriced.new_holds)

    def _report(self, status: SyncStatus, error: str | None, finished_at: datetime) -> SyncReport:
        totals = self._totals
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
            removals_blocked=self._removals_blocked,
            new_holds=self._new_holds,
            unchanged_pages=self._unchanged_pages,
            deactivations_blocked=self._deactivations_blocked,
            includes_inactive=self._listing.includes_inactive,
            page_size_asked=self._page_size if self._listing.page_size else None,
            page_size_answered=self._listing.page_size or None,
        )

    # --- the lease ---------------------------------------------------------------------------------------

    async def _keep_lease(self) -> None:
        interval = self._lease.ttl_seconds / 3
        while not self._finished.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished.wait(), interval)
                return
            try:
                renewed = await self._database.write(_renew, self._lease, utcnow())
            except DatabaseError as exc:
                log.warning(
                    "catalog.sync_lease_renewal_failed", upstream=self._upstream, error=describe_error(exc)
                )
                continue
            if not renewed:
                log.warning("catalog.sync_lease_lost", upstream=self._upstream, lease=self._lease.name)
                self._abort(LeaseLost(f"lease {self._lease.name} was taken by another instance"))
                return

    def _abort(self, failure: BaseException) -> None:
        if self._failure is None:
            self._failure = failure

    # --- fetching and writing ----------------------------------------------------------------------------

    async def _request(self, number: int, page_size: int, seen: Container[bytes]) -> CatalogPage | SeenPage:
        return await self._client.catalog_page(
            number, page_size, updated_after=self._plan.updated_after, priority=Priority.CATALOG, seen=seen
        )

    async def _resolve(
        self, number: int, page_size: int, answer: CatalogPage | SeenPage
    ) -> CatalogPage | FetchedPage:
        """A page answered as one this process remembers becomes that page, if the mirror still holds its
        products as listed then; otherwise it is fetched again and decoded."""
        if isinstance(answer, CatalogPage):
            return answer
        remembered = self._seen[answer.body_digest].unpack()
        if remembered.unchanged_in(self._snapshot):
            self._unchanged_pages += 1
            return remembered
        log.info("catalog.page_fetched_again", upstream=self._upstream, page=number)
        fetched = await self._request(number, page_size, ())
        assert isinstance(fetched, CatalogPage)
        return fetched

    async def _page(self, number: int, page_size: int) -> CatalogPage | FetchedPage:
        answer = await self._request(number, page_size, self._seen)
        return await self._resolve(number, page_size, answer)

    async def _collect(self) -> None:
        # The snapshot loads from the database while the first answers come from the upstream. When one of
        # them fails the others still finish: a database read cut off mid-way can leave SQLite locked.
        snapshot, categories, first = await asyncio.gather(
            self._database.read(lambda tx: tx.mirror.load_snapshot(self._upstream)),
            self._client.catalog_categories(priority=Priority.CATALOG),
            self._request(1, self._page_size, self._seen),
            return_exceptions=True,
        )
        self._snapshot = _outcome(snapshot)
        self._live_products = self._snapshot["product"].live_count()
        first_page = await self._resolve(1, self._page_size, _outcome(first))
        ignored = (
            self._plan.kind == "incremental"
            and isinstance(first_page, CatalogPage)
            and self._upstream_ignores_filter(first_page, first=True)
        )
        if ignored and self._options.incremental == "auto":
            first_page = await self._fall_back_to_full()
        await self._sync_categories(_outcome(categories))
        self._follow_first_page(first_page)
        fetched_first = self._fetched(first_page)
        await self._window.acquire()
        queue: asyncio.Queue[FetchedPage | _Done] = asyncio.Queue()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._write_pages(queue))
            tasks.create_task(self._fetch_pages(queue, fetched_first))
        if self._failure is not None:
            raise self._failure
        if self._plan.kind == "full":
            self._check_complete()

    def _upstream_ignores_filter(self, page: CatalogPage, *, first: bool) -> bool:
        """Whether an incremental answer shows that the upstream did not filter by ``updated_after``: a
        product updated before it, or (first page) a total as long as the whole mirrored catalogue."""
        since = self._plan.updated_after
        assert since is not None
        older = older_than_asked(page.items, since)
        if older is not None:
            evidence = f"product {older} was last updated before the updated_after asked for"
        elif first and total_suggests_full_listing(page.total, self._live_products, page.page_size):
            evidence = f"its total {page.total} covers the {self._live_products} products already mirrored"
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
        await self._record_kind()
        return await self._page(1, self._page_size)

    async def _sync_categories(self, categories: Sequence[dict[str, Any]]) -> None:
        records: dict[int, Record] = {}
        listed: set[int] = set()
        for payload in categories:
            identity = payload["id"]
            if identity in listed:
                continue
            # Listed counts whether or not it can be stored: an unusable category is never removed for it.
            listed.add(identity)
            self._snapshot["category"].mark_listed(identity)
            try:
                records[identity] = category_record(payload, digest_of(payload))
            except IncompleteRecord as exc:
                self._violation(str(exc))
            except TypeError as exc:
                self._violation(f"category {identity} cannot be stored as JSON ({exc}): not mirrored")
        self._listing.counts["category"] = len(listed)
        self._rules = CategoryRules.from_records(records.values())
        for violation in self._rules.category_violations():
            self._violation(violation)
        await self._write([diff_listed("category", records.values(), self._snapshot["category"])])

    def _follow_first_page(self, first: CatalogPage | FetchedPage) -> None:
        self._check_page_number(first, 1)
        listed = len(first.items) if isinstance(first, CatalogPage) else len(first.products)
        answered = first.page_size if first.page_size > 0 else listed or self._page_size
        self._listing.page_size = min(answered, MAX_PAGE_SIZE)
        self._listing.includes_inactive = first.includes_inactive
        self._listing.totals.add(first.total)
        self._listing.pages_total = max(1, math.ceil(max(first.total, 0) / self._listing.page_size))
        if self._listing.page_size != self._page_size:
            log.info(
                "catalog.page_size_clamped",
                upstream=self._upstream,
                asked=self._page_size,
                answered=self._listing.page_size,
            )

    def _check_page_number(self, page: CatalogPage | FetchedPage, number: int) -> None:
        if page.page != number:
            raise IncompleteListing(f"asked for page {number}, the upstream answered page {page.page}")

    def _fetched(self, page: CatalogPage | FetchedPage) -> FetchedPage:
        if isinstance(page, FetchedPage):
            return page
        products = [ListedProduct.of(item, self._snapshot) for item in page.items]
        return FetchedPage(
            page.page, products, page.total, page.page_size, page.body_digest, None, page.includes_inactive
        )

    async def _fetch_pages(self, queue: asyncio.Queue[FetchedPage | _Done], first: FetchedPage) -> None:
        queue.put_nowait(first)
        numbers = iter(range(2, self._listing.pages_total + 1))
        async with asyncio.TaskGroup() as tasks:
            for _ in range(min(self._options.concurrency, self._listing.pages_total - 1)):
                tasks.create_task(self._fetch_worker(numbers, queue))
        queue.put_nowait(_DONE)

    async def _fetch_worker(self, numbers: Iterator[int], queue: asyncio.Queue[FetchedPage | _Done]) -> None:
        for number in numbers:
            await self._window.acquire()
            if self._failure is not None:
                self._window.release()
                return
            try:
                page = await self._page(number, self._listing.page_size)
                self._check_page_number(page, number)
                self._listing.totals.add(page.total)
                if self._plan.kind == "incremental" and isinstance(page, CatalogPage):
                    self._upstream_ignores_filter(page, first=False)
                fetched = self._fetched(page)
            except Exception as exc:  # noqa: BLE001 - ends the fetching; the pass records it as failed
                self._window.release()
                self._abort(exc)
                return
            queue.put_nowait(fetched)

    async def _write_pages(self, queue: asyncio.Queue[FetchedPage | _Done]) -> None:
        finished = False
        while not finished:
            pages: list[FetchedPage] = []
            rows = 0
            item = await queue.get()
            while True:
                if isinstance(item, _Done):
                    finished = True
                    break
                pages.append(item)
                rows += item.rows
                if queue.empty() or rows >= WRITE_BATCH_ROWS:
                    break
                item = queue.get_nowait()
            if pages and self._failure is None:
                try:
                    await self._write_products(pages)
                except Exception as exc:  # noqa: BLE001 - stops the fetchers; the pass records it as failed
                    self._abort(exc)
            for _ in pages:
                self._window.release()

    async def _write_products(self, pages: Sequence[FetchedPage]) -> None:
        new_ids: dict[Entity, set[int]] = {"product": set(), "sku": set()}
        products: list[Record] = []
        skus: list[Record] = []
        stored_as_listed: list[FetchedPage] = []
        for page in pages:
            as_listed = True  # every product of the page is held, or about to be stored, as listed
            for listed in page.products:
                if listed.changes is None and listed.problem is None:
                    as_listed &= self._unchanged(listed)
                elif page.includes_inactive and self._taken_off_sale(listed):
                    self._changed(listed, new_ids, self._held.products, self._held.skus)
                    self._not_mirrored("sku", listed.sku_ids, new_ids)
                    as_listed = False  # not stored until the pass ends: not remembered as stored
                else:
                    as_listed &= self._changed(listed, new_ids, products, skus)
            if as_listed and page.body_digest:
                stored_as_listed.append(page)
        await self._write(
            [
                diff_listed("product", products, self._snapshot["product"]),
                diff_listed("sku", skus, self._snapshot["sku"]),
            ]
        )
        for page in stored_as_listed:
            self._remember(page)
        self._totals.pages += len(pages)
        if self._progress is not None:
            self._progress(self._totals.pages, self._listing.pages_total)

    def _unchanged(self, listed: ListedProduct) -> bool:
        """A product the mirror holds as listed, SKUs included: only noted as listed (and checked).
        False when this pass saw it before (a shifted listing)."""
        if not self._snapshot["product"].mark_listed(listed.id):
            return False  # seen on an earlier page: the listing shifted under us
        counts = self._listing.counts
        counts["product"] += 1
        skus = self._snapshot["sku"]
        marked = sum(skus.mark_listed(sku_id) for sku_id in listed.sku_ids)
        counts["sku"] += marked
        self._check_category(listed)
        return marked == len(listed.sku_ids)

    def _changed(
        self,
        listed: ListedProduct,
        new_ids: dict[Entity, set[int]],
        products: list[Record],
        skus: list[Record],
    ) -> bool:
        """Add the records of a product that differs from the mirror (and of its SKUs that differ) to
        ``products`` and ``skus``; True when every one of them could be made as listed."""
        if not self._first_listing("product", listed.id, new_ids):
            return False  # seen on an earlier page: the listing shifted under us
        self._check_category(listed)
        fresh_skus = [
            position
            for position, sku_id in enumerate(listed.sku_ids)
            if self._first_listing("sku", sku_id, new_ids)
        ]
        changes = listed.changes
        if changes is None:
            if listed.problem is not None:
                self._unusable(listed, listed.problem, fresh_skus, new_ids)
            return False
        try:
            products.append(product_record(changes.payload, listed.digest))
        except IncompleteRecord as exc:
            self._unusable(listed, str(exc), fresh_skus, new_ids)
            return False
        records = self._changed_skus(listed, changes, fresh_skus, new_ids)
        skus.extend(records)
        changed_skus = sum(digest is not None for digest in changes.sku_digests)
        return len(fresh_skus) == len(listed.sku_ids) and len(records) == changed_skus

    def _taken_off_sale(self, listed: ListedProduct) -> bool:
        """A changed product listed inactive that the mirror holds live (on sale, or inactive already: the
        pass's end tells which from the mirror's rows)."""
        changes = listed.changes
        return (
            changes is not None
            and changes.payload.get("is_active") is False
            and self._snapshot["product"].live(listed.id)
        )

    def _remember(self, page: FetchedPage) -> None:
        """Remember a page stored as listed, for the next pass."""
        packed = page.pack()
        if packed is not None:
            self._remembered[page.body_digest] = packed

    def _check_category(self, listed: ListedProduct) -> None:
        if listed.category_id is not None:
            violation = self._rules.product_violation(listed.id, listed.category_id)
            if violation is not None:
                self._violation(violation)

    def _unusable(
        self, listed: ListedProduct, problem: str, fresh_skus: Sequence[int], new_ids: dict[Entity, set[int]]
    ) -> None:
        self._violation(problem)
        self._not_mirrored("product", [listed.id], new_ids)
        self._not_mirrored("sku", [listed.sku_ids[position] for position in fresh_skus], new_ids)

    def _first_listing(self, entity: Entity, identity: int, new_ids: dict[Entity, set[int]]) -> bool:
        """Note that ``identity`` is listed; False when this pass already saw it (a shifted listing)."""
        if identity in self._snapshot[entity]:
            first = self._snapshot[entity].mark_listed(identity)
        else:
            # Not mirrored yet: it becomes a listed snapshot entry when this batch is written.
            first = identity not in new_ids[entity] and identity not in self._listing.unmirrored[entity]
            new_ids[entity].add(identity)
        if first:
            self._listing.counts[entity] += 1
        return first

    def _not_mirrored(
        self, entity: Entity, identities: Sequence[int], new_ids: dict[Entity, set[int]]
    ) -> None:
        for identity in identities:
            if identity in new_ids[entity]:
                self._listing.unmirrored[entity].add(identity)

    def _changed_skus(
        self,
        listed: ListedProduct,
        changes: Changes,
        fresh_skus: Sequence[int],
        new_ids: dict[Entity, set[int]],
    ) -> list[Record]:
        payloads = changes.payload["skus"]
        records = []
        for position in fresh_skus:
            digest = changes.sku_digests[position]
            if digest is None:
                continue
            try:
                records.append(sku_record(payloads[position], listed.id, digest))
            except IncompleteRecord as exc:
                self._violation(str(exc))
                self._not_mirrored("sku", [listed.sku_ids[position]], new_ids)
        return records

    async def _write(self, plans: Sequence[Plan]) -> None:
        if self._failure is not None:
            raise self._failure
        if not any(plan.rows for plan in plans):
            return
        now = utcnow()
        written = await self._database.write(
            _write_plans,
            self._upstream,
            plans,
            run_id=self._run_id,
            now=now,
            log_additions=not self._initial,
        )
        for plan in plans:
            apply_plan(self._snapshot[plan.entity], plan)
        self._totals.count(plans)
        self._written.add(written)

    # --- completeness and removals -----------------------------------------------------------------------

    def _check_complete(self) -> None:
        totals = self._listing.totals
        if len(totals) != 1:
            answered = ", ".join(map(str, sorted(totals)))
            raise IncompleteListing(f"the upstream's product total changed during the sync ({answered})")
        (total,) = totals
        seen = self._listing.counts["product"]
        if seen != total:
            raise IncompleteListing(
                f"saw {seen} distinct products but the upstream reported a total of {total}"
            )

    async def _closing_plans(self) -> list[Plan]:
        """What the pass writes once its listing is done: a full pass's removals (what it did not see
        listed) and the products held back as listed inactive, unless together they would take more than
        ``max_removed_fraction`` of the live products off sale (then nothing of them: the pass is
        suspicious)."""
        full = self._plan.kind == "full"
        removals = [diff_unlisted(entity, self._snapshot[entity]) for entity in ENTITIES] if full else []
        products_removed = sum(plan.removed for plan in removals if plan.entity == "product")
        held = [record.id for record in self._held.products]
        taken_off_sale = 0
        if held:
            previous = await self._database.read(
                lambda tx: tx.mirror.known_rows(self._upstream, "product", held)
            )
            taken_off_sale = len(deactivated(previous.tracked))
        guard = removal_guard(
            products_removed=products_removed,
            products_deactivated=taken_off_sale,
            live_products=self._live_products,
            total_listed=next(iter(self._listing.totals)) if full else None,
            max_fraction=self._options.max_removed_fraction,
            allowed=self._allow_mass_removal,
        )
        if guard.reason is not None:
            log.warning("catalog.sync_mass_removal_blocked", upstream=self._upstream, reason=guard.reason)
        if guard.blocked:
            self._removals_blocked = products_removed
            self._deactivations_blocked = taken_off_sale
            self._blocked_reason = guard.reason
            return []
        return [*self._held.plans(self._snapshot), *removals]

    def _violation(self, text: str) -> None:
        if len(self._totals.violations) >= MAX_VIOLATIONS:
            self._violations_left_out += 1
            return
        self._totals.violations.append(text)
        log.warning("catalog.violation", upstream=self._upstream, violation=text)


def _outcome(result: T | BaseException) -> T:
    """A result of ``gather(..., return_exceptions=True)``, raising the exception it stands for."""
    if isinstance(result, BaseException):
        raise result
    return result


def describe_error(exc: BaseException) -> str:
    """One line about a failure, fit for ``sync_runs.error`` and logs: no secrets, no SQL parameters."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, UpstreamError | IncompleteListing | LeaseLost):
        text = str(exc)
    elif isinstance(exc, DatabaseError):
        text = f"database error: {exc.reason}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return truncate(scrub(text), MAX_ERROR_CHARS)
