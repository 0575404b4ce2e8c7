"""One catalogue sync pass of one upstream: categories, every page of products, their SKUs.

Pages are fetched by ``concurrency`` tasks and handed to a single writer task through a queue (pages fetched
but not yet stored are bounded); the writer diffs them against the snapshot loaded once at the start and
writes each batch of pages in one transaction.
Rows are only marked removed once the listing is known to be complete (every page fetched, as many distinct
products as the upstream's ``total``); a pass that fails part-way keeps what it wrote and removes nothing.

Only one pass per upstream runs at a time across every process on the database: the pass holds the lease
``catalog-sync:<upstream>`` and renews it while it runs; when another instance holds it the pass is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal, Protocol, TypeVar

import structlog

from procurd.core.catalog import (
    ENTITIES,
    CategoryRules,
    Entity,
    IncompleteRecord,
    Plan,
    Record,
    Snapshot,
    apply_plan,
    category_record,
    diff_listed,
    diff_unlisted,
    digest_text,
    mark_listed,
    needs_write,
    product_record,
    sku_record,
)
from procurd.db.database import Database
from procurd.db.errors import DatabaseError
from procurd.db.mirror_store import RunTotals
from procurd.db.stores import Tx
from procurd.db.types import utcnow
from procurd.instance import instance_id
from procurd.logs import scrub
from procurd.upstream.errors import UpstreamError, truncate
from procurd.upstream.models import Category, Product, ProductPage
from procurd.upstream.ratelimit import Priority

log = structlog.get_logger("procurd.catalog")
T = TypeVar("T")

LEASE_PREFIX: Final = "catalog-sync:"
DEFAULT_LEASE_TTL_SECONDS: Final = 60.0
SKIPPED_BUSY: Final = "another instance is syncing"
MAX_PAGE_SIZE: Final = 100
# Rows (products plus SKUs) the writer gathers from queued pages into one transaction at most.
WRITE_BATCH_ROWS: Final = 1000
MAX_VIOLATIONS: Final = 100
MAX_ERROR_CHARS: Final = 500

SyncStatus = Literal["running", "ok", "failed", "skipped"]
ProgressCallback = Callable[[int, int], None]
"""``progress(pages_done, pages_total)``, called after each batch of pages is stored."""


class CatalogClient(Protocol):
    """What a sync needs of :class:`procurd.upstream.UpstreamClient`."""

    async def categories(self, *, priority: Priority = ...) -> Sequence[Category]: ...

    async def products(
        self, page: int = ..., page_size: int = ..., *, priority: Priority = ...
    ) -> ProductPage: ...


@dataclass(frozen=True, slots=True)
class SyncReport:
    """The outcome of one sync pass (also what ``sync_runs`` records of it)."""

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
    page_size: int = 50,
    concurrency: int = 4,
    holder: str | None = None,
    progress: ProgressCallback | None = None,
    lease_ttl_seconds: float = DEFAULT_LEASE_TTL_SECONDS,
) -> SyncReport:
    """Mirror ``upstream_name``'s catalogue once and report how it went.

    Failures of the upstream, and of the database during the pass, end the pass as ``failed`` and are
    recorded on its run; only a database too broken to take the lease or record the run raises.

    ``page_size`` is what is asked for; the page size and total the upstream answers with are followed.
    ``holder`` names this instance in the lease (default ``host:pid``); a pass that finds the lease held
    elsewhere returns a ``skipped`` report without touching the mirror.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    lease_name = LEASE_PREFIX + upstream_name
    # A token per pass: two passes in one process exclude each other like passes on two machines.
    lease_holder = f"{holder or instance_id()}#{secrets.token_hex(4)}"
    now = utcnow()
    if not await database.write(
        lambda tx: tx.leases.acquire(lease_name, lease_holder, now, lease_ttl_seconds)
    ):
        log.info("catalog_sync_skipped", upstream=upstream_name, reason=SKIPPED_BUSY)
        now = utcnow()
        return SyncReport(None, upstream_name, "skipped", 0, 0, 0, 0, 0, 0, 0, 0, [], SKIPPED_BUSY, now, now)
    try:
        sync = _SyncPass(
            database,
            client,
            upstream_name,
            page_size=min(max(page_size, 1), MAX_PAGE_SIZE),
            concurrency=concurrency,
            progress=progress,
            lease=_Lease(lease_name, lease_holder, lease_ttl_seconds),
        )
        return await sync.run()
    finally:
        await _release(database, lease_name, lease_holder)


async def last_sync(database: Database, upstream: str, *, finished: bool = False) -> SyncReport | None:
    """The most recent sync pass of ``upstream``, or ``None``.

    While a pass is under way that is the ``running`` one, unless ``finished`` asks for the last that ended.
    """
    row = await database.read(lambda tx: tx.mirror.last_run(upstream, finished=finished))
    return None if row is None else SyncReport.from_row(row)


async def _release(database: Database, name: str, holder: str) -> None:
    try:
        await database.write(lambda tx: tx.leases.release(name, holder))
    except DatabaseError as exc:
        # The lease expires on its own; a failed release only delays the next pass.
        log.warning("catalog_sync_lease_release_failed", lease=name, error=describe_error(exc))


@dataclass(frozen=True, slots=True)
class _Lease:
    name: str
    holder: str
    ttl_seconds: float


def _renew(tx: Tx, lease: _Lease, now: datetime) -> bool:
    return tx.leases.renew(lease.name, lease.holder, now, lease.ttl_seconds)


@dataclass(frozen=True, slots=True)
class _ListedSku:
    id: int
    digest: str
    document: str | None  # the SKU's JSON, kept only when the mirror's row differs


@dataclass(frozen=True, slots=True)
class _ListedProduct:
    """A listed product, digested; its JSON is kept only where it differs from the mirror's rows.

    Pages wait for the writer in this form: JSON text takes a fraction of the memory of parsed models.
    """

    id: int
    category_id: int | None
    digest: str
    document: str | None
    skus: tuple[_ListedSku, ...]

    @classmethod
    def of(cls, product: Product, snapshot: Mapping[Entity, Snapshot]) -> _ListedProduct:
        # Digests of the client's JSON serialization: the upstream's fields, stable from one sync to the next.
        # A listed id's snapshot entry only changes when the writer stores that very listing, so what is
        # unchanged now is still unchanged when the page is written.
        skus = []
        for sku in product.skus:
            sku_document = sku.model_dump_json()
            sku_digest = digest_text(sku_document, product.id)
            changed = needs_write(snapshot["sku"], sku.id, sku_digest)
            skus.append(_ListedSku(sku.id, sku_digest, sku_document if changed else None))
        document = product.model_dump_json(exclude={"skus"})
        digest = digest_text(document)
        changed = needs_write(snapshot["product"], product.id, digest)
        return cls(product.id, product.category_id, digest, document if changed else None, tuple(skus))


@dataclass(frozen=True, slots=True)
class _FetchedPage:
    number: int
    products: list[_ListedProduct]

    @property
    def rows(self) -> int:
        return sum(1 + len(listed.skus) for listed in self.products)


class _Done:
    """The end of the page queue."""


_DONE: Final = _Done()


@dataclass(slots=True)
class _Listing:
    """What the upstream listed during this pass.

    Listed ids that the mirror holds are marked in the snapshot itself (:func:`mark_listed`); only ids
    that could not be mirrored are kept here, to recognise them when a shifting listing repeats them.
    """

    counts: dict[Entity, int] = field(default_factory=lambda: dict.fromkeys(ENTITIES, 0))
    unmirrored: dict[Entity, set[int]] = field(default_factory=lambda: {entity: set() for entity in ENTITIES})
    totals: set[int] = field(default_factory=set)
    page_size: int = 0
    pages_total: int = 0


class _SyncPass:
    def __init__(
        self,
        database: Database,
        client: CatalogClient,
        upstream: str,
        *,
        page_size: int,
        concurrency: int,
        progress: ProgressCallback | None,
        lease: _Lease,
    ) -> None:
        self._database = database
        self._client = client
        self._upstream = upstream
        self._page_size = page_size
        self._concurrency = concurrency
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
        # Pages fetched but not yet stored: bounded, so memory does not grow when fetching outpaces writing.
        self._window = asyncio.Semaphore(max(2, concurrency))

    async def run(self) -> SyncReport:
        self._started_at = utcnow()
        started = self._started_at
        await self._database.write(lambda tx: tx.mirror.close_interrupted_runs(self._upstream, started))
        self._run_id = await self._database.write(lambda tx: tx.mirror.start_run(self._upstream, started))
        log.info("catalog_sync_started", upstream=self._upstream, run_id=self._run_id)
        keeper = asyncio.create_task(self._keep_lease())
        try:
            return await self._execute()
        finally:
            self._finished.set()
            await keeper

    async def _execute(self) -> SyncReport:
        try:
            await self._collect()
            removals = self._removal_plans()
        except asyncio.CancelledError:
            await self._finish("failed", "cancelled before it finished", ())
            raise
        except Exception as exc:  # noqa: BLE001 - every failure is recorded on the run, never raised
            return await self._finish("failed", describe_error(exc), ())
        self._totals.count(removals)
        return await self._finish("ok", None, removals)

    async def _finish(self, status: SyncStatus, error: str | None, removals: Sequence[Plan]) -> SyncReport:
        self._totals.categories = self._listing.counts["category"]
        self._totals.products = self._listing.counts["product"]
        self._totals.skus = self._listing.counts["sku"]
        if self._violations_left_out:
            self._totals.violations.append(f"... and {self._violations_left_out} more violations")
        finished_at = utcnow()
        await self._database.write(
            lambda tx: tx.mirror.finish_run(
                self._run_id,
                upstream=self._upstream,
                status=status,
                finished_at=finished_at,
                totals=self._totals,
                error=error,
                plans=removals,
            )
        )
        report = self._report(status, error, finished_at)
        event = "catalog_sync_finished" if status == "ok" else "catalog_sync_failed"
        emit = log.info if status == "ok" else log.warning
        emit(
            event,
            upstream=self._upstream,
            run_id=self._run_id,
            seconds=round((finished_at - self._started_at).total_seconds(), 3),
            pages=report.pages,
            products=report.products,
            skus=report.skus,
            added=report.added,
            changed=report.changed,
            removed=report.removed,
            rows_written=report.rows_written,
            violations=len(report.violations),
            error=error,
        )
        return report

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
                    "catalog_sync_lease_renewal_failed", upstream=self._upstream, error=describe_error(exc)
                )
                continue
            if not renewed:
                log.warning("catalog_sync_lease_lost", upstream=self._upstream, lease=self._lease.name)
                self._abort(LeaseLost(f"lease {self._lease.name} was taken by another instance"))
                return

    def _abort(self, failure: BaseException) -> None:
        if self._failure is None:
            self._failure = failure

    # --- fetching and writing ----------------------------------------------------------------------------

    async def _collect(self) -> None:
        # The snapshot loads from the database while the first answers come from the upstream. When one of
        # them fails the others still finish: a database read cut off mid-way can leave SQLite locked.
        # Shielded too, so a cancellation from outside (shutdown) never cuts the read short either.
        snapshot, categories, first = await asyncio.gather(
            self._database.read(lambda tx: tx.mirror.load_snapshot(self._upstream)),
            self._client.categories(priority=Priority.CATALOG),
            self._client.products(1, self._page_size, priority=Priority.CATALOG),
            return_exceptions=True,
        )
        self._snapshot = _outcome(snapshot)
        await self._sync_categories(_outcome(categories))
        first_page = _outcome(first)
        self._follow_first_page(first_page)
        fetched_first = self._fetched(1, first_page)
        await self._window.acquire()
        queue: asyncio.Queue[_FetchedPage | _Done] = asyncio.Queue()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._write_pages(queue))
            tasks.create_task(self._fetch_pages(queue, fetched_first))
        if self._failure is not None:
            raise self._failure
        self._check_complete()

    async def _sync_categories(self, categories: Sequence[Category]) -> None:
        records: dict[int, Record] = {}
        for category in categories:
            if category.id not in records:
                digest = digest_text(category.model_dump_json())
                records[category.id] = category_record(category.model_dump(mode="json"), digest)
        for identity in records:
            mark_listed(self._snapshot["category"], identity)
        self._listing.counts["category"] = len(records)
        self._rules = CategoryRules.from_records(records.values())
        for violation in self._rules.category_violations():
            self._violation(violation)
        await self._write([diff_listed("category", records.values(), self._snapshot["category"])])

    def _follow_first_page(self, first: ProductPage) -> None:
        self._check_page_number(first, 1)
        answered = first.page_size if first.page_size > 0 else len(first.items) or self._page_size
        self._listing.page_size = min(answered, MAX_PAGE_SIZE)
        self._listing.totals.add(first.total)
        self._listing.pages_total = max(1, math.ceil(max(first.total, 0) / self._listing.page_size))
        if self._listing.page_size != self._page_size:
            log.info(
                "catalog_sync_page_size_clamped",
                upstream=self._upstream,
                asked=self._page_size,
                answered=self._listing.page_size,
            )

    def _check_page_number(self, page: ProductPage, number: int) -> None:
        if page.page != number:
            raise IncompleteListing(f"asked for page {number}, the upstream answered page {page.page}")

    def _fetched(self, number: int, page: ProductPage) -> _FetchedPage:
        return _FetchedPage(number, [_ListedProduct.of(product, self._snapshot) for product in page.items])

    async def _fetch_pages(self, queue: asyncio.Queue[_FetchedPage | _Done], first: _FetchedPage) -> None:
        queue.put_nowait(first)
        numbers = iter(range(2, self._listing.pages_total + 1))
        async with asyncio.TaskGroup() as tasks:
            for _ in range(min(self._concurrency, self._listing.pages_total - 1)):
                tasks.create_task(self._fetch_worker(numbers, queue))
        queue.put_nowait(_DONE)

    async def _fetch_worker(self, numbers: Iterator[int], queue: asyncio.Queue[_FetchedPage | _Done]) -> None:
        for number in numbers:
            await self._window.acquire()
            if self._failure is not None:
                self._window.release()
                return
            try:
                page = await self._client.products(number, self._listing.page_size, priority=Priority.CATALOG)
                self._check_page_number(page, number)
                self._listing.totals.add(page.total)
                fetched = self._fetched(number, page)
            except Exception as exc:  # noqa: BLE001 - ends the fetching; the pass records it as failed
                self._window.release()
                self._abort(exc)
                return
            queue.put_nowait(fetched)

    async def _write_pages(self, queue: asyncio.Queue[_FetchedPage | _Done]) -> None:
        finished = False
        while not finished:
            pages: list[_FetchedPage] = []
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

    async def _write_products(self, pages: Sequence[_FetchedPage]) -> None:
        new_ids: dict[Entity, set[int]] = {"product": set(), "sku": set()}
        products: list[Record] = []
        skus: list[Record] = []
        for page in pages:
            for listed in page.products:
                if not self._first_listing("product", listed.id, new_ids):
                    continue  # seen on an earlier page: the listing shifted under us
                if listed.category_id is not None:
                    violation = self._rules.product_violation(listed.id, listed.category_id)
                    if violation is not None:
                        self._violation(violation)
                fresh_skus = [sku for sku in listed.skus if self._first_listing("sku", sku.id, new_ids)]
                if listed.document is not None:
                    try:
                        products.append(product_record(json.loads(listed.document), listed.digest))
                    except IncompleteRecord as exc:
                        self._violation(str(exc))
                        self._not_mirrored("product", [listed.id], new_ids)
                        self._not_mirrored("sku", [sku.id for sku in fresh_skus], new_ids)
                        continue
                skus.extend(self._changed_skus(listed.id, fresh_skus, new_ids))
        await self._write(
            [
                diff_listed("product", products, self._snapshot["product"]),
                diff_listed("sku", skus, self._snapshot["sku"]),
            ]
        )
        self._totals.pages += len(pages)
        if self._progress is not None:
            self._progress(self._totals.pages, self._listing.pages_total)

    def _first_listing(self, entity: Entity, identity: int, new_ids: dict[Entity, set[int]]) -> bool:
        """Note that ``identity`` is listed; False when this pass already saw it (a shifted listing)."""
        if identity in self._snapshot[entity]:
            first = mark_listed(self._snapshot[entity], identity)
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
        self, product_id: int, skus: Sequence[_ListedSku], new_ids: dict[Entity, set[int]]
    ) -> list[Record]:
        records = []
        for sku in skus:
            if sku.document is not None:
                try:
                    records.append(sku_record(json.loads(sku.document), product_id, sku.digest))
                except IncompleteRecord as exc:
                    self._violation(str(exc))
                    self._not_mirrored("sku", [sku.id], new_ids)
        return records

    async def _write(self, plans: Sequence[Plan]) -> None:
        if self._failure is not None:
            raise self._failure
        now = utcnow()
        await self._database.write(
            lambda tx: tx.mirror.write_plans(self._upstream, plans, run_id=self._run_id, now=now)
        )
        for plan in plans:
            apply_plan(self._snapshot[plan.entity], plan)
        self._totals.count(plans)

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

    def _removal_plans(self) -> list[Plan]:
        return [diff_unlisted(entity, self._snapshot[entity]) for entity in ENTITIES]

    def _violation(self, text: str) -> None:
        if len(self._totals.violations) >= MAX_VIOLATIONS:
            self._violations_left_out += 1
            return
        self._totals.violations.append(text)
        log.warning("catalog_violation", upstream=self._upstream, violation=text)


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
