"""The sandbox's side of the signed site-to-site API (seed 000): :class:`SandboxBackend` answers from the
site in memory, as a real site does, for the shared protocol server (:mod:`procurd.protocol`).

What the sandbox adds to the protocol: the real sites' rate limit (counted on the raw API key, before the
signature is checked, as Dujiao-Next does), the request log (every request, with whether it
authenticated), and the fault knobs (delays, hangs, failures, malformed answers, dropped connections).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from aiohttp import web

from procurd.protocol.dujiao import (
    API_PREFIX,
    Backend,
    Caller,
    Credential,
    ErrorAnswer,
    Listing,
    OrderSubmission,
    ProductQuery,
    SignedApi,
)
from procurd.protocol.dujiao.failures import internal_error
from procurd.protocol.dujiao.server import rate_limited_response
from procurd.protocol.web import dump_json, json_response
from procurd.sandbox.catalog import money_text
from procurd.sandbox.faults import AFTER_KINDS, BEFORE_KINDS, RequestFault
from procurd.sandbox.site import SandboxSite
from procurd.sandbox.state import ApiUser
from procurd.sandbox.traffic import UNKNOWN_ENDPOINT

__all__ = ["API_PREFIX", "SandboxBackend", "json_response", "signed_api"]

log = structlog.get_logger("procurd.sandbox")


def abort_connection(request: web.Request) -> web.Response:
    """Close the connection without an answer (the returned response is never written)."""
    if request.transport is not None:
        request.transport.abort()
    return web.Response(status=500)


class SandboxBackend(Backend):
    """The sandbox site behind the shared signed API."""

    def __init__(self, site: SandboxSite) -> None:
        self.site = site
        self.state = site.state
        self.config = site.config
        self.faults = site.faults

    # The site's knobs may change while it runs: read them on every request.
    @property
    def header_prefix(self) -> str:
        return self.config.header_prefix

    @property
    def max_body_bytes(self) -> int:
        return self.config.max_body_bytes

    @property
    def page_size_max(self) -> int:
        return self.config.page_size_max

    @property
    def honours_updated_after(self) -> bool:
        return self.config.honour_updated_after

    def page_size(self, asked: int | None) -> int:
        """Seed 000's clamp; Dujiao-Next since 2026 reads anything outside 1 to the maximum (50) as it."""
        if not self.config.speaks_2026:
            return super().page_size(asked)
        maximum = self.config.page_size_max
        return asked if asked is not None and 1 <= asked <= maximum else maximum

    def now(self) -> float:
        return self.state.now()

    async def credential(self, api_key: str) -> Credential | None:
        user = self.state.users.get(api_key)
        if user is None:
            return None
        return Credential(user.api_secret, user.key_active, user.user_active, user)

    # -- the site's own rules ---------------------------------------------------------------------------

    async def before_authentication(
        self, request: web.Request, endpoint: str, api_key: str
    ) -> web.Response | None:
        config = self.config
        if not (config.rate_limit and api_key):
            return None
        allowed = self.site.rate_limiter.allow(
            api_key,
            config.rate_limit_requests,
            config.rate_limit_window_seconds,
            config.rate_limit_block_seconds,
        )
        if allowed:
            return None
        self.site.record_request(endpoint, api_key, True)
        return rate_limited_response(uuid.uuid4().hex, status=config.rate_limit_status)

    def authentication_failed(
        self, request: web.Request, endpoint: str, api_key: str, error: ErrorAnswer
    ) -> None:
        self.site.record_request(endpoint, api_key, False, authenticated=False)

    async def after_authentication(
        self, request: web.Request, endpoint: str, caller: Caller
    ) -> web.Response | None:
        self.site.record_request(endpoint, caller.api_key, False, authenticated=True)
        return None

    async def unrouted(self, request: web.Request, signed: Callable[[], Awaitable[bool]]) -> None:
        api_key = request.headers.get(f"{self.config.header_prefix}-Api-Key", "").strip()
        self.site.record_request(UNKNOWN_ENDPOINT, api_key, False, await signed())

    def answered(
        self, request: web.Request, endpoint: str | None, caller: Caller | None, status: int, outcome: str
    ) -> None:
        log.debug(
            "sandbox.request",
            method=request.method,
            path=request.path,
            endpoint=endpoint,
            status=status,
            api_key=caller.api_key if caller else None,
        )

    async def around(self, request: web.Request, endpoint: str) -> web.Response | None:
        """The knobs that act before the work: delay, then fail, hang or malformed."""
        delay = self.faults.take(endpoint, ("delay",))
        if delay is not None and await self.site.wait_closing(delay.seconds):
            return abort_connection(request)
        fault = self.faults.take(endpoint, BEFORE_KINDS)
        if fault is None:
            return None
        return await self._apply_before(request, fault)

    async def _apply_before(self, request: web.Request, fault: RequestFault) -> web.Response:
        if fault.kind == "hang":
            await self.site.wait_closing(None)
            return abort_connection(request)
        if fault.kind == "malformed":
            return web.Response(
                body=fault.body, status=fault.status, headers={"Content-Type": fault.content_type}
            )
        message = "too many requests" if fault.status == 429 else "injected failure"
        return json_response(ErrorAnswer(fault.status, fault.error_code, message).body(), fault.status)

    async def after(self, request: web.Request, endpoint: str, response: web.Response) -> web.Response:
        fault = self.faults.take(endpoint, AFTER_KINDS)
        if fault is None:
            return response
        if fault.kind == "drop":
            return abort_connection(request)
        return json_response(internal_error().body(), 500)

    # -- endpoints --------------------------------------------------------------------------------------

    async def ping(self, caller: Caller) -> Mapping[str, Any]:
        user: ApiUser = caller.account
        return {
            "site_name": self.config.site_name,
            "user_id": user.user_id,
            "balance": money_text(user.balance),
            "currency": self.config.currency,
            "member_level": user.member_level,
        }

    async def categories(self, caller: Caller) -> bytes:
        return dump_json([self.state.categories[key].to_dict() for key in sorted(self.state.categories)])

    async def products(self, caller: Caller, query: ProductQuery) -> Listing:
        speaks_2026 = self.config.speaks_2026
        include_inactive = speaks_2026 and query.include_inactive
        listed = self.faults.listing(self.state.listed_products(include_inactive))
        if query.updated_after is not None:
            listed = [product for product in listed if product.updated_instant() >= query.updated_after]
        if query.category_id is not None:
            listed = [product for product in listed if product.category_id == query.category_id]
        start = (query.page - 1) * query.page_size
        return Listing(
            [product.listing_json() for product in listed[start : start + query.page_size]],
            len(listed),
            includes_inactive=include_inactive if speaks_2026 else None,
        )

    async def product(self, caller: Caller, product_id: int) -> bytes:
        product = self.state.visible_product(product_id)
        if product is None:
            raise ErrorAnswer(404, "product_not_found", "product not found")
        if not product.is_active and self.config.inactive_detail == "404":
            raise ErrorAnswer(404, "product_unavailable", "product is inactive")
        return product.detail_json()

    async def existing_order(self, caller: Caller, downstream_order_no: str) -> Mapping[str, Any] | None:
        order = self.state.existing_order(caller.api_key, downstream_order_no)
        return None if order is None else order.summary()

    async def create_order(self, caller: Caller, submission: OrderSubmission) -> Mapping[str, Any]:
        flags = self.faults.new_order_flags()
        result = self.state.create_order(caller.api_key, submission, flags)
        self.faults.used_new_order_flags(result.used_pending_payment, result.used_hold_delivery)
        order = result.order
        if result.created:
            self.site.order_created(order)
        if result.payment_failed:
            fields = {"order_id": order.order_id, "order_no": order.order_no, "status": order.status}
            raise ErrorAnswer(200, "payment_failed", "wallet payment failed: the balance is too low", fields)
        return order.summary()

    async def order(self, caller: Caller, order_id: int) -> Mapping[str, Any]:
        return self.state.find_order(caller.api_key, order_id).to_api()

    async def cancel_order(self, caller: Caller, order_id: int) -> Mapping[str, Any]:
        order = self.state.cancel_order(caller.api_key, order_id)
        return {"ok": True, "order_id": order.order_id, "order_no": order.order_no, "status": order.status}


def signed_api(site: SandboxSite) -> SignedApi:
    """The sandbox's signed API, to mount at ``/api/v1/upstream{tail}``."""
    return SignedApi(SandboxBackend(site))
