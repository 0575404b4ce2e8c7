"""What one catalogue pass saw listed, free of I/O: the bookkeeping a pass keeps while its pages arrive.

A :class:`ListedProduct` is a listed product digested as a whole (only one that differs from the mirror keeps
its decoded payload). A :class:`Listing` takes the categories and then the pages of products in the order the
pass stores them, and tells of each product whether the mirror holds it as listed (it is only noted), whether
it differs (its records go into the :class:`Batch` being written), whether this pass saw it on an earlier page
(a listing that shifted under the pass) or whether it cannot be mirrored (a violation). It counts what was
listed, keeps back what a listing that includes inactive products takes off sale (:class:`HeldBack`), tells
whether a listing is complete, and at the end what the pass removes and takes off sale
(:meth:`Listing.closing`, under :func:`procurd.core.catalog.removal_guard`).

:class:`RunTotals` and :class:`RunOutcome` are what ``sync_runs`` records of a pass; :class:`Written` is what
its writes touched, for the repricing it ends with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Final, Literal, Protocol

from procurd.core.catalog import (
    ENTITIES,
    CategoryRules,
    Entity,
    IncompleteRecord,
    PassKind,
    Plan,
    Record,
    RemovalGuard,
    Snapshot,
    apply_plan,
    category_record,
    deactivated,
    diff_listed,
    diff_unlisted,
    digest_of,
    product_digest,
    product_record,
    removal_guard,
    sku_digest,
    sku_record,
)

SyncStatus = Literal["running", "ok", "failed", "skipped", "suspicious"]
COMPLETE_STATUSES: Final = ("ok", "suspicious")  # passes whose listing was complete
MAX_PAGE_SIZE: Final = 100
MAX_VIOLATIONS: Final = 100


class IncompleteListing(Exception):
    """The upstream's listing cannot be trusted to be complete, so nothing may be marked removed."""


# --- what sync_runs records ---------------------------------------------------------------------------------


@dataclass(slots=True)
class RunTotals:
    """The counters of one sync run, as ``sync_runs`` stores them."""

    pages: int = 0
    categories: int = 0
    products: int = 0
    skus: int = 0
    added: int = 0
    restored: int = 0
    changed: int = 0
    removed: int = 0
    rows_written: int = 0
    violations: list[str] = field(default_factory=list)
    violations_left_out: int = 0

    def count(self, plans: Sequence[Plan]) -> None:
        """Add the effect of written ``plans``."""
        for plan in plans:
            self.added += plan.added
            self.restored += plan.restored
            self.changed += plan.changed
            self.removed += plan.removed
            self.rows_written += plan.rows

    def violation(self, text: str) -> bool:
        """Keep a violation among the first :data:`MAX_VIOLATIONS`; False when it is only counted."""
        if len(self.violations) >= MAX_VIOLATIONS:
            self.violations_left_out += 1
            return False
        self.violations.append(text)
        return True

    def close(self, counts: Mapping[Entity, int]) -> None:
        """Take the listing's counts, and say how many violations were left out."""
        self.categories = counts["category"]
        self.products = counts["product"]
        self.skus = counts["sku"]
        if self.violations_left_out:
            self.violations.append(f"... and {self.violations_left_out} more violations")


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """How a run ended, as ``finish_run`` records it."""

    status: str
    kind: PassKind
    finished_at: datetime
    totals: RunTotals
    error: str | None
    ignored_updated_after: bool = False


@dataclass(frozen=True, slots=True)
class ListingSaid:
    """What a listing showed of the upstream's dialect (once its first page was answered)."""

    includes_inactive: bool
    page_size_asked: int
    page_size: int
    at: datetime


# --- listed products ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Changes:
    """What a sync needs of a listed product that differs from the mirror: its decoded payload and each
    SKU's digest (None where the SKU's row is unchanged)."""

    payload: dict[str, Any]
    sku_digests: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class ListedProduct:
    """A listed product, digested as a whole; only one that differs from the mirror keeps its payload
    (pages wait for the writer in this form)."""

    id: int
    category_id: int | None
    sku_ids: tuple[int, ...]
    digest: bytes = b""
    changes: Changes | None = None
    problem: str | None = None

    @classmethod
    def of(cls, payload: dict[str, Any], snapshot: Mapping[Entity, Snapshot]) -> ListedProduct:
        # A listed id's snapshot entry only changes when the writer stores that very listing, so what is
        # unchanged now is still unchanged when the page is written.
        identity: int = payload["id"]
        category = payload.get("category_id")
        category_id = category if type(category) is int else None
        sku_payloads = payload.get("skus") or ()
        sku_ids = tuple(sku["id"] for sku in sku_payloads)
        try:
            unchanged = cls(identity, category_id, sku_ids, product_digest(payload))
            # A SKU the mirror lacks (one it could not store) sends the product down the long way, so the
            # reason is reported again on every pass.
            if unchanged.unchanged_in(snapshot):
                return unchanged
            skus = snapshot["sku"]
            sku_digests = tuple(
                digested if skus.needs_write(sku_id, digested) else None
                for sku_id, digested in zip(
                    sku_ids, (sku_digest(sku, identity) for sku in sku_payloads), strict=True
                )
            )
        except TypeError as exc:
            problem = f"product {identity} cannot be stored as JSON ({exc}): not mirrored"
            return cls(identity, category_id, sku_ids, problem=problem)
        return replace(unchanged, changes=Changes(payload, sku_digests))

    def unchanged_in(self, snapshot: Mapping[Entity, Snapshot]) -> bool:
        """Whether the mirror holds this product, SKUs included, as it was listed (by its digest)."""
        skus = snapshot["sku"]
        return not snapshot["product"].needs_write(self.id, self.digest) and all(map(skus.live, self.sku_ids))


@dataclass(slots=True)
class HeldBack:
    """The records of products a listing that says ``includes_inactive: true`` lists inactive while the
    mirror holds them live, with those of their SKUs: a pass writes them only at its end, once it knows how
    many products they take off sale (the mass-removal guard counts them with the removals)."""

    products: list[Record] = field(default_factory=list)
    skus: list[Record] = field(default_factory=list)

    def plans(self, snapshot: Mapping[Entity, Snapshot]) -> list[Plan]:
        if not self.products:
            return []
        return [
            diff_listed("product", self.products, snapshot["product"]),
            diff_listed("sku", self.skus, snapshot["sku"]),
        ]


@dataclass(slots=True)
class Batch:
    """The records of the pages one write stores, and the ids they list that the mirror does not hold yet."""

    products: list[Record] = field(default_factory=list)
    skus: list[Record] = field(default_factory=list)
    new_ids: dict[Entity, set[int]] = field(default_factory=lambda: {"product": set(), "sku": set()})


@dataclass(slots=True)
class Written:
    """What a pass's writes touched, for repricing: products, and SKUs' cost changes."""

    products: set[int] = field(default_factory=set)
    cost_rises: dict[int, tuple[str, str]] = field(default_factory=dict)

    def add(self, other: Written) -> None:
        self.products |= other.products
        self.cost_rises.update(other.cost_rises)

    def note(self, plan: Plan, product_of: Mapping[int, int]) -> None:
        """Add what written ``plan`` touched (its change log filled); ``product_of``: the product each
        rewritten SKU belonged to before."""
        records = (*plan.inserts, *plan.updates, *plan.restores)
        if plan.entity == "product":
            self.products.update(record.id for record in records)
            self.products.update(plan.removals)
        elif plan.entity == "sku":
            self.products.update(record.values["product_id"] for record in records)
            self.products.update(product_of.values())
            for change in plan.changes:
                if change.field == "price_amount" and change.old_value is not None and change.new_value:
                    self.cost_rises[change.entity_id] = (change.old_value, change.new_value)


# --- the listing --------------------------------------------------------------------------------------------


class PageHead(Protocol):
    """What the bookkeeping reads of an answered page besides its products."""

    @property
    def page(self) -> int: ...

    @property
    def total(self) -> int: ...

    @property
    def page_size(self) -> int: ...

    @property
    def includes_inactive(self) -> bool | None: ...


@dataclass(frozen=True, slots=True)
class Closing:
    """What a pass writes once its listing is done, and what the mass-removal guard said of it."""

    plans: list[Plan]
    guard: RemovalGuard
    products_removed: int
    products_deactivated: int


class Listing:
    """What the upstream listed during one pass, checked against the mirror's snapshot as pages are stored.

    Listed ids that the mirror holds are marked in the snapshot itself (:meth:`Snapshot.mark_listed`); only
    ids that could not be mirrored are kept here, to recognise them when a shifting listing repeats them.
    ``violation`` is told of every record the pass cannot mirror and every rule the listing breaks.
    """

    def __init__(self, violation: Callable[[str], None]) -> None:
        self._violation = violation
        self.snapshot: dict[Entity, Snapshot] = {entity: Snapshot() for entity in ENTITIES}
        self.live_products = 0
        self.counts: dict[Entity, int] = dict.fromkeys(ENTITIES, 0)
        self.unmirrored: dict[Entity, set[int]] = {entity: set() for entity in ENTITIES}
        self.totals: set[int] = set()
        self.page_size = 0
        self.pages_total = 0
        self.includes_inactive: bool | None = None  # what the first page answered
        self.rules = CategoryRules({}, {}, frozenset())
        self.held = HeldBack()

    def load(self, snapshot: dict[Entity, Snapshot]) -> None:
        """What the mirror holds at the start of the pass."""
        self.snapshot = snapshot
        self.live_products = snapshot["product"].live_count()

    # --- pages as they are answered -------------------------------------------------------------------------

    def first_page(self, page: PageHead, listed: int, asked: int) -> None:
        """Follow the first page's answer: its page size (at most :data:`MAX_PAGE_SIZE`; the number of
        products it listed when it says none), its total and whether it lists inactive products."""
        self.page(page, 1)
        answered = page.page_size if page.page_size > 0 else listed or asked
        self.page_size = min(answered, MAX_PAGE_SIZE)
        self.includes_inactive = page.includes_inactive
        self.pages_total = max(1, math.ceil(max(page.total, 0) / self.page_size))

    def page(self, page: PageHead, number: int) -> None:
        """Check that the upstream answered page ``number``, and note the total it said."""
        if page.page != number:
            raise IncompleteListing(f"asked for page {number}, the upstream answered page {page.page}")
        self.totals.add(page.total)

    def said(self, asked: int, at: datetime) -> ListingSaid | None:
        """What the listing showed of the upstream, once its first page was answered."""
        if not self.page_size:
            return None
        return ListingSaid(self.includes_inactive is True, asked, self.page_size, at)

    # --- categories -----------------------------------------------------------------------------------------

    def categories(self, payloads: Iterable[dict[str, Any]]) -> Plan:
        """Note the listed categories and their rules; the plan that brings the mirror's in step."""
        records: dict[int, Record] = {}
        listed: set[int] = set()
        for payload in payloads:
            identity = payload["id"]
            if identity in listed:
                continue
            # Listed counts whether or not it can be stored: an unusable category is never removed for it.
            listed.add(identity)
            self.snapshot["category"].mark_listed(identity)
            try:
                records[identity] = category_record(payload, digest_of(payload))
            except IncompleteRecord as exc:
                self._violation(str(exc))
            except TypeError as exc:
                self._violation(f"category {identity} cannot be stored as JSON ({exc}): not mirrored")
        self.counts["category"] = len(listed)
        self.rules = CategoryRules.from_records(records.values())
        for violation in self.rules.category_violations():
            self._violation(violation)
        return diff_listed("category", records.values(), self.snapshot["category"])

    # --- products -------------------------------------------------------------------------------------------

    def take(self, batch: Batch, products: Sequence[ListedProduct], includes_inactive: bool | None) -> bool:
        """Note one page's products, adding the records of those that differ from the mirror to ``batch``;
        True when every product of the page is held, or about to be stored, as listed."""
        as_listed = True
        for listed in products:
            if listed.changes is None and listed.problem is None:
                as_listed &= self._unchanged(listed)
            elif includes_inactive and self._taken_off_sale(listed):
                self._changed(listed, batch.new_ids, self.held.products, self.held.skus)
                self._not_mirrored("sku", listed.sku_ids, batch.new_ids)
                as_listed = False  # not stored until the pass ends: not remembered as stored
            else:
                as_listed &= self._changed(listed, batch.new_ids, batch.products, batch.skus)
        return as_listed

    def plans(self, batch: Batch) -> list[Plan]:
        """The writes that store ``batch``."""
        return [
            diff_listed("product", batch.products, self.snapshot["product"]),
            diff_listed("sku", batch.skus, self.snapshot["sku"]),
        ]

    def stored(self, plans: Iterable[Plan]) -> None:
        """``plans`` were written: the snapshot holds what they wrote (as listed)."""
        for plan in plans:
            apply_plan(self.snapshot[plan.entity], plan)

    def _unchanged(self, listed: ListedProduct) -> bool:
        """A product the mirror holds as listed, SKUs included: only noted as listed (and checked).
        False when this pass saw it before (a shifted listing)."""
        if not self.snapshot["product"].mark_listed(listed.id):
            return False  # seen on an earlier page: the listing shifted under us
        counts = self.counts
        counts["product"] += 1
        skus = self.snapshot["sku"]
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
            and self.snapshot["product"].live(listed.id)
        )

    def _check_category(self, listed: ListedProduct) -> None:
        if listed.category_id is not None:
            violation = self.rules.product_violation(listed.id, listed.category_id)
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
        if identity in self.snapshot[entity]:
            first = self.snapshot[entity].mark_listed(identity)
        else:
            # Not mirrored yet: it becomes a listed snapshot entry when this batch is written.
            first = identity not in new_ids[entity] and identity not in self.unmirrored[entity]
            new_ids[entity].add(identity)
        if first:
            self.counts[entity] += 1
        return first

    def _not_mirrored(
        self, entity: Entity, identities: Sequence[int], new_ids: dict[Entity, set[int]]
    ) -> None:
        for identity in identities:
            if identity in new_ids[entity]:
                self.unmirrored[entity].add(identity)

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

    # --- completeness and removals --------------------------------------------------------------------------

    def check_complete(self) -> None:
        """Raise :class:`IncompleteListing` unless one total was answered throughout and as many distinct
        products were listed."""
        if len(self.totals) != 1:
            answered = ", ".join(map(str, sorted(self.totals)))
            raise IncompleteListing(f"the upstream's product total changed during the sync ({answered})")
        (total,) = self.totals
        seen = self.counts["product"]
        if seen != total:
            raise IncompleteListing(
                f"saw {seen} distinct products but the upstream reported a total of {total}"
            )

    def held_ids(self) -> list[int]:
        """The products held back as listed inactive (the mirror's rows of them tell which go off sale)."""
        return [record.id for record in self.held.products]

    def closing(
        self,
        *,
        full: bool,
        held_as_stored: Mapping[int, Sequence[object]],
        max_fraction: float,
        allowed: bool,
    ) -> Closing:
        """What the pass writes once its (complete) listing is done: a full pass's removals (what it did not
        see listed) and the products held back, unless together they would take more than ``max_fraction``
        of the live products off sale (then nothing of them, and the guard says why).

        ``held_as_stored``: the tracked values (TRACKED_FIELDS order) the mirror holds of the products of
        :meth:`held_ids`."""
        removals = [diff_unlisted(entity, self.snapshot[entity]) for entity in ENTITIES] if full else []
        removed = sum(plan.removed for plan in removals if plan.entity == "product")
        taken_off_sale = len(deactivated(held_as_stored))
        guard = removal_guard(
            products_removed=removed,
            products_deactivated=taken_off_sale,
            live_products=self.live_products,
            total_listed=next(iter(self.totals)) if full else None,
            max_fraction=max_fraction,
            allowed=allowed,
        )
        plans = [] if guard.blocked else [*self.held.plans(self.snapshot), *removals]
        return Closing(plans, guard, removed, taken_off_sale)
