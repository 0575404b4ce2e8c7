"""What a catalogue pass needs of the world: of an upstream client, and of storage (its ports).

The pass and the repricing ask storage through these protocols only; :mod:`procurd.operations.catalog_pass`
implements them on the database, each method one transaction. A method that fails with a failure of the
storage raises what the storage raises: :meth:`CatalogStore.failure` tells such a failure apart.
"""

from __future__ import annotations

from collections.abc import Collection, Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from procurd.core.catalog import Entity, PassHistory, PassKind, Plan, Snapshot
from procurd.core.listing import ListingSaid, RunOutcome, Written
from procurd.core.pricing import Pricing, Repricing
from procurd.upstream.models import CatalogPage, PingResult, SeenPage
from procurd.upstream.ratelimit import Priority


@dataclass(frozen=True, slots=True)
class PriceWrite:
    """How a repricing writes: ``cost_rises`` (a pass's, SKU id to old and new cost) may hold prices; the
    change log's entries name ``run_id`` and ``now``, and are left out unless ``logged``."""

    now: datetime
    cost_rises: Mapping[int, tuple[str, str]] | None = None
    run_id: int | None = None
    logged: bool = True


class CurrencySource(Protocol):
    """What repricing needs of an upstream client: a ping tells the upstream's currency."""

    async def ping(self, *, priority: Priority = ...) -> PingResult: ...


class CatalogClient(CurrencySource, Protocol):
    """What a pass needs of an upstream (:class:`procurd.upstream.interface.Upstream`)."""

    async def catalog_categories(self, *, priority: Priority = ...) -> list[dict[str, Any]]: ...

    async def catalog_page(
        self,
        page: int,
        page_size: int,
        *,
        updated_after: datetime | None,
        priority: Priority,
        seen: Container[bytes],
    ) -> CatalogPage | SeenPage:
        """Page ``page`` of the products, or :class:`SeenPage` when its body's digest is among ``seen``."""


@runtime_checkable
class NotingClient(Protocol):
    """An upstream whose listing can leave goods out for reasons of its own (acg-faka: a commodity the API
    cannot buy, a request bound reached): the pass records what it says as violations of its run, and
    removes nothing after a listing that was not complete."""

    def catalog_notes(self) -> list[str]:
        """What the latest listing left out, and why."""

    def catalog_complete(self) -> bool:
        """Whether the latest listing held everything the upstream offers (False: some of it waits for a
        later listing, so what the pass does not see is not gone)."""


class StorageFailures(Protocol):
    """How a failure of the storage is told apart from others (it is the storage's own exception)."""

    def failure(self, exc: BaseException) -> str | None:
        """``exc`` in one line when it is a failure of the storage (a pass records it, or logs it and goes on
        where it can), or None when it is something else."""


class LeaseStorage(StorageFailures, Protocol):
    """The named leases a pass holds while it runs (one holder per name across every process)."""

    async def acquire_lease(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        """Take lease ``name`` for ``holder`` when it is free, expired or already ``holder``'s."""

    async def renew_lease(self, name: str, holder: str, now: datetime, ttl_seconds: float) -> bool:
        """Extend ``holder``'s lease; False when ``holder`` no longer holds it."""

    async def release_lease(self, name: str, holder: str) -> None: ...


class PricingStorage(Protocol):
    """The mirror's selling prices, and the currency the upstream's last ping reported."""

    async def currency(self, upstream: str) -> str | None: ...

    async def record_currency(self, upstream: str, currency: str, now: datetime) -> None: ...

    async def has_prices(self, upstream: str) -> bool:
        """Whether any row of the upstream's mirror has a selling price."""

    async def category_ids(self, upstream: str) -> set[int]:
        """Ids of the categories the upstream still lists."""

    async def product_ids(self, upstream: str) -> list[int]: ...

    async def reprice(
        self, upstream: str, pricing: Pricing, product_ids: Collection[int], write: PriceWrite
    ) -> Repricing:
        """Reprice the SKUs of ``product_ids`` and those products in one transaction, from the costs it
        reads under row locks (so that no price is computed from a cost changed meanwhile)."""


class CatalogStore(LeaseStorage, PricingStorage, Protocol):
    """Everything a pass stores: its run in ``sync_runs``, the mirror's rows, and what the listing said."""

    async def record_skipped(self, upstream: str, now: datetime, kind: PassKind, reason: str) -> int:
        """Record a pass that did not run; its run's id."""

    async def pass_history(self, upstream: str) -> PassHistory: ...

    async def start_run(self, upstream: str, started: datetime, kind: PassKind) -> int:
        """Close the runs an earlier holder of the lease left running (it died), and record this one as
        running; its id."""

    async def set_run_kind(self, run_id: int, kind: PassKind, updated_after: datetime | None) -> None: ...

    async def load_snapshot(self, upstream: str) -> dict[Entity, Snapshot]:
        """What the mirror holds of the upstream: per entity, each row's digest and removal mark."""

    async def write_plans(
        self, upstream: str, plans: Sequence[Plan], *, run_id: int, now: datetime, log_additions: bool
    ) -> Written:
        """Write ``plans`` and their change-log entries in one transaction (filling each plan's
        ``changes`` from the tracked values the rows held before); what the writes touched."""

    async def products_as_stored(self, upstream: str, ids: Collection[int]) -> Mapping[int, Sequence[object]]:
        """The tracked values (TRACKED_FIELDS order) the mirror holds of products ``ids``."""

    async def finish_run(
        self, upstream: str, run_id: int, outcome: RunOutcome, said: ListingSaid | None
    ) -> None:
        """Close the run with its outcome, and record what the listing said of the upstream (if anything),
        in one transaction."""
