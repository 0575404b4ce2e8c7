"""The catalogue pass on the database: the storage ports of :mod:`procurd.catalog.ports`, and the pass,
repricing and price holds as the rest of procurd calls them.

:class:`CatalogPassStore` is the only place that opens the transactions of a pass and of a repricing: each of
its methods runs one transaction function, and each function names the stores it touches (``MirrorTx``,
``LeaseTx`` ...). :func:`run_sync` and :func:`reprice_upstream` are :func:`procurd.catalog.sync.run_pass` and
:func:`procurd.catalog.pricing.reprice_products` on a database.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import structlog

from procurd.catalog.ports import CurrencySource, PriceWrite
from procurd.catalog.pricing import reprice_products, with_currency
from procurd.catalog.sync import SyncReport, run_pass
from procurd.config import PricingSettings
from procurd.core.catalog import Entity, PassHistory, PassKind, Plan, Record, Snapshot, log_changes
from procurd.core.clock import utcnow
from procurd.core.listing import ListingSaid, RunOutcome, Written
from procurd.core.pricing import Pricing, ReleasedHold, Repricing, release, reprice
from procurd.db.database import Database
from procurd.db.dialect_store import DialectStore
from procurd.db.errors import DatabaseError
from procurd.db.health_store import HealthStore
from procurd.db.leases import LeaseStore
from procurd.db.mirror_store import MirrorStore

log = structlog.get_logger("procurd.catalog.pricing")
P = ParamSpec("P")
T = TypeVar("T")


class MirrorTx(Protocol):
    """A transaction on the mirror's rows, its change log and its runs."""

    @property
    def mirror(self) -> MirrorStore: ...


class LeaseTx(Protocol):
    @property
    def leases(self) -> LeaseStore: ...


class HealthTx(Protocol):
    @property
    def health(self) -> HealthStore: ...


class RunEndTx(MirrorTx, Protocol):
    """A pass's last transaction: its run, and what its listing said of the upstream's dialect."""

    @property
    def dialects(self) -> DialectStore: ...


# --- the transactions ---------------------------------------------------------------------------------------


def acquire_lease(tx: LeaseTx, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
    return tx.leases.acquire(name, holder, now, ttl_seconds)


def renew_lease(tx: LeaseTx, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
    return tx.leases.renew(name, holder, now, ttl_seconds)


def release_lease(tx: LeaseTx, name: str, holder: str) -> None:
    tx.leases.release(name, holder)


def record_skipped(tx: MirrorTx, upstream: str, now: datetime, kind: PassKind, reason: str) -> int:
    return tx.mirror.record_skipped(upstream, now, kind, reason)


def pass_history(tx: MirrorTx, upstream: str) -> PassHistory:
    return tx.mirror.pass_history(upstream)


def start_run(tx: MirrorTx, upstream: str, started: datetime, kind: PassKind) -> int:
    """Close the runs an earlier holder of the lease left running (it died), and record this one."""
    tx.mirror.close_interrupted_runs(upstream, started)
    return tx.mirror.start_run(upstream, started, kind)


def set_run_kind(tx: MirrorTx, run_id: int, kind: PassKind, updated_after: datetime | None) -> None:
    tx.mirror.set_run_kind(run_id, kind, updated_after)


def load_snapshot(tx: MirrorTx, upstream: str) -> dict[Entity, Snapshot]:
    return tx.mirror.load_snapshot(upstream)


def _by_id(record: Record) -> int:
    return record.id


def write_plans(
    tx: MirrorTx, upstream: str, plans: Sequence[Plan], *, run_id: int, now: datetime, log_additions: bool
) -> Written:
    """Write ``plans`` with their change-log entries (old values read from the rows they rewrite)."""
    written = Written()
    for plan in plans:
        # Rows in id order: concurrent writers on PostgreSQL then lock them in one order.
        for records in (plan.inserts, plan.updates, plan.restores):
            records.sort(key=_by_id)
        plan.removals.sort()
        known_ids = plan.known_ids()
        known = tx.mirror.known_rows(upstream, plan.entity, known_ids) if known_ids else None
        log_changes(plan, known.tracked if known else {}, log_additions=log_additions)
        tx.mirror.write_plan(upstream, plan, run_id=run_id, now=now)
        written.note(plan, known.product_of if known else {})
    return written


def products_as_stored(tx: MirrorTx, upstream: str, ids: Collection[int]) -> dict[int, tuple[object, ...]]:
    return tx.mirror.known_rows(upstream, "product", ids).tracked


def finish_run(
    tx: RunEndTx, upstream: str, run_id: int, outcome: RunOutcome, said: ListingSaid | None
) -> None:
    tx.mirror.finish_run(run_id, outcome)
    if said is not None:
        learned = {
            "includes_inactive": said.includes_inactive,
            "page_size_asked": said.page_size_asked,
            "page_size": said.page_size,
            "listing_at": said.at,
        }
        tx.dialects.learn(upstream, learned, said.at)


def currency(tx: HealthTx, upstream: str) -> str | None:
    return tx.health.currency(upstream)


def record_currency(tx: HealthTx, upstream: str, currency: str, now: datetime) -> None:
    tx.health.update(upstream, {"currency": currency}, now)


def has_prices(tx: MirrorTx, upstream: str) -> bool:
    return tx.mirror.has_prices(upstream)


def category_ids(tx: MirrorTx, upstream: str) -> set[int]:
    return tx.mirror.category_ids(upstream)


def product_ids(tx: MirrorTx, upstream: str) -> list[int]:
    return tx.mirror.product_ids(upstream)


def reprice_chunk(
    tx: MirrorTx, upstream: str, pricing: Pricing, product_ids: Collection[int], write: PriceWrite
) -> Repricing:
    """Reprice the SKUs of ``product_ids`` and those products, from their rows read under row locks."""
    skus, products = tx.mirror.pricing_facts(upstream, product_ids)
    repricing = reprice(upstream, skus, products, pricing, cost_rises=write.cost_rises)
    tx.mirror.write_prices(upstream, repricing, run_id=write.run_id, now=write.now, log=write.logged)
    return repricing


def release_hold_of(
    tx: MirrorTx, upstream: str, sku_id: int, pricing: Pricing, now: datetime
) -> ReleasedHold | None:
    """Release a SKU's hold and write its product's prices; None when the SKU is not held."""
    product_id = tx.mirror.product_of_sku(upstream, sku_id)
    if product_id is None:
        return None
    # The product's rows are locked first, in the order every repricing locks them.
    skus, products = tx.mirror.pricing_facts(upstream, [product_id])
    released = release(upstream, sku_id, skus, products, pricing)
    if released is None:
        return None
    repricing, hold = released
    tx.mirror.release_hold(upstream, sku_id)
    tx.mirror.write_prices(upstream, repricing, run_id=None, now=now)
    return hold


def last_run(tx: MirrorTx, upstream: str, finished: bool) -> Mapping[Any, Any] | None:
    return tx.mirror.last_run(upstream, finished=finished)


def held_skus(tx: MirrorTx, upstream: str | None) -> list[Mapping[Any, Any]]:
    return list(tx.mirror.holds(upstream))


# --- the ports ----------------------------------------------------------------------------------------------


class CatalogPassStore:
    """:class:`procurd.catalog.ports.CatalogStore` on ``database``: one transaction a method."""

    def __init__(self, database: Database) -> None:
        self._database = database

    def failure(self, exc: BaseException) -> str | None:
        return f"database error: {exc.reason}" if isinstance(exc, DatabaseError) else None

    async def acquire_lease(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        return await self._database.write(acquire_lease, name, holder, now, ttl_seconds)

    async def renew_lease(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        return await self._database.write(renew_lease, name, holder, now, ttl_seconds)

    async def release_lease(self, name: str, holder: str) -> None:
        await self._database.write(release_lease, name, holder)

    async def record_skipped(self, upstream: str, now: datetime, kind: PassKind, reason: str) -> int:
        return await self._database.write(record_skipped, upstream, now, kind, reason)

    async def pass_history(self, upstream: str) -> PassHistory:
        return await self._database.read(pass_history, upstream)

    async def start_run(self, upstream: str, started: datetime, kind: PassKind) -> int:
        return await self._database.write(start_run, upstream, started, kind)

    async def set_run_kind(self, run_id: int, kind: PassKind, updated_after: datetime | None) -> None:
        await self._database.write(set_run_kind, run_id, kind, updated_after)

    async def load_snapshot(self, upstream: str) -> dict[Entity, Snapshot]:
        return await self._database.read(load_snapshot, upstream)

    async def write_plans(
        self, upstream: str, plans: Sequence[Plan], *, run_id: int, now: datetime, log_additions: bool
    ) -> Written:
        return await self._database.write(
            write_plans, upstream, plans, run_id=run_id, now=now, log_additions=log_additions
        )

    async def products_as_stored(self, upstream: str, ids: Collection[int]) -> Mapping[int, Sequence[object]]:
        return await self._database.read(products_as_stored, upstream, ids)

    async def finish_run(
        self, upstream: str, run_id: int, outcome: RunOutcome, said: ListingSaid | None
    ) -> None:
        await self._database.write(finish_run, upstream, run_id, outcome, said)

    async def currency(self, upstream: str) -> str | None:
        return await self._database.read(currency, upstream)

    async def record_currency(self, upstream: str, currency: str, now: datetime) -> None:
        await self._database.write(record_currency, upstream, currency, now)

    async def has_prices(self, upstream: str) -> bool:
        return await self._database.read(has_prices, upstream)

    async def category_ids(self, upstream: str) -> set[int]:
        return await self._database.read(category_ids, upstream)

    async def product_ids(self, upstream: str) -> list[int]:
        return await self._database.read(product_ids, upstream)

    async def reprice(
        self, upstream: str, pricing: Pricing, product_ids: Collection[int], write: PriceWrite
    ) -> Repricing:
        return await self._database.write(reprice_chunk, upstream, pricing, product_ids, write)


# --- the pass, repricing and holds on a database ------------------------------------------------------------


def _on_database(
    run: Callable[Concatenate[CatalogPassStore, P], Awaitable[T]],
) -> Callable[Concatenate[Database, P], Awaitable[T]]:
    async def on_database(database: Database, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await run(CatalogPassStore(database), *args, **kwargs)

    on_database.__doc__ = run.__doc__
    return on_database


run_sync = _on_database(run_pass)
"""One catalogue pass (:func:`procurd.catalog.sync.run_pass`) with ``database`` as its storage."""

reprice_upstream = _on_database(reprice_products)
"""Repricing (:func:`procurd.catalog.pricing.reprice_products`) of the mirror in ``database``."""


async def last_sync(database: Database, upstream: str, *, finished: bool = False) -> SyncReport | None:
    """The most recent pass of ``upstream`` that ran (skipped ones are not), or ``None``.

    While a pass is under way that is the ``running`` one, unless ``finished`` asks for the last that ended.
    """
    row = await database.read(last_run, upstream, finished)
    return None if row is None else SyncReport.from_row(row)


async def release_hold(
    database: Database,
    upstream: str,
    sku_id: int,
    settings: PricingSettings,
    *,
    client: CurrencySource | None = None,
) -> ReleasedHold | None:
    """Release a SKU's price hold and price it from the rules and its current cost at once (one
    transaction); None when the SKU is not held."""
    pricing = await with_currency(CatalogPassStore(database), upstream, settings.compiled(), client)
    released = await database.write(release_hold_of, upstream, sku_id, pricing, utcnow())
    if released is not None:
        log.info("pricing.hold_released", upstream=upstream, sku_id=sku_id, sell_price=released.sell_price)
    return released


async def holds(database: Database, upstream: str | None = None) -> list[dict[str, Any]]:
    """Held SKUs as JSON-ready dicts, oldest hold first."""
    rows = await database.read(held_skus, upstream)
    return [
        {
            "upstream": row["upstream"],
            "sku_id": row["sku_id"],
            "product_id": row["product_id"],
            "sku_code": row["sku_code"],
            "title": row["title"],
            "cost": row["cost"],
            "held_cost": row["held_cost"],
            "sell_price": row["sell_price"],
            "sell_currency": row["sell_currency"],
            "price_held_at": row["price_held_at"].isoformat() if row["price_held_at"] else None,
        }
        for row in rows
    ]
