"""An acg-faka supplier's goods as seed 000's catalogue: categories, one product per commodity, one SKU per
orderable choice (ids from the :class:`~procurd.protocol.acgfaka.ports.ChoiceBook`).

The supplier has no pages: one ``items`` request lists every commodity open for docking. A catalogue pass asks
:meth:`AcgFakaCatalogue.catalog_categories` and page 1 together; both are answered from one ``items`` request,
and the commodities, built into products, are handed to the pass in pages of the size it asks for (pages
after the first come from the same listing, so one pass sees one listing).

Passes stay cheap. A commodity is priced and stocked (``valuation`` and ``stock`` per choice, or what the
version has: :meth:`~procurd.protocol.acgfaka.client.AcgFakaClient.goods`) only when its listing record
changed since this process last built it, or the build is older than :data:`REFRESH_AFTER` (a member-level
discount changes prices without changing the listing); otherwise its product is handed on as built, at no
request. The requests a pass makes for prices and stock are bounded (``requests_per_pass``): what the bound
leaves out keeps its last build, and is built by a later pass (a commodity that alone needs more than the
bound is not mirrored, and named). A commodity the process never built (the
first pass after a start) that the bound leaves out cannot be handed on: the listing is then not complete
(:meth:`AcgFakaCatalogue.catalog_complete`), the pass stores what it was handed and removes nothing, and the
next pass goes on where it stopped. :meth:`AcgFakaCatalogue.catalog_notes` says what a listing left out and
why, for the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Literal

from procurd.config import UpstreamSettings
from procurd.core.listing import MAX_PAGE_SIZE
from procurd.core.records import ListedChoice
from procurd.protocol.acgfaka.client import AcgFakaClient, Features
from procurd.protocol.acgfaka.goods import (
    MAX_CHOICES,
    Commodity,
    Goods,
    GoodsError,
    Listing,
    PriceSource,
    Problem,
)
from procurd.protocol.acgfaka.ports import ChoiceBook
from procurd.upstream.errors import BusinessError
from procurd.upstream.models import CatalogPage, Product, SeenPage
from procurd.upstream.ratelimit import Priority

DEFAULT_REQUESTS_PER_PASS: Final = 500
REFRESH_AFTER: Final = 24 * 3600.0  # seconds a build is handed on unchanged at most
FEATURES_AFTER: Final = 3600.0  # seconds the version's features are trusted before they are asked again
MAX_NOTES: Final = 50

Half = Literal["categories", "products"]


@dataclass(frozen=True, slots=True)
class Built:
    """One commodity as this process last built it: its product with procurd's SKU ids (None when not one
    choice could be offered), the problems found, and when."""

    record: bytes  # the digest of the listing record it was built from (and the version's price source)
    product: dict[str, Any] | None
    problems: tuple[Problem, ...]
    at: float


@dataclass(slots=True)
class PassListing:
    """What one pass is handed: the categories, the products (by id), what the listing said."""

    categories: list[dict[str, Any]]
    products: list[dict[str, Any]]
    total: int
    notes: list[str] = field(default_factory=list)
    built: int = 0  # commodities priced and stocked by this listing
    reused: int = 0  # handed on as built before, at no request
    deferred_kept: int = 0  # left for a later pass by the bound, handed on as last built
    deferred_missing: int = 0  # left for a later pass by the bound, never built: not handed on
    requests: int = 0  # price and stock requests made


@dataclass(slots=True)
class BuildStats:
    built: int = 0
    reused: int = 0
    deferred_kept: int = 0
    deferred_missing: int = 0
    requests: int = 0


def commodity_digest(commodity: Commodity, source: PriceSource) -> bytes:
    """What a commodity's listing record said, as a digest: a change of it (its config, prices, stock
    counter, buyer inputs, name ...) or of the version's price source rebuilds the commodity."""
    return hashlib.sha256(f"{source.value}|{commodity!r}".encode()).digest()


def requests_for(commodity: Commodity, features: Features) -> int:
    """How many requests :meth:`AcgFakaClient.goods` makes for ``commodity`` on a supplier with
    ``features``."""
    source = features.price_source
    try:
        choices = commodity.choices(MAX_CHOICES, add_ons=source is not PriceSource.ITEMS)
    except GoodsError:
        return 0
    usable = [choice for choice in choices if commodity.choice_problem(choice) is None]
    if not usable:
        return 0
    cost = len(usable) if source is PriceSource.VALUATION else int(source is PriceSource.INVENTORY)
    if features.stock:
        cost += len(usable)
    elif not commodity.manual:
        cost += len({choice.race for choice in usable})
    return cost


def _note(problem: Problem, code: str | None = None) -> str:
    if problem.commodity_id is None:
        subject = "the listing"
    else:
        subject = f"commodity {problem.commodity_id}" + (f" ({code})" if code else "")
    where = f", choice {problem.choice_key}" if problem.choice_key else ""
    return f"{subject}{where}: {problem.code}: {problem.reason}; not mirrored"


class AcgFakaCatalogue:
    """The catalogue of one acg-faka supplier, for catalogue passes (see the module)."""

    def __init__(
        self,
        settings: UpstreamSettings,
        client: AcgFakaClient,
        choices: ChoiceBook,
        *,
        requests_per_pass: int = DEFAULT_REQUESTS_PER_PASS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if requests_per_pass < 1:
            raise ValueError("requests_per_pass must be at least 1")
        self.settings = settings
        self.client = client
        self.choices = choices
        self.requests_per_pass = requests_per_pass
        self._clock = clock
        self._built: dict[int, Built] = {}
        self._features: tuple[Features, float] | None = None
        self._listing: asyncio.Task[PassListing] | None = None
        self._served: set[Half] = set()
        self._last: PassListing | None = None

    def close(self) -> None:
        """Stop a listing still being built (its pass was cancelled): the client is about to close."""
        if self._listing is not None and not self._listing.done():
            self._listing.cancel()
        self._listing = None

    @property
    def features_known(self) -> Features | None:
        """The version's features as last detected, if they were."""
        return self._features[0] if self._features is not None else None

    async def features(self, *, priority: Priority = Priority.CATALOG, fresh: bool = False) -> Features:
        """The supplier's features, detected at most once per :data:`FEATURES_AFTER` unless ``fresh``."""
        now = self._clock()
        if fresh or self._features is None or now - self._features[1] > FEATURES_AFTER:
            self._features = (await self.client.features(priority=priority), now)
        return self._features[0]

    def catalog_notes(self) -> list[str]:
        """What the latest listing left out, and why (for the pass's run)."""
        return list(self._last.notes) if self._last is not None else []

    def catalog_complete(self) -> bool:
        """Whether the latest listing handed on every commodity the shop lists (False while the bound
        leaves out some this process never read: the pass then removes nothing)."""
        return self._last is None or self._last.deferred_missing == 0

    @property
    def last_listing(self) -> PassListing | None:
        return self._last

    # -- the pass's two first requests share one listing ------------------------------------------------

    def _listing_for(self, half: Half, priority: Priority) -> asyncio.Task[PassListing]:
        """The listing a pass's categories and first page are answered from: the same one for the two
        halves of a pass, a new one when a half is asked again (the next pass)."""
        if self._listing is None or half in self._served:
            self._listing = asyncio.ensure_future(self._build_listing(priority))
            self._served = set()
        self._served.add(half)
        return self._listing

    async def catalog_categories(self, *, priority: Priority = Priority.CATALOG) -> list[dict[str, Any]]:
        listing = await asyncio.shield(self._listing_for("categories", priority))
        return listing.categories

    async def catalog_page(
        self,
        page: int = 1,
        page_size: int = 20,
        *,
        updated_after: datetime | None = None,
        priority: Priority = Priority.CATALOG,
        seen: Container[bytes] | None = None,
    ) -> CatalogPage | SeenPage:
        """Page ``page`` of the listing's products (acg-faka has no ``updated_after``: every pass lists
        everything). Page 1 takes a new listing; later pages come from the one page 1 took."""
        if page < 1 or not 1 <= page_size <= MAX_PAGE_SIZE:
            raise ValueError(f"page must be at least 1 and page_size 1 to {MAX_PAGE_SIZE}")
        if page == 1 or self._listing is None:
            listing = await asyncio.shield(self._listing_for("products", priority))
        else:
            listing = await asyncio.shield(self._listing)
        items = listing.products[(page - 1) * page_size : page * page_size]
        digest = b""
        if seen is not None:
            body = json.dumps(
                [listing.total, page, page_size, items], sort_keys=True, ensure_ascii=False, default=str
            )
            digest = hashlib.sha256(body.encode()).digest()
            if digest in seen:
                return SeenPage(digest)
        # acg-faka lists only what is on sale: what it stops listing is gone from it.
        return CatalogPage(items, listing.total, page, page_size, digest, False)

    async def product(self, product_id: int, *, priority: Priority = Priority.CATALOG) -> Product:
        """One commodity as a product, from a fresh listing; ``product_unavailable`` when the supplier does
        not list it (or ``codes`` leaves it out)."""
        listing = await self._build_listing(priority, only=product_id)
        found = next((item for item in listing.products if item["id"] == product_id), None)
        if found is None:
            raise BusinessError(
                f"commodity {product_id} is not listed for docking",
                code="product_unavailable",
                upstream=self.client.name,
                endpoint="items",
                http_status=404,
            )
        return Product.model_validate(found)

    # -- building --------------------------------------------------------------------------------------

    async def _build_listing(self, priority: Priority, *, only: int | None = None) -> PassListing:
        listing = await self.client.items(priority=priority)
        features = await self.features(priority=priority)
        commodities, notes = self._chosen(listing)
        if only is not None:
            commodities = [commodity for commodity in commodities if commodity.id == only]
        built, stats = await self._build(commodities, features, priority, force=only is not None)
        kept = {commodity.id for commodity in commodities}
        products = sorted(
            (entry.product for entry in built.values() if entry.product is not None),
            key=lambda product: int(product["id"]),
        )
        result = PassListing(self._categories(listing, products), products, len(products), notes)
        for commodity in commodities:
            entry = built.get(commodity.id)
            for problem in entry.problems if entry is not None else ():
                result.notes.append(_note(problem, commodity.code))
        result.notes[:0] = (_note(problem) for problem in listing.problems)
        self._account(result, stats)
        if only is None:
            for identity in [identity for identity in self._built if identity not in kept]:
                del self._built[identity]  # no longer listed: a commodity listed again is built anew
            self._last = result
        if len(result.notes) > MAX_NOTES:
            more = len(result.notes) - MAX_NOTES + 1
            result.notes[MAX_NOTES - 1 :] = [f"and {more} more commodities or choices not mirrored"]
        return result

    def _chosen(self, listing: Listing) -> tuple[list[Commodity], list[str]]:
        codes = self.settings.codes
        if not codes:
            return list(listing.commodities), []
        wanted = set(codes)
        chosen = [commodity for commodity in listing.commodities if commodity.code in wanted]
        listed = {commodity.code for commodity in chosen}
        notes = [
            f"code {code} is not listed for docking by the supplier (hidden, off sale, not opened for "
            "docking or unknown): not mirrored"
            for code in codes
            if code not in listed
        ]
        return chosen, notes

    async def _build(
        self, commodities: Sequence[Commodity], features: Features, priority: Priority, *, force: bool
    ) -> tuple[dict[int, Built], BuildStats]:
        """Each commodity's build: the one before when its record is unchanged and it is fresh enough, else
        a new one within the pass's request bound (what the bound leaves out keeps its old build, or has
        none)."""
        now = self._clock()
        source = features.price_source
        result: dict[int, Built] = {}
        stale: list[tuple[float, Commodity, bytes]] = []
        stats = BuildStats()
        for commodity in commodities:
            record = commodity_digest(commodity, source)
            before = self._built.get(commodity.id)
            fresh_enough = before is not None and now - before.at < REFRESH_AFTER
            if not force and before is not None and before.record == record and fresh_enough:
                result[commodity.id] = before
                stats.reused += 1
                continue
            # Never built first (the listing cannot be complete without them), then the oldest builds.
            stale.append((before.at if before is not None else -math.inf, commodity, record))
        stale.sort(key=lambda entry: entry[0])
        fresh: list[tuple[Commodity, bytes, Goods]] = []
        deferred: list[Commodity] = []
        bound = self.requests_per_pass
        for _, commodity, record in stale:
            cost = requests_for(commodity, features)
            if cost > bound:  # no pass could read it: not mirrored, and not waited for
                reason = (
                    f"{commodity.code}: needs {cost} price and stock requests, more than "
                    f"catalog_requests_per_pass ({bound}) allows a pass"
                )
                fresh.append(
                    (commodity, record, Goods(None, (Problem("too_many_requests", commodity.id, reason),)))
                )
                continue
            if stats.requests + cost > bound:
                deferred.append(commodity)
                continue
            stats.requests += cost
            stats.built += 1
            goods = await self.client.goods(commodity, features, priority=priority)
            fresh.append((commodity, record, goods))
        listed = [
            ListedChoice(sku["choice_key"], commodity.id, commodity.code, sku["race"], _options(sku))
            for commodity, _, goods in fresh
            if goods.product is not None
            for sku in goods.product["skus"]
        ]
        ids = await self.choices.sku_ids(self.client.name, listed) if listed else {}
        for commodity, record, goods in fresh:
            product = goods.product
            if product is not None:
                for sku in product["skus"]:
                    sku["id"] = ids[sku["choice_key"]]
            entry = Built(record, product, goods.problems, now)
            result[commodity.id] = entry
            if not force:
                self._built[commodity.id] = entry
        for commodity in deferred:
            before = self._built.get(commodity.id)
            if before is not None:
                result[commodity.id] = before
                stats.deferred_kept += 1
            else:
                stats.deferred_missing += 1
        return result, stats

    def _account(self, result: PassListing, stats: BuildStats) -> None:
        """What the listing says of its builds (a commodity the bound left out that was never built makes
        it incomplete: :meth:`catalog_complete`)."""
        result.built, result.reused, result.requests = stats.built, stats.reused, stats.requests
        result.deferred_kept, result.deferred_missing = stats.deferred_kept, stats.deferred_missing
        deferred = stats.deferred_kept + stats.deferred_missing
        if deferred:
            missing = stats.deferred_missing
            tail = "; nothing is removed until every listed commodity was read" if missing else ""
            result.notes.insert(
                0,
                f"{deferred} commodities wait for the next pass: this pass's {self.requests_per_pass} price "
                f"and stock requests were spent ({stats.deferred_kept} kept as last read, "
                f"{stats.deferred_missing} not read yet{tail})",
            )

    def _categories(self, listing: Listing, products: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The listed categories; with ``codes``, those holding a mirrored commodity and their parents. The
        supplier leaves out a category without goods of its own for docking, the parent of listed ones too:
        such a child is mirrored at the top (its parent's id kept as ``acg_faka_pid``)."""
        listed = {category["id"] for category in listing.categories}
        categories = [
            category
            if category["parent_id"] in listed or not category["parent_id"]
            else {**category, "parent_id": 0, "acg_faka_pid": category["parent_id"]}
            for category in listing.categories
        ]
        if not self.settings.codes:
            return categories
        by_id = {category["id"]: category for category in categories}
        wanted: set[int] = set()
        for product in products:
            identity = product.get("category_id")
            while isinstance(identity, int) and identity in by_id and identity not in wanted:
                wanted.add(identity)
                identity = by_id[identity]["parent_id"]
        return [category for category in categories if category["id"] in wanted]


def _options(sku: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple((str(group), str(option)) for group, option in sku["options"])
