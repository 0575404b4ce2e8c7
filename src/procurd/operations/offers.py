"""Offers: a storefront SKU code bought from the first of its upstream SKUs that can supply it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from procurd import offers
from procurd.core.refusals import Refused
from procurd.offers import OfferError, Stored
from procurd.runtime import Runtime

__all__ = ["OfferOperations", "Stored"]

OFFER_ERROR_STATUS = {"invalid_request": 400, "invalid_offer_code": 400, "invalid_source": 400}


def offer_refusal(error: OfferError) -> Refused:
    return Refused(OFFER_ERROR_STATUS.get(error.code, 422), error.code, error.message)


class OfferOperations:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def check_code(self, code: str) -> str:
        try:
            return offers.check_code(code)
        except OfferError as exc:
            raise offer_refusal(exc) from None

    async def put(self, code: str, sources: Sequence[tuple[str, int]]) -> Stored:
        """Create or replace an offer: its sources, first choice first, as ``(upstream, sku_id)`` pairs."""
        upstreams = self.runtime.service.upstream_names
        try:
            return await offers.put_offer(self.runtime.database, self.check_code(code), sources, upstreams)
        except OfferError as exc:
            raise offer_refusal(exc) from None

    async def put_request(self, code: str, sources: Any) -> Stored:
        """:meth:`put` with the admin API's ``[{"upstream", "sku_id"}, ...]``."""
        try:
            checked = offers.check_sources(sources, self.runtime.service.upstream_names)
        except OfferError as exc:
            raise offer_refusal(exc) from None
        return await self.put(code, checked)

    def parse_source(self, text: str) -> tuple[str, int]:
        """``UPSTREAM:SKU_ID`` (the command line's form of a source)."""
        try:
            return offers.parse_source(text)
        except OfferError as exc:
            raise offer_refusal(exc) from None

    async def delete(self, code: str) -> None:
        if not await offers.delete_offer(self.runtime.database, self.check_code(code)):
            raise Refused(404, "offer_not_found", f"no offer {code!r}")

    async def view(self, code: str) -> dict[str, Any]:
        found = await offers.offer_view(self.runtime.database, self.check_code(code))
        if found is None:
            raise Refused(404, "offer_not_found", f"no offer {code!r}")
        return found

    async def page(self, page: int, page_size: int) -> tuple[int, list[dict[str, Any]]]:
        return await offers.offers_page(self.runtime.database, page, page_size)
