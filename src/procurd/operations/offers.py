"""Offers: a storefront SKU code sold from an ordered list of upstream SKUs (its sources).

``PUT /api/v1/offers/{code}``, ``procurd offers set`` and the console all go through :func:`put_offer`; the
view of an offer (:func:`offer_view`) shows each source as the mirror knows it and the one in use now: the
first that is active and in stock, whose selling price and stock a storefront lists. An order item that
names the offer is procured from its sources as :mod:`procurd.core.sources` decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from procurd.core.clock import utcnow
from procurd.core.intake import OFFER_CODE_PATTERN, OFFER_CODE_RULE
from procurd.core.numbers import MAX_ID
from procurd.core.orders import iso
from procurd.core.procurement import MirroredSku, SourceRef
from procurd.core.records import Offer
from procurd.core.refusals import Refused
from procurd.core.sources import listing_problem
from procurd.db.database import Database
from procurd.db.views import WithOffers, WithProcurements
from procurd.operations.runtime import Runtime

log = structlog.get_logger("procurd.offers")

MAX_SOURCES = 20
OFFER_ERROR_STATUS = {"invalid_request": 400, "invalid_offer_code": 400, "invalid_source": 400}


class OffersTx(WithOffers, WithProcurements, Protocol):
    """An offer and the mirrored SKUs its sources name."""


class OfferError(Exception):
    """An offer procurd refuses to store; nothing was changed. ``code`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Stored:
    created: bool
    view: dict[str, Any]


def check_code(code: str) -> str:
    if not OFFER_CODE_PATTERN.fullmatch(code):
        raise OfferError("invalid_offer_code", f"an offer code is {OFFER_CODE_RULE}")
    return code


def parse_source(text: str) -> tuple[str, int]:
    """``UPSTREAM:SKU_ID`` (the command line's form of a source)."""
    upstream, separator, sku_id = text.rpartition(":")
    if not separator or not upstream or not (sku_id.isascii() and sku_id.isdigit()):
        raise OfferError("invalid_source", f"{text!r}: a source is UPSTREAM:SKU_ID, such as main:12")
    return upstream, int(sku_id)


def check_sources(raw: Any, upstreams: Sequence[str]) -> list[tuple[str, int]]:
    """The ``sources`` of a request: a list of ``{"upstream", "sku_id"}`` objects, first choice first."""
    if not isinstance(raw, list) or not raw:
        raise OfferError("invalid_request", 'sources must be a non-empty list of {"upstream", "sku_id"}')
    if len(raw) > MAX_SOURCES:
        raise OfferError("invalid_request", f"an offer has at most {MAX_SOURCES} sources")
    sources: list[tuple[str, int]] = []
    for position, item in enumerate(raw):
        where = f"sources.{position}"
        if not isinstance(item, dict) or set(item) - {"upstream", "sku_id"}:
            raise OfferError("invalid_request", f'{where}: an object with "upstream" and "sku_id" only')
        upstream, sku_id = item.get("upstream"), item.get("sku_id")
        if not isinstance(upstream, str):
            raise OfferError("invalid_request", f"{where}.upstream: the name of a configured upstream")
        if isinstance(sku_id, bool) or not isinstance(sku_id, int) or not 0 < sku_id <= MAX_ID:
            raise OfferError("invalid_request", f"{where}.sku_id: a positive integer")
        sources.append((upstream, sku_id))
    return check_source_list(sources, upstreams)


def check_source_list(sources: Sequence[tuple[str, int]], upstreams: Sequence[str]) -> list[tuple[str, int]]:
    if not sources:
        raise OfferError("invalid_request", "an offer needs at least one source")
    if len(sources) > MAX_SOURCES:
        raise OfferError("invalid_request", f"an offer has at most {MAX_SOURCES} sources")
    seen: set[tuple[str, int]] = set()
    for position, (upstream, sku_id) in enumerate(sources):
        if upstream not in upstreams:
            raise OfferError(
                "unknown_upstream",
                f"sources.{position}: no upstream {upstream!r} (configured: {', '.join(upstreams)})",
            )
        if (upstream, sku_id) in seen:
            raise OfferError(
                "duplicate_source", f"sources.{position}: {upstream} SKU {sku_id} is listed twice"
            )
        seen.add((upstream, sku_id))
    return list(sources)


async def put_offer(
    database: Database, code: str, sources: Sequence[tuple[str, int]], upstreams: Sequence[str]
) -> Stored:
    """Create or replace the offer ``code``; every source must be a SKU the mirror holds."""
    check_code(code)
    checked = check_source_list(sources, upstreams)
    now = utcnow()

    def put(tx: OffersTx) -> tuple[bool, dict[str, Any]]:
        mirror = tx.procurements.mirrored_skus(checked)
        missing = [key for key in checked if key not in mirror]
        if missing:
            upstream, sku_id = missing[0]
            position = checked.index(missing[0])
            raise OfferError(
                "sku_not_found",
                f"sources.{position}: {upstream} SKU {sku_id} is not in the mirrored catalogue "
                "(run a catalogue sync?)",
            )
        created = tx.offers.put(code, checked, now)
        offer = tx.offers.get(code)
        assert offer is not None
        return created, _view(offer, mirror)

    created, view = await database.write(put)
    log.info("offer.stored", offer=code, created=created, sources=[f"{u}:{s}" for u, s in checked])
    return Stored(created, view)


async def delete_offer(database: Database, code: str) -> bool:
    deleted = await database.write(lambda tx: tx.offers.delete(code))
    if deleted:
        log.info("offer.deleted", offer=code)
    return deleted


async def offer_view(database: Database, code: str) -> dict[str, Any] | None:
    def read(tx: OffersTx) -> dict[str, Any] | None:
        offer = tx.offers.get(code)
        if offer is None:
            return None
        return _view(offer, tx.procurements.mirrored_skus(offer.sources))

    return await database.read(read)


async def offers_page(database: Database, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]:
    def read(tx: OffersTx) -> tuple[int, list[dict[str, Any]]]:
        total, found = tx.offers.page(page, page_size)
        mirror = tx.procurements.mirrored_skus(key for offer in found for key in offer.sources)
        return total, [_view(offer, mirror) for offer in found]

    return await database.read(read)


def _view(offer: Offer, mirror: dict[tuple[str, int], MirroredSku]) -> dict[str, Any]:
    sources = [_source_view(position, key, mirror.get(key)) for position, key in enumerate(offer.sources)]
    in_use = next((source for source in sources if source["available"]), None)
    return {
        "code": offer.code,
        "sources": sources,
        "in_use": None if in_use is None else {"upstream": in_use["upstream"], "sku_id": in_use["sku_id"]},
        "sell_price": None if in_use is None else in_use["sell_price"],
        "sell_currency": None if in_use is None else in_use["sell_currency"],
        "stock_status": "out_of_stock" if in_use is None else in_use["stock_status"],
        "stock_quantity": 0 if in_use is None else in_use["stock_quantity"],
        "created_at": iso(offer.created_at),
        "updated_at": iso(offer.updated_at),
    }


def _source_view(position: int, key: tuple[str, int], sku: MirroredSku | None) -> dict[str, Any]:
    upstream, sku_id = key
    problem = listing_problem(SourceRef(upstream, sku_id), sku)
    return {
        "position": position,
        "upstream": upstream,
        "sku_id": sku_id,
        "available": problem is None,
        "reason": None if problem is None else problem[0],
        "cost": None if sku is None else sku.price_amount,
        "sell_price": None if sku is None else sku.sell_price,
        "sell_currency": None if sku is None else sku.sell_currency,
        "stock_status": None if sku is None else sku.stock_status,
        "stock_quantity": None if sku is None else sku.stock_quantity,
    }


def offer_refusal(error: OfferError) -> Refused:
    return Refused(OFFER_ERROR_STATUS.get(error.code, 422), error.code, error.message)


class OfferOperations:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def check_code(self, code: str) -> str:
        try:
            return check_code(code)
        except OfferError as exc:
            raise offer_refusal(exc) from None

    async def put(self, code: str, sources: Sequence[tuple[str, int]]) -> Stored:
        """Create or replace an offer: its sources, first choice first, as ``(upstream, sku_id)`` pairs."""
        upstreams = self.runtime.service.upstream_names
        try:
            return await put_offer(self.runtime.database, self.check_code(code), sources, upstreams)
        except OfferError as exc:
            raise offer_refusal(exc) from None

    async def put_request(self, code: str, sources: Any) -> Stored:
        """:meth:`put` with the admin API's ``[{"upstream", "sku_id"}, ...]``."""
        try:
            checked = check_sources(sources, self.runtime.service.upstream_names)
        except OfferError as exc:
            raise offer_refusal(exc) from None
        return await self.put(code, checked)

    def parse_source(self, text: str) -> tuple[str, int]:
        """``UPSTREAM:SKU_ID`` (the command line's form of a source)."""
        try:
            return parse_source(text)
        except OfferError as exc:
            raise offer_refusal(exc) from None

    async def delete(self, code: str) -> None:
        if not await delete_offer(self.runtime.database, self.check_code(code)):
            raise Refused(404, "offer_not_found", f"no offer {code!r}")

    async def view(self, code: str) -> dict[str, Any]:
        found = await offer_view(self.runtime.database, self.check_code(code))
        if found is None:
            raise Refused(404, "offer_not_found", f"no offer {code!r}")
        return found

    async def page(self, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]:
        return await offers_page(self.runtime.database, page, page_size)
